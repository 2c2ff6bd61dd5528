"""Judging a candidate by experiment.

:class:`~.verifier.Verifier` writes a candidate into the sandbox and orders its reruns;
what the reruns say is turned into a :class:`~pytest_kernelfix.heal.outcomes.Verdict`.
"""
