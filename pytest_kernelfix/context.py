"""What a fixer gets to see about one bug: editable sources, tests, the error log."""

from __future__ import annotations

from dataclasses import dataclass

from pytest_kernelfix.failure import ErrorInfo


@dataclass(frozen=True)
class SourceFile:
    """A file of the project: ``path`` is relative to the rootdir, with ``/``."""

    path: str
    text: str


@dataclass(frozen=True)
class BugContext:
    """One bug as a fixer sees it.

    ``editable`` are the only files edits may target; ``tests`` are read-only context.
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
