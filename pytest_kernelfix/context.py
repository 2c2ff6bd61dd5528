"""What a fixer gets to see about one bug: editable sources, tests, the error log."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pytest_kernelfix.failure import ErrorInfo
from pytest_kernelfix.grouping import BugGroup
from pytest_kernelfix.project import Project
from pytest_kernelfix.redact import redact


@dataclass(frozen=True)
class SourceFile:
    """A file of the project: ``path`` is relative to the rootdir, with ``/``."""

    path: str
    text: str


@dataclass(frozen=True)
class BugContext:
    """One bug as a fixer sees it.

    ``editable`` are the only files edits may target; ``tests`` are read-only context.
    Both are views for a prompt (redacted); the healing loop edits the real bytes.
    ``error_log`` is already cut (head + tail) and redacted. ``checks`` say in words how a
    candidate will be verified (interpreter run, GPU compile gate) so a prompt can tell
    the model what the checks can and cannot see.
    """

    group_id: str
    nodeids: tuple[str, ...]
    error: ErrorInfo
    error_log: str
    editable: tuple[SourceFile, ...]
    tests: tuple[SourceFile, ...] = ()
    kernel_lines: tuple[str, ...] = ()
    device: str = "interpret"
    checks: tuple[str, ...] = ()


_HEAD_LINES = 40
_TAIL_LINES = 100
_MAX_LINE = 400
_MAX_LOG_CHARS = 16_000
_MAX_SOURCE_CHARS = 60_000


def truncate_log(
    text: str,
    *,
    head: int = _HEAD_LINES,
    tail: int = _TAIL_LINES,
    max_chars: int = _MAX_LOG_CHARS,
) -> str:
    """Keep the start and the end of a log (where the test and the exception are).

    Very long lines (a tensor dump) are shortened too, so one line cannot eat the budget.
    """
    lines = [
        line if len(line) <= _MAX_LINE else line[:_MAX_LINE] + " ...[line cut]"
        for line in text.splitlines()
    ]
    if len(lines) > head + tail:
        cut = len(lines) - head - tail
        lines = [*lines[:head], f"... [{cut} lines cut] ...", *lines[-tail:]]
    result = "\n".join(lines)
    if len(result) > max_chars:
        keep = max_chars // 2
        result = f"{result[:keep]}\n... [{len(result) - 2 * keep} characters cut] ...\n" + (
            result[-keep:]
        )
    return result


def kernel_lines(error: ErrorInfo, project: Project, editable: tuple[str, ...]) -> tuple[str, ...]:
    """Traceback lines inside editable files, closest to the fault last."""
    lines = []
    for frame in error.frames:
        if not project.contains(frame.path):
            continue
        rel = project.relative(frame.path)
        if rel in editable:
            lines.append(f"{rel}:{frame.lineno} in {frame.name}: {frame.line}".rstrip(": "))
    return tuple(dict.fromkeys(lines))


def error_report(group: BugGroup, project: Project) -> str:
    """The error a fixer sees first: the real exception, its kernel line, then the log.

    The interpreter wraps kernel errors in ``InterpreterError``; the real exception and
    its kernel line are stated up front so they are not lost in a cut log.
    """
    failure = group.first
    others = len(group.failures) - 1
    parts = [f"Test: {failure.nodeid}" + (f" (and {others} more with the same error)"
                                         if others else "")]
    parts.append(f"Error: {failure.error.headline}")
    located = kernel_lines(failure.error, project, group.editable)
    if located:
        parts.append(f"Raised at: {located[-1]}")
    parts.append("")
    parts.append(truncate_log(failure.longrepr))
    return "\n".join(parts)


def read_source(path: Path) -> str:
    """A project file as text (undecodable bytes replaced, huge files cut)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if len(text) > _MAX_SOURCE_CHARS:
        text = text[:_MAX_SOURCE_CHARS] + "\n# ... [file cut] ...\n"
    return text


def build_context(
    group: BugGroup,
    project: Project,
    *,
    device: str,
    checks: tuple[str, ...] = (),
    environ: Mapping[str, str] | None = None,
) -> BugContext:
    """Everything a fixer may see about ``group``, redacted."""
    editable = tuple(
        SourceFile(rel, redact(read_source(project.root / rel), environ))
        for rel in group.editable
    )
    test_paths = dict.fromkeys(failure.test_path for failure in group.failures if failure.test_path)
    tests = tuple(
        SourceFile(project.display(path), redact(read_source(Path(path)), environ))
        for path in test_paths
        if os.path.isfile(path)
    )
    error = ErrorInfo(
        group.first.error.type,
        redact(group.first.error.message, environ),
        group.first.error.frames,
    )
    return BugContext(
        group_id=group.id,
        nodeids=group.nodeids,
        error=error,
        error_log=redact(error_report(group, project), environ),
        editable=editable,
        tests=tests,
        kernel_lines=tuple(redact(line, environ) for line in
                           kernel_lines(group.first.error, project, group.editable)),
        device=device,
        checks=checks,
    )

