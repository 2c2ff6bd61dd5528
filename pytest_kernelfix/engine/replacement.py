"""What replaces one match: the span spliced out and the text spliced in.

Line breaks at the ends of ``old_string`` and ``new_string`` mean what they mean to
``str.replace``, at every level. An exact match is replaced by ``new_string`` as
written, unless it is whole lines whose first one was copied without its indentation:
those are re-indented like the other levels' matches. A match of whole lines takes in
the line breaks (and blank lines) that ``old_string`` quotes at its ends, where the file
has them, and puts back the ones ``new_string`` has: a quote whose last line was deleted
but whose line break was kept leaves that line break in the file, as a plain replacement
would. Inside the lines, ``new_string`` is re-indented (:mod:`~pytest_kernelfix.engine.indent`).

Exceptions, all what a user means: a line break that a non-blank ``new_string`` dropped
from its end is kept (so is one dropped from its start where it ends a line the quote
leaves in the file): ``str.replace`` would join two lines, which no model means; a blank
``new_string`` on whole lines deletes those lines with their terminator; and later
guesses (tried only when a Python result does not parse) re-indent differently or keep
the file's line breaks at the ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kernelfix.engine.indent import INDENTATIONS, Style, reindent, restyle
from pytest_kernelfix.engine.match import Match, TextView, is_elision, text_view


@dataclass(frozen=True)
class Edit:
    """Replace ``text[start:end]`` with ``replacement``."""

    start: int
    end: int
    replacement: str


class Failed(Exception):
    """A modification could not be applied; the message is the model-facing reason."""


@dataclass(frozen=True)
class Guess:
    """One way to place a replacement: an indentation (``INDENTATIONS``) and its ends.

    ``literal``: an exact match of whole lines gets new_string as written, like
    ``str.replace``; the other levels have no such choice and ignore it.
    """

    indent: int
    keep_breaks: bool = False
    literal: bool = False

    @property
    def name(self) -> str:
        name = "new_string as written" if self.literal else INDENTATIONS[self.indent]
        return name + (" and the file's line breaks at its ends kept" if self.keep_breaks else "")


# The first guess is the plain replacement; a Python file whose result does not parse
# gets the next ones, in order.
GUESSES = (
    Guess(0, literal=True),
    Guess(0, keep_breaks=True, literal=True),
    *(Guess(indent, keep) for indent in range(len(INDENTATIONS)) for keep in (False, True)),
)


def edits_for(
    text: str, match: Match, old: str, new: str, style: Style, guess: Guess
) -> list[Edit]:
    """The edits that replace one match; an elided match keeps what it elided."""
    if not match.parts:
        return [_edit(text, match, old, new, style, guess)]
    old_parts = _elided_pieces(old)
    new_parts = _elided_pieces(new)
    if len(new_parts) == len(old_parts):
        # A piece that an elision line follows does not end where the quote ends.
        closed = -1 if _elides_at_end(old.split("\n")) else len(old_parts) - 1
        olds, news = map("\n".join, old_parts), map("\n".join, new_parts)
        pieces = enumerate(zip(match.parts, olds, news, strict=True))
        return [
            _edit(text, part, o, n, style, guess, literal=False, open_end=index != closed)
            for index, (part, o, n) in pieces
        ]
    if len(new_parts) > 1:
        raise Failed(
            f"old_string elides code in {len(old_parts)} pieces but new_string has "
            f"{len(new_parts)}; keep the same '...' lines in both, or write new_string in full."
        )
    head = match.parts[0]
    first, last, _ = _core_lines(text, head)
    reference = (text_view(text).raw[first : last + 1], _edges(old_parts[0])[1])
    whole = Match(match.start, match.end, head.level, match.score)
    return [_edit(text, whole, old, new, style, guess, reference=reference, literal=False)]


def placeholder(line: str) -> bool:
    """An elision comment: never real code, unlike a bare ``...`` (Python's Ellipsis)."""
    return is_elision(line) and line.lstrip().startswith(("#", "//"))


def _elided_pieces(text: str) -> list[list[str]]:
    """The lines between elision lines, blank lines at their edges kept (they count)."""
    pieces: list[list[str]] = [[]]
    for line in text.split("\n"):
        if is_elision(line):
            pieces.append([])
        else:
            pieces[-1].append(line)
    return [piece for piece in pieces if any(line.strip() for line in piece)]


def _edit(
    text: str,
    match: Match,
    old: str,
    new: str,
    style: Style,
    guess: Guess,
    *,
    reference: tuple[Sequence[str], Sequence[str]] | None = None,
    literal: bool = True,
    open_end: bool = False,
) -> Edit:
    """One match's edit. ``literal``: ``old`` is exactly what the match searched for;
    ``open_end``: an elision line follows ``old`` in the quote."""
    first, last, whole = _core_lines(text, match)
    deletes = not new.strip() and "\n" not in new
    if not whole:
        if not literal:  # a piece of an elided search, found inside a line
            old, new = ("\n".join(_edges(s.split("\n"))[1]) for s in (old, new))
        return _plain(text, match, old, new, style, guess.keep_breaks)
    if match.level == "exact" and literal and guess.literal and not deletes:
        view = text_view(text)
        indent = text[view.starts[view.line_of(match.start)] : match.start]
        if not indent or indent.strip():  # not lines copied without their indentation
            return _plain(text, match, old, new, style, guess.keep_breaks)
    return _whole_lines(text, first, last, old, new, style, guess, reference, open_end)


def _core_lines(text: str, match: Match) -> tuple[int, int, bool]:
    """First and last line of the match's text without its blank edges, and whether
    that text is whole lines (only whitespace beside it on those lines)."""
    view = text_view(text)
    span = text[match.start : match.end]
    start = match.start + len(span) - len(span.lstrip())
    end = max(start + 1, match.start + len(span.rstrip()))
    first, last = view.line_of(start), view.line_of(end - 1)
    whole = not text[view.starts[first] : start].strip() and not text[end : view.end(last)].strip()
    return first, last, whole


def _plain(text: str, match: Match, old: str, new: str, style: Style, keep_breaks: bool) -> Edit:
    """``new`` exactly where ``old`` was, in the file's newline and indentation characters."""
    at_line_start = match.start == 0 or text[match.start - 1] == "\n"
    if keep_breaks:
        new = _with_breaks(new, old)
    else:
        new = _restored(old, new, joins_before=not at_line_start)
    lines = new.split("\n")
    head = restyle(lines[0], 0, style) if at_line_start else lines[0]
    rest = [restyle(line, 0, style) for line in lines[1:]]
    return Edit(match.start, match.end, style.newline.join([head, *rest]))


def _restored(old: str, new: str, *, joins_before: bool) -> str:
    """``new`` with the line breaks it dropped from its ends put back, if it has text.

    A line break ends the line before it. The one ``old`` ends with ends its last line,
    which ``new`` rewrote, so the replacement ends where the quote ended (blank lines
    quoted before that point go, as quoted). The one ``old`` starts with ends the line
    before the quote: kept only when that line keeps text outside the quote
    (``joins_before``); an empty line the quote covers whole goes, as quoted.
    """
    if not new.strip():
        return new
    if _break_at_end(old) and not _break_at_end(new):
        new += old[old.rindex("\n") :]
    if joins_before and _break_at_start(old) and not _break_at_start(new):
        new = old[: old.index("\n") + 1] + new
    return new


def _break_at_end(text: str) -> bool:
    """Whether a line break follows the last non-blank character (blanks around it aside)."""
    return "\n" in text[len(text.rstrip()) :]


def _break_at_start(text: str) -> bool:
    return "\n" in text[: len(text) - len(text.lstrip())]


def _with_breaks(new: str, old: str) -> str:
    """``new`` with the blank lines and line breaks at its ends taken from ``old``."""
    old_lead, _, old_tail = _edges(old.split("\n"))
    _, core, _ = _edges(new.split("\n"))
    if not core:
        return new
    return "\n" * old_lead + "\n".join(core) + "\n" * old_tail


def _whole_lines(
    text: str,
    first: int,
    last: int,
    old: str,
    new: str,
    style: Style,
    guess: Guess,
    reference: tuple[Sequence[str], Sequence[str]] | None,
    open_end: bool = False,
) -> Edit:
    """Replace lines ``first..last``, plus the line breaks old_string quotes around them.

    ``k`` line breaks quoted at an end take in ``c = min(k, room)`` of the file's (the
    room being the breaks up to the next code); the replacement puts back the ``j`` that
    new_string has, less the ``k - c`` the file lacked: the plain replacement of the span
    old_string stands for. A blank new_string without a line break deletes the lines.
    A non-blank one that dropped the line break old_string ends with gets one back (see
    :func:`_restored`); where it would otherwise be joined onto a line of the file outside
    the match, at its start or at an end next to an elision line (``open_end``), too.
    """
    view = text_view(text)
    open_end = open_end or _elides_at_end(old.split("\n"))
    old_lines, new_lines = _unframed(old.split("\n"), new.split("\n"))
    k_lead, old_core, k_tail = _edges(old_lines)
    j_lead, new_core, j_tail = _edges(new_lines)
    room_lead, room_tail = _room(view, first, last)
    c_lead, c_tail = min(k_lead, room_lead), min(k_tail, room_tail)
    if guess.keep_breaks:
        j_lead, j_tail = k_lead, k_tail
    elif new_core:  # line breaks new_string dropped from its ends, as in _restored
        j_lead = j_lead or _onto(view, first - c_lead, c_lead)
        j_tail = j_tail or (_onto(view, last + c_tail, c_tail) if open_end else min(k_tail, 1))
    if not new_core and len(new_lines) == 1:
        return _deletion(view, first, last, c_lead, c_tail)
    if new_core:
        body = reindent(
            new_core, old_core, view.raw[first : last + 1], style, guess.indent, reference
        )
        lead, tail = _kept(j_lead, k_lead, c_lead), _kept(j_tail, k_tail, c_tail)
    else:  # only line breaks: as many as new_string has, less those the file lacked
        body, lead = [], max(0, len(new_lines) - 1 - (k_lead - c_lead) - (k_tail - c_tail))
        tail = 0
    newline = style.newline
    replacement = newline * lead + newline.join(body) + newline * tail
    start = view.end(first - c_lead) if c_lead else view.starts[first]
    end = view.starts[last + c_tail] if c_tail else view.end(last)
    return Edit(start, end, replacement)


def _unframed(old: list[str], new: list[str]) -> tuple[list[str], list[str]]:
    """Old and new lines without the elision lines that frame old_string at its ends.

    Such a line stands for code beyond the match, together with the line break between
    it and the quote; new_string's own elision line at the same end goes with it.
    """
    for edge in (0, -1):
        while (outer := _outer(old, edge)) is not None and is_elision(old[outer]):
            old = old[outer + 1 :] if edge == 0 else old[:outer]
            mirror = _outer(new, edge)
            if mirror is not None and is_elision(new[mirror]):
                new = new[mirror + 1 :] if edge == 0 else new[:mirror]
    return old, new


def _elides_at_end(lines: list[str]) -> bool:
    """Whether the last non-blank line is an elision: the text ends beyond the quote."""
    last = _outer(lines, -1)
    return last is not None and is_elision(lines[last])


def _onto(view: TextView, line: int, taken: int) -> int:
    """1 when a replacement without a line break at this end would be joined onto the
    text of ``line``: the match took line breaks up to it, and it is not empty."""
    return int(bool(taken and view.raw[line]))


def _outer(lines: list[str], edge: int) -> int | None:
    """Index of the outermost non-blank line at one end (0: the start, -1: the end)."""
    order = range(len(lines)) if edge == 0 else range(len(lines) - 1, -1, -1)
    return next((i for i in order if lines[i].strip()), None)


def _edges(lines: list[str]) -> tuple[int, list[str], int]:
    """Line breaks before the first non-blank line, the lines from it to the last
    non-blank line, and line breaks after that (``"a\\n\\n"``: 0, ``["a"]``, 2)."""
    nonblank = [i for i, line in enumerate(lines) if line.strip()]
    if not nonblank:
        return 0, [], 0
    return nonblank[0], lines[nonblank[0] : nonblank[-1] + 1], len(lines) - 1 - nonblank[-1]


def _room(view: TextView, first: int, last: int) -> tuple[int, int]:
    """Line breaks between lines ``first..last`` and the code (or file edge) around them."""
    raw = view.raw
    before = first - 1
    while before >= 0 and not raw[before].strip():
        before -= 1
    after = last + 1
    while after < len(raw) and not raw[after].strip():
        after += 1
    return first - max(before, 0), (after if after < len(raw) else len(raw) - 1) - last


def _kept(wanted: int, quoted: int, taken: int) -> int:
    """Line breaks to write at one end: new_string's, less the quoted ones the file
    lacked; never none where breaks were taken and new_string has some (that would join
    two lines because old_string quoted a blank line that is not there)."""
    return max(wanted - (quoted - taken), 1 if wanted and taken else 0)


def _deletion(view: TextView, first: int, last: int, c_lead: int, c_tail: int) -> Edit:
    """Remove whole lines and the blank lines quoted around them, with one terminator.

    Breaks taken at both ends would join the lines around the deletion: one stays.
    """
    if c_lead and c_tail:
        c_tail -= 1
    if c_lead:
        end = view.starts[last + c_tail] if c_tail else view.end(last)
        return Edit(view.end(first - c_lead), end, "")
    if c_tail:
        return Edit(view.starts[first], view.starts[last + c_tail], "")
    if last + 1 < len(view.starts):
        return Edit(view.starts[first], view.starts[last + 1], "")
    if first > 0:
        return Edit(view.end(first - 1), view.end(last), "")
    return Edit(0, len(view.text), "")
