"""Reach mode's transform and sites (no subprocess here): every check statement of a
test's functions is guarded, the rest of the code keeps its meaning.

A guarded statement records whether it passed instead of raising; a check is named by the
line of the test function's own statement.
"""

from __future__ import annotations

import ast
import builtins
import sys
import textwrap
from collections.abc import Iterator

import pytest

from pytest_kernelfix.rerun.probes.checks import (
    RECORDER,
    CheckLog,
    failing_site,
    guarded_module,
    site_line,
    wrap_checks,
)

SOURCE = '''\
import pytest
import torch

LIMIT = 3
assert LIMIT == 3  # module level: runs at import, never guarded


def helper(a, b):
    assert a == b, "helper"


def test_many():
    x = 1
    assert x == 2
    torch.testing.assert_close(torch.ones(2), torch.zeros(2))
    helper(1, 2)
    for value in (1, 2):
        assert value == 1
    with pytest.raises(ZeroDivisionError):
        1 / 0
    with pytest.raises(AssertionError):
        assert x == 5
    try:
        assert x == 6
    except AssertionError:
        pass
    return "reached the end"
'''


@pytest.fixture
def log() -> Iterator[CheckLog]:
    found = CheckLog()
    setattr(builtins, RECORDER, found)
    yield found
    delattr(builtins, RECORDER)


def load(source: str, filename: str) -> dict[str, object]:
    tree = ast.parse(source)
    wrap_checks(tree)
    namespace: dict[str, object] = {"__name__": "guarded"}
    exec(compile(tree, filename, "exec"), namespace)
    return namespace


def test_every_check_of_a_test_runs_and_each_failure_is_recorded_by_line(log: CheckLog) -> None:
    namespace = load(SOURCE, "/proj/tests/test_many.py")
    log.start("/proj/tests/test_many.py")
    assert namespace["test_many"]() == "reached the end"  # type: ignore[operator]
    counts = {line: (count.runs, count.failures) for line, count in log.sites.items()}
    assert counts[14] == (1, 1)  # assert x == 2
    assert counts[15] == (1, 1)  # assert_close on a line of its own
    assert counts[9] == (1, 1)  # the helper's check is its own site: its assert failed
    assert counts[16] == (1, 0)  # and the test's call of the helper then returned normally
    assert counts[18] == (2, 1)  # a loop runs its check twice...
    assert log.sites[18].outcomes == "PF"  # ... and each run's outcome is kept in order
    assert 22 not in counts and 24 not in counts  # pytest.raises and try/except keep theirs


def test_the_transform_keeps_lines_and_guards_only_function_bodies() -> None:
    tree = ast.parse(SOURCE)
    assert wrap_checks(tree) == 5  # 1 in helper, 4 in test_many (`1 / 0` is no call)
    assert isinstance(tree.body[3], ast.Assert)  # module level untouched
    guarded = [node for node in ast.walk(tree) if isinstance(node, ast.Try)
               and node.handlers and isinstance(node.handlers[0].type, ast.Name)
               and node.handlers[0].type.id == "AssertionError" and node.orelse]
    assert sorted(node.lineno for node in guarded) == [9, 14, 15, 16, 18]
    compile(tree, "test.py", "exec")  # still valid code, locations filled in


def test_a_site_is_the_innermost_frame_in_the_test_file() -> None:
    def helper() -> int:  # a check inside a helper of the test module is its own site
        return site_line(sys._getframe(), __file__)

    line = helper.__code__.co_firstlineno + 1
    assert helper() == line
    assert site_line(sys._getframe(), "/elsewhere/test_x.py") == 0


def test_the_failing_site_of_a_traceback_is_its_innermost_frame_in_the_test_file() -> None:
    # the test calls a helper of its module (line 12), whose assert (line 30) failed in torch
    frames = [("/proj/tests/test_a.py", 12), ("/proj/tests/test_a.py", 30),
              ("/venv/torch/testing/_comparison.py", 1530)]
    assert failing_site(frames, "/proj/tests/test_a.py") == 30
    assert failing_site(frames, "/proj/tests/test_b.py") == 0
    # a check in a test utility module is named by the test's call of it
    frames = [("/proj/tests/test_a.py", 12), ("/proj/tests/utils.py", 7)]
    assert failing_site(frames, "/proj/tests/test_a.py") == 12


def test_a_guarded_module_behaves_as_before_when_every_check_passes(log: CheckLog) -> None:
    source = textwrap.dedent('''\
        def test_ok(values=(1, 2)):
            total = 0
            for value in values:
                total += value
                assert total > 0
            return total
        ''')
    namespace = load(source, "/proj/tests/test_ok.py")
    log.start("/proj/tests/test_ok.py")
    assert namespace["test_ok"]() == 3  # type: ignore[operator]
    assert {line: (c.runs, c.failures) for line, c in log.sites.items()} == {5: (2, 0)}


def test_only_test_modules_of_the_project_are_guarded() -> None:
    """Everything else keeps pytest's cached rewrite (plugins, conftests, packages)."""
    patterns = ("test_*.py", "*_test.py")
    assert guarded_module("/proj/tests/test_ops.py", patterns, "/proj")
    assert guarded_module("/proj/ops_test.py", patterns, "/proj")
    assert not guarded_module("/proj/tests/conftest.py", patterns, "/proj")
    assert not guarded_module("/proj/kernels/ops.py", patterns, "/proj")
    assert not guarded_module("/venv/site-packages/hypothesis/test_x.py", patterns, "/proj")
    assert not guarded_module(None, patterns, "/proj")
