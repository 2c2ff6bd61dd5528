"""Recipes on real kernels: break, run on the interpreter, fix, run again."""

from __future__ import annotations

import importlib.util
import itertools
import textwrap
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

from pytest_kernelfix.capture.errors import ErrorInfo, Frame, describe_exception
from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.fixers.base import FixerError, ProposalRequest
from pytest_kernelfix.fixers.recipes import RecipeFixer, line_edits, rewrite_tanh
from pytest_kernelfix.locate.context import BugContext, SourceFile

HEADER = "import triton\nimport triton.language as tl\n\n\n"

ELEMENTWISE = HEADER + textwrap.dedent('''\
    @triton.jit
    def kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = {expr}
        tl.store(out_ptr + offs, y, mask=mask)


    def launch(x):
        out = torch.empty_like(x)
        kernel[(triton.cdiv(x.numel(), 128),)](x, out, x.numel(), BLOCK=128)
        return out
''')

_counter = itertools.count()


def load(tmp_path: Path, text: str) -> ModuleType:
    """Import ``text`` as a module from a file (Triton reads kernel source from disk)."""
    name = f"recipe_kernel_{next(_counter)}"
    path = tmp_path / f"{name}.py"
    path.write_text("import torch\n" + text)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def error_of(run: Callable[[], object]) -> ErrorInfo:
    try:
        run()
    except Exception as exc:
        return describe_exception(exc)
    raise AssertionError("the broken kernel ran")


def request_for(text: str, error: ErrorInfo, group: str = "kernel-1") -> ProposalRequest:
    source = SourceFile("kernels/k.py", text)
    context = BugContext(group, ("tests/test_k.py::test_k",), error, error.headline, (source,))
    return ProposalRequest(context, 1, (source,))


def apply(text: str, edits: tuple[Modification, ...]) -> str:
    for edit in edits:
        assert edit.file == "kernels/k.py"
        assert text.count(edit.old_string) == 1, edit.old_string  # exact and unique
        text = text.replace(edit.old_string, edit.new_string)
    return text


def heal(tmp_path: Path, broken: str) -> tuple[ModuleType, tuple[Modification, ...], ErrorInfo]:
    """Run the broken kernel, ask the recipes, apply, and load the fixed kernel."""
    x = torch.linspace(-3, 3, 100)
    error = error_of(lambda: load(tmp_path, broken).launch(x))
    proposal = RecipeFixer().propose(request_for(broken, error))
    assert proposal.source == "recipes" and proposal.parse_error == ""
    assert proposal.usage.calls == 0
    return load(tmp_path, apply(broken, proposal.modifications)), proposal.modifications, error


X = torch.linspace(-3, 3, 100)


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("tl.tanh(x)", torch.tanh(X)),
        ("0.5 * tl.math.tanh(x * (1.0 + x)) + tl.tanh(tl.tanh(x))",
         0.5 * torch.tanh(X * (1 + X)) + torch.tanh(torch.tanh(X))),
        ("tl.math.max(x, 0.0) + tl.math.min(x, 1.0)", X.clamp(min=0) + X.clamp(max=1)),
        ("x ** 3 - tl.pow(x, 2) + 1.0 / (x + 4.0) ** 2",
         X**3 - X**2 + 1 / (X + 4) ** 2),
    ],
    ids=["tanh", "nested-tanh", "math-max-min", "powers"],
)
def test_recipe_fixes_the_kernel(tmp_path: Path, expr: str, expected: torch.Tensor) -> None:
    fixed, edits, error = heal(tmp_path, ELEMENTWISE.format(expr=expr))
    assert error.type in ("AttributeError", "TypeError")
    [edit] = edits
    assert edit.old_string == f"    y = {expr}\n"
    torch.testing.assert_close(fixed.launch(X), expected)


def test_block_size_gets_its_constexpr_annotation(tmp_path: Path) -> None:
    broken = ELEMENTWISE.format(expr="x * 2").replace(
        "def kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):",
        "def kernel(x_ptr, out_ptr, n,\n           BLOCK=128):",
    )
    fixed, edits, error = heal(tmp_path, broken)
    assert error.message == "arange's arguments must be of type tl.constexpr"
    assert [(e.old_string, e.new_string) for e in edits] == [
        ("           BLOCK=128):\n", "           BLOCK: tl.constexpr = 128):\n")]
    torch.testing.assert_close(fixed.launch(X), X * 2)


def test_repeated_lines_get_context_until_unique(tmp_path: Path) -> None:
    second = ELEMENTWISE.format(expr="tl.tanh(x)").split("\n\n\n", 1)[1]
    second = second.replace("def kernel(", "def kernel2(").replace("def launch(", "def launch2(")
    second = second.replace("kernel[", "kernel2[")
    broken = ELEMENTWISE.format(expr="tl.tanh(x)") + "\n\n" + second
    fixed, edits, _ = heal(tmp_path, broken)
    assert len(edits) == 2
    torch.testing.assert_close(fixed.launch(X), torch.tanh(X))
    torch.testing.assert_close(fixed.launch2(X), torch.tanh(X))


def test_comments_and_strings_are_left_alone() -> None:
    text = 'y = tl.tanh(a)  # tl.tanh(b) is gone\nname = "tl.tanh(c)"\n'
    assert rewrite_tanh(text) == (
        'y = (2 * tl.sigmoid(2 * a) - 1)  # tl.tanh(b) is gone\nname = "tl.tanh(c)"\n'
    )


def test_line_edits_reproduce_the_rewrite() -> None:
    old = "a\nb\na\nb\nc\n"
    new = "a\nB\na\nb\nc\n"
    edits = line_edits("f.py", old, new, "why")
    assert apply_anywhere(old, edits) == new
    assert all(old.count(edit.old_string) == 1 for edit in edits)


def apply_anywhere(text: str, edits: list[Modification]) -> str:
    for edit in edits:
        text = text.replace(edit.old_string, edit.new_string, 1)
    return text


def test_no_recipe_for_an_unknown_error() -> None:
    error = ErrorInfo("AssertionError", "Both operands must be same dtype. Got fp32 and fp16")
    with pytest.raises(FixerError) as info:
        RecipeFixer().propose(request_for(ELEMENTWISE.format(expr="tl.tanh(x)"), error))
    assert str(info.value) == (
        "no recipe for AssertionError: Both operands must be same dtype. Got fp32 and fp16; "
        "pass --kernelfix-model to ask an LLM"
    )


def test_a_recipe_is_proposed_once_per_bug() -> None:
    error = ErrorInfo("AttributeError", "module 'triton.language' has no attribute 'tanh'")
    fixer = RecipeFixer()
    request = request_for(ELEMENTWISE.format(expr="tl.tanh(x)"), error)
    assert fixer.propose(request).modifications
    with pytest.raises(FixerError, match="no recipe for AttributeError"):
        fixer.propose(request)
    other = request_for(ELEMENTWISE.format(expr="tl.tanh(x)"), error, group="kernel-2")
    assert fixer.propose(other).modifications


def test_the_error_must_match_the_source() -> None:
    error = ErrorInfo("AttributeError", "module 'triton.language' has no attribute 'tanh'")
    with pytest.raises(FixerError, match="no recipe"):
        RecipeFixer().propose(request_for(ELEMENTWISE.format(expr="x * 2"), error))


def test_only_the_kernel_on_the_traceback_is_annotated() -> None:
    text = HEADER + textwrap.dedent('''\
        @triton.jit
        def first(out_ptr, BLOCK):
            tl.store(out_ptr + tl.arange(0, BLOCK), 1.0)


        @triton.jit
        def second(out_ptr, BLOCK):
            tl.store(out_ptr + tl.arange(0, BLOCK), 2.0)
    ''')
    line = text.splitlines().index("    tl.store(out_ptr + tl.arange(0, BLOCK), 2.0)") + 1
    frame = Frame("/proj/kernels/k.py", line, "second", "")
    error = ErrorInfo("ValueError", "arange's arguments must be of type tl.constexpr", (frame,))
    [edit] = RecipeFixer().propose(request_for(text, error)).modifications
    assert (edit.old_string, edit.new_string) == (
        "def second(out_ptr, BLOCK):\n", "def second(out_ptr, BLOCK: tl.constexpr):\n")


def test_a_runtime_exponent_has_no_recipe() -> None:
    error = ErrorInfo("AttributeError", "module 'triton.language' has no attribute 'pow'")
    with pytest.raises(FixerError, match="no recipe"):
        RecipeFixer().propose(request_for(ELEMENTWISE.format(expr="tl.pow(x, n)"), error))


def test_a_missing_attribute_met_by_the_gpu_compiler_gets_the_same_recipe() -> None:
    """On a GPU the compiler, not the interpreter, meets ``tl.tanh``: a CompilationError."""
    error = ErrorInfo("CompilationError",
                      "AttributeError(\"module 'triton.language' has no attribute 'tanh'\")\n"
                      "at 9:25:\n    y = tl.tanh(x)\n                         ^")
    proposal = RecipeFixer().propose(request_for(ELEMENTWISE.format(expr="tl.tanh(x)"), error))
    assert proposal.modifications
    assert "tl.sigmoid" in proposal.modifications[0].new_string
