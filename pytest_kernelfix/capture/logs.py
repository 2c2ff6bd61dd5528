"""Failure logs as a model reads them: relative paths, no machinery frames, cut to size.

A pytest failure log holds absolute paths, the Triton interpreter's and this plugin's own
frames, a wrapped traceback twice and tensor dumps: :func:`clean_log` and
:func:`truncate_log` keep what a fixer needs, within a budget.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

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



_HEAD_LINES = 40
_TAIL_LINES = 100
_MAX_LINE = 400
_MAX_LOG_CHARS = 16_000


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
