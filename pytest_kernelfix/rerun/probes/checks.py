"""Every check of a test, reached and recorded: the probe behind per-check sensitivity.

A poisoned rerun asks, of the check that failed on the original, whether it now fails
because the kernel's output is poisoned. A test stops at its first failing check, so a
check written after one that poison breaks would never be reached. In *reach* mode every
check statement in the test module's functions (an ``assert``, or a call on a line of
its own such as ``torch.testing.assert_close(out, ref)``) runs inside
``try/except AssertionError``: whether it passed or failed is recorded, and the test goes
on to its next check. The test's data flow is untouched (checks compute nothing the test
uses later); only its verdicts stop being fatal, so a reach-mode outcome is read from the
record, never from pytest's pass or fail.

A check is named by its *site*: the line of the innermost frame in the test's file, the
check statement itself, also inside a helper of the test module (a helper that holds a
forward check and a gradient check has two sites, as its traceback has two lines). A
check made in a conftest or a test utility module, which is not guarded, is named by the
line in the test's file that called it, as it is in the original failure's traceback.
The guarded statements run at one site are told apart by the order they ran in (a loop
over outputs).

The transform is applied to test modules only (``python_files``), where pytest rewrites
their asserts; statements inside ``with pytest.raises(...)`` and inside a ``try`` that
handles AssertionError keep their meaning and are left alone.

PYTHONDONTWRITEBYTECODE and the sandbox's missing ``__pycache__`` mean nothing rewritten
here is ever read back by a plain rerun.

PYTEST_DONT_REWRITE: imported by the rerun agent before pytest collects.
"""

from __future__ import annotations

import ast
import builtins
import fnmatch
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

#: The name wrapped check statements call; set in ``builtins`` while reach mode is on.
RECORDER = "__kernelfix_check__"

#: Exception names whose handlers already catch a failed assert: leave their body alone.
_CATCHES_ASSERT = frozenset({"AssertionError", "Exception", "BaseException"})
#: Context managers that expect the body to raise: leave their body alone.
_EXPECTS_RAISE = frozenset({"raises", "warns", "deprecated_call", "assertRaises",
                            "assertRaisesRegex", "assertWarns"})


# -- the transform (pure) ------------------------------------------------------------------


def _is_check(statement: ast.stmt) -> bool:
    """An ``assert``, or a call on a line of its own (``assert_close(a, b)``)."""
    if isinstance(statement, ast.Assert):
        return True
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)


def _handler_names(handler: ast.ExceptHandler) -> Iterable[str]:
    if handler.type is None:
        yield "BaseException"
        return
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    for kind in kinds:
        yield kind.attr if isinstance(kind, ast.Attribute) else getattr(kind, "id", "")


def _expects_raise(statement: ast.With | ast.AsyncWith) -> bool:
    for item in statement.items:
        call = item.context_expr
        func = call.func if isinstance(call, ast.Call) else call
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in _EXPECTS_RAISE:
            return True
    return False


def _guarded(statement: ast.stmt) -> ast.Try:
    """``try: STATEMENT / except AssertionError: if not record(False): raise / else:
    record(True)``, every new node on the statement's own lines.

    The recorder answers whether the failure is swallowed: while reach mode is off (a
    plain phase of a phased child) it is not, and the bare ``raise`` re-raises the
    failure with its traceback untouched, as if the statement were not guarded."""

    def call(passed: bool) -> ast.Call:
        return ast.Call(ast.Name(RECORDER, ast.Load()), [ast.Constant(passed)], [])

    reraise = ast.If(test=ast.UnaryOp(ast.Not(), call(False)), body=[ast.Raise()], orelse=[])
    wrapped = ast.Try(
        body=[statement],
        handlers=[ast.ExceptHandler(ast.Name("AssertionError", ast.Load()), None,
                                    [reraise])],
        orelse=[ast.Expr(call(True))],
        finalbody=[],
    )
    own = {id(node) for node in ast.walk(statement)}
    for node in ast.walk(wrapped):
        if id(node) not in own:
            ast.copy_location(node, statement)
    return wrapped


class _Wrap:
    """Guards the check statements of every function body (not module-level code)."""

    def __init__(self) -> None:
        self.depth = 0
        self.wrapped = 0

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.AST:
        self.depth += 1
        try:
            node.body = self._statements(node.body)
        finally:
            self.depth -= 1
        return node

    def _statements(self, body: list[ast.stmt]) -> list[ast.stmt]:
        result: list[ast.stmt] = []
        for statement in body:
            if _is_check(statement):
                self.wrapped += 1
                result.append(_guarded(statement))
                continue
            result.append(self._compound(statement))
        return result

    def _compound(self, statement: ast.stmt) -> ast.stmt:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return self._function(statement)  # type: ignore[return-value]
        if isinstance(statement, ast.ClassDef):
            statement.body = [self._compound(s) for s in statement.body]
            return statement
        if isinstance(statement, (ast.With, ast.AsyncWith)) and _expects_raise(statement):
            return statement
        if isinstance(statement, ast.Try) and any(
                name in _CATCHES_ASSERT for handler in statement.handlers
                for name in _handler_names(handler)):
            statement.handlers = [self._handler(h) for h in statement.handlers]
            statement.orelse = self._statements(statement.orelse)
            statement.finalbody = self._statements(statement.finalbody)
            return statement
        if self.depth == 0:  # module-level code runs at import: no test is running
            return statement
        for field in ("body", "orelse", "finalbody"):
            value = getattr(statement, field, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(statement, field, self._statements(value))
        if isinstance(statement, ast.Try):
            statement.handlers = [self._handler(h) for h in statement.handlers]
        if isinstance(statement, ast.Match):
            for case in statement.cases:
                case.body = self._statements(case.body)
        return statement

    def _handler(self, handler: ast.ExceptHandler) -> ast.ExceptHandler:
        handler.body = self._statements(handler.body)
        return handler


def wrap_checks(tree: ast.Module) -> int:
    """Guard the check statements of every function in ``tree``, in place; how many."""
    wrap = _Wrap()
    for index, statement in enumerate(tree.body):
        tree.body[index] = wrap._compound(statement)
    ast.fix_missing_locations(tree)
    return wrap.wrapped


# -- sites ---------------------------------------------------------------------------------


def site_line(frame: FrameType | None, test_file: str) -> int:
    """The line of the innermost frame running ``test_file`` (the check statement, in the
    test function or a helper of its module), from ``frame`` outwards; 0 when none runs
    it."""
    while frame is not None:
        if frame.f_code.co_filename == test_file:
            return frame.f_lineno
        frame = frame.f_back
    return 0


def failing_site(frames: Sequence[tuple[str, int]], test_file: str) -> int:
    """The site of a failure from its traceback frames ``(path, line)``, outermost first:
    the line of the innermost frame in ``test_file`` (the check that failed, also inside
    a helper of the test module); 0 when no frame is there."""
    return next((line for path, line in reversed(frames)
                 if os.path.abspath(path) == test_file), 0)


# -- the record ----------------------------------------------------------------------------


#: Executions of one site whose outcome is kept in order (a loop of checks).
MAX_OUTCOMES = 64


@dataclass
class SiteCount:
    """What one check site did in one test: guarded statements run and failed there, and
    the outcome of each execution in order (``P`` passed, ``F`` failed), so that one check
    of a loop over outputs can be told from the others."""

    runs: int = 0
    failures: int = 0
    outcomes: str = ""


class CheckLog:
    """Counts the guarded check statements of the running test, by site.

    While not ``enabled`` it records nothing and a failed check is raised as usual:
    the guards stay in the code, inert (a phased child's plain phases)."""

    def __init__(self) -> None:
        self.test_file = ""
        self.sites: dict[int, SiteCount] = {}
        self.enabled = True

    def start(self, test_file: str) -> None:
        self.test_file = test_file
        self.sites = {}

    def run_index(self, line: int) -> int:
        """Which run of the check at ``line`` is running: how many have ended."""
        count = self.sites.get(line)
        return count.runs if count is not None else 0

    def __call__(self, passed: bool) -> bool:
        """Record one check; True: its failure is swallowed (the test goes on)."""
        if not self.enabled:
            return False
        line = site_line(sys._getframe(1), self.test_file)
        count = self.sites.setdefault(line, SiteCount())
        count.runs += 1
        count.failures += not passed
        if len(count.outcomes) < MAX_OUTCOMES:
            count.outcomes += "P" if passed else "F"
        return True


# -- installing reach mode -----------------------------------------------------------------


def guarded_module(path: str | os.PathLike[str] | None, patterns: Sequence[str],
                   root: str) -> bool:
    """A test module under ``root`` (``python_files``, not a conftest): the modules reach
    mode rewrites with their checks guarded."""
    if not path:
        return False
    path = os.path.abspath(path)
    name = os.path.basename(path)
    return (path.startswith(os.path.join(root, "")) and name != "conftest.py"
            and any(fnmatch.fnmatch(name, pattern) for pattern in patterns))


def reach_rewrite(patterns: Sequence[str], root: str, transformed: set[str]
                  ) -> Callable[..., Any]:
    """pytest's ``rewrite_asserts``, guarding check statements first in test modules
    under ``root`` (their paths are added to ``transformed``)."""
    from _pytest.assertion import rewrite

    original = rewrite.rewrite_asserts

    def rewrite_asserts(mod: ast.Module, source: bytes, module_path: str | None = None,
                        config: Any = None) -> None:
        if guarded_module(module_path, patterns, root):
            wrap_checks(mod)
            transformed.add(os.path.abspath(str(module_path)))
        original(mod, source, module_path, config)

    rewrite_asserts.__wrapped__ = original  # type: ignore[attr-defined]
    return rewrite_asserts


class ReachMode:
    """Reach mode on for this process: guarded test modules, and the log they call."""

    def __init__(self, patterns: Sequence[str], root: str) -> None:
        self.log = CheckLog()
        self.patterns = tuple(patterns) or ("test_*.py", "*_test.py")
        self.root = root
        #: Test files whose checks are guarded (pytest's ``--assert=plain`` rewrites none).
        self.transformed: set[str] = set()
        self._saved: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        """Rewrite test modules with their checks guarded: for them pytest's rewriter is
        not shared through the rerun server's cache (which holds plain rewrites) and never
        read from a pyc; every other module keeps both."""
        from _pytest.assertion import rewrite

        shared = rewrite._rewrite_test
        plain = getattr(shared, "rewrite", shared)
        read_pyc = rewrite._read_pyc

        def rewrite_test(fn: Any, config: Any) -> Any:
            guarded = guarded_module(fn, self.patterns, self.root)
            return (plain if guarded else shared)(fn, config)

        def read(source: Any, pyc: Any, *args: Any, **kwargs: Any) -> Any:
            if guarded_module(source, self.patterns, self.root):
                return None
            return read_pyc(source, pyc, *args, **kwargs)

        for owner, name, value in (
            (rewrite, "rewrite_asserts", reach_rewrite(self.patterns, self.root,
                                                       self.transformed)),
            (rewrite, "_rewrite_test", rewrite_test),
            (rewrite, "_read_pyc", read),
            (builtins, RECORDER, self.log),
        ):
            self._saved.append((owner, name, getattr(owner, name, None)))
            setattr(owner, name, value)

    def uninstall(self) -> None:
        for owner, name, value in reversed(self._saved):
            if value is None and owner is builtins:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        self._saved = []
