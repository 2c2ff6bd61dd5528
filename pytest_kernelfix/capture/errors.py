"""What went wrong in a test, as plain data that survives xdist and subprocesses.

The Triton interpreter wraps every kernel error in ``InterpreterError(repr(e))`` and
the compiler in ``CompilationError``; the useful exception and the kernel line sit in
``__cause__``. :func:`describe_exception` walks that chain once so every later stage
(grouping, prompts, reports) sees the real error and its frames. What crossed a process
as JSON is read back by :func:`pytest_kernelfix.fields.read`.
"""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Any

#: Exception types that only wrap the real error raised inside a kernel.
WRAPPER_TYPES = frozenset({"InterpreterError", "CompilationError", "TritonError"})

_MAX_CHAIN = 8


@dataclass(frozen=True)
class Frame:
    """One traceback entry: ``path`` is absolute, ``lineno`` 1-based."""

    path: str
    lineno: int
    name: str
    line: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "lineno": self.lineno, "name": self.name, "line": self.line}


@dataclass(frozen=True)
class ErrorInfo:
    """The real error behind a failure.

    ``type`` and ``message`` describe the innermost cause (an ``InterpreterError`` is
    unwrapped); ``frames`` run outermost first through the whole ``__cause__`` chain, so
    the last frames are the ones closest to the fault (usually the kernel line).
    """

    type: str
    message: str
    frames: tuple[Frame, ...] = ()

    @property
    def headline(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return f"{self.type}: {first}" if first else self.type

    def signature(self) -> str:
        """The error with numbers, addresses and quoted values normalised.

        Parametrized tests fail with messages that differ only in shapes and counts
        ("Mismatched elements: 12 / 1000"); those are one bug.
        """
        text = self.headline
        text = re.sub(r"0x[0-9a-fA-F]+", "<addr>", text)
        text = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "<n>", text)
        return re.sub(r"\s+", " ", text).strip()

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "message": self.message,
            "frames": [frame.to_json() for frame in self.frames],
        }


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` followed by its explicit causes (``raise ... from``), outermost first."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < _MAX_CHAIN:
        chain.append(current)
        current = current.__cause__
    return chain


def _frames_of(tb: TracebackType | None) -> list[Frame]:
    return [
        Frame(summary.filename, summary.lineno or 0, summary.name, (summary.line or "").strip())
        for summary in traceback.extract_tb(tb)
    ]


def _compilation_frame(exc: BaseException, tb: TracebackType | None) -> Frame | None:
    """The kernel line of a ``CompilationError``, whose message counts from the ``def``.

    The compiler reports ``at L:C:`` relative to the function; the ``JITFunction`` being
    compiled sits in a traceback frame's locals and knows where its ``def`` is.
    """
    node = getattr(exc, "node", None)
    relative = getattr(node, "lineno", None)
    if not isinstance(relative, int):
        return None
    for frame, _ in traceback.walk_tb(tb):
        for value in frame.f_locals.values():
            file_name = getattr(value, "file_name", None)
            def_line = getattr(value, "def_file_line_number", None)
            if isinstance(file_name, str) and isinstance(def_line, int):
                lineno = def_line + relative - 1
                name = getattr(getattr(value, "fn", None), "__name__", "<kernel>")
                line = _source_line(file_name, lineno)
                return Frame(file_name, lineno, name, line)
    return None


def _source_line(path: str, lineno: int) -> str:
    import linecache

    return linecache.getline(path, lineno).strip()


def describe_exception(exc: BaseException) -> ErrorInfo:
    """Turn a raised exception into an :class:`ErrorInfo` (pure data, no references kept)."""
    chain = exception_chain(exc)
    frames: list[Frame] = []
    for link in chain:
        frames.extend(_frames_of(link.__traceback__))
        if hasattr(link, "node") and hasattr(link, "src"):  # a Triton CompilationError
            kernel_frame = _compilation_frame(link, link.__traceback__)
            if kernel_frame is not None:
                frames.append(kernel_frame)
    real = chain[-1]
    for link in reversed(chain):
        if type(link).__name__ not in WRAPPER_TYPES:
            real = link
            break
    message = str(real)
    detail = getattr(real, "error_message", None)
    if type(real).__name__ in WRAPPER_TYPES and isinstance(detail, str) and detail.strip():
        # A CompilationError's text starts "at L:C:" and the source; its own words, the
        # error the compiler met, come first so that the headline names the real problem.
        message = f"{detail.strip()}\n{message}"
    if type(real).__name__ in WRAPPER_TYPES and not message:
        message = repr(real)
    return ErrorInfo(type(real).__name__, message, tuple(frames))


_FATAL = re.compile(r"Fatal Python error: (?P<what>.+)$", re.M)
_FAULT_FRAME = re.compile(r'^\s+File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')


def crash_dump(output: str) -> tuple[str, tuple[Frame, ...]]:
    """The faulthandler dump in a crashed process's output: its text (the ``Fatal
    Python error`` line and the crashing thread's stack) and that stack's frames,
    outermost first (faulthandler writes the most recent call first)."""
    fatal = _FATAL.search(output)
    if fatal is None:
        return "", ()
    blocks: list[list[str]] = [[]]
    for line in output[fatal.end():].splitlines():
        if line.strip():
            blocks[-1].append(line)
        elif blocks[-1]:
            blocks.append([])
    stacks = [block for block in blocks if any(_FAULT_FRAME.match(line) for line in block)]
    current = next((block for block in stacks if block[0].startswith("Current thread")),
                   stacks[0] if stacks else [])
    frames = []
    for line in current:
        match = _FAULT_FRAME.match(line)
        if match:
            path, lineno = match.group("path"), int(match.group("line"))
            frames.append(Frame(path, lineno, match.group("func"), _source_line(path, lineno)))
    text = "\n".join([fatal.group(0), "", *current])
    return text, tuple(reversed(frames))
