"""The rerun child: the pytest plugin that runs in it and maps imports onto the sandbox.

PYTEST_DONT_REWRITE
"""
