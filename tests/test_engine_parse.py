"""Parsing model answers into Modifications: every dialect, and garbage refused."""

from __future__ import annotations

import json

import pytest

from pytest_kernelfix.engine.parse import Modification, ParseError, parse_modifications

OLD = "    x = tl.load(x_ptr + offs)\n"
NEW = "    x = tl.load(x_ptr + offs, mask=mask)\n"
OBJECT = {
    "analysis": "the load has no mask",
    "modifications": [{"old_string": OLD, "new_string": NEW, "reason": "mask the tail"}],
    "summary": "masked the load",
}


def test_bare_json_object() -> None:
    parsed = parse_modifications(json.dumps(OBJECT))
    assert parsed.analysis == "the load has no mask"
    assert parsed.summary == "masked the load"
    assert parsed.modifications == (Modification(OLD, NEW, reason="mask the tail"),)


def test_fenced_json_with_prose_around() -> None:
    text = f"Here is my fix.\n\n```json\n{json.dumps(OBJECT, indent=2)}\n```\nHope it helps!"
    parsed = parse_modifications(text)
    assert parsed.modifications[0].old_string == OLD
    assert parsed.raw == text


def test_unlabelled_fence_and_prose_with_braces_before() -> None:
    text = "The {offs} index is wrong; fix:\n```\n" + json.dumps(OBJECT) + "\n```"
    assert parse_modifications(text).modifications[0].new_string == NEW


def test_bare_json_object_inside_prose() -> None:
    text = "I think {this} is it: " + json.dumps(OBJECT) + " -- done."
    assert len(parse_modifications(text).modifications) == 1


def test_bare_json_list() -> None:
    items = [{"old_string": "a", "new_string": "b"}, {"old_string": "c", "new_string": ""}]
    parsed = parse_modifications(json.dumps(items))
    assert [m.old_string for m in parsed.modifications] == ["a", "c"]
    assert parsed.modifications[1].new_string == ""
    assert parsed.analysis == ""


def test_optional_fields_and_flag_spellings() -> None:
    item = {
        "old_string": "a",
        "new_string": "b",
        "replace_all": "true",
        "anchor": "def k(",
        "file": "kernels/add.py",
    }
    mod = parse_modifications(json.dumps({"modifications": [item]})).modifications[0]
    assert mod == Modification("a", "b", replace_all=True, anchor="def k(", file="kernels/add.py")
    item["replace_all"] = False
    assert not parse_modifications(json.dumps([item])).modifications[0].replace_all


def test_raw_newlines_inside_json_strings_are_tolerated() -> None:
    text = '{"modifications": [{"old_string": "a = 1\n  b = 2", "new_string": "a = 3"}]}'
    assert parse_modifications(text).modifications[0].old_string == "a = 1\n  b = 2"


def test_trailing_commas_are_forgiven() -> None:
    text = '```json\n{"modifications": [{"old_string": "a", "new_string": "b",},],}\n```'
    assert parse_modifications(text).modifications[0].new_string == "b"


def test_literal_backslash_n_is_kept_faithfully() -> None:
    # The engine, not the parser, decides whether "\\n" meant a newline: code such as
    # print("done\n") legitimately holds a backslash and an n.
    text = json.dumps({"modifications": [{"old_string": "a\\nb", "new_string": "c"}]})
    assert parse_modifications(text).modifications[0].old_string == "a\\nb"


def test_empty_modification_list_is_a_valid_answer() -> None:
    parsed = parse_modifications('{"analysis": "cannot fix", "modifications": []}')
    assert parsed.modifications == ()
    assert parsed.analysis == "cannot fix"


def test_null_modifications_and_a_list_encoded_as_a_string() -> None:
    assert parse_modifications('{"analysis": "x", "modifications": null}').modifications == ()
    inner = json.dumps([{"old_string": "a", "new_string": "b"}])
    text = json.dumps({"modifications": inner})
    assert parse_modifications(text).modifications == (Modification("a", "b"),)


def test_search_replace_blocks_with_file_names() -> None:
    text = (
        "Two fixes.\n\n"
        "kernels/add.py\n"
        "```python\n"
        "<<<<<<< SEARCH\n"
        "    x = tl.load(x_ptr + offs)\n"
        "=======\n"
        "    x = tl.load(x_ptr + offs, mask=mask)\n"
        ">>>>>>> REPLACE\n"
        "```\n\n"
        "<<<<<<< SEARCH\n"
        "BLOCK = 1000\n"
        "=======\n"
        "BLOCK = 1024\n"
        ">>>>>>> REPLACE\n"
        "That is all."
    )
    parsed = parse_modifications(text)
    first, second = parsed.modifications
    assert first == Modification(OLD, NEW, file="kernels/add.py")
    assert second == Modification("BLOCK = 1000\n", "BLOCK = 1024\n")
    assert parsed.analysis == "Two fixes.\n\nkernels/add.py"
    assert parsed.summary == "That is all."


def test_search_replace_with_crlf_and_empty_replacement() -> None:
    text = "<<<<<<< SEARCH\r\nx = 1\r\n=======\r\n>>>>>>> REPLACE\r\n"
    assert parse_modifications(text).modifications == (Modification("x = 1\n", ""),)


def test_acr_blocks() -> None:
    text = (
        "# modification 1\n<file>kernels/add.py</file>\n"
        "<original>\n    x = tl.load(x_ptr + offs)\n</original>\n"
        "<patched>\n    x = tl.load(x_ptr + offs, mask=mask)\n</patched>\n"
        "# modification 2\n<file>kernels/mul.py</file>\n"
        "<original>a = 1</original>\n<patched>a = 2</patched>\n"
    )
    first, second = parse_modifications(text).modifications
    assert first == Modification(OLD.rstrip("\n"), NEW.rstrip("\n"), file="kernels/add.py")
    assert second == Modification("a = 1", "a = 2", file="kernels/mul.py")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   \n",
        "I could not find the bug, sorry.",
        '{"analysis": "no edits key here"}',
        "[1, 2, 3]",
        "<<<<<<< SEARCH\nx = 1\n=======\nx = 2\n",
    ],
)
def test_garbage_is_a_parse_error_with_a_format_hint(text: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_modifications(text)
    assert "SEARCH" in str(info.value) and "old_string" in str(info.value)


def test_an_answer_may_ask_for_code_with_or_without_edits() -> None:
    asking = parse_modifications(
        '{"analysis": "need the helper", "modifications": [], '
        '"need": ["ops/act.py:silu", "search: BLOCK_SIZE_N", "", 3]}')
    assert asking.modifications == () and asking.analysis == "need the helper"
    assert asking.need == ("ops/act.py:silu", "search: BLOCK_SIZE_N")
    only = parse_modifications('Let me look first.\n{"need": "ops/act.py:silu"}')
    assert only.need == ("ops/act.py:silu",) and only.modifications == ()
    both = parse_modifications(
        '{"modifications": [{"old_string": "a", "new_string": "b"}], "needs": ["x.py"]}')
    assert both.modifications == (Modification("a", "b"),) and both.need == ("x.py",)
    assert parse_modifications('{"modifications": []}').need == ()


def test_broken_fenced_json_names_the_position() -> None:
    with pytest.raises(ParseError, match=r"not valid JSON .* line 1"):
        parse_modifications('```json\n{"modifications": [{"old_string": "a" "new_string"}]}\n```')


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ({"new_string": "b"}, 'no "old_string"'),
        ({"old_string": "a"}, 'no "new_string"'),
        ({"old_string": "a", "new_string": 3}, "not text"),
    ],
)
def test_incomplete_modification_names_its_index(item: dict[str, object], problem: str) -> None:
    text = json.dumps({"modifications": [{"old_string": "x", "new_string": "y"}, item]})
    with pytest.raises(ParseError, match=r"modifications\[1\]") as info:
        parse_modifications(text)
    assert problem in str(info.value)


def test_unified_diff_hunks_become_search_replace_pairs() -> None:
    """Line numbers are ignored: the hunk's text locates the edit."""
    answer = (
        "The offset should be a scale.\n```diff\n"
        "diff --git a/kernels/ops.py b/kernels/ops.py\n--- a/kernels/ops.py\n"
        "+++ b/kernels/ops.py\n@@ -40,4 +40,4 @@ def scale_kernel(\n"
        "     x = tl.load(x_ptr + offsets, mask=mask)\n"
        "\n"
        "-    y = x + factor\n+    y = x * factor\n"
        "     tl.store(y_ptr + offsets, y, mask=mask)\n"
        "@@ -90,2 +90,3 @@\n def scale(x, factor):\n+    assert x.is_contiguous()\n"
        "     y = torch.empty_like(x)\n"
        "```\nDone."
    )
    parsed = parse_modifications(answer)
    assert parsed.analysis == "The offset should be a scale."
    first, second = parsed.modifications
    assert first.file == second.file == "kernels/ops.py"
    assert first.old_string == (
        "    x = tl.load(x_ptr + offsets, mask=mask)\n\n    y = x + factor\n"
        "    tl.store(y_ptr + offsets, y, mask=mask)"
    )
    assert first.new_string == first.old_string.replace("x + factor", "x * factor")
    assert second.old_string == "def scale(x, factor):\n    y = torch.empty_like(x)"
    assert "assert x.is_contiguous()" in second.new_string


def test_a_diff_hunk_without_context_cannot_be_located() -> None:
    with pytest.raises(ParseError, match="No edits were found"):
        parse_modifications("--- a/k.py\n+++ b/k.py\n@@ -0,0 +1 @@\n+x = 1\n")


DEEP = 1000


@pytest.mark.parametrize("answer", [
    "[" * DEEP + "]" * DEEP,
    "```json\n" + "[" * DEEP + "]" * DEEP + "\n```",
    '{"modifications": ' + "[" * DEEP + "]" * DEEP + "}",
    "Here: " + '[{"old_string": ' * DEEP + '"a"' + "}]" * DEEP,
    '{"old_string": "a", "new_string": "b", "reason": ' + "[" * (DEEP - 10) + "]" * (DEEP - 10)
    + "}",
])
def test_an_answer_nested_too_deep_is_a_parse_error_not_a_crash(answer: str) -> None:
    """A JSON decoder meets its recursion limit at about 1,000 levels: the answer is
    malformed, to be fed back, never a RecursionError that ends the bug."""
    with pytest.raises(ParseError):
        parse_modifications(answer)


def test_a_readable_block_after_one_nested_too_deep_is_still_read() -> None:
    answer = ("```\n" + "[" * DEEP + "]" * DEEP + "\n```\n<<<<<<< SEARCH\n" + OLD
              + "=======\n" + NEW + ">>>>>>> REPLACE\n")
    assert parse_modifications(answer).modifications == (Modification(OLD, NEW),)
