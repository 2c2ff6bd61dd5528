"""One answer to "is this a Triton kernel?", on decorator stacks quoted from real libraries.

Each stack below is copied from the library named beside it (bodies shortened); the same
source goes through the predicate, the outline, a recipe, the guards' shape notes and the
selection's "defines a kernel", which must all agree.
"""

from __future__ import annotations

import ast
import textwrap
import time
from pathlib import Path

import pytest

from pytest_kernelfix.capture.records import defines_kernel
from pytest_kernelfix.fixers.recipes import rewrite_arange_constexpr, rewrite_integer_powers
from pytest_kernelfix.heal.analysis import shape_notes
from pytest_kernelfix.kernels import import_aliases, is_kernel, kernel_functions
from pytest_kernelfix.locate.outline import parse_module


def source(text: str) -> str:
    return textwrap.dedent(text).lstrip()


#: name -> (module source, whether its function ``f`` is a Triton kernel)
STACKS: dict[str, tuple[str, bool]] = {
    # Liger-Kernel src/liger_kernel/ops/dyt.py
    "liger autotune over jit": (source('''
        import triton
        import triton.language as tl

        @triton.autotune(
            configs=[
                triton.Config({"BLOCK_N": bn}, num_stages=ns, num_warps=nw)
                for bn in [1024, 2048, 4096]
                for ns in [1, 2]
                for nw in [4, 8, 16]
            ],
            key=["N"],
        )
        @triton.jit
        def f(X, Y, Alpha, Gamma, Beta, HAVE_BETA: tl.constexpr, N: tl.constexpr,
              BLOCK_N: tl.constexpr):
            col = tl.cast(tl.program_id(0), tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    '''), True),
    # flash-linear-attention fla/ops/generalized_delta_rule/iplr/wy_fast.py
    "fla heuristics, autotune and jit with arguments": (source('''
        import triton
        import triton.language as tl

        @triton.heuristics({
            'IS_VARLEN': lambda args: args['cu_seqlens'] is not None,
        })
        @triton.autotune(
            configs=[
                triton.Config({}, num_warps=num_warps)
                for num_warps in [1, 2, 4, 8, 16]
            ],
            key=['BK'],
            **autotune_cache_kwargs,
        )
        @triton.jit(do_not_specialize=['T'])
        def f(a, b, T, BK: tl.constexpr):
            i_t = tl.program_id(0)
    '''), True),
    # flash-linear-attention fla/ops/gla/chunk.py: the project's own autotuner in the stack
    "fla custom autotune between triton decorators": (source('''
        import triton
        import triton.language as tl

        from fla.ops.utils.cache import fla_cache_autotune

        @triton.heuristics({
            'IS_VARLEN': lambda args: args['cu_seqlens'] is not None,
        })
        @fla_cache_autotune(
            configs=[
                triton.Config({'BK': BK}, num_warps=num_warps, num_stages=num_stages)
                for BK in [32, 64]
                for num_warps in [1, 2, 4, 8]
                for num_stages in [2, 3, 4]
            ],
            key=['BC'],
            **autotune_cache_kwargs,
        )
        @triton.jit(do_not_specialize=['T'])
        def f(q, k, T, BC: tl.constexpr):
            i_t = tl.program_id(0)
    '''), True),
    # flash-linear-attention fla/ops/attnres/backends/gluon.py
    "fla gluon jit": (source('''
        import triton
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl

        @gluon.jit
        def f(a0, a1, b0, b1):
            return a0 + b0, a1 + b1
    '''), True),
    # FlagGems src/flag_gems/fused/instance_norm.py
    "flaggems libentry over autotune and jit": (source('''
        import triton
        import triton.language as tl

        from flag_gems import runtime
        from flag_gems.utils import libentry

        @libentry()
        @triton.autotune(
            configs=runtime.get_tuned_config("instancenorm"),
            key=["M", "N"],
        )
        @triton.jit(do_not_specialize=["eps"])
        def f(X, Y, M, N, eps, BLOCK_SIZE: tl.constexpr):
            pid = tl.program_id(0)
    '''), True),
    # FlagGems src/flag_gems/fused/silu_and_mul.py
    "flaggems pointwise_dynamic over jit": (source('''
        import triton
        import triton.language as tl

        from flag_gems.utils import pointwise_dynamic

        @pointwise_dynamic(promotion_methods=[(0, 1, "DEFAULT")])
        @triton.jit
        def f(x, y):
            x_fp32 = x.to(tl.float32)
    '''), True),
    # vLLM's modules import triton through their own re-export
    "vllm re-exported triton": (source('''
        import torch

        from vllm.triton_utils import tl, triton

        @triton.jit
        def f(sampled_ptr, sampled_stride, num_sampled_ptr):
            req_idx = tl.program_id(0)
    '''), True),
    "jit imported under another name": (source('''
        import triton.language as tl
        from triton import jit as tjit

        @tjit
        def f(x_ptr, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
    '''), True),
    "triton named while only triton.language is imported": (source('''
        import triton.language as tl

        @triton.jit
        def f(x_ptr, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
    '''), True),
    # FlagGems src/flag_gems/runtime/backend/_mthreads/ops/sort.py
    "flaggems tl.constexpr function": (source('''
        import triton
        import triton.language as tl

        @tl.constexpr
        def f(num_bits: tl.constexpr, signed: tl.constexpr) -> tl.dtype:
            num_bits = unwrap_if_constexpr(num_bits)
    '''), False),
    # Liger-Kernel src/liger_kernel/ops/cutedsl/ops/
    # _fused_scaled_cross_entropy_forward_fragment_sm90.py
    "liger cute.jit": (source('''
        import cutlass
        import cutlass.cute as cute

        @cute.jit
        def f(accum: cute.Tensor, s_logits: cute.Tensor):
            return accum ** 2
    '''), False),
    # Liger-Kernel src/liger_kernel/ops/cutile/ops/geglu.py
    "liger cuda tile kernel": (source('''
        import cuda.tile as ct
        import torch

        @ct.kernel(occupancy=1)
        def f(a, b, c, n_cols):
            row = ct.bid(0)
    '''), False),
    # flash-linear-attention
    # fla/ops/generalized_delta_rule/dplr/backends/tilelang/chunk_ho_fwd.py
    "fla tilelang.jit": (source('''
        import tilelang
        import tilelang.language as T
        import torch

        @tilelang.jit(
            pass_configs={
                tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True,
                tilelang.PassConfigKey.TL_DISABLE_DATA_RACE_CHECK: False,
            },
        )
        def f(H, K, V, BT, in_dtype, state_dtype, USE_INITIAL_STATE: bool):
            return H
    '''), False),
    # Megatron-LM's fused bias gelu
    "torch.jit.script": (source('''
        import torch

        @torch.jit.script
        def f(bias, y):
            x = bias + y
            return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
    '''), False),
    "numba.njit": (source('''
        import numba
        import numpy as np

        @numba.njit(cache=True)
        def f(positions):
            return positions ** 2
    '''), False),
    "numba jit imported bare": (source('''
        import numpy as np
        from numba import jit

        @jit(nopython=True, cache=True)
        def f(y):
            return np.abs(y) ** 2
    '''), False),
    "a project's own jit wrapper": (source('''
        import triton.language as tl

        from .utils import jit

        @jit
        def f(x_ptr, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
    '''), False),
}


def function(text: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    return next(n for n in ast.walk(ast.parse(text))
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "f")


@pytest.mark.parametrize(("text", "kernel"), STACKS.values(), ids=STACKS.keys())
def test_the_predicate_the_outline_and_the_selection_agree(
        text: str, kernel: bool, tmp_path: Path) -> None:
    tree = ast.parse(text)
    assert is_kernel(function(text), import_aliases(tree)) is kernel
    assert [f.name for f in kernel_functions(tree)] == (["f"] if kernel else [])
    definition = parse_module(text).find("f")
    assert definition is not None
    assert definition.jit is kernel
    assert definition.header.startswith("@triton.jit ") is kernel
    module = tmp_path / "module.py"
    module.write_text(text)
    assert defines_kernel(str(module)) is kernel


def test_a_stack_of_triton_decorators_is_one_kernel() -> None:
    text = STACKS["fla heuristics, autotune and jit with arguments"][0]
    assert [f.name for f in kernel_functions(ast.parse(text))] == ["f"]
    assert [d.qualname for d in parse_module(text).definitions if d.jit] == ["f"]


def test_a_recipe_rewrites_triton_kernels_only() -> None:
    """Integer powers become products in Triton kernels; numba's and CuTe's functions,
    which the old substring test took for kernels, keep theirs."""
    kernel = source('''
        import triton
        import triton.language as tl

        from flag_gems.utils import pointwise_dynamic

        @pointwise_dynamic(promotion_methods=[(0, 1, "DEFAULT")])
        @triton.jit
        def f(x, y):
            return x ** 2 + y
    ''')
    assert "return (x * x) + y" in rewrite_integer_powers(kernel)
    for name in ("numba.njit", "numba jit imported bare", "liger cute.jit"):
        text = STACKS[name][0]
        assert rewrite_integer_powers(text) == text


def test_the_arange_recipe_finds_the_kernel_under_a_custom_decorator() -> None:
    text = STACKS["flaggems libentry over autotune and jit"][0].replace(
        "pid = tl.program_id(0)", "offs = tl.arange(0, N)")
    assert "def f(X, Y, M, N: tl.constexpr, eps" in rewrite_arange_constexpr(text)


def test_the_guards_read_code_in_other_compilers_as_outside_the_kernels() -> None:
    """A candidate that moves the computation into a ``@torch.jit.script`` function adds
    torch math outside the Triton kernels (the old word search took it for a kernel); the
    same matrix product inside a Triton kernel of a real stack is the kernel's own."""
    before = {"ops/act.py": "import torch\nimport triton\n"}
    script = "\n\n@torch.jit.script\ndef bias_gelu(bias, y):\n    return torch.tanh(bias + y)\n"
    notes = shape_notes(before, {"ops/act.py": before["ops/act.py"] + script})
    assert notes == ("the candidate adds torch/numpy computation (torch.tanh) outside the "
                     "Triton kernels of ops/act.py",)
    for name in ("fla custom autotune between triton decorators", "vllm re-exported triton"):
        text = STACKS[name][0]
        changed = text.rstrip("\n") + "\n    b_o = b_q @ b_k\n"
        assert shape_notes({"ops/k.py": text}, {"ops/k.py": changed}) == ()
    cute = STACKS["liger cute.jit"][0]
    notes = shape_notes({"ops/k.py": cute},
                        {"ops/k.py": cute.rstrip("\n") + "\n    b_o = accum @ s_logits\n"})
    assert notes == ("the candidate adds torch/numpy computation (@) outside the Triton "
                     "kernels of ops/k.py",)


def test_a_kernel_in_a_docstring_or_a_comment_is_no_kernel(tmp_path: Path) -> None:
    """The selection read decorator lines; a usage example in a docstring matched."""
    module = tmp_path / "helpers.py"
    module.write_text('def settings(n):\n    """Sizes a launch of\n\n    @triton.jit\n'
                      '    def kernel(x): ...\n    """\n    # @triton.jit below\n')
    assert not defines_kernel(str(module))
    broken = tmp_path / "broken.py"
    broken.write_text("import triton\n\n@triton.jit\ndef kernel(x:\n    pass\n")
    assert defines_kernel(str(broken))  # a module that does not parse: read by lines


def test_deciding_whether_a_module_defines_a_kernel_stays_cheap(tmp_path: Path) -> None:
    """It runs for every project frame of every failing test: a module that names no
    kernel decorator is not parsed, and one that does is parsed once per version."""
    plain = tmp_path / "plain.py"
    plain.write_text("def f(x):\n    return x + 1\n\n\n" * 20_000)
    kernels = tmp_path / "kernels.py"
    kernels.write_text(STACKS["liger autotune over jit"][0] + "\n\n" + (
        "def g(x):\n    return x + 1\n\n\n" * 5_000))
    start = time.perf_counter()
    for _ in range(1000):
        assert not defines_kernel(str(plain))
        assert defines_kernel(str(kernels))
    assert time.perf_counter() - start < 2.0
