"""Search/replace edits and the parser that reads them out of model answers.

Models answer in several dialects (a JSON object, fenced or not, a bare JSON list, aider
SEARCH/REPLACE blocks, AutoCodeRover ``<original>/<patched>`` blocks); every one of them
becomes the same tuple of :class:`Modification`. Parsing is faithful: strings are kept
as the model wrote them, and the edit engine copes with their quirks (CRLF, literal
``\\n``), because guessing here would corrupt legitimate code.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


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
    """An answer's edits, its prose, and ``need``: code the model asks to see next round
    (``"ops/act.py:silu"``, ``"search: BLOCK_SIZE_N"``)."""

    analysis: str
    modifications: tuple[Modification, ...]
    summary: str
    raw: str
    need: tuple[str, ...] = ()
    #: Why the failure is not a kernel bug, when the answer says so ("" otherwise).
    not_a_kernel_bug: str = ""


class ParseError(ValueError):
    """The answer held no readable edits; the message can be sent back to the model."""


FORMAT_HINT = (
    'Answer with one JSON object {"analysis": "...", "modifications": [{"old_string": '
    '"exact text copied from the file", "new_string": "its replacement", "reason": "..."}], '
    '"summary": "..."}, or with SEARCH/REPLACE blocks (a line "<<<<<<< SEARCH", the old '
    'lines, a line "=======", the new lines, a line ">>>>>>> REPLACE").'
)

_OLD_KEYS = ("old_string", "old", "search", "original")
_NEW_KEYS = ("new_string", "new", "replace", "replacement", "patched")
_FILE_KEYS = ("file", "path", "file_path", "filename")
_LIST_KEYS = ("modifications", "edits", "changes")
_NEED_KEYS = ("need", "needs")
_DECLINE_KEYS = ("not_a_kernel_bug", "not_kernel_bug")

_FENCE = re.compile(r"```[ \t]*([\w+.-]*)[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)
_TRAILING_COMMA = re.compile(r",(\s*[}\]])")
_SEARCH_REPLACE = re.compile(
    r"^[ \t]*<{5,9}[ \t]*SEARCH[^\n]*\n(.*?)"
    r"^[ \t]*={5,9}[ \t]*\n(.*?)"
    r"^[ \t]*>{5,9}[ \t]*REPLACE[^\n]*$",
    re.S | re.M,
)
_SEARCH_MARK = re.compile(r"^[ \t]*<{5,9}[ \t]*SEARCH", re.M)
_ACR = re.compile(r"<original>\n?(.*?)</original>\s*<patched>\n?(.*?)</patched>", re.S)
_ACR_FILE = re.compile(r"<file>\s*(.*?)\s*</file>", re.S)
_PATH_LIKE = re.compile(r"^[\w.\-/\\]+\.[A-Za-z0-9]+$")
_MAX_JSON_TRIES = 200


def parse_modifications(text: str) -> ParsedResponse:
    """Read the edits out of a model answer, whatever supported dialect it used.

    Raises :class:`ParseError` and nothing else: an answer is untrusted input, and one
    that breaks the reader (nested too deep for the JSON decoder, say) is a malformed
    answer to feed back, not a crash.
    """
    try:
        return _parse(text)
    except ParseError:
        raise
    except (RecursionError, MemoryError) as exc:
        raise ParseError(f"The answer could not be read: it is nested too deeply or too "
                         f"large ({type(exc).__name__}). {FORMAT_HINT}") from None
    except Exception as exc:  # a reader's own bug must not end the bug being healed
        raise ParseError(f"The answer could not be read ({type(exc).__name__}). "
                         f"{FORMAT_HINT}") from None


def _parse(text: str) -> ParsedResponse:
    if not text or not text.strip():
        raise ParseError(f"The answer was empty. {FORMAT_HINT}")
    json_problem = ""
    try:
        found = _parse_json(text)
    except ParseError as exc:
        found, json_problem = None, str(exc)
    if found is None:
        lf_text = text.replace("\r\n", "\n")
        found = (
            _parse_search_replace(lf_text, text)
            or _parse_acr(lf_text, text)
            or _parse_unified_diff(lf_text, text)
        )
    if found is not None:
        return found
    if json_problem:
        raise ParseError(json_problem)
    if _SEARCH_MARK.search(text):
        raise ParseError(
            "A SEARCH/REPLACE block is incomplete: each needs a '=======' line and a closing "
            f"'>>>>>>> REPLACE' line. {FORMAT_HINT}"
        )
    raise ParseError(f"No edits were found in the answer. {FORMAT_HINT}")


# --- JSON ------------------------------------------------------------------------------


def _parse_json(text: str) -> ParsedResponse | None:
    """The first JSON value in the answer that has the shape of edits, or None.

    A fenced ``json`` block that does not decode is reported (the model clearly meant
    JSON); stray braces in prose are not.
    """
    decoder = json.JSONDecoder(strict=False)
    fenced_error = ""
    for lang, body in _fenced_blocks(text):
        stripped = body.strip()
        if not stripped.startswith(("{", "[")):
            continue
        try:
            value = _decode_lenient(decoder, stripped)
        except RecursionError:
            if lang.lower() == "json" and not fenced_error:
                fenced_error = (f"The ```json block is nested too deeply to read. "
                                f"{FORMAT_HINT}")
            continue
        except json.JSONDecodeError as exc:
            if lang.lower() == "json" and not fenced_error:
                fenced_error = (
                    f"The ```json block is not valid JSON ({exc.msg} at line {exc.lineno}, "
                    f'column {exc.colno}). Escape newlines as \\n and quotes as \\" inside '
                    f"strings. {FORMAT_HINT}"
                )
            continue
        parsed = _from_json_value(value, text)
        if parsed is not None:
            return parsed
    for value in _bare_json_values(decoder, text):
        parsed = _from_json_value(value, text)
        if parsed is not None:
            return parsed
    if fenced_error:
        raise ParseError(fenced_error)
    return None


def _fenced_blocks(text: str) -> Iterator[tuple[str, str]]:
    for match in _FENCE.finditer(text):
        yield match.group(1), match.group(2)


def _decode_lenient(decoder: json.JSONDecoder, text: str) -> Any:
    """Decode, forgiving trailing commas (a frequent model slip) on a second try."""
    try:
        return decoder.raw_decode(text)[0]
    except json.JSONDecodeError:
        repaired = _TRAILING_COMMA.sub(r"\1", text)
        if repaired == text:
            raise
        return decoder.raw_decode(repaired)[0]


def _bare_json_values(decoder: json.JSONDecoder, text: str) -> Iterator[Any]:
    """Every JSON object or list that starts somewhere in the text and decodes."""
    tries = 0
    for match in re.finditer(r"[{\[]", text):
        start = match.start()
        if not _plausible_json_start(text, start):
            continue
        tries += 1
        if tries > _MAX_JSON_TRIES:
            return
        try:
            value = decoder.raw_decode(text, start)[0]
        except (json.JSONDecodeError, RecursionError):
            continue
        yield value


def _plausible_json_start(text: str, start: int) -> bool:
    rest = text[start + 1 : start + 64].lstrip()
    if text[start] == "{":
        return rest.startswith(('"', "}"))
    return rest.startswith(("{", "]"))


def _from_json_value(value: Any, raw: str) -> ParsedResponse | None:
    """A ParsedResponse when the value has the shape of edits, else None."""
    if isinstance(value, Mapping):
        key = next((key for key in _LIST_KEYS if key in value), None)
        need = _need(_pick(value, _NEED_KEYS))
        decline = _decline(_pick(value, _DECLINE_KEYS), _text_field(value.get("analysis")))
        if key is not None:
            items = value[key] if value[key] is not None else []
        elif _pick(value, _OLD_KEYS) is not None:
            items = [value]
        elif need or decline:  # a request for more code, or a decline: no edits
            items = []
        else:
            return None
        if isinstance(items, str):  # a list the model encoded as a JSON string
            with contextlib.suppress(json.JSONDecodeError):
                items = json.loads(items, strict=False)
        if isinstance(items, Mapping):
            items = [items]
        if not isinstance(items, list):
            raise ParseError(f'"modifications" must be a list of objects. {FORMAT_HINT}')
        return ParsedResponse(
            analysis=_text_field(value.get("analysis")),
            modifications=_modifications(items),
            summary=_text_field(value.get("summary")),
            raw=raw,
            need=need,
            not_a_kernel_bug=decline,
        )
    if isinstance(value, list) and value and all(isinstance(item, Mapping) for item in value):
        if not any(_pick(item, _OLD_KEYS) is not None for item in value):
            return None
        return ParsedResponse(analysis="", modifications=_modifications(value), summary="", raw=raw)
    return None


def _decline(value: Any, analysis: str) -> str:
    """``not_a_kernel_bug`` as its reason: the text given, or the analysis for ``true``."""
    if isinstance(value, str) and value.strip().lower() not in ("", "false", "no"):
        return value.strip()
    if value is True:
        return analysis.strip() or "the model says the failure is not a kernel bug"
    return ""


def _need(value: Any) -> tuple[str, ...]:
    """``need`` as a tuple of non-empty strings (one string or a list of them)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return ()
    return tuple(dict.fromkeys(item.strip() for item in value
                               if isinstance(item, str) and item.strip()))


def _modifications(items: list[Any]) -> tuple[Modification, ...]:
    return tuple(_modification(item, index) for index, item in enumerate(items))


def _modification(item: Any, index: int) -> Modification:
    where = f"modifications[{index}]"
    if not isinstance(item, Mapping):
        raise ParseError(f"{where} is not an object. {FORMAT_HINT}")
    old = _pick(item, _OLD_KEYS)
    new = _pick(item, _NEW_KEYS)
    if not isinstance(old, str):
        raise ParseError(f'{where} has no "old_string" text. {FORMAT_HINT}')
    if new is None:
        raise ParseError(
            f'{where} has no "new_string" (use "" to delete the old text). {FORMAT_HINT}'
        )
    if not isinstance(new, str):
        raise ParseError(f'{where} has a "new_string" that is not text. {FORMAT_HINT}')
    return Modification(
        old_string=old,
        new_string=new,
        reason=_text_field(item.get("reason")),
        replace_all=_flag(item.get("replace_all")),
        anchor=_text_field(item.get("anchor")),
        file=_text_field(_pick(item, _FILE_KEYS)),
    )


def _pick(item: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    return next((item[key] for key in keys if key in item), None)


def _text_field(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1")
    return bool(value)


# --- SEARCH/REPLACE and <original>/<patched> blocks ------------------------------------


def _parse_search_replace(text: str, raw: str) -> ParsedResponse | None:
    blocks = list(_SEARCH_REPLACE.finditer(text))
    if not blocks:
        return None
    modifications = []
    previous_end = 0
    for block in blocks:
        modifications.append(
            Modification(
                old_string=block.group(1),
                new_string=block.group(2),
                file=_file_above(text, previous_end, block.start()),
            )
        )
        previous_end = block.end()
    return ParsedResponse(
        analysis=_prose(text[: blocks[0].start()]),
        modifications=tuple(modifications),
        summary=_prose(text[blocks[-1].end() :]),
        raw=raw,
    )


def _file_above(text: str, floor: int, start: int) -> str:
    """The file name written on the last meaningful line before a block, if any."""
    for line in reversed(text[floor:start].split("\n")):
        stripped = line.strip()
        if not stripped or stripped.startswith("```"):
            continue
        candidate = stripped.strip("*`#: ").removeprefix("File").strip("*`#: ")
        return candidate if _PATH_LIKE.match(candidate) else ""
    return ""


def _parse_acr(text: str, raw: str) -> ParsedResponse | None:
    blocks = list(_ACR.finditer(text))
    if not blocks:
        return None
    files = [(m.start(), m.group(1)) for m in _ACR_FILE.finditer(text)]
    modifications = tuple(
        Modification(
            old_string=_drop_final_newline(block.group(1)),
            new_string=_drop_final_newline(block.group(2)),
            file=next((name for pos, name in reversed(files) if pos < block.start()), ""),
        )
        for block in blocks
    )
    first = min([blocks[0].start(), *(pos for pos, _ in files)])
    return ParsedResponse(
        analysis=_prose(text[:first]),
        modifications=modifications,
        summary=_prose(text[blocks[-1].end() :]),
        raw=raw,
    )


_HUNK_LINE = (" ", "-", "+")
_DIFF_START = ("diff --git ", "--- ", "+++ ", "@@")


def _parse_unified_diff(text: str, raw: str) -> ParsedResponse | None:
    """Hunks of a unified diff, read as search/replace pairs.

    Context and removed lines make ``old_string``, context and added lines
    ``new_string``; the line numbers in ``@@`` headers are ignored, since models count
    lines badly. A hunk without context or removed lines cannot be located: skipped.
    """
    lines = text.split("\n")
    modifications: list[Modification] = []
    file = ""
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        if line.startswith("+++ "):
            name = line[4:].split("\t")[0].strip()
            file = "" if name == "/dev/null" else name.removeprefix("b/")
            continue
        if not (line.startswith("@@") and line.count("@@") >= 2):
            continue
        old: list[str] = []
        new: list[str] = []
        while index < len(lines):
            body = lines[index]
            if body.startswith(("--- ", "+++ ", "@@")):
                break
            if body == "" and index + 1 < len(lines) and lines[index + 1][:1] in _HUNK_LINE:
                body = " "  # a blank context line whose leading space was lost
            if body.startswith("\\"):  # "\ No newline at end of file"
                index += 1
                continue
            if body[:1] not in _HUNK_LINE:
                break
            if body[0] != "+":
                old.append(body[1:])
            if body[0] != "-":
                new.append(body[1:])
            index += 1
        if any(line.strip() for line in old):
            modifications.append(
                Modification("\n".join(old), "\n".join(new), file=file)
            )
    if not modifications:
        return None
    first = next(n for n, line in enumerate(lines) if line.startswith(_DIFF_START))
    return ParsedResponse(
        analysis=_prose("\n".join(lines[:first])),
        modifications=tuple(modifications),
        summary="",
        raw=raw,
    )


def _drop_final_newline(value: str) -> str:
    return value[:-1] if value.endswith("\n") else value


def _prose(value: str) -> str:
    """Prose around blocks, without leftover fence lines."""
    lines = [line for line in value.strip().split("\n") if not line.strip().startswith("```")]
    return "\n".join(lines).strip()
