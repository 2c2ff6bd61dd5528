"""The matcher: every level, its spans in the original text, and every refusal."""

from __future__ import annotations

import pytest
from rapidfuzz import fuzz

from pytest_kernelfix.engine.match import (
    Ambiguous,
    Match,
    NoMatch,
    find_all,
    find_match,
    line_span,
    nearest,
    nearest_fragment,
)

KERNEL = """\
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * scale, mask=mask)
"""


def matched(content: str, search: str, **kwargs: str) -> Match:
    found = find_match(content, search, **kwargs)
    assert isinstance(found, Match), getattr(found, "message", found)
    return found


def lines_of(content: str, found: Match) -> tuple[int, int]:
    return line_span(content, found)


# --- exact ---------------------------------------------------------------------------


def test_exact_returns_the_span_of_the_original() -> None:
    search = "    y = tl.load(y_ptr + offs, mask=mask)\n"
    found = matched(KERNEL, search)
    assert found.level == "exact"
    assert KERNEL[found.start : found.end] == search
    assert found.score == 1.0


def test_exact_twice_is_ambiguous_and_says_how_to_disambiguate() -> None:
    found = find_match(KERNEL, "x = tl.load(x_ptr + offs, mask=mask)")
    assert isinstance(found, Ambiguous)
    assert found.level == "exact"
    assert found.lines == ((10, 10), (20, 20))
    message = found.message
    assert "line 10" in message and "line 20" in message
    assert "replace_all" in message and "anchor" in message and "surrounding lines" in message


def test_a_very_ambiguous_search_names_a_dozen_places_and_counts_the_rest() -> None:
    found = find_match("x = 1\n" * 40, "x = 1")
    assert isinstance(found, Ambiguous) and len(found.lines) == 40
    assert "matches 40 places" in found.message and "line 12 and 28 more" in found.message


def test_exact_prefers_placements_that_do_not_cut_an_identifier() -> None:
    content = "max_x = 1\nx = 1\n"
    found = matched(content, "x = 1")
    assert found.start == content.index("\nx = 1") + 1


def test_exact_keeps_a_cut_placement_when_it_is_the_only_one() -> None:
    content = "max_x = 1\n"
    found = matched(content, "x = 1")
    assert content[found.start : found.end] == "x = 1"


def test_a_placement_cutting_a_line_of_code_loses_to_a_line_based_match() -> None:
    content = "    x = 1\n    y\n        x = 1\n        y = 2\n"
    # Re-indented, the search is literally inside lines 3-4 ("y" is a piece of "y = 2"),
    # but as whole lines it only fits lines 1-2.
    found = matched(content, "        x = 1\n        y")
    assert found.level == "trimmed" and lines_of(content, found) == (1, 2)


def test_a_search_starting_inside_deeper_indentation_is_not_aligned() -> None:
    content = "    x = 1\n        x = 1\n"
    found = matched(content, "    x = 1\n")
    assert (found.start, found.end) == (0, 10)


def test_inline_multi_line_placement_is_used_when_nothing_else_fits() -> None:
    content = "y = 0\nx = foo(a,\n    b)  # keep\n"
    found = matched(content, "foo(a,\n    b)")
    assert found.level == "exact"
    assert content[found.start : found.end] == "foo(a,\n    b)"


def test_overlapping_exact_placements_are_still_ambiguous() -> None:
    found = find_match("a\na\na\n", "a\na")
    assert isinstance(found, Ambiguous)
    assert found.lines == ((1, 2), (2, 3))


# --- trimmed and whitespace ---------------------------------------------------------


def test_trimmed_matches_a_dedented_search_and_spans_whole_lines() -> None:
    search = "x = tl.load(x_ptr + offs, mask=mask)\ny = tl.load(y_ptr + offs, mask=mask)"
    found = matched(KERNEL, search)
    assert found.level == "trimmed"
    assert KERNEL[found.start : found.end] == (
        "    x = tl.load(x_ptr + offs, mask=mask)\n    y = tl.load(y_ptr + offs, mask=mask)"
    )


def test_trimmed_ignores_trailing_whitespace_and_blank_edges() -> None:
    search = (
        "\n\n    mask = offs < n   \n    x = tl.load(x_ptr + offs, mask=mask)\t\n"
        "    y = tl.load(y_ptr + offs, mask=mask)  \n\n"
    )
    found = matched(KERNEL, search)
    assert found.level == "trimmed"
    assert lines_of(KERNEL, found) == (9, 11)


def test_trimmed_needs_the_same_blank_lines_but_whitespace_does_not() -> None:
    content = "a = 1\n\nb = 2\nc = 3\n"
    found = matched(content, "a = 1\nb = 2")
    assert found.level == "whitespace"
    assert content[found.start : found.end] == "a = 1\n\nb = 2"


def test_whitespace_level_treats_runs_of_blanks_and_tabs_as_one_space() -> None:
    search = "mask  =  offs\t<  n\nx = tl.load(x_ptr + offs,   mask=mask)"
    found = find_match(KERNEL, search)
    assert isinstance(found, Ambiguous) and found.level == "whitespace"
    search = (
        "mask = offs  <  n\n"
        "x = tl.load(x_ptr + offs,\tmask=mask)\n"
        "y =  tl.load(y_ptr + offs, mask=mask)"
    )
    found = matched(KERNEL, search)
    assert found.level == "whitespace"
    assert lines_of(KERNEL, found) == (9, 11)


def test_tabs_in_the_file_match_spaces_in_the_search() -> None:
    content = "def k():\n\tif x:\n\t\ty = 1\n\treturn y\n"
    found = matched(content, "    if x:\n        y = 1\n")
    assert found.level == "trimmed"
    assert content[found.start : found.end] == "\tif x:\n\t\ty = 1"


# --- fuzzy ---------------------------------------------------------------------------


def test_fuzzy_accepts_a_one_character_typo_on_the_right_lines() -> None:
    search = "mask = offs < n\nx = tl.load(x_ptr + offs, mask=mask)\n"
    search += "y = tl.laod(y_ptr + offs, mask=mask)"
    found = matched(KERNEL, search)
    assert found.level == "fuzzy"
    assert lines_of(KERNEL, found) == (9, 11)
    assert 0.9 < found.score < 1.0


def test_fuzzy_threshold_is_inclusive_at_080() -> None:
    assert fuzz.ratio("abcdefghij", "abcdefghXY") == 80.0
    found = matched("abcdefghij\n", "abcdefghXY")
    assert found.level == "fuzzy" and found.score == pytest.approx(0.8)


def test_fuzzy_below_threshold_at_079_is_refused_with_the_nearest_fragment() -> None:
    line, search = "abcdefghijklmnopqrstuvwx", "abcdefghijklmnopqrsVWXYZ"
    assert 79.0 < fuzz.ratio(line, search) < 80.0
    found = find_match(f"zzz\n{line}\n", search)
    assert isinstance(found, NoMatch)
    assert found.nearest is not None and found.nearest.first_line == 2
    assert "0.79" in found.message and "line 2" in found.message
    assert "exact, trimmed, whitespace, fuzzy" in found.message


def test_fuzzy_gap_of_exactly_010_is_enough() -> None:
    content = "abcdefghiX\nabcdefghXY\n"
    assert fuzz.ratio("abcdefghij", "abcdefghiX") - fuzz.ratio("abcdefghij", "abcdefghXY") == 10
    found = matched(content, "abcdefghij")
    assert lines_of(content, found) == (1, 1)


def test_fuzzy_gap_below_010_between_separate_places_is_ambiguous() -> None:
    content = "abcdefghiX\nunrelated line here\nabcdefghX\n"
    found = find_match(content, "abcdefghij")
    assert isinstance(found, Ambiguous) and found.level == "fuzzy"
    assert found.lines == ((1, 1), (3, 3))
    assert found.scores[0] == pytest.approx(0.9)
    assert "0.10 confidence gap" in found.message
    assert "line 1 (similarity 0.90)" in found.message


def test_fuzzy_best_window_need_not_be_first() -> None:
    content = "abcdefgXYZ\nsomething else entirely\nabcdefghiX\n"
    found = matched(content, "abcdefghij")
    assert lines_of(content, found) == (3, 3)


def test_overlapping_windows_are_not_rivals() -> None:
    content = "alpha_one = compute(1)\nalpha_two = compute(2)\nalpha_three = compute(3)\n"
    search = "alpha_one = compute(1)\nalpha_two = compute(2)\nalpha_thre = compute(3)"
    shorter = "alpha_one = compute(1)\nalpha_two = compute(2)"
    # The two-line window overlapping the answer scores within the gap of the best one.
    assert fuzz.ratio(search, shorter) > 70
    found = matched(content, search)
    assert found.level == "fuzzy"
    assert lines_of(content, found) == (1, 3)


def test_near_twin_blocks_with_a_typo_are_refused_not_guessed() -> None:
    search = "x = tl.laod(x_ptr + offs, mask=mask)"
    found = find_match(KERNEL, search)
    assert isinstance(found, Ambiguous)


def test_fuzzy_window_may_have_one_line_more_or_less() -> None:
    content = "def f(a):\n    b = a + 1\n    c = b * 2\n    d = c - 3\n    return d\n\nx = 0\n"
    dropped = "def f(a):\n    b = a + 1\n    d = c - 3\n    return d"
    found = matched(content, dropped)
    assert found.level == "fuzzy" and lines_of(content, found) == (1, 5)
    added = "def f(a):\n    b = a + 1\n    c = b * 2\n    c = c + 0\n    d = c - 3\n    return d"
    found = matched(content, added)
    assert lines_of(content, found) == (1, 5)


def test_an_unquoted_extra_edge_line_is_left_out_of_a_fuzzy_window() -> None:
    content = (
        "num = grid_size(n_rows)\nkernel[(num,)](\n    X.stride(0),\n    num_warps=4,\n"
        "    n_cols,\n    RSTD.stride(0),\n    X,\n    Y.stride(0),\n)\n"
    )
    # Two lines swapped: a window that also takes line 7 ("X,") scores a little higher
    # by chance, but the search never quotes that line.
    search = (
        "num = grid_size(n_rows)\nkernel[(num,)](\n    X.stride(0),\n    num_warps=4,\n"
        "    RSTD.stride(0),\n    n_cols,"
    )
    found = matched(content, search)
    assert found.level == "fuzzy" and lines_of(content, found) == (1, 6)


def test_lines_the_search_joined_stay_in_the_window() -> None:
    content = "y = 0\nx = foo(\n    alpha, beta)\nz = 1\n"
    found = matched(content, "x = foo(alpha, beta)")
    assert found.level == "fuzzy" and lines_of(content, found) == (2, 3)


def test_hallucinated_text_is_not_found() -> None:
    found = find_match(KERNEL, "acc = tl.dot(a_tile, b_tile, acc)\nacc = acc.to(tl.float16)")
    assert isinstance(found, NoMatch)
    assert found.levels_tried == ("exact", "trimmed", "whitespace", "fuzzy")


# --- edges ---------------------------------------------------------------------------


@pytest.mark.parametrize("content", ["", "\n", "x = 1\n"])
def test_empty_search_never_matches(content: str) -> None:
    assert isinstance(find_match(content, ""), NoMatch)
    assert isinstance(find_match(content, "  \n\t\n"), NoMatch | Ambiguous)


def test_empty_content() -> None:
    found = find_match("", "x = 1")
    assert isinstance(found, NoMatch) and found.nearest is None
    assert "No part of the file" in found.message


def test_search_longer_than_content() -> None:
    assert isinstance(find_match("a = 1\n", "a = 1\nb = 2\nc = 3\nd = 4\n"), NoMatch)
    found = matched("alpha = 1\nbeta = 2\n", "alpha = 1\nbeta = 2\nc = 3")
    assert found.level == "fuzzy" and (found.start, found.end) == (0, 18)


def test_crlf_file_exact_and_trimmed_spans() -> None:
    content = "def k():\r\n    a = 1\r\n    b = 2\r\n"
    found = matched(content, "    a = 1\n    b = 2\n")
    assert found.level == "exact"
    assert content[found.start : found.end] == "    a = 1\r\n    b = 2\r\n"
    found = matched(content, "a = 1\nb = 2")
    assert found.level == "trimmed"
    assert content[found.start : found.end] == "    a = 1\r\n    b = 2"


def test_crlf_search_in_lf_file() -> None:
    found = matched("a = 1\nb = 2\n", "a = 1\r\nb = 2\r\n")
    assert found.level == "exact" and (found.start, found.end) == (0, 12)


def test_unicode_content() -> None:
    content = "# café ≥ naïve\nx = 'π'  # ünïcode\ny = 2\n"
    found = matched(content, "x = 'π'  # ünïcode")
    assert content[found.start : found.end] == "x = 'π'  # ünïcode"
    found = matched(content, "x = 'π' # ünïcöde\ny = 2")
    assert found.level == "fuzzy" and lines_of(content, found) == (2, 3)


def test_no_trailing_newline() -> None:
    content = "a = 1\nb = 2"
    found = matched(content, "b = 2\n")
    assert found.level == "trimmed"
    assert content[found.start : found.end] == "b = 2"


# --- anchor, replace_all, elision ----------------------------------------------------


def test_anchor_picks_the_first_occurrence_after_it() -> None:
    found = matched(KERNEL, "x = tl.load(x_ptr + offs, mask=mask)", anchor="def scale_kernel(")
    assert lines_of(KERNEL, found) == (20, 20)


def test_anchor_that_is_missing_or_ambiguous_is_reported_as_such() -> None:
    missing = find_match(KERNEL, "mask = offs < n", anchor="def mul_kernel(a, b):")
    assert isinstance(missing, NoMatch) and "anchor" in missing.message
    twice = find_match(KERNEL, "mask = offs < n", anchor="@triton.jit")
    assert isinstance(twice, Ambiguous) and twice.message.startswith("anchor matches 2 places")
    # Not after the anchor: the x line there is similar, but the real line before the
    # anchor is the better match, so nothing is edited.
    before_it = find_match(
        KERNEL, "y = tl.load(y_ptr + offs, mask=mask)", anchor="def scale_kernel("
    )
    assert isinstance(before_it, Ambiguous) and before_it.lines == ((20, 20), (11, 11))
    nowhere = find_match(KERNEL, "acc += tl.dot(a, b)", anchor="def scale_kernel(")
    assert isinstance(nowhere, NoMatch) and "anchor's line 16" in nowhere.message


def test_find_all_returns_every_occurrence_in_order() -> None:
    found = find_all(KERNEL, "mask = offs < n")
    assert isinstance(found, tuple)
    assert [line_span(KERNEL, m) for m in found] == [(9, 9), (19, 19)]
    after = find_all(KERNEL, "mask = offs < n", anchor="def scale_kernel(")
    assert isinstance(after, tuple) and len(after) == 1


def test_find_all_with_nothing_found() -> None:
    assert isinstance(find_all(KERNEL, "tl.atomic_add(ptr, 1)"), NoMatch)


def test_elision_matches_from_the_part_before_to_the_part_after() -> None:
    search = (
        "def scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):\n"
        "    # ... existing code ...\n"
        "    tl.store(out_ptr + offs, x * scale, mask=mask)\n"
    )
    found = matched(KERNEL, search)
    assert lines_of(KERNEL, found) == (16, 21)
    assert [lines_of(KERNEL, part) for part in found.parts] == [(16, 16), (21, 21)]


def test_elision_with_a_bare_ellipsis_line() -> None:
    search = (
        "def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    ...\n"
        "    y = tl.load(y_ptr + offs, mask=mask)"
    )
    found = matched(KERNEL, search)
    assert lines_of(KERNEL, found) == (6, 11)


def test_elision_part_after_must_be_unique_after_the_part_before() -> None:
    # The part after occurs in both kernels: after add_kernel's head that is ambiguous,
    # after scale_kernel's head it is not.
    twice = find_match(
        KERNEL,
        "def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):\n...\nmask = offs < n",
    )
    assert isinstance(twice, Ambiguous) and twice.lines == ((9, 9), (19, 19))
    assert twice.message.startswith("piece 2 of old_string")
    once = matched(
        KERNEL,
        "def scale_kernel(x_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):\n...\nmask = offs < n",
    )
    assert lines_of(KERNEL, once) == (16, 19)


def test_elision_part_missing_says_which() -> None:
    found = find_match(
        KERNEL,
        "def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    ...\n    acc += tl.dot(a, b)",
    )
    assert isinstance(found, NoMatch)
    assert "piece 2" in found.message


def test_elision_text_that_is_literally_in_the_file_matches_as_is() -> None:
    content = "class P(Protocol):\n    def f(self) -> int:\n        ...\n\nx = 1\n"
    found = matched(content, "    def f(self) -> int:\n        ...\n")
    assert found.level == "exact" and not found.parts


# --- nearest fragment -----------------------------------------------------------------


def test_nearest_fragment_names_lines_and_similarity() -> None:
    text = nearest_fragment(KERNEL, "y = tl.load(y_pointer + offsets)")
    assert text.startswith("line 11 (similarity 0.")
    assert "tl.load(y_ptr + offs, mask=mask)" in text
    fragment = nearest(KERNEL, "y = tl.load(y_pointer + offsets)")
    assert fragment is not None and fragment.first_line == 11


def test_nearest_of_nothing() -> None:
    assert nearest("", "x") is None
    assert nearest_fragment("a\n", "  ") == ""
