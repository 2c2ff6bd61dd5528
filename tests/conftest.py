"""Shared test set-up, and the split of the suite into unit and session tests.

Kernels imported by tests in this process run on the Triton interpreter: the variable
must be set before any ``@triton.jit`` function is decorated.

A test is a *session* test when it starts pytest or a rerun in another process (seconds
each, where a unit test takes milliseconds). It is marked so automatically, by what its
code uses, the way pytest's own suite marks its ``pytester`` tests: the ``pytester``
fixture, or a name below in the test function, in a fixture of its module that it
requests, or in a helper of its module that either calls. ``make test-fast`` deselects
them. Session tests run first, whole sessions first of all, so that under ``-n`` the
longest tests do not form the tail of the run.
"""

from __future__ import annotations

import os
import types
from collections.abc import Generator, Iterable, Iterator

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

#: Names that start another process: pytest in a subprocess, a rerun, a shell command.
SUBPROCESS_NAMES = frozenset({"runpytest_subprocess", "run_tests", "subprocess", "Popen"})
#: Names of a whole healing session in a subprocess: the longest tests.
WHOLE_SESSION_NAMES = frozenset({"runpytest_subprocess"})
_HELPER_DEPTH = 3


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "session: starts pytest or a rerun in a subprocess (marked automatically)")


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for constant in code.co_consts:  # nested functions and lambdas
        if isinstance(constant, types.CodeType):
            yield from _names(constant)


def _function(value: object) -> types.FunctionType | None:
    """A plain function, or the one behind a ``@pytest.fixture`` definition."""
    value = getattr(value, "__wrapped__", value)
    return value if isinstance(value, types.FunctionType) else None


def used_names(function: types.FunctionType, fixtures: Iterable[str] = ()) -> frozenset[str]:
    """Names the test's code uses: its own, its module's fixtures it requests, and the
    module-level helpers these call."""
    module_globals = function.__globals__
    seen: set[str] = set()
    pending = [(function.__code__, 0)]
    for name in fixtures:
        fixture = _function(module_globals.get(name))
        if fixture is not None:
            pending.append((fixture.__code__, 1))
    while pending:
        code, depth = pending.pop()
        for name in _names(code):
            if name in seen:
                continue
            seen.add(name)
            helper = _function(module_globals.get(name))
            if depth < _HELPER_DEPTH and helper is not None:
                pending.append((helper.__code__, depth + 1))
    return frozenset(seen)


def cost_rank(item: pytest.Item) -> int:
    """0: a whole session in a subprocess; 1: another session test; 2: a unit test."""
    function = _function(getattr(item, "function", None))
    fixtures = tuple(getattr(item, "fixturenames", ()))
    names = used_names(function, fixtures) if function is not None else frozenset()
    if names & WHOLE_SESSION_NAMES:
        return 0
    if "pytester" in fixtures or names & SUBPROCESS_NAMES:
        return 1
    return 2


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Generator[None, None, None]:
    ranks = {item: cost_rank(item) for item in items}
    for item, rank in ranks.items():
        if rank < 2:
            item.add_marker(pytest.mark.session)
    items.sort(key=ranks.__getitem__)  # stable: the order within a rank is kept
    return (yield)
