"""Search/replace edits and the parser that reads them out of model answers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Modification:
    """Replace ``old_string`` with ``new_string``.

    ``anchor`` picks the first occurrence after the anchor text; ``replace_all`` replaces
    every occurrence; ``file`` names the target file (relative to the project root)
    when the fix spans several files.
    """

    old_string: str
    new_string: str
    reason: str = ""
    replace_all: bool = False
    anchor: str = ""
    file: str = ""


@dataclass(frozen=True)
class ParsedResponse:
    analysis: str
    modifications: tuple[Modification, ...]
    summary: str
    raw: str


class ParseError(ValueError):
    """The answer held no readable edits; the message can be sent back to the model."""


def parse_modifications(text: str) -> ParsedResponse:
    raise NotImplementedError("edit parsing is being written (issue 2)")
