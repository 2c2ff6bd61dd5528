"""What a rerun child measures around each test: integrity, poisoned outputs, GPU compiles.

PYTEST_DONT_REWRITE
"""
