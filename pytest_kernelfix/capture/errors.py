"""What went wrong in a test, as plain data that survives xdist and subprocesses.

The Triton interpreter wraps every kernel error in ``InterpreterError(repr(e))`` and
the compiler in ``CompilationError``; the useful exception and the kernel line sit in
``__cause__``. :func:`describe_exception` walks that chain once so every later stage
(grouping, prompts, reports) sees the real error and its frames.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Sequence
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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Frame:
        return cls(str(data["path"]), int(data["lineno"]), str(data["name"]), str(data["line"]))


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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ErrorInfo:
        frames = tuple(Frame.from_json(item) for item in data.get("frames", ()))
        return cls(str(data["type"]), str(data["message"]), frames)


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


# -- the error log a model reads ----------------------------------------------------------

#: Traceback entries that are machinery, not code to fix: the Triton interpreter and
#: launcher internals, and this plugin's own wrappers (its launch recorder, its shim).
INTERNAL_PATHS = re.compile(
    r"(^|/)triton/runtime/(interpreter|jit|autotuner)\.py$|(^|/)pytest_kernelfix/"
)
_SEP = re.compile(r"^(_ ){3,}_?\s*$")
_CHAIN = (
    "The above exception was the direct cause of the following exception:",
    "During handling of the above exception, another exception occurred:",
)
_SHORT = re.compile(r"^(?P<path>\S.*?):(?P<line>\d+): in (?P<func>\S+)\s*$")
_LOCATION = re.compile(r"^(?P<path>\S.*?\.py):(?P<line>\d+):(?: (?P<what>.*))?$")
_NATIVE = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_OBJECT_ARG = re.compile(r"^\w+ = <.* at 0x[0-9a-fA-F]+>(, \w+ = .*)?$")
_SITE_PACKAGES = re.compile(r"(?<![\w.-])/\S*?/(site-packages|dist-packages)/")
_RERUN_ALIAS = re.compile(r"(?<![\w.-])/\S*?/kernelfix-rerun-[\w-]+/imports/")


def relative_paths(text: str, roots: Sequence[str]) -> str:
    """``text`` with every root prefix (``/abs/root/``) removed and installed packages
    shown from their ``site-packages/`` directory on."""
    for root in sorted({r.rstrip("/") for r in roots if r and r.strip("/")}, key=len,
                       reverse=True):
        text = text.replace(root + "/", "")
    text = _RERUN_ALIAS.sub("", text)
    return _SITE_PACKAGES.sub(lambda m: m.group(1) + "/", text)


def _internal(path: str) -> bool:
    return bool(INTERNAL_PATHS.search(path.replace("\\", "/")))


def _entries(block: list[str]) -> list[tuple[str, list[str]]]:
    """A block between separators as (path, lines) entries: native ``File "path"``
    entries (each with its indented code lines), short ``path:N: in f`` entries, or one
    long entry located by its last ``path:N: Error`` line (path "" when it has none)."""
    entries: list[tuple[str, list[str]]] = []
    if any(_NATIVE.match(line) for line in block):
        for line in block:
            start = _NATIVE.match(line)
            if start:
                entries.append((start.group("path"), [line]))
            elif entries and entries[-1][0] and line.startswith("    "):
                entries[-1][1].append(line)
            else:
                entries.append(("", [line]))
        return entries
    first = next((line for line in block if line.strip()), "")
    if _SHORT.match(first):
        for line in block:
            start = _SHORT.match(line)
            if start or not entries:
                entries.append((start.group("path") if start else "", [line]))
            else:
                entries[-1][1].append(line)
        return entries
    location = next((m for line in reversed(block) if (m := _LOCATION.match(line))), None)
    return [(location.group("path") if location else "", block)]


def _error_lines(lines: list[str]) -> list[str]:
    errors = [line for line in lines if line.startswith("E ")]
    if not errors:
        return []
    head = re.sub(r"^E\s+", "E   ", errors[0])
    return [head if len(head) <= 300 else head[:300] + " ..."]


def clean_log(text: str, roots: Sequence[str] = ()) -> str:
    """A pytest failure log as the model should read it.

    Paths are made rootdir-relative; traceback entries of the Triton interpreter, the
    launcher and this plugin are dropped (the error line a dropped last entry carried is
    kept, shortened: it is the wrapper's ``InterpreterError``, which repeats the cause
    shown above); a chained section identical to an earlier one is left out.
    """
    lines = relative_paths(text, roots).splitlines()
    sections: list[list[str]] = [[]]
    chains: list[str] = []
    for line in lines:
        if line.strip() in _CHAIN:
            chains.append(line.strip())
            sections.append([])
        else:
            sections[-1].append(line)
    cleaned: list[list[str]] = []
    for section in sections:
        blocks: list[list[str]] = [[]]
        for line in section:
            if _SEP.match(line):
                blocks.append([])
            else:
                blocks[-1].append(line)
        kept_blocks: list[list[str]] = []
        for number, block in enumerate(blocks):
            last_block = number == len(blocks) - 1
            kept: list[str] = []
            entries = _entries(block)
            for position, (path, entry) in enumerate(entries):
                if path and _internal(path):
                    if last_block and position == len(entries) - 1:
                        kept += _error_lines(entry)
                    continue
                kept += [line for line in entry if not _OBJECT_ARG.match(line)]
            if any(line.strip() for line in kept):
                kept_blocks.append(kept)
        body: list[str] = []
        for number, block in enumerate(kept_blocks):
            if number:
                body.append("_ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _ _")
            body += block
        while body and not body[0].strip():
            body.pop(0)
        while body and not body[-1].strip():
            body.pop()
        cleaned.append(body)
    out: list[str] = []
    seen: list[list[str]] = []
    for number, body in enumerate(cleaned):
        if number and (not any(line.strip() for line in body) or body in seen):
            continue
        if number:
            out += ["", chains[number - 1], ""]
        out += body
        seen.append(body)
    return "\n".join(out).strip("\n")


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
