"""What replaces one match: the spliced span and the text that lands on it.

A match of whole lines gets ``new_string`` re-indented to the file's indentation (see
:mod:`~pytest_kernelfix.engine.indent`); a match inside a line gets it as written. An
elided match keeps the code it elided, and a blank ``new_string`` deletes whole lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kernelfix.engine.indent import Style, reindent, restyle, shifts
from pytest_kernelfix.engine.match import Match, Query, is_elision, line_span, text_view


@dataclass(frozen=True)
class Edit:
    """Replace ``text[start:end]`` with ``replacement``."""

    start: int
    end: int
    replacement: str


class Failed(Exception):
    """A modification could not be applied; the message is the model-facing reason."""


def edits_for(text: str, match: Match, old: str, new: str, style: Style, guess: int) -> list[Edit]:
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
        raise Failed(
            f"old_string elides code in {len(old_parts)} pieces but new_string has "
            f"{len(new_parts)}; keep the same '...' lines in both, or write new_string in full."
        )
    head = match.parts[0]
    reference = (_span_lines(text, head), Query.of("\n".join(old_parts[0])).lines)
    whole = Match(match.start, match.end, head.level, match.score)
    return [_edit(text, whole, old, new, style, guess, reference)]


def placeholder(line: str) -> bool:
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
) -> Edit:
    view = text_view(text)
    end = match.end
    if text[match.start : end].endswith("\n"):
        end -= 2 if text[match.start : end].endswith("\r\n") else 1
    first = view.line_of(match.start)
    last = view.line_of(max(match.start, end - 1))
    whole_lines = not text[view.starts[first] : match.start].strip() and end == view.end(last)
    if not whole_lines:
        return Edit(match.start, match.end, _inline(old, new, style))
    old_lines, new_lines = _aligned_lines(old, new)
    if not any(line.strip() for line in new_lines):
        return _deletion(text, first, last)
    file_lines, ref_old = reference or (view.raw[first : last + 1], old_lines)
    first_shift, rest_shift = shifts(file_lines, ref_old, style)
    body = reindent(new_lines, first_shift, rest_shift, style, guess)
    return Edit(view.starts[first], view.end(last), style.newline.join(body))


def _inline(old: str, new: str, style: Style) -> str:
    """A replacement inside a line: same line ending policy, the file's newline and tabs."""
    if old.endswith("\n") and new and not new.endswith("\n"):
        new += "\n"
    elif new.endswith("\n") and not old.endswith("\n"):
        new = new[:-1]
    lines = new.split("\n")
    rest = [restyle(line, 0, style) for line in lines[1:]]
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


def _deletion(text: str, first: int, last: int) -> Edit:
    """Remove whole lines together with one line terminator."""
    view = text_view(text)
    if last + 1 < len(view.starts):
        return Edit(view.starts[first], view.starts[last + 1], "")
    if first > 0:
        return Edit(view.end(first - 1), view.end(last), "")
    return Edit(0, len(text), "")


