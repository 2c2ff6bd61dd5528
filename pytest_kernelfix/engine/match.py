"""Locate a model's ``old_string`` in a file, tolerantly but never wrongly.

Levels are tried in order: ``exact``, ``trimmed`` (per line, leading and trailing
whitespace ignored), ``whitespace`` (runs of blanks equal one space, blank lines
ignored) and ``fuzzy`` (rapidfuzz similarity of windows of n-1, n and n+1 lines). Every
level returns a span of the ORIGINAL text so the replacement lands on real bytes, and
every level refuses ambiguity: a wrong edit costs far more than a refused one.

The fuzzy level accepts a window only when it scores at least :data:`THRESHOLD` and beats
the best window that does NOT overlap it by :data:`GAP`; overlapping windows are the
same place seen through a shifted frame, not a rival. To stay within a few milliseconds
on 3,000-line files it ranks windows with a line-level score matrix (one C call) and
scores only the promising windows on their full text.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import compress
from typing import Literal

import numpy as np
from rapidfuzz import fuzz, process

Level = Literal["exact", "trimmed", "whitespace", "fuzzy"]
LEVELS: tuple[Level, ...] = ("exact", "trimmed", "whitespace", "fuzzy")
THRESHOLD = 0.8
GAP = 0.1

# Windows whose line-level estimate reaches this are scored on their full text. The
# estimate is a lower bound of the real score for windows whose line breaks match the
# search, so this leaves a wide margin under THRESHOLD - GAP.
_PREFILTER = 0.5
_TOP_WINDOWS = 6
# Characters of window text scored per window size: long searches score fewer of the
# windows that clear the prefilter (the best estimates first), which bounds the cost.
_SCORED_CHARS = 60_000
_MAX_ROWS = 12
_EDGE_FIT = 50.0  # an edge line this unlike the search's edge lines matches nothing
_EDGE_MARGIN = 3.0  # ...unless leaving it out costs more similarity than this
_MAX_WINDOWS = 400
_LISTED = 12  # places named in an ambiguity message
_EPS = 1e-9

_ELISION = re.compile(
    r"^\s*(?:(?:#|//)\s*)?(?:\.\.\.|…)[\w\s,.:;'\"()/-]*$"
    r"|^\s*(?:#|//)[^\n]*\bexisting code\b[^\n]*$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Match:
    """A located span ``content[start:end]``; ``parts`` are the pieces of an elided search."""

    start: int
    end: int
    level: Level
    score: float = 1.0
    parts: tuple[Match, ...] = ()


@dataclass(frozen=True)
class Fragment:
    """The lines of the file most similar to a search, for a model to copy next round."""

    first_line: int
    last_line: int
    text: str
    similarity: float

    def describe(self) -> str:
        return (
            f"{line_range(self.first_line, self.last_line)} "
            f"(similarity {self.similarity:.2f}):\n```\n{self.text}\n```"
        )


@dataclass(frozen=True)
class NoMatch:
    """Nothing matched at any level; says which levels ran and what came closest."""

    levels_tried: tuple[Level, ...]
    nearest: Fragment | None = None
    reason: str = ""

    @property
    def message(self) -> str:
        tried = ", ".join(self.levels_tried) or "none"
        text = f"old_string was not found in the file (levels tried: {tried}"
        if "fuzzy" in self.levels_tried:
            text += f"; fuzzy needs similarity >= {THRESHOLD:.2f}"
        text += ")."
        if self.reason:
            text += f" {self.reason}"
        if self.nearest is not None:
            text += f" The most similar fragment is at {self.nearest.describe()}"
        else:
            text += " No part of the file resembles it."
        return text

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Ambiguous:
    """Several places match equally well; refusing beats guessing."""

    level: Level
    lines: tuple[tuple[int, int], ...]
    scores: tuple[float, ...] = ()
    what: str = "old_string"

    @property
    def levels_tried(self) -> tuple[Level, ...]:
        return LEVELS[: LEVELS.index(self.level) + 1]

    @property
    def message(self) -> str:
        tried = ", ".join(self.levels_tried)
        if self.level == "fuzzy":
            places = " and ".join(
                f"{line_range(*span)} (similarity {score:.2f})"
                for span, score in zip(self.lines, self.scores, strict=False)
            )
            head = (
                f"{self.what} is too close to two places at the fuzzy level: {places}; "
                f"a fuzzy match must beat every other place by the {GAP:.2f} confidence gap "
                f"(levels tried: {tried})."
            )
        else:
            places = ", ".join(line_range(*span) for span in self.lines[:_LISTED])
            if len(self.lines) > _LISTED:
                places += f" and {len(self.lines) - _LISTED} more"
            head = (
                f"{self.what} matches {len(self.lines)} places at the {self.level} level "
                f"({places}; levels tried: {tried})."
            )
        return (
            f"{head} To pick one: add more surrounding lines so it is unique, set "
            '"replace_all": true to change every occurrence, or set "anchor" to a '
            "unique line that comes before the intended occurrence."
        )

    def __str__(self) -> str:
        return self.message


Failure = NoMatch | Ambiguous


def find_match(content: str, search: str, *, anchor: str = "") -> Match | NoMatch | Ambiguous:
    """The one place in ``content`` that ``search`` means, or why there is none.

    With ``anchor`` the first occurrence at or after the anchor's line wins.
    """
    first_line = _anchor_line(content, anchor)
    if not isinstance(first_line, int):
        return first_line
    view, query = text_view(content), Query.of(search)
    found: Match | Failure
    if query.elided:
        found = _locate(view, query, first_line, pick_first=bool(anchor), fuzzy=False)
        if isinstance(found, NoMatch):
            found = _locate_elided(view, query, first_line, pick_first=bool(anchor))
    else:
        found = _locate(view, query, first_line, pick_first=bool(anchor))
    if anchor and isinstance(found, NoMatch) and not found.reason:
        where = f"Only the text from the anchor's line {first_line + 1} on was searched."
        return NoMatch(found.levels_tried, found.nearest, reason=where)
    return found


def find_all(content: str, search: str, *, anchor: str = "") -> tuple[Match, ...] | Failure:
    """Every non-overlapping occurrence, for ``replace_all``.

    Occurrences come from the first level that finds any. Exact ones are whole-line
    placements plus, like ``str.replace``, placements inside lines that cut no
    identifier (not for a search that starts with indentation: that one means lines).
    The fuzzy level never multiplies: it yields at most its one confident match.
    """
    query = Query.of(search)
    first_line = _anchor_line(content, anchor)
    if query.elided or not isinstance(first_line, int):
        found = find_match(content, search, anchor=anchor)
        return (found,) if isinstance(found, Match) else found
    view = text_view(content)
    floor = view.starts[first_line]
    aligned, inline, _ = _exact_spans(view, query.text, floor)
    if not query.text[:1].isspace():
        aligned += inline
    if aligned:
        return tuple(Match(a, b, "exact") for a, b in _non_overlapping(sorted(aligned)))
    for phase in ("trimmed", "whitespace"):
        spans = _spans(view, query, phase, floor)
        if spans:
            level = _LEVEL_OF[phase]
            return tuple(Match(start, end, level) for start, end in _non_overlapping(spans))
    found = _locate(view, query, first_line, pick_first=False)
    return (found,) if isinstance(found, Match) else found


def nearest(content: str, search: str) -> Fragment | None:
    """The window of ``content`` most similar to ``search``, however dissimilar."""
    view = text_view(content)
    query = Query.of(search)
    if not query.nonblank:
        return None
    return _fragment(view, _fuzzy(view, query, 0).best)


def nearest_fragment(content: str, search: str) -> str:
    """``nearest`` rendered for a model: line numbers, similarity and the text."""
    fragment = nearest(content, search)
    return fragment.describe() if fragment is not None else ""


def line_span(content: str, match: Match) -> tuple[int, int]:
    """1-based first and last line of a match."""
    view = text_view(content)
    return view.line_of(match.start) + 1, view.line_of(max(match.start, match.end - 1)) + 1


# --- texts as line tables ------------------------------------------------------------


class TextView:
    """Line tables of one text: offsets plus the per-line keys each level compares."""

    def __init__(self, text: str) -> None:
        self.text = text
        crlf = "\r" in text and text.count("\r\n") * 2 > text.count("\n")
        self.newline = "\r\n" if crlf else "\n"

    @cached_property
    def raw(self) -> Sequence[str]:
        """Each line without its terminator (a trailing CR belongs to the terminator)."""
        if "\r" not in self.text:
            return self._pieces
        return [p[:-1] if p.endswith("\r") else p for p in self._pieces]

    @cached_property
    def starts(self) -> tuple[int, ...]:
        """Offset of every line's first character."""
        lengths = np.fromiter(map(len, self._pieces), dtype=np.int64, count=len(self._pieces))
        starts = np.zeros(len(lengths), dtype=np.int64)
        np.cumsum(lengths[:-1] + 1, out=starts[1:])
        return tuple(starts.tolist())

    @cached_property
    def _pieces(self) -> list[str]:
        return self.text.split("\n")

    def end(self, line: int) -> int:
        """Offset just past the text of ``line``, before its line terminator."""
        return self.starts[line] + len(self.raw[line])

    def line_of(self, offset: int) -> int:
        return bisect_right(self.starts, offset) - 1

    @cached_property
    def trimmed(self) -> Sequence[str]:
        return list(map(str.strip, self.raw))

    @cached_property
    def normalized(self) -> Sequence[str]:
        return _normalize(self.trimmed)

    @cached_property
    def nonblank(self) -> tuple[int, ...]:
        """Indices of the lines that hold more than whitespace."""
        return tuple(compress(range(len(self.normalized)), self.normalized))

    @cached_property
    def nonblank_text(self) -> tuple[str, ...]:
        return tuple(filter(None, self.normalized))

    @cached_property
    def nonblank_lengths(self) -> np.ndarray:
        return np.fromiter(map(len, self.nonblank_text), dtype=np.float32)

    @cached_property
    def joined(self) -> tuple[str, tuple[int, ...]]:
        """Non-blank normalized lines joined by newlines, with each line's offset."""
        offsets = np.zeros(len(self.nonblank_text) + 1, dtype=np.int64)
        np.cumsum(self.nonblank_lengths.astype(np.int64) + 1, out=offsets[1:])
        return "\n".join(self.nonblank_text), tuple(offsets.tolist())


def _normalize(trimmed: Sequence[str]) -> list[str]:
    """Trimmed lines with every run of blanks and tabs read as one space.

    Only lines that hold a run are rebuilt: splitting every line costs ~1 ms per 3,000.
    """
    return [" ".join(line.split()) if "  " in line or "\t" in line else line for line in trimmed]


@lru_cache(maxsize=16)
def text_view(text: str) -> TextView:
    """One TextView per text: a file is searched many times between two edits."""
    return TextView(text)


@dataclass(frozen=True)
class Query:
    """A search string, prepared once for every level."""

    text: str
    lines: tuple[str, ...]
    elided: tuple[tuple[str, ...], ...] = ()

    @classmethod
    def of(cls, search: str) -> Query:
        text = search.replace("\r\n", "\n")
        lines = strip_edge_elisions(tuple(line.rstrip("\r") for line in text.split("\n")))
        return cls(text, lines, _elided_parts(lines))

    @cached_property
    def trimmed(self) -> tuple[str, ...]:
        return tuple(line.strip() for line in self.lines)

    @cached_property
    def nonblank(self) -> tuple[str, ...]:
        return tuple(filter(None, _normalize(self.trimmed)))


def _strip_blank_edges(lines: tuple[str, ...]) -> tuple[str, ...]:
    first = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    last = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip()), -1)
    return lines[first : last + 1]


def strip_edge_elisions(lines: tuple[str, ...]) -> tuple[str, ...]:
    """Lines without blank or elision lines at either end: those elide nothing inside."""
    lines = _strip_blank_edges(lines)
    while lines and is_elision(lines[0]):
        lines = _strip_blank_edges(lines[1:])
    while lines and is_elision(lines[-1]):
        lines = _strip_blank_edges(lines[:-1])
    return lines


def is_elision(line: str) -> bool:
    """A line that stands for omitted code: ``...`` or ``# ... existing code ...``."""
    return bool(_ELISION.match(line))


def _elided_parts(lines: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    """The pieces between elision lines, or () when the search elides nothing inside."""
    parts: list[tuple[str, ...]] = [()]
    for line in lines:
        if is_elision(line):
            parts.append(())
        else:
            parts[-1] = (*parts[-1], line)
    kept = [_strip_blank_edges(part) for part in parts]
    kept = [part for part in kept if part]
    return tuple(kept) if len(kept) > 1 else ()


# --- the levels ------------------------------------------------------------------------

Span = tuple[int, int]


def _locate(
    view: TextView, query: Query, first_line: int, *, pick_first: bool, fuzzy: bool = True
) -> Match | Failure:
    """Levels in order; the first level with candidates decides."""
    floor = view.starts[min(first_line, len(view.raw) - 1)] if first_line else 0
    exact = dict(zip(_EXACT_PHASES, _exact_spans(view, query.text, floor), strict=True))
    for phase in _PHASES:
        spans = exact[phase] if phase in exact else _spans(view, query, phase, floor)
        level = _LEVEL_OF[phase]
        if len(spans) == 1 or (spans and pick_first):
            return Match(spans[0][0], spans[0][1], level)
        if spans:
            return Ambiguous(level, tuple(_lines(view, span) for span in spans))
    if not fuzzy:
        return NoMatch(LEVELS[:3])
    return _decide_fuzzy(view, query, first_line)


# The exact level runs in three phases. A placement whose edges sit on line boundaries
# (only whitespace beside it on its first and last line) comes first, then one that
# starts or ends inside a line, cuts no identifier in two and does not start with
# indentation (``str.replace`` finds it, and it cannot be re-indented lines). The rest
# are tried only after the line-based levels failed, so a re-indented search is not
# captured by an unrelated line it happens to be a piece of.
_PHASES = ("exact", "inline", "trimmed", "whitespace", "cut")
_LEVEL_OF: dict[str, Level] = {
    "exact": "exact",
    "inline": "exact",
    "trimmed": "trimmed",
    "whitespace": "whitespace",
    "cut": "exact",
}


def _spans(view: TextView, query: Query, phase: str, floor: int) -> list[Span]:
    """All placements of the query at a line level that start at or after ``floor``."""
    if not query.nonblank:
        return []
    if phase == "trimmed":
        return _line_spans(view, view.trimmed, range(len(view.raw)), query.trimmed, floor)
    return _line_spans(view, view.nonblank_text, view.nonblank, query.nonblank, floor)


_EXACT_PHASES = ("exact", "inline", "cut")


def _exact_spans(
    view: TextView, search: str, floor: int
) -> tuple[list[Span], list[Span], list[Span]]:
    """Substring placements: aligned on line boundaries, inside lines, cutting.

    Among the cutting ones, those that cut an identifier in two lose to the others.
    """
    if not search:
        return [], [], []
    if view.newline == "\r\n" and "\r" not in search:
        search = search.replace("\n", "\r\n")
    text = view.text
    spans = []
    position = text.find(search, floor)
    while position >= 0:
        spans.append((position, position + len(search)))
        position = text.find(search, position + 1)
    aligned = [span for span in spans if _aligned(text, span)]
    inline = [span for span in spans if not _aligned(text, span)]
    clean = [span for span in inline if not _cuts_token(text, span)]
    if search[0] in " \t":
        return aligned, [], clean or inline
    return aligned, clean, [span for span in inline if _cuts_token(text, span)]


def _aligned(text: str, span: Span) -> bool:
    """Only whitespace beside the placement on its lines, and no indentation cut in two."""
    start, end = span
    line_start = text.rfind("\n", 0, start) + 1
    before = text[line_start:start]
    if before and (before.strip() or text[start] in " \t"):
        return False
    if text[end - 1] == "\n":
        return True
    line_end = text.find("\n", end)
    return not text[end : len(text) if line_end < 0 else line_end].strip()


def _cuts_token(text: str, span: Span) -> bool:
    start, end = span
    head = start > 0 and _word(text[start]) and _word(text[start - 1])
    tail = end < len(text) and _word(text[end - 1]) and _word(text[end])
    return head or tail


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _line_spans(
    view: TextView,
    keys: Sequence[str],
    line_numbers: Sequence[int],
    wanted: tuple[str, ...],
    floor: int,
) -> list[Span]:
    """Placements of ``wanted`` in ``keys``; spans cover whole original lines."""
    n = len(wanted)
    spans = []
    i = _index(keys, wanted[0], 0)
    while i >= 0:
        if tuple(keys[i : i + n]) == wanted:
            first, last = line_numbers[i], line_numbers[i + n - 1]
            if view.starts[first] >= floor:
                spans.append((view.starts[first], view.end(last)))
        i = _index(keys, wanted[0], i + 1)
    return spans


def _index(keys: Sequence[str], key: str, start: int) -> int:
    """``keys.index`` (a C loop) without the exception."""
    try:
        return keys.index(key, start)
    except ValueError:
        return -1


def _non_overlapping(spans: list[Span]) -> list[Span]:
    kept: list[Span] = []
    for span in spans:
        if not kept or span[0] >= kept[-1][1]:
            kept.append(span)
    return kept


def _lines(view: TextView, span: Span) -> tuple[int, int]:
    return view.line_of(span[0]) + 1, view.line_of(max(span[0], span[1] - 1)) + 1


def _anchor_line(content: str, anchor: str) -> int | Failure:
    """The 0-based line where the anchor starts (0 without one), or why it cannot serve."""
    if not anchor:
        return 0
    found = find_match(content, anchor)
    if isinstance(found, Match):
        return text_view(content).line_of(found.start)
    if isinstance(found, Ambiguous):
        return Ambiguous(found.level, found.lines, found.scores, what="anchor")
    return NoMatch(found.levels_tried, found.nearest, reason="The anchor itself was not found.")


def _locate_elided(
    view: TextView, query: Query, first_line: int, *, pick_first: bool
) -> Match | Failure:
    """Each piece around the elision lines must be found once, in order, after the last."""
    parts: list[Match] = []
    for index, lines in enumerate(query.elided):
        part = Query("\n".join(lines), lines)
        found = _locate(view, part, first_line, pick_first=pick_first and index == 0)
        if not isinstance(found, Match):
            reason = (
                f"It elides code with '...', so each of its {len(query.elided)} pieces must be "
                f"found once, in order; piece {index + 1} was not."
            )
            if isinstance(found, Ambiguous):
                what = f"piece {index + 1} of old_string (split at its '...' lines)"
                return Ambiguous(found.level, found.lines, found.scores, what=what)
            return NoMatch(found.levels_tried, found.nearest, reason=reason)
        parts.append(found)
        first_line = view.line_of(max(found.start, found.end - 1)) + 1
        if first_line >= len(view.raw) and index + 1 < len(query.elided):
            return NoMatch(LEVELS, None, reason="The pieces after the elision are missing.")
    worst = max(LEVELS.index(part.level) for part in parts)
    return Match(
        parts[0].start,
        parts[-1].end,
        LEVELS[worst],
        min(part.score for part in parts),
        tuple(parts),
    )


# --- fuzzy -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Window:
    """``size`` non-blank lines starting at non-blank line ``start``; score in 0..100."""

    start: int
    size: int
    score: float

    def overlaps(self, other: _Window) -> bool:
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True)
class _FuzzyResult:
    """The best window and every window scored on its full text."""

    best: _Window | None
    scored: tuple[_Window, ...] = ()

    def rival(self, best: _Window) -> _Window | None:
        """The best scored window that does not overlap ``best``."""
        others = [w for w in self.scored if not w.overlaps(best)]
        return max(others, key=lambda w: w.score, default=None)


def _decide_fuzzy(view: TextView, query: Query, first_line: int) -> Match | Failure:
    """The best window from ``first_line`` on, if it clears the threshold and the gap.

    Rivals are looked for in the WHOLE file: a search that matches better before an
    anchor is evidence that the window after it is not what the model meant.
    """
    if not query.nonblank:
        return NoMatch(LEVELS)
    result = _fuzzy(view, query, first_line)
    if result.best is None:
        return NoMatch(LEVELS)
    best = _without_stray_edge(view, query, result.best)
    if best.score < THRESHOLD * 100 - _EPS:
        return NoMatch(LEVELS, _fragment(view, best))
    rivals = [result.rival(best)]
    if first_line:
        rivals.append(_fuzzy(view, query, 0, floor=best.score - _IRRELEVANT).rival(best))
    rival = max((w for w in rivals if w is not None), key=lambda w: w.score, default=None)
    if rival is not None and best.score - rival.score < GAP * 100 - _EPS:
        return Ambiguous(
            "fuzzy",
            (_window_lines(view, best), _window_lines(view, rival)),
            (best.score / 100, rival.score / 100),
        )
    first, last = _windowline_range(view, best)
    return Match(view.starts[first], view.end(last), "fuzzy", best.score / 100)


def _without_stray_edge(view: TextView, query: Query, window: _Window) -> _Window:
    """A window one line longer than the search, minus its unmatched line if at an edge.

    Aligning the search lines to the window's lines with one window line left out shows
    which line the search does not mention (an edge line unlike both edge lines of the
    search is left out too); at an edge it merely scored a little by chance, and
    replacing it would delete code the model never quoted.
    """
    wanted = query.nonblank
    n = len(wanted)
    if window.size != n + 1:
        return window
    lines = view.nonblank_text[window.start : window.start + n + 1]
    ratios = process.cdist(wanted, lines, scorer=fuzz.ratio, dtype=np.float64)
    q_len = np.fromiter(map(len, wanted), dtype=np.float64, count=n)
    w_len = np.fromiter(map(len, lines), dtype=np.float64, count=n + 1)
    lcs2 = ratios * (q_len[:, None] + w_len[None, :])
    rows = np.arange(n)
    same = np.concatenate([[0.0], np.cumsum(lcs2[rows, rows])])
    later = np.concatenate([[0.0], np.cumsum(lcs2[rows, rows + 1])])
    # Leaving out window line p pairs search lines before p with 0..p-1, the rest shifted.
    fits = same + (later[n] - later)
    skipped = int(np.argmax(fits))
    if fits[0] >= fits[skipped] or ratios[:2, 0].max() < _EDGE_FIT:
        skipped = 0
    elif fits[n] >= fits[skipped] or ratios[-2:, n].max() < _EDGE_FIT:
        skipped = n
    if 0 < skipped < n:
        return window
    start = window.start + (1 if skipped == 0 else 0)
    text, offsets = view.joined
    body = text[offsets[start] : offsets[start + n] - 1]
    trimmed = _Window(start, n, fuzz.ratio("\n".join(wanted), body))
    # Much worse without the line: the search does quote it (say, two lines it joined).
    return trimmed if trimmed.score >= window.score - _EDGE_MARGIN else window


def _fuzzy(
    view: TextView, query: Query, first_line: int, floor: float | None = None
) -> _FuzzyResult:
    """The best window and every window scored on its full text.

    Windows are ranked by an estimate from line scores; the best-ranked window of each
    size is scored first, and the others only as far as they could still matter: one
    that scores below ``floor`` (by default the best score so far less
    :data:`_IRRELEVANT`) can be neither the best nor a rival within the gap, so its score
    is cut short and recorded as 0.
    """
    offset = bisect_left(view.nonblank, first_line)
    lines = view.nonblank_text[offset:]
    wanted = query.nonblank
    n, total = len(wanted), len(lines)
    sizes = [k for k in (n, n - 1, n + 1) if 1 <= k <= total]
    if not sizes:
        return _FuzzyResult(None)
    estimates = _estimates(wanted, lines, view.nonblank_lengths[offset:], sizes)
    limit = min(_MAX_WINDOWS, max(_TOP_WINDOWS, _SCORED_CHARS // (sum(map(len, wanted)) + n)))
    chosen = _promising(estimates, set(), limit)
    scored: list[_Window] = []
    leaders: set[Span] = set()
    if floor is None:
        leaders = {(int(np.argmax(values)), k) for k, values in estimates.items()}
        scored = _score(view, offset, query, leaders)
        floor = max(w.score for w in scored) - _IRRELEVANT
    scored += _score(view, offset, query, chosen - leaders, floor)
    first_best = max(scored, key=lambda w: _rank(w, n))
    far = _promising(estimates, {(first_best.start - offset, first_best.size)}, limit)
    scored += _score(view, offset, query, far - chosen - leaders, floor)
    return _FuzzyResult(max(scored, key=lambda w: _rank(w, n)), tuple(scored))


# A window this far below the best can change no decision: the best may lose its stray
# edge line (up to _EDGE_MARGIN) and a rival matters within GAP of what is left.
_IRRELEVANT = GAP * 100 + _EDGE_MARGIN + 1


def _rank(window: _Window, size: int) -> tuple[float, int, int]:
    """Higher score first; on a tie the window as long as the search, then the earliest."""
    return window.score, -abs(window.size - size), -window.start


def _estimates(
    wanted: tuple[str, ...], lines: tuple[str, ...], lengths: np.ndarray, sizes: list[int]
) -> dict[int, np.ndarray]:
    """Per window size, an estimate of every window's similarity (0..1) from line scores.

    ``lcs2[t, c]`` is twice the longest common subsequence of search line t and file line
    c (rapidfuzz's ratio times the summed lengths). Pairing search lines with consecutive
    window lines, one line skipped when the sizes differ, and summing is a lower bound of
    the window's own LCS, hence of its ratio. Long searches use every ``step``-th line
    only (scaled up), which keeps the cost flat.
    """
    n, total = len(wanted), len(lines)
    step = -(-n // _MAX_ROWS)
    rows = wanted[::step]
    m = len(rows)
    q_len = np.fromiter(map(len, wanted), dtype=np.float32, count=n)
    ratios = process.cdist(rows, lines, scorer=fuzz.ratio, dtype=np.float32)
    width = total + n + 2
    padded = np.zeros((m, width), dtype=np.float32)
    pair_len = q_len[::step, None] + lengths[None, :]
    np.multiply(ratios, pair_len * 0.01, out=padded[:, 1 : total + 1])
    flat = padded.ravel()

    def prefix(shift: int) -> np.ndarray:
        """Running sums down the diagonal pairing search line j with window line j+shift."""
        diagonal = np.lib.stride_tricks.as_strided(
            flat[shift + 1 :],
            shape=(m, total),
            strides=((width + step) * flat.itemsize, flat.itemsize),
            writeable=False,
        )
        sums = np.zeros((m + 1, total), dtype=np.float32)
        np.cumsum(diagonal, axis=0, out=sums[1:])
        return sums

    same = prefix(0)
    aligned = {n: same[m]}
    if n + 1 in sizes:
        later = prefix(1)
        aligned[n + 1] = (same - later).max(axis=0) + later[m]
    if n - 1 in sizes:
        earlier = prefix(-1)
        # With every line sampled, the skipped search line must pair with nothing.
        split = same[:m] - earlier[1:] if step == 1 else same - earlier
        aligned[n - 1] = split.max(axis=0) + earlier[m]
    scale = float(q_len.sum() / q_len[::step].sum()) if step > 1 else 1.0
    cumulative = np.zeros(total + 1, dtype=np.float32)
    np.cumsum(lengths, out=cumulative[1:])
    q_total = float(q_len.sum()) + n - 1
    estimates = {}
    for k in sizes:
        count = total - k + 1
        window_len = cumulative[k : k + count] - cumulative[:count] + (k - 1)
        newlines = 2 * (min(n, k) - 1)
        estimates[k] = (aligned[k][:count] * scale + newlines) / (q_total + window_len)
    return estimates


def _promising(
    estimates: dict[int, np.ndarray], excluded: set[tuple[int, int]], limit: int
) -> set[Span]:
    """Windows worth a full score: the estimate ranks on top, or clears the prefilter
    (at most ``limit`` of those per size, the best estimates first).

    ``excluded`` holds one window whose neighbourhood is masked, so that the best
    windows elsewhere in the file are always scored too (they are the rivals).
    """
    chosen: set[Span] = set()
    for k, values in estimates.items():
        masked = values.copy()
        for start, size in excluded:
            lo, hi = max(0, start - k + 1), start + size
            masked[lo:hi] = -1.0
        top = min(_TOP_WINDOWS, len(masked))
        best = np.argpartition(-masked, top - 1)[:top]
        passing = np.flatnonzero(masked >= _PREFILTER)
        if len(passing) > limit:
            passing = passing[np.argsort(-masked[passing])[:limit]]
        chosen.update((int(i), k) for i in (*best, *passing) if masked[i] >= 0)
    return chosen


def _score(
    view: TextView, offset: int, query: Query, windows: set[Span], floor: float = 0.0
) -> list[_Window]:
    """Windows with their similarity on the full text; below ``floor`` it reads 0."""
    if not windows:
        return []
    text, offsets = view.joined
    ordered = sorted(windows)
    bodies = [text[offsets[offset + i] : offsets[offset + i + k] - 1] for i, k in ordered]
    wanted = "\n".join(query.nonblank)
    cutoff = max(0.0, floor)
    scores = process.cdist(
        [wanted], bodies, scorer=fuzz.ratio, dtype=np.float64, score_cutoff=cutoff
    )[0]
    return [
        _Window(offset + i, k, float(score)) for (i, k), score in zip(ordered, scores, strict=True)
    ]


def _windowline_range(view: TextView, window: _Window) -> tuple[int, int]:
    return view.nonblank[window.start], view.nonblank[window.start + window.size - 1]


def _window_lines(view: TextView, window: _Window) -> tuple[int, int]:
    first, last = _windowline_range(view, window)
    return first + 1, last + 1


def _fragment(view: TextView, window: _Window | None) -> Fragment | None:
    if window is None:
        return None
    first, last = _windowline_range(view, window)
    text = "\n".join(view.raw[first : last + 1])
    return Fragment(first + 1, last + 1, text, window.score / 100)


def line_range(first: int, last: int) -> str:
    """'line 7' or 'lines 7-9': how messages name 1-based lines."""
    return f"line {first}" if first == last else f"lines {first}-{last}"
