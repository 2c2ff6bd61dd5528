"""Whether an edited Python file still parses, checked on the statements around the edit.

A whole 3,000-line module costs ~20 ms to parse and one kernel ~1 ms, so the check first
parses the innermost indented ``def``/``class`` around the edit, then the top-level
statements around it (widened step by step), and the whole file only when those chunks
cannot tell a broken edit from chunk borders that were not statement borders.
"""

from __future__ import annotations

import ast
import re
from bisect import bisect_left
from collections.abc import Callable, Sequence
from functools import lru_cache

from pytest_kernelfix.engine.indent import indent_of
from pytest_kernelfix.engine.match import text_view
from pytest_kernelfix.engine.replacement import Edit

_WIDEN = 3
_CONTINUATION = re.compile(r"(else|elif|except|finally)\b|[)\]}#]")


def is_python(path: str, code: str) -> bool:
    if path:
        return path.endswith((".py", ".pyi"))
    return bool(code.strip()) and not syntax_error(code)


def syntax_error(text: str, first_line: int = 0) -> str:
    """'' when the text parses, else the error and its line (``first_line`` + its own)."""
    try:
        ast.parse(text)
    except SyntaxError as exc:
        return f"{exc.msg} at line {first_line + (exc.lineno or 1)}"
    except (ValueError, RecursionError, MemoryError) as exc:
        return str(exc) or type(exc).__name__
    return ""


def syntax_problem(
    before: str, after: str, edits: Sequence[Edit], whole_parses: Callable[[], bool]
) -> str:
    """Why ``after`` (``before`` with ``edits`` applied) no longer parses, or ''.

    '' also when the text did not parse before the edit: ``whole_parses`` says whether
    ``before`` parses as a whole, asked only when the chunks cannot tell. An error found
    in a chunk is reported at its line in the file, without parsing the whole file.
    """
    if not edits:
        return ""

    def error_after(lo: int, hi: int, depth: int = 0) -> str | None:
        """The error of ``after`` between the moved borders; None when it cannot say."""
        start, stop = moved(lo, edits), moved(hi, edits)
        piece = _dedent(after[start:stop], depth) if depth else after[start:stop]
        return None if piece is None else syntax_error(piece, after.count("\n", 0, start))

    nested = _nested_chunk(before, edits[0].start, edits[-1].end)
    if nested is not None:
        lo, hi, depth = nested
        problem = error_after(lo, hi, depth)
        if problem == "":
            return ""
        old = _dedent(before[lo:hi], depth)
        if old is not None and not syntax_error(old):
            return problem or syntax_error(after)  # it parsed before the edit: it stands
    for widen in range(_WIDEN):
        chunks = _merged([_chunk(before, e.start, e.end, widen) for e in edits])
        failing = [(lo, hi, problem) for lo, hi in chunks if (problem := error_after(lo, hi))]
        if not failing:
            return ""
        if not any(syntax_error(before[lo:hi]) for lo, hi, _ in failing):
            return str(failing[0][2])  # they parsed before the edit: the error stands
    return syntax_error(after) if whole_parses() else ""


def clear_caches() -> None:
    """Forget the per-text quote tables (benchmarks measure cold calls)."""
    _triple_quotes.cache_clear()


def _chunk(before: str, start: int, end: int, widen: int = 0) -> tuple[int, int]:
    """Offsets of the top-level statements around ``before[start:end]``.

    Both borders lie in text an edit of that span leaves alone, so the same offsets (the
    end shifted by the change in length) frame the chunk after the edit. ``widen`` takes
    that many more statements on each side. A border that falls inside a triple-quoted
    string (an odd number of its quotes before it) moves out of the string first.
    """
    view = text_view(before)
    lines = view.raw
    head, tail = view.line_of(start), view.line_of(end) + 1
    for step in range(widen + 1):
        if step:
            head, tail = max(0, head - 1), tail + 1
        while True:
            while head > 0 and not _starts_statement(lines, head):
                head -= 1
            opening = _string_opening(before, view.starts[head])
            if opening < 0:
                break
            head = view.line_of(opening)
        while True:
            while tail < len(lines) and not _starts_statement(lines, tail):
                tail += 1
            if tail >= len(lines) or _string_opening(before, view.starts[tail]) < 0:
                break
            tail += 1
    hi = view.starts[tail] if tail < len(lines) else len(before)
    return view.starts[head], hi


def _nested_chunk(before: str, start: int, end: int) -> tuple[int, int, int] | None:
    """The innermost indented ``def``/``class`` around an edit: (start, end, indentation).

    A method of a large class parses in a fraction of the time the class takes. None
    when the edit sits in no indented definition.
    """
    view = text_view(before)
    lines = view.raw
    first, last = view.line_of(start), view.line_of(max(start, end - 1))
    limit = min((_depth(line) for line in lines[first : last + 1] if line.strip()), default=0)
    head = first - 1
    while head >= 0 and limit > 0:
        line = lines[head]
        if line.strip() and not line.lstrip().startswith("#") and _depth(line) < limit:
            if _DEFINITION.match(line):
                break
            limit = _depth(line)
        head -= 1
    else:
        return None
    depth = _depth(lines[head])
    if depth == 0:
        return None
    while head > 0 and lines[head - 1].startswith(" " * depth + "@"):
        head -= 1
    tail = last + 1
    while tail < len(lines) and not _closes(lines[tail], depth):
        tail += 1
    hi = view.starts[tail] if tail < len(lines) else len(before)
    return view.starts[head], hi, depth


_DEFINITION = re.compile(r"\s*(async\s+def|def|class)\b")


def _depth(line: str) -> int:
    return len(indent_of(line))


def _closes(line: str, depth: int) -> bool:
    """A line that ends a block indented deeper than ``depth``."""
    body = line.strip()
    return bool(body) and _depth(line) <= depth and not _CONTINUATION.match(body)


def _dedent(text: str, depth: int) -> str | None:
    """Text moved ``depth`` columns left, or None when a line sits left of that."""
    out = []
    for line in text.split("\n"):
        if line[:depth].strip(" \t\r"):
            return None
        out.append(line[depth:])
    return "\n".join(out)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted spans with overlapping ones joined."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo < out[-1][1]:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return out


def moved(offset: int, edits: Sequence[Edit]) -> int:
    """Where an offset outside every edit lands once the edits are applied."""
    return offset + sum(len(e.replacement) - (e.end - e.start) for e in edits if e.end <= offset)


def _string_opening(text: str, offset: int) -> int:
    """Where the triple-quoted string around ``offset`` opens, or -1 when outside one.

    A quote count, blind to quotes inside other strings and comments: good enough to
    choose borders, which are verified by parsing anyway.
    """
    for quotes in _triple_quotes(text):
        before = bisect_left(quotes, offset)
        if before % 2:
            return quotes[before - 1]
    return -1


@lru_cache(maxsize=8)
def _triple_quotes(text: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(m.start() for m in re.finditer(re.escape(q), text)) for q in ('"""', "'''"))


def _starts_statement(lines: Sequence[str], index: int) -> bool:
    """A column-0 line that begins a statement: not a continuation, not a decorated def."""
    if not _top_level(lines[index]):
        return False
    above = index - 1
    while above >= 0 and not _top_level(lines[above]):
        above -= 1
    return above < 0 or not lines[above].startswith("@")


def _top_level(line: str) -> bool:
    return bool(line) and not line[0].isspace() and not _CONTINUATION.match(line)

