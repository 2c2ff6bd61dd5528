"""Ctrl-C while healing ends the session the way pytest ends one: summary, clean exit."""

from __future__ import annotations

import pytest
from kernel_project import make_project

INTERRUPTING_HOOK = """
import time

FINISHED = []


def pytest_runtest_logfinish(nodeid, location):
    FINISHED.append(nodeid)


def pytest_kernelfix_propose(request, config):
    while len(FINISHED) < 5:  # healing begins while the tests run: Ctrl-C once they ran
        time.sleep(0.05)
    raise KeyboardInterrupt  # what Ctrl-C raises while the fixer waits for a model
"""


def test_ctrl_c_while_healing_ends_the_session_cleanly(pytester: pytest.Pytester) -> None:
    make_project(pytester, bug="offset")
    pytester.makeconftest(INTERRUPTING_HOOK)
    pytester.makefile(".py", unconfigure_marker=(
        "def pytest_unconfigure(config):\n"
        "    open(str(config.rootpath / 'unconfigured'), 'w').close()\n"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "unconfigure_marker",
                                           "--kernelfix")
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the tests' verdict, not a crash
    result.assert_outcomes(failed=4, passed=1)
    result.stdout.fnmatch_lines(["*healing was interrupted: nothing more was healed*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert (pytester.path / "unconfigured").exists()  # every plugin still cleaned up
