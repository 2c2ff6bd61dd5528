"""How a file indents, and moving a replacement to the indentation of what it replaces.

Models copy code at the wrong depth, with tabs in a file of spaces, or with the first
line taken from mid-line; the replacement they write shares those faults. The offsets
measured between the matched lines and ``old_string`` move ``new_string`` back to where
the file has the code, written with the file's own indentation characters.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kernelfix.engine.match import text_view


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


# Indentation guesses for a replacement, in order; the later ones are tried only for
# Python files whose result did not parse.
GUESSES = (
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
    lines: Sequence[str], first_shift: int, rest_shift: int, style: Style, guess: int
) -> list[str]:
    """Lines of new_string at the file's indentation, per guess (see ``GUESSES``)."""
    out = []
    lead = next((i for i, line in enumerate(lines) if line.strip()), 0)
    for index, line in enumerate(lines):
        if not line.strip():
            out.append("")
        elif guess == 2 or (guess == 1 and index > lead):
            out.append(line)
        else:
            out.append(restyle(line, first_shift if index == lead else rest_shift, style))
    return out


def restyle(line: str, shift: int, style: Style) -> str:
    """``line`` moved ``shift`` columns, its indentation written in the file's style."""
    prefix = indent_of(line)
    if shift == 0 and style.fits(prefix):
        return line
    return style.render(max(0, style.width(prefix) + shift)) + line[len(prefix) :]
