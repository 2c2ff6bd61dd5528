"""Properties of the edit engine over generated files (hypothesis).

Files are built from a small vocabulary so that lines repeat, at several indentation
depths, so uniqueness, ambiguity and re-indentation are all exercised.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pytest_kernelfix.engine.match import Match, find_match, line_span
from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.engine.splice import apply_modifications, unified_diff

TOKENS = ["x", "y", "acc", "=", "+", "*", "1", "2", "tl.load(p)", "mask", "offs", "(", ")", ":"]
LINE = st.builds(
    lambda depth, words: "    " * depth + " ".join(words),
    st.integers(0, 3),
    st.lists(st.sampled_from(TOKENS), min_size=1, max_size=5),
)
FILE = st.tuples(st.lists(LINE, min_size=1, max_size=30), st.booleans())
PROPERTY = settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
)


def join(lines: list[str], trailing_newline: bool) -> str:
    return "\n".join(lines) + ("\n" if trailing_newline else "")


def occurrences(text: str, part: str) -> int:
    count, position = 0, text.find(part)
    while position >= 0:
        count, position = count + 1, text.find(part, position + 1)
    return count


def line_start(lines: list[str], index: int) -> int:
    return sum(len(line) + 1 for line in lines[:index])


def reindent(lines: list[str], shift: int, tabs: bool) -> list[str]:
    """Move every line by ``shift`` levels (never below column 0), optionally with tabs."""
    out = []
    for line in lines:
        body = line.lstrip(" ")
        levels = max(0, (len(line) - len(body)) // 4 + shift)
        out.append(("\t" if tabs else "    ") * levels + body)
    return out


@st.composite
def file_and_block(draw: st.DrawFn) -> tuple[list[str], bool, int, int]:
    lines, trailing = draw(FILE)
    first = draw(st.integers(0, len(lines) - 1))
    last = draw(st.integers(first, min(len(lines) - 1, first + 5)))
    return lines, trailing, first, last


@PROPERTY
@given(file_and_block())
def test_a_unique_exact_block_lands_on_exactly_its_span(
    case: tuple[list[str], bool, int, int],
) -> None:
    lines, trailing, first, last = case
    content = join(lines, trailing)
    block = "\n".join(lines[first : last + 1])
    assume(occurrences(content, block) == 1)
    found = find_match(content, block)
    assert isinstance(found, Match)
    assert found.level == "exact"
    start = line_start(lines, first)
    assert (found.start, found.end) == (start, start + len(block))

    result = apply_modifications(content, [Modification(block, block + " CHANGED")], path="k.txt")
    assert result.success, result.errors
    assert result.code == content[: found.end] + " CHANGED" + content[found.end :]


@PROPERTY
@given(file_and_block(), st.integers(-3, 3), st.booleans())
def test_a_reindented_unique_block_lands_on_the_same_lines(
    case: tuple[list[str], bool, int, int], shift: int, tabs: bool
) -> None:
    lines, trailing, first, last = case
    content = join(lines, trailing)
    size = last - first + 1
    trimmed = [line.strip() for line in lines]
    wanted = trimmed[first : last + 1]
    assume(sum(trimmed[i : i + size] == wanted for i in range(len(lines))) == 1)
    depths = [(len(line) - len(line.lstrip(" "))) // 4 for line in lines[first : last + 1]]
    assume(min(depths) + shift >= 0)  # the block's own shape survives the move

    moved = reindent(lines[first : last + 1], shift, tabs)
    found = find_match(content, "\n".join(moved))
    assert isinstance(found, Match)
    assert line_span(content, found) == (first + 1, last + 1)
    end_of_block = line_start(lines, last) + len(lines[last])
    assert found.end == end_of_block
    indent = len(lines[first]) - len(lines[first].lstrip(" "))
    assert line_start(lines, first) <= found.start <= line_start(lines, first) + indent

    # The replacement, written at the moved indentation, lands at the file's.
    new = [*moved[:-1], moved[-1] + " + 1"]
    result = apply_modifications(
        content, [Modification("\n".join(moved), "\n".join(new))], path="k.txt"
    )
    assert result.success, result.errors
    expected = [*lines[:last], lines[last] + " + 1", *lines[last + 1 :]]
    assert result.code == join(expected, trailing)


FOREIGN = st.lists(
    st.text(alphabet="QZKVW#0123456789", min_size=3, max_size=30), min_size=1, max_size=6
)


@PROPERTY
@given(FILE, FOREIGN)
def test_text_that_is_not_in_the_file_changes_nothing(
    file: tuple[list[str], bool], foreign: list[str]
) -> None:
    content = join(*file)
    search = "\n".join(foreign)
    result = apply_modifications(content, [Modification(search, "replacement")], path="k.txt")
    assert result.code == content and result.diff == ""
    assert result.levels == ("none",) and not result.success
    assert "levels tried: exact, trimmed, whitespace, fuzzy" in result.errors[0]


@PROPERTY
@given(FILE, st.integers(0, 29), st.sampled_from(["", "  ", "\t"]))
def test_a_line_that_repeats_is_never_applied_without_disambiguation(
    file: tuple[list[str], bool], index: int, pad: str
) -> None:
    lines, trailing = file
    line = lines[index % len(lines)]
    content = join([*lines, line], trailing)
    search = pad + line.strip()
    result = apply_modifications(content, [Modification(search, "CHANGED")], path="k.txt")
    assert result.code == content and result.levels == ("none",)


DIFF_TEXT = st.lists(st.sampled_from(["a", "b", "c", "", "d = 1", "    e"]), max_size=12)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@settings(max_examples=25, deadline=None)
@given(DIFF_TEXT, DIFF_TEXT, st.booleans(), st.booleans(), st.booleans())
def test_git_apply_reproduces_the_after_text(
    before: list[str], after: list[str], end_before: bool, end_after: bool, crlf: bool
) -> None:
    newline = "\r\n" if crlf else "\n"
    old = newline.join(before) + (newline if end_before and before else "")
    new = newline.join(after) + (newline if end_after and after else "")
    diff = unified_diff(old, new, "dir/k.py")
    assert (diff == "") == (old == new)
    if not diff:
        return
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "dir" / "k.py"
        target.parent.mkdir()
        target.write_bytes(old.encode())
        subprocess.run(
            ["git", "apply", "--unsafe-paths", "--directory=", "-"],
            cwd=tmp,
            input=diff.encode(),
            check=True,
            capture_output=True,
        )
        assert target.read_bytes() == new.encode()


# --- line breaks at the ends of a quote ---------------------------------------------------

BLANK = st.sampled_from(["", "", "    "])
ROUGH_FILE = st.tuples(st.lists(st.one_of(LINE, BLANK), min_size=1, max_size=24), st.booleans())
NEW_LINES = st.lists(st.one_of(LINE, BLANK, st.sampled_from(["x = 1", "acc + 2"])), max_size=4)


def is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


@st.composite
def offset(draw: st.DrawFn, text: str) -> int:
    """Any offset, or one at a line boundary (those are where line breaks get lost)."""
    starts = [0, *(i + 1 for i, ch in enumerate(text) if ch == "\n")]
    ends = [i for i, ch in enumerate(text) if ch == "\n"] + [len(text)]
    return draw(
        st.one_of(
            st.integers(0, len(text)), st.sampled_from(starts), st.sampled_from(ends)
        )
    )


@st.composite
def edge_breaks(draw: st.DrawFn) -> tuple[str, str]:
    return "\n" * draw(st.integers(0, 2)), "\n" * draw(st.integers(0, 2))


@st.composite
def exact_quote(draw: st.DrawFn) -> tuple[str, str, str]:
    """A file, a substring of it that occurs once, and an arbitrary new_string."""
    lines, trailing = draw(ROUGH_FILE)
    text = join(lines, trailing)
    a, b = sorted((draw(offset(text)), draw(offset(text))))
    old = text[a:b]
    assume(old.strip() and occurrences(text, old) == 1)
    # Like str.replace, the engine takes a quote that cuts no identifier in two; one that
    # starts with indentation means lines unless it is whole lines (see match._PHASES),
    # and one that starts right after a line's indentation is lines copied without it.
    assume(not (a > 0 and is_word(text[a - 1]) and is_word(text[a])))
    assume(not (b < len(text) and is_word(text[b - 1]) and is_word(text[b])))
    whole = (a == 0 or text[a - 1] == "\n") and (b == len(text) or "\n" in (text[b - 1], text[b]))
    assume(old[0] not in " \t" or whole)
    before = text[text.rfind("\n", 0, a) + 1 : a]
    assume(not before or before.strip())
    lead, tail = draw(edge_breaks())
    new = lead + "\n".join(draw(NEW_LINES)) + tail
    assume(new != old and (new.strip() or "\n" in new))  # blank: a deletion, tested below
    return text, old, new


def intended(text: str, old: str, new: str) -> str:
    """What replaces the quote: new_string, with the line breaks it dropped put back.

    A non-blank new_string without a line break after its text, for a quote with one,
    ends where the quote ended (its last line break and what follows it); one without a
    line break before its text, for a quote that starts with one ending a line it leaves
    in the file, starts where the quote started. Everything else is ``str.replace``.
    """
    if not new.strip():
        return new
    if "\n" in old[len(old.rstrip()) :] and "\n" not in new[len(new.rstrip()) :]:
        new += old[old.rindex("\n") :]
    start = text.index(old)
    head = old[: len(old) - len(old.lstrip())]
    joins = start > 0 and text[start - 1] != "\n"
    if joins and "\n" in head and "\n" not in new[: len(new) - len(new.lstrip())]:
        new = old[: old.index("\n") + 1] + new
    return new


@PROPERTY
@given(exact_quote(), st.booleans())
def test_an_exact_quote_is_replaced_like_str_replace_keeping_dropped_line_breaks(
    case: tuple[str, str, str], crlf: bool
) -> None:
    text, old, new = case
    replacement = intended(text, old, new)
    if crlf:
        assume("\n" in text)  # a file without line breaks has no newline style to follow
        text = text.replace("\n", "\r\n")
    result = apply_modifications(text, [Modification(old, new)], path="k.txt")
    assert result.success, result.errors
    assert result.levels == ("exact",)
    newline = "\r\n" if crlf else "\n"
    expected = text.replace(old.replace("\n", newline), replacement.replace("\n", newline), 1)
    assert result.code == expected


@PROPERTY
@given(exact_quote())
def test_an_exact_quote_ending_with_a_line_break_keeps_it(case: tuple[str, str, str]) -> None:
    text, old, new = case
    new = new.rstrip()  # the model dropped the line break (and any blank line) at the end
    assume(old.endswith("\n") and new.strip())
    assume("\n" not in old[: len(old) - len(old.lstrip())])  # the start is another rule
    result = apply_modifications(text, [Modification(old, new)], path="k.txt")
    assert result.code == text.replace(old, new + "\n", 1)


@PROPERTY
@given(ROUGH_FILE, st.data(), st.booleans())
def test_a_blank_new_string_deletes_the_quoted_lines_whole(
    file: tuple[list[str], bool], data: st.DataObject, final_newline: bool
) -> None:
    lines, trailing = file
    text = join(lines, trailing)
    pieces = text.split("\n")
    first = data.draw(st.integers(0, len(pieces) - 1))
    last = data.draw(st.integers(first, min(len(pieces) - 1, first + 3)))
    assume(pieces[first].strip() and pieces[last].strip())
    end = "\n" if final_newline and last + 1 < len(pieces) else ""
    old = "\n".join(pieces[first : last + 1]) + end
    assume(occurrences(text, old) == 1)
    result = apply_modifications(text, [Modification(old, "")], path="k.txt")
    assert result.code == "\n".join(pieces[:first] + pieces[last + 1 :])


@PROPERTY
@given(
    st.lists(LINE, min_size=1, max_size=6),
    st.lists(LINE, max_size=6),
    st.lists(LINE, max_size=6),
    st.integers(0, 2),
    st.integers(0, 2),
    st.data(),
)
def test_line_breaks_at_the_ends_of_a_tolerant_match_are_a_plain_replacement(
    block: list[str],
    above: list[str],
    below: list[str],
    blank_above: int,
    blank_below: int,
    data: st.DataObject,
) -> None:
    text = join([*above, *[""] * blank_above, *block, *[""] * blank_below, *below], True)
    shift = data.draw(st.integers(-2, 2))
    tabs = data.draw(st.booleans())
    depths = [(len(line) - len(line.lstrip(" "))) // 4 for line in block]
    assume(min(depths) + shift >= 0)
    trimmed = [line.strip() for line in text.split("\n")]
    wanted = [line.strip() for line in block]
    size = len(block)
    assume(sum(trimmed[i : i + size] == wanted for i in range(len(trimmed))) == 1)
    keys = [" ".join(line.split()) for line in text.split("\n") if line.strip()]
    wanted_keys = [" ".join(line.split()) for line in block]
    assume(sum(keys[i : i + size] == wanted_keys for i in range(len(keys))) == 1)
    moved = reindent(block, shift, tabs)
    # A space doubled inside one line the model leaves as it is: the whitespace level.
    wide = data.draw(st.sampled_from([None, *range(len(block) - 1)]))
    if wide is not None:
        assume(" " in moved[wide].strip())
        body = moved[wide].lstrip()
        moved[wide] = moved[wide][: len(moved[wide]) - len(body)] + body.replace(" ", "  ", 1)
    exact = shift == 0 and not tabs and wide is None
    assume(exact or occurrences(text, "\n".join(moved)) == 0)
    # Quote up to as many blank lines as the file has, answer with any number of them.
    k_lead = data.draw(st.integers(0, blank_above))
    k_tail = data.draw(st.integers(0, blank_below))
    j_lead, j_tail = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))
    change = data.draw(st.sampled_from(["edit last", "drop last", "add line"]))
    fixed = list(block)
    if change == "edit last":
        fixed[-1] += " + 1"
    elif change == "drop last":
        assume(len(block) > 1)
        fixed.pop()
    else:
        fixed.append(block[-1].replace(block[-1].strip(), "acc = 0"))
    # The model's own copy of the lines it left alone, its fix re-indented like them.
    new_moved = [*moved[: len(block) - 1], *reindent(fixed, shift, tabs)[len(block) - 1 :]]
    old = "\n" * k_lead + "\n".join(moved) + "\n" * k_tail
    new = "\n" * j_lead + "\n".join(new_moved) + "\n" * j_tail
    result = apply_modifications(text, [Modification(old, new)], path="k.txt")
    assert result.success, result.errors
    start = len(join([*above, *[""] * blank_above], bool(above or blank_above))) - k_lead
    end = start + k_lead + len("\n".join(block)) + k_tail
    # A line break the quote ends with is kept where new_string drops it (the quote never
    # starts with the line break of a line of code here: k_lead <= blank_above).
    j_tail = j_tail or min(k_tail, 1)
    expected_new = "\n" * j_lead + "\n".join(fixed) + "\n" * j_tail
    assert result.code == text[:start] + expected_new + text[end:]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize(("old", "new"), [
    ("a\na\na\na\na", "b\na\na\na\na"),  # difflib alone ends the hunk in a change
    ("a\na\na\na\na\n", "a\na\na\na\nb\na\n"),
    ("x\na\na\na\na\na\ny", "x\na\na\nz\na\na\na\ny"),
])
def test_changes_among_repeated_lines_apply_with_git(old: str, new: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "k.py"
        target.write_bytes(old.encode())
        subprocess.run(["git", "apply", "--unsafe-paths", "-"], cwd=tmp, check=True,
                       input=unified_diff(old, new, "k.py").encode(), capture_output=True)
        assert target.read_bytes() == new.encode()
