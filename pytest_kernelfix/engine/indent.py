"""How a file indents, and moving a replacement to the indentation of what it replaces.

Models copy code at the wrong depth, with tabs in a file of spaces, or with the first
line taken from mid-line; the replacement they write shares those faults. The offsets
measured between the matched lines and ``old_string`` move ``new_string`` back to where
the file has the code, written with the file's own indentation characters.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kernelfix.engine.match import THRESHOLD, text_view


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


def has_leading_tab(text: str) -> bool:
    """Whether some line of ``text`` is indented with a tab."""
    return bool(_LEADING_TAB.search(text))


def indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


# How a replacement of whole lines may be indented, in order; the later ones are tried
# only for Python files whose result did not parse.
INDENTATIONS = (
    "new_string moved by as much as old_string was off",
    "only its first line moved and the rest as written",
    "new_string exactly as written",
)


def shifts(file_lines: Sequence[str], old_lines: Sequence[str], style: Style) -> tuple[int, int]:
    """How far the matched lines sit from old_string: for its first line, and the rest.

    The first line gets its own shift because models often copy it from mid-line
    (without its indentation) while the other lines keep theirs.
    """
    found = [style.width(indent_of(line)) for line in file_lines if line.strip()]
    wrote = [style.width(indent_of(line)) for line in old_lines if line.strip()]
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


def reindent(
    new_lines: Sequence[str],
    old_lines: Sequence[str],
    file_lines: Sequence[str],
    style: Style,
    mode: int,
    reference: tuple[Sequence[str], Sequence[str]] | None = None,
) -> list[str]:
    """Lines of new_string at the file's indentation, per mode (see ``INDENTATIONS``).

    ``old_lines`` were matched to ``file_lines``; ``reference`` (file lines, old lines)
    measures the shifts instead when only part of them correspond (an elided search).
    In the first mode a line the model did not move lands where the file has it (see
    :func:`placements`); the others move by the shifts of :func:`shifts`.
    """
    first_shift, rest_shift = shifts(*(reference or (file_lines, old_lines)), style)
    placed = placements(new_lines, old_lines, file_lines, style) if mode == 0 else {}
    out = []
    lead = next((i for i, line in enumerate(new_lines) if line.strip()), 0)
    for index, line in enumerate(new_lines):
        if not line.strip():
            out.append("")
        elif mode == 2 or (mode == 1 and index > lead):
            out.append(line)
        elif index in placed:
            out.append(placed[index])
        else:
            out.append(restyle(line, first_shift if index == lead else rest_shift, style))
    return out


def placements(
    new_lines: Sequence[str], old_lines: Sequence[str], file_lines: Sequence[str], style: Style
) -> dict[int, str]:
    """The lines of new_string the model did not move, as they land in the file.

    A new line paired with an old line (the same line, or the one it replaced) that the
    model left as it was is the file's line, byte for byte; one it changed but kept at
    the old line's indentation gets the file line's indentation. A block shift would move
    such a line whenever the model mis-copied its indentation alone (a continuation line
    inside parentheses, say), though the model never meant to move it.
    """
    file_of = _partners(old_lines, file_lines, similar=True)
    out = {}
    for new_index, old_index in _partners(new_lines, old_lines, similar=False).items():
        if old_index not in file_of:
            continue
        new, old, found = new_lines[new_index], old_lines[old_index], file_lines[file_of[old_index]]
        if new.rstrip() == old.rstrip():
            out[new_index] = found
        elif style.width(indent_of(new)) == style.width(indent_of(old)):
            out[new_index] = indent_of(found) + new.lstrip(" \t")
    return out


def _partners(a: Sequence[str], b: Sequence[str], *, similar: bool) -> dict[int, int]:
    """Which non-blank line of ``b`` each non-blank line of ``a`` corresponds to.

    Lines equal up to whitespace pair up in order; so do the lines of a changed run when
    both sides of it have as many lines, and when ``similar`` only where the two are alike
    (a fuzzy match may set unrelated lines side by side).
    """
    a_index = [i for i, line in enumerate(a) if line.strip()]
    b_index = [i for i, line in enumerate(b) if line.strip()]
    a_keys = [" ".join(a[i].split()) for i in a_index]
    b_keys = [" ".join(b[i].split()) for i in b_index]
    out = {}
    opcodes = difflib.SequenceMatcher(None, a_keys, b_keys, autojunk=False).get_opcodes()
    for tag, a1, a2, b1, b2 in opcodes:
        if tag == "equal" or (tag == "replace" and a2 - a1 == b2 - b1):
            for k in range(a2 - a1):
                if tag == "equal" or not similar or _alike(a_keys[a1 + k], b_keys[b1 + k]):
                    out[a_index[a1 + k]] = b_index[b1 + k]
    return out


def _alike(a: str, b: str) -> bool:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() >= _ALIKE


_ALIKE = THRESHOLD  # the fuzzy level's own threshold


def restyle(line: str, shift: int, style: Style) -> str:
    """``line`` moved ``shift`` columns, its indentation written in the file's style."""
    prefix = indent_of(line)
    if shift == 0 and style.fits(prefix):
        return line
    return style.render(max(0, style.width(prefix) + shift)) + line[len(prefix) :]
