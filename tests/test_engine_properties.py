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
