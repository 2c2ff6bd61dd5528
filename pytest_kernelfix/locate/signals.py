"""What a failure says about where its fault is, besides its frames and launches.

Three readings of one failure, from its error, its traceback and the test's own source:

- **gradients**: the test computes or compares gradients (``.backward()``,
  ``torch.autograd.grad``, ``.grad``) or the autograd engine raised ("function
  XBackward returned an incorrect number of gradients"). Then the autograd Function's
  ``backward`` matters as much as its ``forward``, whichever launched what.
- **a check of gradients**: the check that failed is the innermost test-side frame (a
  helper of the test module, a conftest, a test utility module), read outward to the
  test module's own line; it compares gradients when that text names one, or when
  autograd raised. A bug whose failing check reads gradients is named after the kernel
  launched from ``backward``.
- **an expected exception**: the test expected an exception that never came ("DID NOT
  RAISE", "Should have thrown an error"): the check that is missing may be in any
  project function on the way to the launch.

Pure functions over a :class:`~pytest_kernelfix.capture.records.Failure` and the test
module's text, read once per content (:func:`~.outline.parse_module` caches it).
"""

from __future__ import annotations

import ast
import functools
import os
import re
from pathlib import Path

from pytest_kernelfix.capture.errors import Frame
from pytest_kernelfix.capture.records import Failure
from pytest_kernelfix.locate.outline import Definition, ModuleIndex, parse_module
from pytest_kernelfix.locate.reach import nodeid_qualname
from pytest_kernelfix.project import Project

#: Test code that computes or compares gradients.
GRADIENT_CODE = re.compile(r"\.backward\s*\(|autograd\.grad\s*\(|\.grad\b|\bgradcheck\b")
#: A failing check's text that names a gradient (``x.grad``, ``dx``, ``grad_w``, ``dW``).
GRADIENT_WORDS = re.compile(r"\.grad\b|\bgrad(s|ients?)?\b|\bgrad_\w+|\w+_grad\b"
                            r"|\bd(?!t\b)(?:[a-zA-Z]|input|weight|bias|logits)(?:_\w+)?\b")
#: An assignment of a gradient (``got = torch.autograd.grad(...)``, ``gx = x.grad``):
#: the names it binds are gradients too.
GRADIENT_ASSIGNMENT = re.compile(
    r"^\s*([\w\s,()\[\]]+?)\s*=\s*[^=].*(?:autograd\.grad\s*\(|\.grad\b)", re.M)
#: Errors the autograd engine raises about a Function's ``backward``.
AUTOGRAD_ERROR = re.compile(
    r"incorrect number of gradients|returned an invalid gradient|Backward\d*\b"
    r"|does not require grad|grad_fn|the graph a second time|modified by an inplace operation")
#: A test that expected an exception and did not get it.
NO_RAISE = re.compile(r"DID NOT RAISE|DID NOT WARN|[Ss]hould (have )?(raised?|thrown|throw|"
                      r"failed|errored)|[Ee]xpected (an? )?(exception|error) (to be raised|was "
                      r"not raised)|did not raise")
#: Module-level helpers of the test module followed from the test function, at most.
_HELPER_DEPTH = 2


#: The engine's rejection of what a Function's ``backward`` returned, naming the Function.
RETURNED_BY = re.compile(r"function (\w+?)Backward\d* returned an (?:incorrect number of "
                         r"gradients|invalid gradient)")


def returned_by(failure: Failure) -> str:
    """The autograd Function whose ``backward`` returned gradients the engine rejected
    ("function XBackward returned an incorrect number of gradients": ``X``), else ``""``."""
    match = RETURNED_BY.search(failure.error.headline)
    return match.group(1) if match else ""


def _autograd_raised(failure: Failure) -> bool:
    error = failure.error
    if AUTOGRAD_ERROR.search(error.headline):
        return True
    return any(f"{os.sep}autograd{os.sep}" in frame.path for frame in error.frames[-3:])


def test_source(failure: Failure) -> str:
    """The failing test function's text and that of the test module's functions it calls
    (two calls deep): what the test itself does."""
    path = failure.test_path
    try:
        stamp = os.stat(path).st_mtime_ns if path else 0
    except OSError:
        return ""
    return _test_source(path, nodeid_qualname(failure.nodeid), stamp) if stamp else ""


@functools.lru_cache(maxsize=256)
def _test_source(path: str, name: str, stamp: int) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    index = parse_module(text)
    test = index.find(name)
    if test is None:
        return ""
    lines = text.splitlines()
    chosen = _helpers(index, test)
    return "\n".join("\n".join(lines[d.start - 1:d.end]) for d in chosen)


def _helpers(index: ModuleIndex, test: Definition) -> list[Definition]:
    chosen = [test]
    frontier = [test]
    for _ in range(_HELPER_DEPTH):
        found = []
        for definition in frontier:
            for used in definition.names:
                helper = index.find(used.split(".")[0])
                if helper is not None and helper.kind == "function" and helper not in chosen:
                    chosen.append(helper)
                    found.append(helper)
        frontier = found
    return chosen


def involves_gradients(failure: Failure, source: str | None = None) -> bool:
    """The test computes or compares gradients, a launch ran in a ``backward``, or the
    autograd engine raised."""
    if _autograd_raised(failure):
        return True
    if any(name == "backward" for launch in failure.launches for _, _, name in launch.sites):
        return True
    return bool(GRADIENT_CODE.search(test_source(failure) if source is None else source))


def expects_raise(failure: Failure) -> bool:
    """The test expected an exception that did not come: its message says so, or the
    test failed inside a block that expects one (``with pytest.raises(...)``, or a
    ``try`` whose body fails the test when nothing is raised)."""
    if NO_RAISE.search(failure.error.message) or "DID NOT RAISE" in failure.longrepr:
        return True
    path = failure.test_path
    lines = [frame.lineno for frame in failure.error.frames
             if path and os.path.abspath(frame.path) == os.path.abspath(path)]
    if not lines:
        return False
    try:
        stamp = os.stat(path).st_mtime_ns
    except OSError:
        return False
    return any(start <= line <= end for start, end in _expecting(path, stamp)
               for line in lines)


#: Context managers that expect their body to raise (or warn).
_EXPECTING = frozenset({"raises", "assertRaises", "assertRaisesRegex", "warns"})


def _fails(node: ast.stmt) -> bool:
    """``assert False``, ``pytest.fail(...)``, ``self.fail(...)``, ``raise AssertionError``."""
    if isinstance(node, ast.Assert):
        return isinstance(node.test, ast.Constant) and not node.test.value
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func
        return isinstance(func, ast.Attribute) and func.attr == "fail"
    if isinstance(node, ast.Raise) and node.exc is not None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        return isinstance(exc, ast.Name) and exc.id == "AssertionError"
    return False


@functools.lru_cache(maxsize=64)
def _expecting(path: str, stamp: int) -> tuple[tuple[int, int], ...]:
    """The line spans of the blocks of a test module that expect an exception."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return ()
    spans = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                call = item.context_expr
                func = call.func if isinstance(call, ast.Call) else call
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if name in _EXPECTING:
                    spans.append((node.lineno, node.end_lineno or node.lineno))
        elif isinstance(node, ast.Try) and any(_fails(statement) for statement in node.body):
            spans.append((node.lineno, node.end_lineno or node.lineno))
    return tuple(spans)


def check_frames(failure: Failure, project: Project) -> tuple[Frame, ...]:
    """The frames of the check that failed, innermost first: the innermost test-side frame
    (the test module, a conftest, a test utility module) and those outward of it up to
    and including the first in the test module itself. An assertion helper the project
    keeps beside its code (``fla/utils/_testing.py``'s ``assert_close``) is part of the
    check when the test calls it as a check: a statement of its own that raised an
    AssertionError."""
    frames: list[Frame] = []
    test = os.path.abspath(failure.test_path) if failure.test_path else ""
    inside = False
    everything = failure.error.frames
    for position in range(len(everything) - 1, -1, -1):
        frame = everything[position]
        path = os.path.abspath(frame.path)
        test_side = path == test or (project.contains(path) and not project.in_environment(path)
                                     and project.is_test_file(project.relative(path)))
        if not test_side and not inside and position and _asserting_helper(
                failure, frame, everything[position - 1], project):
            frames.append(frame)
            continue
        if not test_side:
            if inside:
                break  # out of the test code again: a fixture or a plugin called it
            continue
        inside = True
        frames.append(frame)
        if path == test:
            break
    return tuple(frames)


def _asserting_helper(failure: Failure, frame: Frame, caller: Frame, project: Project) -> bool:
    """``frame`` is a project function that raised an AssertionError, called by the test's
    code as a statement of its own (``assert_close('dk', ref, tri, 0.005)``)."""
    if failure.error.type != "AssertionError" or not project.is_source(frame.path):
        return False
    caller_path = os.path.abspath(caller.path)
    if caller_path != os.path.abspath(failure.test_path) and not (
            project.contains(caller_path) and project.is_test_file(project.relative(caller_path))):
        return False
    return bool(re.match(rf"(?:[\w.]+\.)?{re.escape(frame.name)}\s*\(", caller.line))


def checks_gradients(failure: Failure, project: Project, source: str | None = None) -> bool:
    """The check that failed compares gradients (its text names one, or a name the test
    bound to one), or the autograd engine raised."""
    if _autograd_raised(failure):
        return True
    frames = check_frames(failure, project)
    if any(GRADIENT_WORDS.search(frame.line) for frame in frames):
        return True
    text = test_source(failure) if source is None else source
    bound = {name for match in GRADIENT_ASSIGNMENT.finditer(text)
             for name in re.findall(r"\w+", match.group(1))}
    return any(name in bound for frame in frames for name in re.findall(r"\w+", frame.line))
