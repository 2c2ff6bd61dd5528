"""Apply a model's modifications to one file's text and describe the result as a diff.

The matcher says WHERE; this module decides WHAT lands there: the replacement is moved
to the indentation of the matched lines, written with the file's tabs or spaces and
newline, checked to still parse (Python), refused when it overlaps an earlier edit, and
the whole result becomes a unified diff that ``git apply`` accepts. Every failure is one
self-contained sentence a model can act on in the next round.
"""

from __future__ import annotations

import ast
import difflib
import re
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from pytest_kernelfix.engine.match import (
    LEVELS,
    Ambiguous,
    Match,
    NoMatch,
    Query,
    find_all,
    find_match,
    is_elision,
    line_range,
    line_span,
    text_view,
)
from pytest_kernelfix.engine.parse import Modification, ParsedResponse


@dataclass(frozen=True)
class DiffResult:
    """What applying a list of modifications did.

    ``levels`` has one entry per modification: the match level, ``none`` when it failed
    or ``skipped`` when it changed nothing. ``code`` holds every modification that
    applied, even when others failed; ``success`` means all applied and something changed.
    """

    success: bool
    code: str
    original: str
    diff: str
    applied: int
    levels: tuple[str, ...]
    errors: tuple[str, ...]
    warnings: tuple[str, ...]
    raw_llm_output: str = ""
    path: str = ""


def apply_modifications(
    code: str,
    modifications: Sequence[Modification] | ParsedResponse,
    *,
    path: str = "",
    raw_llm_output: str = "",
    labels: Sequence[str] = (),
) -> DiffResult:
    """Apply ``modifications`` in order, each on the text the previous ones produced.

    Messages name each modification "Modification i of n", or by ``labels[i]`` when a
    caller that split a larger list per file knows a better name ("Edit 4").
    """
    if isinstance(modifications, ParsedResponse):
        raw_llm_output = raw_llm_output or modifications.raw
        modifications = modifications.modifications
    tabs = any(_LEADING_TAB.search(m.old_string + "\n" + m.new_string) for m in modifications)
    state = _State(code, Style.of(code, tabs_to_convert=tabs), _is_python(path, code))
    total = len(modifications)
    for number, modification in enumerate(modifications, 1):
        label = labels[number - 1] if number <= len(labels) else f"Modification {number} of {total}"
        state.apply(modification, label)
    if state.applied == 0 and not state.errors:
        state.warnings.append("No modification changed the code.")
    return DiffResult(
        success=not state.errors and state.applied > 0,
        code=state.text,
        original=code,
        diff=unified_diff(code, state.text, path or "file"),
        applied=state.applied,
        levels=tuple(state.levels),
        errors=tuple(state.errors),
        warnings=tuple(state.warnings),
        raw_llm_output=raw_llm_output,
        path=path,
    )


def clear_caches() -> None:
    """Forget every per-text table, so the next call pays full price (benchmarks)."""
    text_view.cache_clear()
    _triple_quotes.cache_clear()


# --- the file's conventions --------------------------------------------------------------


@dataclass(frozen=True)
class Style:
    """How a file indents and ends its lines; model text is rewritten to match."""

    newline: str = "\n"
    indent: str = " "
    unit: int = 4

    @classmethod
    def of(cls, text: str, *, tabs_to_convert: bool = True) -> Style:
        """The file's style; a space file's level width is measured only when model tabs
        need converting (it costs a pass over every line, the rest is C string counts)."""
        newline = text_view(text).newline
        tabs = "\t" in text and text.count("\n\t") + text.startswith("\t")
        if tabs and tabs > text.count("\n ") + text.startswith(" "):
            return cls(newline, "\t", 4)
        if not tabs_to_convert:
            return cls(newline, " ", 4)
        widths = [len(indent) for indent in _SPACE_INDENT.findall(text, 0, _STYLE_SAMPLE)]
        # Two-space files have many widths that are not a multiple of four; aligned
        # continuation lines are the odd ones out, hence a share rather than all.
        fours = sum(1 for w in widths if w % 4 == 0)
        twos = sum(1 for w in widths if w % 2 == 0)
        unit = 2 if twos - fours > len(widths) // 5 else 4
        return cls(newline, " ", unit)

    def width(self, prefix: str) -> int:
        """Columns of an indentation; a tab counts as one indentation level."""
        return prefix.count("\t") * self.unit + prefix.count(" ")

    def render(self, width: int) -> str:
        if self.indent == "\t":
            return "\t" * (width // self.unit) + " " * (width % self.unit)
        return " " * width

    def fits(self, prefix: str) -> bool:
        """Whether an indentation is already written the way this file writes them."""
        if self.indent == " ":
            return "\t" not in prefix
        spaces = prefix.lstrip("\t")
        return set(spaces) <= {" "} and len(spaces) < self.unit


_SPACE_INDENT = re.compile(r"^( +)(?=\S)", re.M)
_LEADING_TAB = re.compile(r"^ *\t", re.M)
_STYLE_SAMPLE = 1 << 16  # characters enough to see how a file indents


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


# --- one modification --------------------------------------------------------------------


@dataclass(frozen=True)
class _Edit:
    """Replace ``text[start:end]`` with ``replacement``."""

    start: int
    end: int
    replacement: str


class _Failed(Exception):
    """A modification could not be applied; the message is the model-facing reason."""


class _State:
    """The text being edited, the spans already changed, and the running report."""

    def __init__(self, text: str, style: Style, python: bool) -> None:
        self.original = text
        self.text = text
        self.style = style
        self.python = python
        self.parses: bool | None = None
        self.touched: list[tuple[int, int, str]] = []  # changed spans and who changed them
        self.applied = 0
        self.levels: list[str] = []
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def apply(self, modification: Modification, label: str) -> None:
        old = modification.old_string.replace("\r\n", "\n")
        new = modification.new_string.replace("\r\n", "\n")
        if old == new:
            self.levels.append("skipped")
            self.warnings.append(f"{label} was skipped: its new_string equals its old_string.")
            return
        notes: list[str] = []
        try:
            level, edits = self._plan(modification, old, new, notes)
            self._commit(edits, label, notes)
        except _Failed as exc:
            self.levels.append("none")
            self.errors.append(f"{label} (old_string {_preview(old)}) was not applied: {exc}")
            return
        self.levels.append(level)
        self.warnings += [f"{label} {note}" for note in notes]
        self.applied += 1

    def _plan(
        self, modification: Modification, old: str, new: str, notes: list[str]
    ) -> tuple[str, list[tuple[str, list[_Edit]]]]:
        """The match level and the candidate edit lists, best indentation guess first.

        ``notes`` collects what to warn about should the modification apply.
        """
        if not old.strip():
            raise _Failed(
                "old_string is empty; copy the exact lines to replace from the file "
                "(to insert code, replace a neighbouring line with itself plus the new code)."
            )
        matches = self._locate(modification, old)
        unescaped = _unescape(old)
        if unescaped != old and not _confident(matches):
            # A fuzzy hit on text with literal \n is weaker evidence than any hit on the
            # text with real newlines that the model almost surely meant.
            retry = self._locate(modification, unescaped)
            if isinstance(retry, tuple):
                notes.append("had literal \\n in old_string; they were read as newlines.")
                old, new, matches = unescaped, _unescape(new), retry
        if isinstance(matches, (NoMatch, Ambiguous)):
            raise _Failed(matches.message + self._conflict_hint(old))
        self._check_conflicts(matches)
        if not any(is_elision(line) for line in old.split("\n")):
            kept = "\n".join(line for line in new.split("\n") if not _placeholder(line))
            if kept != new:
                notes.append(
                    "had placeholder comments such as '# ... existing code ...' in "
                    "new_string; they were dropped, as old_string elides nothing."
                )
                new = kept
        for match in matches:
            if match.level == "fuzzy":
                notes.append(
                    f"matched {line_range(*line_span(self.text, match))} only fuzzily "
                    f"(similarity {match.score:.2f}); check it changed the intended code."
                )
        guesses: list[tuple[str, list[_Edit]]] = []
        for guess, name in enumerate(_GUESSES):
            edits = [e for m in matches for e in _edits(self.text, m, old, new, self.style, guess)]
            if all(edits != seen for _, seen in guesses):
                guesses.append((name, edits))
        level = max((m.level for m in matches), key=LEVELS.index)
        return level, guesses

    def _locate(
        self, modification: Modification, old: str
    ) -> tuple[Match, ...] | NoMatch | Ambiguous:
        if modification.replace_all:
            return find_all(self.text, old, anchor=modification.anchor)
        found = find_match(self.text, old, anchor=modification.anchor)
        return (found,) if isinstance(found, Match) else found

    def _conflict_hint(self, old: str) -> str:
        """Why a search that fits the original text no longer fits: an earlier edit."""
        if not self.touched or self.text == self.original:
            return ""
        found = find_match(self.original, old)
        if not isinstance(found, Match):
            return ""
        lines = line_range(*line_span(self.original, found))
        return (
            f" It does match the original text at {lines}, which an earlier modification "
            "in this list already changed (a conflict): merge the two into one modification."
        )

    def _check_conflicts(self, matches: tuple[Match, ...]) -> None:
        for match in matches:
            for start, end, owner in self.touched:
                inside = start < match.end and match.start < end
                if inside or (start == end and match.start < start < match.end):
                    lines = line_range(*line_span(self.text, match))
                    raise _Failed(
                        f"it conflicts with {owner}: it targets {lines}, text that one "
                        "already changed; merge the two into one modification."
                    )

    def _commit(self, guesses: list[tuple[str, list[_Edit]]], label: str, notes: list[str]) -> None:
        problem = ""
        for attempt, (name, edits) in enumerate(guesses):
            text, regions = _splice(self.text, edits)
            problem = self._syntax_problem(text, edits)
            if not problem:
                if attempt:
                    notes.append(
                        f"was re-indented into code that did not parse; it was applied with "
                        f"{name} instead."
                    )
                self._shift_touched(edits)
                self.touched += [(start, end, label) for start, end in regions]
                self.text = text
                return
        tried = "; ".join(name for name, _ in guesses) if len(guesses) > 1 else "as is"
        raise _Failed(
            f"the result would not parse as Python ({problem}); indentations tried: {tried}. "
            "Check the indentation and brackets of new_string."
        )

    def _syntax_problem(self, text: str, edits: list[_Edit]) -> str:
        """Why ``text`` no longer parses, or '' (also when the text before did not parse).

        The top-level statements around the edit are parsed on their own first (a whole
        3,000-line file costs ~20 ms, one kernel ~1 ms); the whole file is parsed only
        when that chunk fails, to tell a broken edit from chunk borders that were not
        statement borders (column-0 text inside a string).
        """
        if not self.python or not edits:
            return ""
        nested = _nested_chunk(self.text, edits[0].start, edits[-1].end)
        if nested is not None:
            lo, hi, depth = nested
            after = _dedent(text[_moved(lo, edits) : _moved(hi, edits)], depth)
            if after is not None and not _syntax_error(after):
                return ""
            before = _dedent(self.text[lo:hi], depth)
            if before is not None and not _syntax_error(before):
                return _syntax_error(text)  # it parsed before the edit: the error stands
        for widen in range(_WIDEN):
            chunks = _merged([_chunk(self.text, e.start, e.end, widen) for e in edits])
            failing = [
                (lo, hi)
                for lo, hi in chunks
                if _syntax_error(text[_moved(lo, edits) : _moved(hi, edits)])
            ]
            if not failing:
                return ""
            if not any(_syntax_error(self.text[lo:hi]) for lo, hi in failing):
                return _syntax_error(text)  # they parsed before the edit: the error stands
        if self.parses is None:
            self.parses = not _syntax_error(self.text)
        return _syntax_error(text) if self.parses else ""

    def _shift_touched(self, edits: list[_Edit]) -> None:
        shifted = []
        for start, end, owner in self.touched:
            delta = sum(len(e.replacement) - (e.end - e.start) for e in edits if e.end <= start)
            shifted.append((start + delta, end + delta, owner))
        self.touched = shifted


def _confident(found: tuple[Match, ...] | NoMatch | Ambiguous) -> bool:
    return isinstance(found, tuple) and all(match.level != "fuzzy" for match in found)


# Indentation guesses for a replacement, in order; the later ones are tried only for
# Python files whose result did not parse.
_GUESSES = (
    "new_string moved by as much as old_string was off",
    "only its first line moved and the rest as written",
    "new_string exactly as written",
)


def _preview(old: str) -> str:
    line = next((line.strip() for line in old.split("\n") if line.strip()), "")
    return repr(line if len(line) <= 60 else line[:57] + "...")


_ESCAPE = re.compile(r"\\([ntr\"'\\])")
_ESCAPED = {"n": "\n", "t": "\t", "r": "", '"': '"', "'": "'", "\\": "\\"}


def _unescape(text: str) -> str:
    """Read ``\\n`` as a newline where a model escaped its JSON twice.

    Only for strings without a real newline: a string that has both is code that means
    its backslashes.
    """
    if "\\n" not in text or "\n" in text.rstrip("\n"):
        return text
    return _ESCAPE.sub(lambda m: _ESCAPED[m.group(1)], text)


def _splice(text: str, edits: list[_Edit]) -> tuple[str, list[tuple[int, int]]]:
    """Apply sorted, disjoint edits; return the text and where each replacement landed."""
    pieces, regions, position, shift = [], [], 0, 0
    for edit in edits:
        # Two whole-line deletions at the end of a file may both claim one newline.
        begin = max(edit.start, position)
        pieces += [text[position:begin], edit.replacement]
        start = begin + shift
        regions.append((start, start + len(edit.replacement)))
        shift += len(edit.replacement) - (edit.end - begin)
        position = max(edit.end, position)
    pieces.append(text[position:])
    return "".join(pieces), regions


# --- building replacements ---------------------------------------------------------------


def _edits(text: str, match: Match, old: str, new: str, style: Style, guess: int) -> list[_Edit]:
    """The edits that replace one match; an elided match keeps what it elided."""
    if not match.parts:
        return [_edit(text, match, old, new, style, guess)]
    old_parts = Query.of(old).elided
    new_parts = _elided_pieces(new)
    if len(new_parts) == len(old_parts):
        return [
            _edit(text, part, "\n".join(o), "\n".join(n), style, guess)
            for part, o, n in zip(match.parts, old_parts, new_parts, strict=True)
        ]
    if len(new_parts) > 1:
        raise _Failed(
            f"old_string elides code in {len(old_parts)} pieces but new_string has "
            f"{len(new_parts)}; keep the same '...' lines in both, or write new_string in full."
        )
    head = match.parts[0]
    reference = (_span_lines(text, head), Query.of("\n".join(old_parts[0])).lines)
    whole = Match(match.start, match.end, head.level, match.score)
    return [_edit(text, whole, old, new, style, guess, reference)]


def _placeholder(line: str) -> bool:
    """An elision comment: never real code, unlike a bare ``...`` (Python's Ellipsis)."""
    return is_elision(line) and line.lstrip().startswith(("#", "//"))


def _elided_pieces(new: str) -> list[list[str]]:
    pieces: list[list[str]] = [[]]
    for line in new.split("\n"):
        if is_elision(line):
            pieces.append([])
        else:
            pieces[-1].append(line)
    return [piece for piece in pieces if any(line.strip() for line in piece)]


def _span_lines(text: str, match: Match) -> Sequence[str]:
    view = text_view(text)
    first, last = line_span(text, match)
    return view.raw[first - 1 : last]


def _edit(
    text: str,
    match: Match,
    old: str,
    new: str,
    style: Style,
    guess: int,
    reference: tuple[Sequence[str], Sequence[str]] | None = None,
) -> _Edit:
    view = text_view(text)
    end = match.end
    if text[match.start : end].endswith("\n"):
        end -= 2 if text[match.start : end].endswith("\r\n") else 1
    first = view.line_of(match.start)
    last = view.line_of(max(match.start, end - 1))
    whole_lines = not text[view.starts[first] : match.start].strip() and end == view.end(last)
    if not whole_lines:
        return _Edit(match.start, match.end, _inline(old, new, style))
    old_lines, new_lines = _aligned_lines(old, new)
    if not any(line.strip() for line in new_lines):
        return _deletion(text, first, last)
    file_lines, ref_old = reference or (view.raw[first : last + 1], old_lines)
    first_shift, rest_shift = _shifts(file_lines, ref_old, style)
    body = _reindent(new_lines, first_shift, rest_shift, style, guess)
    return _Edit(view.starts[first], view.end(last), style.newline.join(body))


def _inline(old: str, new: str, style: Style) -> str:
    """A replacement inside a line: same line ending policy, the file's newline and tabs."""
    if old.endswith("\n") and new and not new.endswith("\n"):
        new += "\n"
    elif new.endswith("\n") and not old.endswith("\n"):
        new = new[:-1]
    lines = new.split("\n")
    rest = [_restyle(line, 0, style) for line in lines[1:]]
    return style.newline.join([lines[0], *rest])


def _aligned_lines(old: str, new: str) -> tuple[list[str], list[str]]:
    """Old and new as lines, without the edge lines (blank or '...') that old only framed.

    A final newline on either side is dropped first, so an edit that adds or forgets it
    neither joins nor splits lines.
    """
    old_lines = old.removesuffix("\n").split("\n")
    new_lines = new.removesuffix("\n").split("\n")
    for edge in (0, -1):
        while old_lines and new_lines and _frame(old_lines[edge]) and _frame(new_lines[edge]):
            old_lines.pop(edge)
            new_lines.pop(edge)
        while old_lines and _frame(old_lines[edge]):
            old_lines.pop(edge)
    return old_lines, new_lines


def _frame(line: str) -> bool:
    return not line.strip() or is_elision(line)


def _deletion(text: str, first: int, last: int) -> _Edit:
    """Remove whole lines together with one line terminator."""
    view = text_view(text)
    if last + 1 < len(view.starts):
        return _Edit(view.starts[first], view.starts[last + 1], "")
    if first > 0:
        return _Edit(view.end(first - 1), view.end(last), "")
    return _Edit(0, len(text), "")


def _shifts(file_lines: Sequence[str], old_lines: Sequence[str], style: Style) -> tuple[int, int]:
    """How far the matched lines sit from old_string: for its first line, and the rest.

    The first line gets its own shift because models often copy it from mid-line
    (without its indentation) while the other lines keep theirs.
    """
    found = [style.width(_indent(line)) for line in file_lines if line.strip()]
    wrote = [style.width(_indent(line)) for line in old_lines if line.strip()]
    if not found or not wrote:
        return 0, 0
    first = found[0] - wrote[0]
    if len(found) == len(wrote) and len(wrote) > 1:
        counts = Counter(a - b for a, b in zip(found[1:], wrote[1:], strict=True))
        top = max(counts.values())
        rest = first if counts.get(first) == top else counts.most_common(1)[0][0]
    elif len(found) > 1 and len(wrote) > 1:
        rest = min(found[1:]) - min(wrote[1:])
    else:
        rest = first
    if (first - rest) % 2:
        first = rest  # an odd offset is a typo at the line's start, not a real indent
    return first, rest


def _reindent(
    lines: Sequence[str], first_shift: int, rest_shift: int, style: Style, guess: int
) -> list[str]:
    """Lines of new_string at the file's indentation, per guess (see ``_GUESSES``)."""
    out = []
    lead = next((i for i, line in enumerate(lines) if line.strip()), 0)
    for index, line in enumerate(lines):
        if not line.strip():
            out.append("")
        elif guess == 2 or (guess == 1 and index > lead):
            out.append(line)
        else:
            out.append(_restyle(line, first_shift if index == lead else rest_shift, style))
    return out


def _restyle(line: str, shift: int, style: Style) -> str:
    prefix = _indent(line)
    if shift == 0 and style.fits(prefix):
        return line
    return style.render(max(0, style.width(prefix) + shift)) + line[len(prefix) :]


# --- Python syntax -----------------------------------------------------------------------

_WIDEN = 3
_CONTINUATION = re.compile(r"(else|elif|except|finally)\b|[)\]}#]")


def _is_python(path: str, code: str) -> bool:
    if path:
        return path.endswith((".py", ".pyi"))
    return bool(code.strip()) and not _syntax_error(code)


def _syntax_error(text: str) -> str:
    """'' when the text parses, else the error and its line."""
    try:
        ast.parse(text)
    except SyntaxError as exc:
        return f"{exc.msg} at line {exc.lineno or 1}"
    except (ValueError, RecursionError, MemoryError) as exc:
        return str(exc) or type(exc).__name__
    return ""


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
    return len(line) - len(line.lstrip(" \t"))


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


def _moved(offset: int, edits: list[_Edit]) -> int:
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


# --- diffs -------------------------------------------------------------------------------


def unified_diff(before: str, after: str, path: str) -> str:
    """A git-style diff of one file ('' when equal); several concatenate into one patch.

    Lines keep their own terminators, so CRLF survives, and a last line without one
    gets git's ``\\ No newline at end of file`` marker. Only the lines between the
    common head and tail (plus context) are split and given to difflib: on a
    3,000-line file that is the difference between ~6 ms and a fraction of one.
    """
    if before == after:
        return ""
    head, tail = _common_edges(before, after)
    start = head
    for _ in range(_CONTEXT):
        start = before.rfind("\n", 0, start - 1) + 1 if start else 0
    stop = len(before) - tail
    for _ in range(_CONTEXT):
        stop = before.find("\n", stop) + 1 or len(before)
    lo = before.count("\n", 0, start)
    a = _diff_lines(before[start:stop])
    b = _diff_lines(after[start : stop + len(after) - len(before)])
    out = [f"diff --git a/{path} b/{path}\n", f"--- a/{path}\n", f"+++ b/{path}\n"]
    for group in difflib.SequenceMatcher(None, a, b).get_grouped_opcodes(_CONTEXT):
        first, last = group[0], group[-1]
        old_range = _hunk_range(lo + first[1], lo + last[2])
        new_range = _hunk_range(lo + first[3], lo + last[4])
        out.append(f"@@ -{old_range} +{new_range} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [_diff_line(" ", line) for line in a[i1:i2]]
                continue
            out += [_diff_line("-", line) for line in a[i1:i2]]
            out += [_diff_line("+", line) for line in b[j1:j2]]
    return "".join(out)


_CONTEXT = 3


def _diff_lines(text: str) -> list[str]:
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def _common_edges(before: str, after: str) -> tuple[int, int]:
    """Lengths of the common head and tail, each whole lines, never overlapping.

    Bisection on slice equality: C comparisons instead of a loop over characters.
    """
    limit = min(len(before), len(after))
    head = _bisect_equal(lambda k: before[:k] == after[:k], limit)
    head = before.rfind("\n", 0, head) + 1
    tail = _bisect_equal(
        lambda k: before[len(before) - k :] == after[len(after) - k :], limit - head
    )
    start = len(before) - tail
    if start > head and before[start - 1] != "\n":
        # Move the tail's start to the next line start; that newline is common text.
        start = before.find("\n", start) + 1 or len(before)
    return head, len(before) - start


def _bisect_equal(equal: Callable[[int], bool], limit: int) -> int:
    """The largest k <= limit with equal(k), for a predicate true up to some k.

    Comparing list slices runs in C; a Python loop over 3,000 lines does not.
    """
    lo, hi = 0, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if equal(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _hunk_range(start: int, stop: int) -> str:
    """Unified diff range: 1-based start and length; an empty range names the line before."""
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start + 1 if length else start},{length}"


def _diff_line(tag: str, line: str) -> str:
    if line.endswith("\n"):
        return tag + line
    return f"{tag}{line}\n\\ No newline at end of file\n"
