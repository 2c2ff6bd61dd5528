"""Applying modifications: re-indentation, newlines, syntax guard, conflicts, diffs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from pytest_kernelfix.engine.parse import Modification, parse_modifications
from pytest_kernelfix.engine.splice import DiffResult, apply_modifications, unified_diff

KERNEL = """\
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(out_ptr, in_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(in_ptr + row * stride + cols, mask=mask)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    out = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * stride + cols, out, mask=mask)
"""


def apply(code: str, *mods: Modification, path: str = "kernel.py") -> DiffResult:
    return apply_modifications(code, list(mods), path=path)


def applied(code: str, *mods: Modification, path: str = "kernel.py") -> str:
    result = apply(code, *mods, path=path)
    assert result.success, result.errors
    return result.code


# --- landing and re-indenting -------------------------------------------------------


def test_exact_edit() -> None:
    old = "    x = tl.load(in_ptr + row * stride + cols, mask=mask)\n"
    new = "    x = tl.load(in_ptr + row * stride + cols, mask=mask, other=-float('inf'))\n"
    result = apply(KERNEL, Modification(old, new))
    assert result.code == KERNEL.replace(old, new)
    assert result.levels == ("exact",) and result.applied == 1
    assert result.original == KERNEL and result.errors == ()


def test_dedented_edit_moves_to_the_matched_indentation_keeping_relative_indentation() -> None:
    old = "x = x - tl.max(x, axis=0)\nnum = tl.exp(x)"
    new = "x = x - tl.max(x, axis=0)\nif True:\n    num = tl.exp(x)"
    result = apply(KERNEL, Modification(old, new))
    assert result.levels == ("trimmed",)
    assert "    x = x - tl.max(x, axis=0)\n    if True:\n        num = tl.exp(x)\n" in result.code


def test_over_indented_edit_moves_left() -> None:
    old = "            num = tl.exp(x)\n            out = num / tl.sum(num, axis=0)\n"
    new = "            num = tl.exp(x - 1)\n            out = num / tl.sum(num, axis=0)\n"
    code = applied(KERNEL, Modification(old, new))
    assert code == KERNEL.replace("tl.exp(x)", "tl.exp(x - 1)")


def test_first_line_copied_from_mid_line_keeps_the_rest_absolute() -> None:
    content = "def f(a):\n    if a:\n        b = 1\n        c = 2\n    return a\n"
    old = "if a:\n        b = 1\n"
    new = "if a:\n        b = 10\n"
    assert applied(content, Modification(old, new)) == content.replace("b = 1\n", "b = 10\n")


def test_a_typo_eating_the_first_character_does_not_shift_the_first_line() -> None:
    content = "def f(x):\n    y = x + 1\n    z = y * 2\n    return z\n"
    old = "     = x + 1\n    z = y * 2\n    return z"  # the "y" was lost in copying
    new = "    y = x + 2\n    z = y * 2\n    return z"
    code = applied(content, Modification(old, new), path="notes.txt")
    assert code == content.replace("x + 1", "x + 2")


def test_python_second_guess_keeps_lines_after_the_first_as_written() -> None:
    content = "def f(x):\n    if x:\n        y = 1\n    return y\n"
    old = "if x:\n    y = 1"  # dedented by four
    new = "if x:\n        y = 2\n    z = 3"  # but its later lines written in place
    result = apply(content, Modification(old, new))
    assert result.success, result.errors
    assert result.code == "def f(x):\n    if x:\n        y = 2\n    z = 3\n    return y\n"
    assert any("only its first line moved" in w for w in result.warnings)


def test_python_third_guess_takes_new_string_exactly_as_written() -> None:
    content = "def f(x):\n    y = x\n    return y\n"
    # old copied without indentation, new written at the file's real indentation
    result = apply(content, Modification("y = x", "    y = x * 2"))
    assert result.success, result.errors
    assert result.code == "def f(x):\n    y = x * 2\n    return y\n"
    assert any("exactly as written" in w for w in result.warnings)


def test_edit_that_breaks_python_fails_with_a_clear_message() -> None:
    result = apply(KERNEL, Modification("    num = tl.exp(x)\n", "    num = tl.exp(x\n"))
    assert not result.success and result.levels == ("none",)
    assert result.code == KERNEL
    (error,) = result.errors
    assert error.startswith("Modification 1 of 1")
    assert "would not parse as Python" in error and "line 12" in error


def test_syntax_is_not_checked_for_other_languages_or_broken_originals() -> None:
    assert applied("int x = 1;\n", Modification("int x = 1;", "int x = (;"), path="k.cu")
    broken = "def f(:\n    return 1\n"
    assert applied(broken, Modification("return 1", "return 2")) == broken.replace("1", "2")


def test_syntax_check_is_not_fooled_by_column_zero_text_inside_strings() -> None:
    content = 'DOC = """\ndef not_code(a):\n    x = 1\n"""\n\n\ndef f():\n    return 1\n'
    # Inside the string an unbalanced bracket is fine: the file still parses.
    inside = applied(content, Modification("    x = 1\n", "    x = (\n"))
    assert "    x = (\n" in inside
    assert applied(content, Modification("return 1", "return 2")).endswith("return 2\n")
    broken = apply(content, Modification("return 1", "return (2"))
    assert not broken.success and "parse" in broken.errors[0]


def test_syntax_check_inside_a_method_of_a_class() -> None:
    content = (
        "class Op:\n"
        "    @staticmethod\n"
        "    def forward(ctx, x):\n"
        "        y = x + 1\n"
        "        return y\n"
        "\n"
        "    def backward(ctx, g):\n"
        "        return g\n"
    )
    assert applied(content, Modification("y = x + 1", "y = x + 2")) == content.replace("1", "2")
    broken = apply(content, Modification("y = x + 1", "y = (x + 1"))
    assert not broken.success and "parse" in broken.errors[0]
    # Moving a line out to the class body is still valid Python.
    moved = applied(
        content, Modification("        return g\n", "        return g\n\n    scale = 2\n")
    )
    assert moved.endswith("    scale = 2\n")


@pytest.mark.parametrize(
    ("old", "new", "line"),
    [
        ("        y = x + 1\n", "        y = (x + 1\n", 6),  # in a method: its chunk alone
        ("    return 1\n", "    return (1\n", 11),  # in a top-level function
    ],
)
def test_a_syntax_error_is_reported_at_its_line_in_the_file(old: str, new: str, line: int) -> None:
    content = (
        "import math\n\n\n"
        "class Op:\n"
        "    def forward(ctx, x):\n"
        "        y = x + 1\n"
        "        return y\n\n\n"
        "def f():\n"
        "    return 1\n"
    )
    result = apply(content, Modification(old, new))
    assert not result.success
    assert f"at line {line})" in result.errors[0]


def test_tabs_in_model_text_follow_a_space_indented_file() -> None:
    old = "\tnum = tl.exp(x)\n\tout = num / tl.sum(num, axis=0)"
    new = "\tnum = tl.exp(x)\n\tif True:\n\t\tout = num / tl.sum(num, axis=0)"
    code = applied(KERNEL, Modification(old, new))
    assert "    num = tl.exp(x)\n    if True:\n        out = num / tl.sum(num, axis=0)\n" in code
    assert "\t" not in code


def test_spaces_in_model_text_follow_a_tab_indented_file() -> None:
    content = "def f(x):\n\tif x:\n\t\treturn 1\n\treturn 0\n"
    new = "    if x:\n        return 2\n    return 0"
    code = applied(content, Modification("    if x:\n        return 1\n    return 0", new))
    assert code == "def f(x):\n\tif x:\n\t\treturn 2\n\treturn 0\n"


def test_crlf_file_keeps_crlf_for_new_lines() -> None:
    content = KERNEL.replace("\n", "\r\n")
    old = "    num = tl.exp(x)\n"
    new = "    num = tl.exp(x)\n    num = num * 1.0\n"
    code = applied(content, Modification(old, new))
    assert "    num = tl.exp(x)\r\n    num = num * 1.0\r\n" in code
    assert code.count("\n") == code.count("\r\n") == content.count("\n") + 1


def test_crlf_in_model_text_becomes_the_file_newline() -> None:
    code = applied(KERNEL, Modification("num = tl.exp(x)\r\n", "num = tl.exp(x)\r\nnum += 0\r\n"))
    assert "\r" not in code and "    num = tl.exp(x)\n    num += 0\n" in code


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("    num = tl.exp(x)\n", "    num = tl.exp(x + 0)"),
        ("num = tl.exp(x)\n", "num = tl.exp(x + 0)"),
    ],
)
def test_a_final_newline_missing_from_new_string_does_not_join_python_lines(
    old: str, new: str
) -> None:
    result = apply(KERNEL, Modification(old, new))
    assert result.code == KERNEL.replace("tl.exp(x)", "tl.exp(x + 0)")
    assert not result.warnings  # the edit as written, not a later guess


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("    num = tl.exp(x)", "    num = tl.exp(x + 0)\n"),
        ("num = tl.exp(x)", "num = tl.exp(x + 0)\n"),
    ],
)
def test_a_final_newline_added_by_new_string_is_kept_like_str_replace(old: str, new: str) -> None:
    code = applied(KERNEL, Modification(old, new))
    assert code == KERNEL.replace(old, new)
    assert "    num = tl.exp(x + 0)\n\n    out = " in code


def test_deleting_lines_removes_them_whole() -> None:
    code = applied(KERNEL, Modification("x = x - tl.max(x, axis=0)", ""))
    assert code == KERNEL.replace("    x = x - tl.max(x, axis=0)\n", "")


def test_deleting_the_last_line_of_a_file_without_trailing_newline() -> None:
    assert applied("a = 1\nb = 2", Modification("b = 2", "")) == "a = 1"


@pytest.mark.parametrize("content", ["a\nx\nx", "a\nx\nx\n", "x\nx"])
def test_deleting_every_occurrence_up_to_the_end_of_the_file(content: str) -> None:
    code = applied(content, Modification("x", "", replace_all=True), path="k.txt")
    assert "x" not in code and code.rstrip("\n") == content[: content.find("x")].rstrip("\n")


def test_inline_edit_inside_a_line() -> None:
    code = applied(KERNEL, Modification("tl.exp(x)", "tl.exp(x.to(tl.float32))"))
    assert "    num = tl.exp(x.to(tl.float32))\n" in code


def test_fuzzy_edit_lands_on_the_original_lines_and_warns() -> None:
    old = "    num = tl.exp(x)\n    out = num / tl.sun(num, axis=0)\n"
    new = "    num = tl.exp(x)\n    out = num / tl.sum(num, axis=0) + 0.0\n"
    result = apply(KERNEL, Modification(old, new))
    assert result.levels == ("fuzzy",)
    assert result.code == KERNEL.replace("tl.sum(num, axis=0)", "tl.sum(num, axis=0) + 0.0")
    assert any("fuzzily" in w and "lines 12-13" in w for w in result.warnings)


def test_literal_backslash_n_from_double_escaped_json_still_matches() -> None:
    old = "    num = tl.exp(x)\\n    out = num / tl.sum(num, axis=0)"
    new = "    num = tl.exp(x)\\n    out = num / (tl.sum(num, axis=0) + 1e-6)"
    result = apply(KERNEL, Modification(old, new))
    assert result.success, result.errors
    assert "    out = num / (tl.sum(num, axis=0) + 1e-6)\n" in result.code
    assert "\\n" not in result.code


def test_code_that_means_its_backslash_n_is_matched_as_written() -> None:
    content = 'print("done\\n")\nx = 1\n'
    assert applied(content, Modification('print("done\\n")', 'print("ok\\n")')).startswith(
        'print("ok\\n")\n'
    )


# --- several modifications ----------------------------------------------------------


def test_modifications_apply_in_order_on_the_updated_text() -> None:
    first = Modification("    row = tl.program_id(0)\n", "    row = tl.program_id(0)\n    # a\n")
    second = Modification("    num = tl.exp(x)", "    num = tl.exp(x) # b")
    result = apply(KERNEL, first, second)
    assert result.applied == 2 and result.levels == ("exact", "exact")
    assert "# a\n" in result.code and "# b\n" in result.code


def test_overlapping_edits_conflict_on_the_later_one() -> None:
    first = Modification("    num = tl.exp(x)\n", "    num = tl.exp(x - 1)\n")
    second = Modification("    num = tl.exp(x - 1)\n", "    num = tl.exp(x - 2)\n")
    result = apply(KERNEL, first, second)
    assert result.levels == ("exact", "none") and result.applied == 1
    assert not result.success
    (error,) = result.errors
    assert error.startswith("Modification 2 of 2")
    assert "conflicts with Modification 1 of 2" in error
    assert "tl.exp(x - 1)" in result.code


def test_a_later_edit_of_text_an_earlier_one_rewrote_is_reported_as_a_conflict() -> None:
    first = Modification("    num = tl.exp(x)\n", "    num = tl.exp2(x * 1.4426950408889634)\n")
    second = Modification(
        "    num = tl.exp(x)\n    out = num", "    num = tl.exp(x)\n    out = 2 * num"
    )
    result = apply(KERNEL, first, second)
    assert result.levels == ("exact", "none")
    assert "does match the original text at lines 12-13" in result.errors[0]
    assert "conflict" in result.errors[0]


def test_adjacent_edits_do_not_conflict() -> None:
    first = Modification("    x = x - tl.max(x, axis=0)\n", "    x = x - tl.max(x, axis=0)  # 1\n")
    second = Modification("    num = tl.exp(x)\n", "    num = tl.exp(x)  # 2\n")
    assert apply(KERNEL, first, second).applied == 2


def test_edit_inside_a_deleted_region_conflicts() -> None:
    content = "a = 1\nb = 2\nc = 3\n"
    result = apply(content, Modification("b = 2\n", ""), Modification("a = 1\nc = 3", "x"))
    assert result.levels == ("exact", "none")


def test_noop_is_skipped_and_not_counted() -> None:
    same = Modification("    num = tl.exp(x)\n", "    num = tl.exp(x)\n")
    result = apply(KERNEL, same)
    assert result.levels == ("skipped",) and result.applied == 0
    assert result.code == KERNEL and result.diff == "" and not result.success
    assert result.errors == ()
    other = apply(KERNEL, same, Modification("tl.exp(x)", "tl.exp(x + 0)"))
    assert other.success and other.applied == 1 and other.levels == ("skipped", "exact")


@pytest.mark.parametrize("old", ["", "   \n  "])
def test_empty_old_string_is_refused(old: str) -> None:
    result = apply(KERNEL, Modification(old, "x = 1\n"))
    assert result.levels == ("none",) and "empty" in result.errors[0]


def test_replace_all_replaces_every_occurrence() -> None:
    content = (
        "def f(a):\n    return a * 2\n\n\nclass C:\n    def g(self, a):\n        return a * 2\n"
    )
    result = apply(content, Modification("return a * 2", "return a * 3", replace_all=True))
    assert result.success and result.code == content.replace("a * 2", "a * 3")


def test_replace_all_of_dedented_lines_reindents_each_occurrence() -> None:
    content = (
        "def f(a):\n    b = a\n    return b\n\n\n"
        "class C:\n    def g(self, a):\n        b = a\n        return b\n"
    )
    mod = Modification("b = a\nreturn b", "b = a + 1\nreturn b", replace_all=True)
    assert applied(content, mod) == content.replace("b = a\n", "b = a + 1\n")


def test_replace_all_of_a_fragment_renames_like_str_replace_but_whole_tokens_only() -> None:
    content = "a = x_ptr + 1\nb = tl.load(x_ptr)\nc = f(\n    x_ptr\n)\nmax_x_ptr = 0\n"
    code = applied(content, Modification("x_ptr", "x_base", replace_all=True))
    assert code == "a = x_base + 1\nb = tl.load(x_base)\nc = f(\n    x_base\n)\nmax_x_ptr = 0\n"


def test_replace_all_of_indented_lines_leaves_longer_lines_alone() -> None:
    content = "def f():\n    x = g(y)\n    x = g(y) + 1\n    x = g(y)\n"
    code = applied(content, Modification("    x = g(y)\n", "    x = h(y)\n", replace_all=True))
    assert code == "def f():\n    x = h(y)\n    x = g(y) + 1\n    x = h(y)\n"


def test_anchor_picks_the_occurrence_after_it() -> None:
    content = "def f(a):\n    return a * 2\n\n\ndef g(a):\n    return a * 2\n"
    code = applied(content, Modification("return a * 2", "return a * 4", anchor="def g(a):"))
    assert code == "def f(a):\n    return a * 2\n\n\ndef g(a):\n    return a * 4\n"


def test_ambiguous_edit_error_names_index_levels_and_remedies() -> None:
    content = "def f(a):\n    return a * 2\n\n\ndef g(a):\n    return a * 2\n"
    result = apply(content, Modification("x = 1", "x = 1"), Modification("return a * 2", "x"))
    (error,) = result.errors
    assert error.startswith("Modification 2 of 2 (old_string 'return a * 2') was not applied")
    assert "lines 2, 6" in error or ("line 2" in error and "line 6" in error)
    assert "replace_all" in error and "anchor" in error and "levels tried: exact" in error


def test_labels_name_modifications_in_messages() -> None:
    mods = [Modification("tl.exp(x)", "tl.exp(x + 0)"), Modification("nothing here", "x")]
    result = apply_modifications(KERNEL, mods, path="k.py", labels=["Edit 3", "Edit 7"])
    assert result.errors[0].startswith("Edit 7 (old_string 'nothing here') was not applied")


def test_missing_edit_error_shows_the_nearest_fragment() -> None:
    result = apply(KERNEL, Modification("    out = num / tl.total(num, dim=0)\n", "x"))
    (error,) = result.errors
    assert "levels tried: exact, trimmed, whitespace, fuzzy" in error
    assert "line 13 (similarity 0." in error
    assert "out = num / tl.sum(num, axis=0)" in error


# --- elision --------------------------------------------------------------------------

ELIDED_OLD = (
    "def softmax_kernel(out_ptr, in_ptr, stride, n_cols, BLOCK: tl.constexpr):\n"
    "    # ... existing code ...\n"
    "    tl.store(out_ptr + row * stride + cols, out, mask=mask)\n"
)


def test_elision_in_both_keeps_the_elided_code() -> None:
    new = ELIDED_OLD.replace("BLOCK: tl.constexpr", "BLOCK: tl.constexpr, eps").replace(
        "out, mask", "out + eps, mask"
    )
    code = applied(KERNEL, Modification(ELIDED_OLD, new))
    expected = KERNEL.replace("BLOCK: tl.constexpr", "BLOCK: tl.constexpr, eps")
    assert code == expected.replace("out, mask=mask)", "out + eps, mask=mask)")


def test_elision_only_in_old_replaces_the_whole_span() -> None:
    new = "def softmax_kernel(out_ptr, in_ptr, stride, n_cols, BLOCK: tl.constexpr):\n    pass\n"
    code = applied(KERNEL, Modification(ELIDED_OLD, new))
    assert code.endswith("@triton.jit\n" + new)


def test_elision_with_a_different_number_of_pieces_is_refused() -> None:
    new = "def softmax_kernel():\n    # ...\n    row = 1\n    # ...\n    tl.store(out_ptr)\n"
    result = apply(KERNEL, Modification(ELIDED_OLD, new))
    assert result.levels == ("none",) and "pieces" in result.errors[0]


def test_placeholder_comments_in_new_string_alone_are_dropped() -> None:
    old = "    row = tl.program_id(0)\n"
    new = "    row = tl.program_id(0).to(tl.int64)\n    # ... existing code ...\n"
    result = apply(KERNEL, Modification(old, new))
    assert result.code == KERNEL.replace("tl.program_id(0)", "tl.program_id(0).to(tl.int64)")
    assert any("placeholder" in w for w in result.warnings)


# --- inputs, outputs -------------------------------------------------------------------


def test_parsed_response_is_accepted_and_its_raw_text_kept() -> None:
    raw = (
        '{"modifications": [{"old_string": "num = tl.exp(x)", "new_string": "num = tl.exp(x+1)"}]}'
    )
    result = apply_modifications(KERNEL, parse_modifications(raw), path="k.py")
    assert result.success and result.raw_llm_output == raw


def test_no_modifications() -> None:
    result = apply(KERNEL)
    assert not result.success and result.code == KERNEL and result.levels == ()


def test_partial_success_keeps_the_edits_that_applied() -> None:
    good = Modification("num = tl.exp(x)", "num = tl.exp(x + 0)")
    bad = Modification("acc = tl.dot(a, b)", "acc += tl.dot(a, b)")
    result = apply(KERNEL, good, bad)
    assert not result.success and result.applied == 1 and result.levels == ("exact", "none")
    assert "tl.exp(x + 0)" in result.code and result.diff


def test_unified_diff_format() -> None:
    assert unified_diff("a\n", "a\n", "k.py") == ""
    diff = unified_diff("a\nb\nc\n", "a\nB\nc\n", "pkg/k.py")
    assert diff.splitlines()[:4] == [
        "diff --git a/pkg/k.py b/pkg/k.py",
        "--- a/pkg/k.py",
        "+++ b/pkg/k.py",
        "@@ -1,3 +1,3 @@",
    ]
    marker = unified_diff("a\nb", "a\nc", "k.py")
    assert marker.endswith("-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n")


def test_unified_diff_has_three_lines_of_context() -> None:
    before = "".join(f"line{i}\n" for i in range(20))
    diff = unified_diff(before, before.replace("line10\n", "LINE10\n"), "k.py")
    assert "@@ -8,7 +8,7 @@" in diff and " line7\n" in diff and " line6\n" not in diff


# --- git apply ---------------------------------------------------------------------------

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(repo: Path, *args: str, stdin: str | None = None) -> None:
    subprocess.run(
        ["git", "-c", "core.autocrlf=false", *args],
        cwd=repo,
        input=stdin.encode() if stdin is not None else None,
        check=True,
        capture_output=True,
    )


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode())


@needs_git
def test_git_apply_accepts_a_multi_file_patch(tmp_path: Path) -> None:
    files = {
        "kernels/softmax.py": (KERNEL, Modification("num = tl.exp(x)", "num = tl.exp(x - 0)")),
        "kernels/crlf.py": (
            KERNEL.replace("\n", "\r\n"),
            Modification(
                "    cols = tl.arange(0, BLOCK)\n", "    cols = tl.arange(0, BLOCK)\n    pass\n"
            ),
        ),
        "kernels/tail.py": ("a = 1\nb = 2", Modification("b = 2", "b = 3\nc = 4")),
        "kernels/gain_newline.py": ("a = 1", Modification("a = 1", "a = 2\n")),
    }
    _git(tmp_path, "init", "-q")
    patch, expected = [], {}
    for name, (text, mod) in files.items():
        _write(tmp_path / name, text)
        result = apply_modifications(text, [mod], path=name)
        assert result.success, result.errors
        patch.append(result.diff)
        expected[name] = result.code
    _git(tmp_path, "apply", "--check", "-", stdin="".join(patch))
    _git(tmp_path, "apply", "-", stdin="".join(patch))
    for name, text in expected.items():
        assert (tmp_path / name).read_bytes() == text.encode()
    assert b"\r\n    pass\r\n" in (tmp_path / "kernels/crlf.py").read_bytes()
    assert (tmp_path / "kernels/tail.py").read_bytes() == b"a = 1\nb = 3\nc = 4"


@needs_git
def test_git_apply_can_remove_a_final_newline(tmp_path: Path) -> None:
    _write(tmp_path / "k.py", "a = 1\nb = 2\n")
    _git(tmp_path, "init", "-q")
    diff = unified_diff("a = 1\nb = 2\n", "a = 1\nb = 3", "k.py")
    _git(tmp_path, "apply", "-", stdin=diff)
    assert (tmp_path / "k.py").read_bytes() == b"a = 1\nb = 3"
