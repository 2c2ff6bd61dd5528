"""Line breaks at the ends of a quote, and lines the model did not move.

Regressions of the wrong edits seen on a corpus of model-style edits: ``new_string`` ends
with a line break and ``old_string`` does not (the model deleted the last line of its
quote and kept the line break), in a file with a blank line after the quoted block; and
a continuation line, mis-indented in the quote, that re-indentation moved in the file.
The expected text is always the plain replacement of the span the quote stands for,
computed with ``str.replace`` on the exact quote.
"""

from __future__ import annotations

import pytest

from pytest_kernelfix.engine import apply_proposal
from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.engine.splice import DiffResult, apply_modifications

KERNEL = """\
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = x * 2

    tl.store(y_ptr + offs, y, mask=mask)


@triton.jit
def shift_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs,
                mask=offs < n, other=0.0)
    y = x + 1
    tl.store(y_ptr + offs, y, mask=offs < n)
"""

LOAD = "    x = tl.load(x_ptr + offs, mask=mask)"
QUOTE = f"{LOAD}\n    y = x * 2"  # the last line of the quote is deleted below...
KEPT = f"{LOAD}\n"  # ...and its line break kept


def apply(content: str, *mods: Modification, path: str = "kernel.py") -> DiffResult:
    result = apply_modifications(content, list(mods), path=path)
    assert result.success, result.errors
    return result


def test_exact_quote_whose_last_line_is_deleted_keeps_the_line_break() -> None:
    result = apply(KERNEL, Modification(QUOTE, KEPT))
    assert result.levels == ("exact",)
    assert result.code == KERNEL.replace(QUOTE, KEPT)
    assert f"{LOAD}\n\n\n    tl.store" in result.code  # the file's blank line is still there


@pytest.mark.parametrize(
    ("level", "old", "new"),
    [
        # copied without indentation, answered the same way
        ("trimmed", "x = tl.load(x_ptr + offs, mask=mask)\ny = x * 2", LOAD.strip() + "\n"),
        # a space doubled inside the quote
        ("whitespace", f"{LOAD.replace('+ offs', '+  offs')}\n    y = x * 2", KEPT),
        # a typo in the quote
        ("fuzzy", f"{LOAD.replace('mask=mask', 'mask=msk')}\n    y = x * 2", KEPT),
    ],
)
def test_a_tolerant_match_keeps_the_line_break_like_a_plain_replacement(
    level: str, old: str, new: str
) -> None:
    result = apply(KERNEL, Modification(old, new))
    assert result.levels == (level,)
    assert result.code == KERNEL.replace(QUOTE, KEPT)


def test_elided_quote_keeps_the_line_break_of_its_last_piece() -> None:
    head = "def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):\n    # ... existing code ...\n"
    old, new = head + QUOTE, head + KEPT
    result = apply(KERNEL, Modification(old, new))
    assert result.code == KERNEL.replace(QUOTE, KEPT)


def test_crlf_file_keeps_the_line_break_in_its_own_newline() -> None:
    content = KERNEL.replace("\n", "\r\n")
    result = apply(content, Modification(QUOTE, KEPT))
    assert result.code == content.replace(QUOTE.replace("\n", "\r\n"), KEPT.replace("\n", "\r\n"))


def test_replace_all_keeps_the_line_break_at_every_occurrence() -> None:
    content = "a = 1\nb = 2\n\nc = 3\na = 1\nb = 2\n\nd = 4\n"
    result = apply(content, Modification("a = 1\nb = 2", "a = 1\n", replace_all=True))
    assert result.code == content.replace("a = 1\nb = 2", "a = 1\n")


def test_anchored_quote_keeps_the_line_break() -> None:
    old = "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n    mask = offs < n"
    new = "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
    content = KERNEL.replace("    y = x * 2\n", "    y = x * 2\n    mask = offs < n\n\n")
    content = content.replace("    x = tl.load(x_ptr + offs,\n", "    mask = offs < n\n\n" + (
        "    x = tl.load(x_ptr + offs,\n"
    ))
    result = apply(content, Modification(old, new, anchor="def shift_kernel"))
    cut = content.index("def shift_kernel")
    assert result.code == content[:cut] + content[cut:].replace(old, new, 1)


def test_a_changed_last_line_with_an_added_line_break_adds_a_blank_line() -> None:
    # The model rewrote the last line and ended it with a line break the quote lacks.
    old, new = "y = x * 2", "y = x * 3\n"
    result = apply(KERNEL, Modification(old, new))
    assert result.code == KERNEL.replace(old, new)


def test_two_blank_lines_between_functions_survive_a_deleted_last_line() -> None:
    old = "    y = x * 2\n\n    tl.store(y_ptr + offs, y, mask=mask)"
    new = "    y = x * 2\n"
    result = apply(KERNEL, Modification(old, new))
    assert result.code == KERNEL.replace(old, new)
    assert "    y = x * 2\n\n\n\n@triton.jit\ndef shift_kernel" in result.code


def test_a_continuation_line_copied_at_the_wrong_indentation_is_not_moved() -> None:
    # The continuation line was copied two columns left of where it is, with a space
    # doubled inside; the model changed only the next line.
    old = "    x = tl.load(x_ptr + offs,\n              mask=offs  < n, other=0.0)\n    y = x + 1"
    new = "    x = tl.load(x_ptr + offs,\n              mask=offs  < n, other=0.0)\n    y = x + 2"
    result = apply(KERNEL, Modification(old, new))
    assert result.levels == ("whitespace",)
    assert result.code == KERNEL.replace("y = x + 1", "y = x + 2")


def test_a_changed_continuation_line_keeps_the_file_indentation() -> None:
    old = "    x = tl.load(x_ptr + offs,\n              mask=offs  < n, other=0.0)\n    y = x + 1"
    new = "    x = tl.load(x_ptr + offs,\n              mask=offs < n, other=1.0)\n    y = x + 1"
    result = apply(KERNEL, Modification(old, new))
    assert result.code == KERNEL.replace("other=0.0)", "other=1.0)")


def test_an_exact_quote_starting_after_an_odd_indentation_is_a_plain_replacement() -> None:
    content = "x = foo(a,\n        b,\n       c)\ny = 1\n"  # c) aligned at an odd column
    old, new = "c)\ny = 1", "c, d)\ny = 2"
    assert apply(content, Modification(old, new)).code == content.replace(old, new)


@pytest.mark.parametrize("indent", ["    ", ""])
def test_a_final_line_break_dropped_from_new_string_is_kept_in_any_file(indent: str) -> None:
    old, new = f"{indent}{LOAD.strip()}\n", f"{indent}{LOAD.strip()[:-1]}, other=0.0)"
    kept = KERNEL.replace("mask=mask)\n    y", "mask=mask, other=0.0)\n    y")
    assert apply(KERNEL, Modification(old, new), path="kernel.txt").code == kept
    result = apply(KERNEL, Modification(old, new))
    assert result.code == kept
    assert not result.warnings  # the edit as written, not a later guess


@pytest.mark.parametrize(
    ("new", "expected"),
    [
        ("x = 2\ny = x", "    x = 2\n    y = x\n"),  # a line added below
        ("\nx = 2", "\n    x = 2\n"),  # a blank line added above
    ],
)
def test_a_line_quoted_without_its_indentation_is_re_indented_whole(
    new: str, expected: str
) -> None:
    content = "def f():\n    x = 1\n    return x\n"
    result = apply(content, Modification("x = 1", new), path="notes.txt")
    assert result.code == "def f():\n" + expected + "    return x\n"


# --- a line break dropped from new_string ---------------------------------------------------
#
# The corpus's wrong edits: old_string quotes whole lines with their final line break and a
# non-empty new_string drops it. ``str.replace`` would join the next line onto the edit; in
# Python the joined lines often still parse (the next line swallowed by a comment, a
# one-line ``if``, a blank line gone), so no syntax check can catch it.

WRAPPER = """\
import torch


def attention(q, k, v, out, sink, BLOCK_M=64):
    device = q.device
    # check the output tensor
    if out.dtype in (torch.bfloat16, torch.float16):
        return _attention_small(q, k, v, out)

    _attn_fwd[(q.shape[0],)](
        q,
        out,  # (b, m, h, d)  bf16
        sink,
        BLOCK_M=BLOCK_M,
    )
    return out
"""

# (old line, new line): the line the model rewrote, and what comes after it in the file.
SITES = {
    "before a comment": ("    device = q.device", "    device = k.device"),
    "before a deeper line": (
        "    if out.dtype in (torch.bfloat16, torch.float16):",
        "    if out.dtype in (torch.bfloat16,):",
    ),
    "before a blank line": (
        "        return _attention_small(q, k, v, out)",
        "        return _attention_small(q, k, v, out, sink)",
    ),
    "a parameter after a comment": (
        "        out,  # (b, m, h, d)  bf16",
        "        out,  # (b, m, h, d)  fp32",
    ),
}


def doubled_space(line: str) -> str:
    body = line.lstrip()
    return line[: len(line) - len(body)] + body.replace(" ", "  ", 1)


def typo(line: str) -> str:
    at = len(line) - len(line.lstrip()) + 1  # the second character of the code
    return line[:at] + line[at + 1 :]


# How the model copied the line: (old_string, new_string) from (old line, new line), and
# the level that finds it.
COPIES = {
    "exact": (lambda old, new: (old + "\n", new), "exact"),
    "without its indentation": (lambda old, new: (old.lstrip() + "\n", new.lstrip()), "exact"),
    "indented deeper": (lambda old, new: ("  " + old + "\n", "  " + new), "trimmed"),
    "a space doubled": (lambda old, new: (doubled_space(old) + "\n", new), "whitespace"),
    "with a typo": (lambda old, new: (typo(old) + "\n", new), "fuzzy"),
}


@pytest.mark.parametrize("site", SITES)
@pytest.mark.parametrize("copy", COPIES)
def test_a_final_line_break_dropped_from_new_string_is_kept_at_every_level(
    site: str, copy: str
) -> None:
    old_line, new_line = SITES[site]
    quote, level = COPIES[copy]
    old, new = quote(old_line, new_line)
    result = apply(WRAPPER, Modification(old, new))
    assert result.levels == (level,)
    assert result.code == WRAPPER.replace(old_line + "\n", new_line + "\n")


@pytest.mark.parametrize("site", SITES)
def test_a_crlf_file_keeps_the_dropped_line_break_in_its_own_newline(site: str) -> None:
    old_line, new_line = SITES[site]
    content = WRAPPER.replace("\n", "\r\n")
    result = apply(content, Modification(old_line + "\n", new_line))
    assert result.code == content.replace(old_line + "\r\n", new_line + "\r\n")


def test_the_dropped_line_break_is_kept_with_the_file_ending_on_the_quote() -> None:
    result = apply(WRAPPER, Modification("    return out\n", "    return out.float()"))
    assert result.code == WRAPPER.replace("    return out\n", "    return out.float()\n")


def test_a_file_without_a_final_newline_gets_none_from_a_quote_of_its_last_line() -> None:
    content = WRAPPER.rstrip("\n")
    result = apply(content, Modification("    return out\n", "    return out.float()"))
    assert result.levels == ("trimmed",)
    assert result.code == content.replace("    return out", "    return out.float()")


def test_a_quoted_blank_line_is_dropped_but_the_line_break_of_the_quote_stays() -> None:
    old = "        return _attention_small(q, k, v, out)\n\n"
    new = "        return _attention_small(q, k, v, out, sink)"
    result = apply(WRAPPER, Modification(old, new))
    assert result.code == WRAPPER.replace(old, new + "\n")


def test_replace_all_keeps_the_dropped_line_break_at_every_occurrence() -> None:
    content = "a = 1\n# note\nb = 2\na = 1\n\nc = 3\na = 1\n"
    result = apply(content, Modification("a = 1\n", "a = 2", replace_all=True), path="k.txt")
    assert result.code == content.replace("a = 1\n", "a = 2\n")


def test_an_anchored_quote_keeps_the_dropped_line_break() -> None:
    content = "a = 1\n# note\nb = 2\na = 1\n# other\n"
    result = apply(content, Modification("a = 1\n", "a = 2", anchor="b = 2"), path="k.txt")
    assert result.code == "a = 1\n# note\nb = 2\na = 2\n# other\n"


def test_an_elided_quote_keeps_the_line_break_dropped_after_its_last_piece() -> None:
    head = "def attention(q, k, v, out, sink, BLOCK_M=64):\n    # ... existing code ...\n"
    old_line, new_line = SITES["before a deeper line"]
    result = apply(WRAPPER, Modification(head + old_line + "\n", head + new_line))
    assert result.code == WRAPPER.replace(old_line + "\n", new_line + "\n")


def test_apply_proposal_keeps_the_dropped_line_break() -> None:
    old_line, new_line = SITES["a parameter after a comment"]
    mod = Modification(old_line + "\n", new_line, file="ops/attention.py")
    outcome = apply_proposal([mod], {"ops/attention.py": WRAPPER})
    assert outcome.errors == ()
    assert outcome.files["ops/attention.py"] == WRAPPER.replace(old_line, new_line)


def test_an_empty_new_string_still_deletes_the_whole_line() -> None:
    old_line, _ = SITES["before a comment"]
    result = apply(WRAPPER, Modification(old_line + "\n", ""))
    assert result.code == WRAPPER.replace(old_line + "\n", "")


# --- a line break dropped from the start of new_string ------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "level"),
    [
        ("\n        sink,", "        sink_ptr,", "exact"),
        ("\nsink,", "sink_ptr,", "trimmed"),
        (
            "\n        sink,\n        BLOCK_M=BLOCK_N,",  # a typo in the second line
            "        sink_ptr,\n        BLOCK_M=BLOCK_M,",
            "fuzzy",
        ),
    ],
)
def test_the_line_break_ending_the_line_before_the_quote_is_kept(
    old: str, new: str, level: str
) -> None:
    # The quote starts with the line break that ends the comment line above it: joined,
    # the parameter would be part of the comment, and the result would still parse.
    result = apply(WRAPPER, Modification(old, new))
    assert result.levels == (level,)
    assert result.code == WRAPPER.replace("        sink,\n", "        sink_ptr,\n")


def test_a_blank_line_quoted_at_the_start_is_still_dropped() -> None:
    old = "\n    _attn_fwd[(q.shape[0],)]("
    new = "    _attn_fwd[(q.shape[0], 1)]("
    result = apply(WRAPPER, Modification(old, new))
    assert result.code == WRAPPER.replace(old, new)
    assert "out)\n    _attn_fwd[(q.shape[0], 1)](" in result.code


# --- line breaks next to an elision line ------------------------------------------------
#
# A piece of an elided quote that an elision line follows does not end where the quote
# ends: a blank line quoted before the elision line and left out of new_string is dropped,
# as written, and the line break is kept only where the code after it would be joined on.

ELIDED = "    # ... existing code ...\n"
SPACED = "def f():\n    a = 1\n\n    x = 2\n    b = 4\n    c = 5\n"
TIGHT = SPACED.replace("\n\n", "\n")
A_CHANGED = "def f():\n    a = 10\n    x = 2\n    b = 4\n    c = 5\n"


@pytest.mark.parametrize(
    ("content", "old", "new", "expected"),
    [
        # the quoted blank line is in the file: dropped, as quoted
        (SPACED, f"    a = 1\n\n{ELIDED}    b = 4", f"    a = 10\n{ELIDED}    b = 4", A_CHANGED),
        (SPACED, f"    a = 1\n\n{ELIDED}", f"    a = 10\n{ELIDED}", A_CHANGED),
        # the quoted blank line is not in the file: the elided code is not joined on
        (TIGHT, f"    a = 1\n\n{ELIDED}    b = 4", f"    a = 10\n{ELIDED}    b = 4", A_CHANGED),
        (TIGHT, f"    a = 1\n\n{ELIDED}", f"    a = 10\n{ELIDED}", A_CHANGED),
        (
            SPACED,
            f"    x = 2\n{ELIDED}    b = 4\n\n{ELIDED}",
            f"    x = 2\n{ELIDED}    b = 40\n{ELIDED}",
            SPACED.replace("b = 4", "b = 40"),
        ),
    ],
)
def test_a_line_break_next_to_an_elision_line_joins_no_lines(
    content: str, old: str, new: str, expected: str
) -> None:
    assert apply(content, Modification(old, new), path="notes.txt").code == expected
