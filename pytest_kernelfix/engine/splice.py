"""Apply a model's modifications to one file's text and describe the result as a diff.

The matcher says WHERE (:mod:`~pytest_kernelfix.engine.match`); this module applies
each modification in turn: it builds what lands on the match
(:mod:`~pytest_kernelfix.engine.replacement`), tries the indentation guesses until the
result still parses (:mod:`~pytest_kernelfix.engine.chunks`), refuses an edit that
overlaps an earlier one, and reports the whole as a unified diff
(:mod:`~pytest_kernelfix.engine.diff`). Every failure is one self-contained sentence a
model can act on in the next round.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from pytest_kernelfix.engine import chunks
from pytest_kernelfix.engine.diff import unified_diff
from pytest_kernelfix.engine.indent import Style, has_leading_tab
from pytest_kernelfix.engine.match import (
    LEVELS,
    Ambiguous,
    Match,
    NoMatch,
    find_all,
    find_match,
    is_elision,
    line_range,
    line_span,
    text_view,
)
from pytest_kernelfix.engine.parse import Modification, ParsedResponse
from pytest_kernelfix.engine.replacement import GUESSES, Edit, Failed, edits_for, placeholder

__all__ = ["DiffResult", "Style", "apply_modifications", "clear_caches", "unified_diff"]


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
    tabs = any(has_leading_tab(m.old_string + "\n" + m.new_string) for m in modifications)
    state = _State(code, Style.of(code, tabs_to_convert=tabs), chunks.is_python(path, code))
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
    chunks.clear_caches()


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
        except Failed as exc:
            self.levels.append("none")
            self.errors.append(f"{label} (old_string {_preview(old)}) was not applied: {exc}")
            return
        self.levels.append(level)
        self.warnings += [f"{label} {note}" for note in notes]
        self.applied += 1

    def _plan(
        self, modification: Modification, old: str, new: str, notes: list[str]
    ) -> tuple[str, Iterator[tuple[str, list[Edit]]]]:
        """The match level and the candidate edit lists, the plain replacement first.

        ``notes`` collects what to warn about should the modification apply.
        """
        if not old.strip():
            raise Failed(
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
            raise Failed(matches.message + self._conflict_hint(old))
        self._check_conflicts(matches)
        if not any(is_elision(line) for line in old.split("\n")):
            kept = "\n".join(line for line in new.split("\n") if not placeholder(line))
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
        level = max((m.level for m in matches), key=LEVELS.index)
        return level, self._candidates(matches, old, new)

    def _candidates(
        self, matches: tuple[Match, ...], old: str, new: str
    ) -> Iterator[tuple[str, list[Edit]]]:
        """Each guess's edits, built only when the ones before did not parse."""
        seen: list[list[Edit]] = []
        for guess in GUESSES:
            edits = [
                e for m in matches for e in edits_for(self.text, m, old, new, self.style, guess)
            ]
            if edits not in seen:
                seen.append(edits)
                yield guess.name, edits

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
                    raise Failed(
                        f"it conflicts with {owner}: it targets {lines}, text that one "
                        "already changed; merge the two into one modification."
                    )

    def _commit(
        self, guesses: Iterator[tuple[str, list[Edit]]], label: str, notes: list[str]
    ) -> None:
        problem, tried = "", []
        for attempt, (name, edits) in enumerate(guesses):
            tried.append(name)
            text, regions = _splice(self.text, edits)
            problem = self._syntax_problem(text, edits)
            if not problem:
                if attempt:
                    notes.append(
                        f"would not parse as written; it was applied with {name} instead."
                    )
                self._shift_touched(edits)
                self.touched += [(start, end, label) for start, end in regions]
                self.text = text
                return
        ways = "; ".join(tried) if len(tried) > 1 else "as is"
        raise Failed(
            f"the result would not parse as Python ({problem}); placements tried: {ways}. "
            "Check the indentation and brackets of new_string."
        )

    def _syntax_problem(self, text: str, edits: list[Edit]) -> str:
        """Why ``text`` no longer parses, or '' (also when the text before did not parse)."""
        if not self.python:
            return ""
        return chunks.syntax_problem(self.text, text, edits, self._parses)

    def _parses(self) -> bool:
        """Whether the text parses as a whole; asked at most once per call."""
        if self.parses is None:
            self.parses = not chunks.syntax_error(self.text)
        return self.parses

    def _shift_touched(self, edits: list[Edit]) -> None:
        shifted = []
        for start, end, owner in self.touched:
            delta = chunks.moved(start, edits) - start
            shifted.append((start + delta, end + delta, owner))
        self.touched = shifted


def _confident(found: tuple[Match, ...] | NoMatch | Ambiguous) -> bool:
    return isinstance(found, tuple) and all(match.level != "fuzzy" for match in found)


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


def _splice(text: str, edits: list[Edit]) -> tuple[str, list[tuple[int, int]]]:
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


