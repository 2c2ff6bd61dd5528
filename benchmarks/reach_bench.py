"""Reach benchmark: heal bugs injected into real Triton code, shown only what the plugin finds.

    .venv/bin/python benchmarks/reach_bench.py [--jobs 2] [--only NAME ...] [--keep DIR]
                                               [--baseline REV]

At run time it copies modules of the installed ``liger-kernel`` package into a temporary
project (nothing copied is committed) and lays them out the way many Triton libraries
are: liger's ``swiglu`` is split into a kernel module, a ``@triton.jit`` activation
helper module and a wrapper module (``ops/swiglu_ops.py``); ``geglu``, ``rms_norm``
(712 lines), ``softmax`` and ``cross_entropy`` (607 lines) stay whole, importing
liger's ``ops/utils.py``. Two more modules are written here in the style of real
activation libraries: twenty documented ``@triton.jit`` activations and their
gradients behind a dispatcher on a ``tl.constexpr`` name (716 lines), and the kernel
and wrapper that launch it, sizing the launch with liger's ``calculate_settings``. Its
tests mark nothing ``kernel``: the ini sets ``kernelfix_select = launched``; the RMSNorm
block-size bug is caught by tests that compare two paths through the same kernel
(``assert torch.allclose(y1, y2)``), so its error names no file but the test.

Each bug is injected into a fresh copy, and ``pytest --kernelfix`` runs that op's tests.
The fixer is a conftest ``pytest_kernelfix_propose`` hook that can fix only what it is
shown: it renders the prompt the model would get, and answers with the fix only when
the faulty line is in it (else it answers with no edit, which is reported as the model
declining). So a bug heals only when the plugin showed its code; a bug is counted
wrong when its faulty line was not in the first prompt or it did not heal. Printed per
bug: healed or not, whether the faulty line was in the first prompt, the first prompt's size
(characters, and tokens counted with tiktoken's o200k_base, which litellm ships for
offline use), rounds and seconds. Also measured in this run: the cost of recording a
launch with and without its launch sites, and how long reach takes on liger's modules.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

PROMPT_BUDGET = 24_000  # characters (pytest_kernelfix.locate.context.PROMPT_BUDGET)
TOKEN_BUDGET = 6_500


@dataclass(frozen=True)
class Bug:
    name: str
    kind: str
    file: str  # relative to the project
    where: str  # "kernel module" or where else it lives
    tests: str
    good: str
    bad: str


BUGS = (
    Bug("swiglu-forward", "numerics in the kernel", "ligerlite/ops/swiglu.py",
        "kernel module", "tests/test_swiglu.py",
        "    c_row = silu(a_row).cast(b_row.dtype) * b_row",
        "    c_row = silu(a_row).cast(b_row.dtype) + b_row"),
    Bug("swiglu-backward", "gradient in the kernel", "ligerlite/ops/swiglu.py",
        "kernel module", "tests/test_swiglu.py",
        "    db_row = dc_row * silu_a", "    db_row = dc_row * sig_a"),
    Bug("silu-helper", "numerics in a jit helper, no frame there",
        "ligerlite/ops/activations.py", "jit helper module", "tests/test_swiglu.py",
        "    return x * tl.sigmoid(x)", "    return x * tl.sigmoid(x * 0.5)"),
    Bug("silu-helper-attribute", "AttributeError in a jit helper",
        "ligerlite/ops/activations.py", "jit helper module", "tests/test_swiglu.py",
        "    return x * tl.sigmoid(x)", "    return x * tl.sigmoidal(x)"),
    Bug("swiglu-grid", "wrong launch grid in the wrapper", "ligerlite/ops/swiglu_ops.py",
        "wrapper module", "tests/test_swiglu.py",
        "        _swiglu_forward_kernel[(n_rows,)](",
        "        _swiglu_forward_kernel[(n_rows - 1,)]("),
    Bug("swiglu-stride", "wrong stride in the wrapper", "ligerlite/ops/swiglu_ops.py",
        "wrapper module", "tests/test_swiglu.py",
        "            dc.stride(-2),\n            float(gate_multiplier),\n"
        "            n_cols=n_cols,",
        "            dc.stride(-1),\n            float(gate_multiplier),\n"
        "            n_cols=n_cols,"),
    Bug("block-size-helper", "block size computed in a utils helper",
        "ligerlite/ops/utils.py", "utils module", "tests/test_swiglu.py",
        "    BLOCK_SIZE = triton.next_power_of_2(n)",
        "    BLOCK_SIZE = triton.next_power_of_2(n) // 4"),
    Bug("contiguous-decorator", "argument order in a utils decorator on the stack",
        "ligerlite/ops/utils.py", "utils module", "tests/test_swiglu.py",
        "        args = [maybe_to_contiguous(arg) for arg in args]",
        "        args = [maybe_to_contiguous(arg) for arg in reversed(args)]"),
    Bug("geglu-constant", "numerics in the kernel", "ligerlite/ops/geglu.py",
        "kernel module", "tests/test_geglu.py",
        "    sqrt_2_over_pi = 0.7978845608028654  # sqrt(2 / pi)\n    a_cubed = a_row * a_row "
        "* a_row\n    tanh_arg = sqrt_2_over_pi * (a_row + 0.044715 * a_cubed)\n    tanh_result "
        "= tanh(tanh_arg)\n    geglu_a = 0.5 * a_row * (1 + tanh_result)\n    c_row",
        "    sqrt_2_over_pi = 0.5978845608028654  # sqrt(2 / pi)\n    a_cubed = a_row * a_row "
        "* a_row\n    tanh_arg = sqrt_2_over_pi * (a_row + 0.044715 * a_cubed)\n    tanh_result "
        "= tanh(tanh_arg)\n    geglu_a = 0.5 * a_row * (1 + tanh_result)\n    c_row"),
    Bug("geglu-grid", "wrong launch grid, same module", "ligerlite/ops/geglu.py",
        "kernel module", "tests/test_geglu.py",
        "        _geglu_tanh_forward_kernel[(n_rows,)](",
        "        _geglu_tanh_forward_kernel[(n_rows // 2,)]("),
    Bug("rms-norm-mean", "numerics in a 712-line module", "ligerlite/ops/rms_norm.py",
        "kernel module", "tests/test_rms_norm.py",
        "    mean_square = tl.sum(X_row * X_row, axis=0) / n_cols\n    rstd = rsqrt(mean_square "
        "+ eps)\n\n    # We can save time",
        "    mean_square = tl.sum(X_row * X_row, axis=0) / (n_cols + 1)\n    rstd = "
        "rsqrt(mean_square + eps)\n\n    # We can save time"),
    Bug("softmax-max", "overflow: the row maximum is not subtracted",
        "ligerlite/ops/softmax.py", "kernel module", "tests/test_softmax.py",
        "    m = tl.max(x, axis=0)\n    e = tl.exp(x - m)",
        "    m = tl.max(x, axis=0)\n    e = tl.exp(x)"),
    Bug("cross-entropy-lse", "numerics in a 607-line module", "ligerlite/ops/cross_entropy.py",
        "kernel module", "tests/test_cross_entropy.py",
        "    lse = m + tl.log(d)", "    lse = m + tl.log(d + 1.0)"),
    Bug("element-mul", "kernel in utils launched by another module's wrapper",
        "ligerlite/ops/utils.py", "utils module (its own kernel)", "tests/test_cross_entropy.py",
        "        tl.store(X_ptrs, X_block * grad_output, mask=X_offsets < n_cols)",
        "        tl.store(X_ptrs, X_block * grad_output * 0.5, mask=X_offsets < n_cols)"),
    Bug("silu-dispatcher", "numerics in a jit helper behind a constexpr dispatcher",
        "ligerlite/ops/activation_fns.py", "jit helper module (20 activations)",
        "tests/test_activation.py",
        "    return xf / (1.0 + tl.exp(-xf))", "    return xf / (1.0 + tl.exp(xf))"),
    # the shapes real libraries have and the first benchmark missed (issue 25)
    Bug("mish-autotuned-dispatcher", "a helper behind the dispatcher of an autotuned, heuristic "
        "kernel (relative import, positional arguments, if chains without elif)",
        "ligerlite/ops/activation_fns.py", "jit helper module (20 activations)",
        "tests/test_fused_activation.py",
        "    return x * _tanh(_softplus(x))", "    return x * _tanh(_softplus(x * 0.5))"),
    Bug("rms-norm-rows-per-program", "rows per program of the partial-gradient buffer, "
        "rounded down in backward", "ligerlite/ops/rms_norm.py", "autograd backward wrapper",
        "tests/test_rms_norm_grad.py",
        "    rows_per_program = math.ceil(n_rows / sm_count)",
        "    rows_per_program = n_rows // sm_count"),
    Bug("rms-norm-gradient-count", "backward returns one gradient too few (autograd raises)",
        "ligerlite/ops/rms_norm.py", "autograd Function", "tests/test_rms_norm_grad.py",
        "        return dX, dW, None, None, None, None, None",
        "        return dX, dW, None, None, None"),
    Bug("rms-norm-forward-beside-grads", "the forward kernel, checked in a test helper that "
        "also checks gradients", "ligerlite/ops/rms_norm.py", "kernel module",
        "tests/test_rms_norm_grad.py",
        "    mean_square = tl.sum(X_row * X_row, axis=0) / n_cols\n    rstd = rsqrt(mean_square "
        "+ eps)\n\n    # We can save time",
        "    mean_square = tl.sum(X_row * X_row, axis=0) / (n_cols + 1)\n    rstd = "
        "rsqrt(mean_square + eps)\n\n    # We can save time"),
    Bug("rms-norm-block-size", "block size halved in a utils helper, two paths compared",
        "ligerlite/ops/utils.py", "utils module", "tests/test_rms_norm_paths.py",
        "    BLOCK_SIZE = triton.next_power_of_2(n)\n",
        "    BLOCK_SIZE = triton.next_power_of_2(n) // 2\n"),
)

#: Twenty activations as (name, what the docstrings call it, forward body, gradient body),
#: from which :func:`activation_fns` writes a long module the way Triton activation
#: libraries are written (attorch's ``act_kernels.py``): a documented ``@triton.jit``
#: function and its gradient per activation, and a dispatcher on a constexpr name.
ACTIVATIONS = (
    ("relu", "ReLU", "return tl.maximum(x, 0.0)", "return tl.where(x > 0.0, dy, 0.0)"),
    ("relu6", "ReLU6", "return tl.minimum(tl.maximum(x, 0.0), 6.0)",
     "return tl.where((x > 0.0) & (x < 6.0), dy, 0.0)"),
    ("squared_relu", "squared ReLU", "r = tl.maximum(x, 0.0)\nreturn r * r",
     "return 2.0 * tl.maximum(x, 0.0) * dy"),
    ("leaky_relu", "leaky ReLU", "return tl.where(x >= 0.0, x, x * LEAKY_SLOPE)",
     "return tl.where(x >= 0.0, dy, dy * LEAKY_SLOPE)"),
    ("elu", "ELU", "return tl.where(x > 0.0, x, tl.exp(tl.minimum(x, 0.0)) - 1.0)",
     "return tl.where(x > 0.0, dy, dy * tl.exp(tl.minimum(x, 0.0)))"),
    ("selu", "SELU",
     "negative = (tl.exp(tl.minimum(x, 0.0)) - 1.0) * SELU_ALPHA\n"
     "return tl.where(x > 0.0, x, negative) * SELU_SCALE",
     "negative = tl.exp(tl.minimum(x, 0.0)) * SELU_ALPHA\n"
     "return tl.where(x > 0.0, dy, dy * negative) * SELU_SCALE"),
    ("sigmoid", "sigmoid", "return tl.sigmoid(x)",
     "s = tl.sigmoid(x)\nreturn dy * s * (1.0 - s)"),
    ("hard_sigmoid", "hard sigmoid", "return tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0) / 6.0",
     "return tl.where((x > -3.0) & (x < 3.0), dy / 6.0, 0.0)"),
    ("silu", "SiLU",
     "# x * sigmoid(x), written out so the division is done once in fp32\n"
     "xf = x.to(tl.float32)\nreturn xf / (1.0 + tl.exp(-xf))",
     "s = tl.sigmoid(x)\nreturn dy * s * (1.0 + x * (1.0 - s))"),
    ("hard_swish", "hard swish", "return x * hard_sigmoid(x)",
     "inside = dy * (2.0 * x + 3.0) / 6.0\n"
     "return tl.where(x < -3.0, 0.0, tl.where(x > 3.0, dy, inside))"),
    ("gelu", "GELU (exact, with erf)", "return 0.5 * x * (1.0 + tl.erf(x * INV_SQRT_2))",
     "cdf = 0.5 * (1.0 + tl.erf(x * INV_SQRT_2))\npdf = tl.exp(-0.5 * x * x) * INV_SQRT_2PI\n"
     "return dy * (cdf + x * pdf)"),
    ("gelu_tanh", "GELU (tanh approximation)",
     "inner = (x + 0.044715 * x * x * x) * SQRT_2_OVER_PI\nreturn 0.5 * x * (1.0 + _tanh(inner))",
     "t = _tanh((x + 0.044715 * x * x * x) * SQRT_2_OVER_PI)\n"
     "d_inner = (1.0 + 0.134145 * x * x) * SQRT_2_OVER_PI\n"
     "return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner)"),
    ("quick_gelu", "quick GELU", "return x * tl.sigmoid(1.702 * x)",
     "s = tl.sigmoid(1.702 * x)\nreturn dy * (s + 1.702 * x * s * (1.0 - s))"),
    ("tanh", "tanh", "return _tanh(x)", "t = _tanh(x)\nreturn dy * (1.0 - t * t)"),
    ("hard_tanh", "hard tanh", "return tl.minimum(tl.maximum(x, -1.0), 1.0)",
     "return tl.where((x > -1.0) & (x < 1.0), dy, 0.0)"),
    ("softplus", "softplus", "return _softplus(x)",
     "return tl.where(x > SOFTPLUS_THRESHOLD, dy, dy * tl.sigmoid(x))"),
    ("softsign", "softsign", "return x / (1.0 + tl.abs(x))",
     "d = 1.0 + tl.abs(x)\nreturn dy / (d * d)"),
    ("mish", "Mish", "return x * _tanh(_softplus(x))",
     "t = _tanh(_softplus(x))\nreturn dy * (t + x * tl.sigmoid(x) * (1.0 - t * t))"),
    ("log_sigmoid", "log-sigmoid", "return -_softplus(-x)", "return dy * tl.sigmoid(-x)"),
    ("identity", "the identity", "return x", "return dy"),
)

ACTIVATION_HEADER = '''\
"""Elementwise activations for Triton kernels, one ``@triton.jit`` function each.

``apply_activation(x, ACTIVATION)`` dispatches on a ``tl.constexpr`` name, so a kernel
compiles only the activation it is launched with; ``apply_activation_grad`` does the
same for the backward pass. Every function takes and returns fp32 blocks.
"""

import triton
import triton.language as tl

SQRT_2_OVER_PI: tl.constexpr = tl.constexpr(0.7978845608028654)
INV_SQRT_2: tl.constexpr = tl.constexpr(0.7071067811865476)
INV_SQRT_2PI: tl.constexpr = tl.constexpr(0.3989422804014327)
SELU_ALPHA: tl.constexpr = tl.constexpr(1.6732632423543772)
SELU_SCALE: tl.constexpr = tl.constexpr(1.0507009873554805)
LEAKY_SLOPE: tl.constexpr = tl.constexpr(0.01)
SOFTPLUS_THRESHOLD: tl.constexpr = tl.constexpr(20.0)


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _softplus(x):
    # log(1 + exp(x)), linear above the threshold like torch
    safe = tl.minimum(x, SOFTPLUS_THRESHOLD)
    return tl.where(x > SOFTPLUS_THRESHOLD, x, tl.log(1.0 + tl.exp(safe)))
'''

_INPUT_DOC = "x: Input. The input must be loaded and cannot be a pointer."
_GRAD_DOC = "dy: Output gradients. They must be loaded and cannot be a pointer."


def _jit(signature: str, doc: list[str], body: str) -> str:
    lines = ["@triton.jit", f"def {signature}:", '    """']
    lines += [f"    {line}".rstrip() for line in doc] + ['    """']
    lines += [f"    {line}" for line in body.splitlines()]
    return "\n".join(lines) + "\n"


def _dispatcher(signature: str, target: str, call: str) -> str:
    lines = ["@triton.jit", f"def {signature}:"]
    for index, (name, *_rest) in enumerate(ACTIVATIONS[:-1]):
        test = f'ACTIVATION == "{name}"' + (' or ACTIVATION == "swish"' if name == "silu"
                                           else "")
        lines += [f"    {'if' if index == 0 else 'elif'} {test}:",
                  f"        {target} = {name}{call}"]
    lines += ["    else:", f"        {target} = identity{call}", f"    return {target}"]
    return "\n".join(lines) + "\n"


def _real_dispatcher() -> str:
    """A dispatcher the way real libraries write one: a long docstring, positional
    parameters besides the constexpr name, ``if`` chains of which only some use ``elif``,
    each assigning ``output``, and a dropout branch the kernel turns off."""
    lines = ["@triton.jit",
             "def apply_act(x, drop_p, seed, param, act: tl.constexpr, dropout: tl.constexpr):",
             '    """', "    Applies the activation named by act to the input, then dropout.", "",
             "    Args:", f"        {_INPUT_DOC}", "        drop_p: Dropout probability.",
             "        seed: Seed of the dropout's random numbers.",
             "        param: The activation's parameter, where it has one.",
             "        act: Name of the activation (a constexpr: Triton folds the branches).",
             "        dropout: Whether to apply dropout.", "", "    Returns:",
             "        The activated input.", '    """']
    for index, (name, *_rest) in enumerate(ACTIVATIONS):
        keyword = "if" if index % 4 == 0 else "elif"
        lines += [f"    {keyword} act == '{name}':", "        x = x.to(tl.float32)",
                  f"        output = {name}(x)"]
    lines += ["    if dropout:", "        keep = tl.rand(seed, tl.arange(0, 1)) > drop_p",
              "        output = tl.where(keep, output / (1.0 - drop_p), 0.0)",
              "    return output"]
    return "\n".join(lines) + "\n"


def activation_fns() -> str:
    """The long activation module: twenty documented activations, their gradients and
    the three dispatchers."""
    parts = [ACTIVATION_HEADER]
    for name, title, forward, grad in ACTIVATIONS:
        parts.append(_jit(f"{name}(x)", [f"Applies {title} to the input.", "", "Args:",
                                         f"    {_INPUT_DOC}", "", "Returns:",
                                         f"    Input transformed by {title}."], forward))
        parts.append(_jit(f"{name}_grad(x, dy)",
                          [f"Calculates the gradient of {title}.", "", "Args:",
                           f"    {_INPUT_DOC}", f"    {_GRAD_DOC}", "", "Returns:",
                           f"    Gradient of {title} with respect to the input."], grad))
    parts.append(_dispatcher("apply_activation(x, ACTIVATION: tl.constexpr)", "y", "(x)"))
    parts.append(_dispatcher("apply_activation_grad(x, dy, ACTIVATION: tl.constexpr)", "dx",
                             "_grad(x, dy)"))
    parts.append(_real_dispatcher())
    return "\n\n".join(parts)


#: The kernel that applies one activation per launch, and its wrapper.
ACTIVATION = '''\
import torch
import triton
import triton.language as tl

from ligerlite.ops.activation_fns import apply_activation, apply_activation_grad
from ligerlite.ops.utils import calculate_settings


@triton.jit
def _activation_forward_kernel(
    x_ptr, y_ptr, x_row_stride, y_row_stride, n_cols,
    ACTIVATION: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    x = tl.load(x_ptr + row * x_row_stride + offsets, mask=mask, other=0.0).to(tl.float32)
    y = apply_activation(x, ACTIVATION)
    tl.store(y_ptr + row * y_row_stride + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _activation_backward_kernel(
    x_ptr, dy_ptr, dx_ptr, row_stride, n_cols,
    ACTIVATION: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    x = tl.load(x_ptr + row * row_stride + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * row_stride + offsets, mask=mask, other=0.0).to(tl.float32)
    dx = apply_activation_grad(x, dy, ACTIVATION)
    tl.store(dx_ptr + row * row_stride + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)


def activation_forward(x, activation):
    shape = x.shape
    x = x.reshape(-1, shape[-1]).contiguous()
    n_rows, n_cols = x.shape
    BLOCK_SIZE, num_warps = calculate_settings(n_cols)
    y = torch.empty_like(x)
    _activation_forward_kernel[(n_rows,)](
        x, y, x.stride(0), y.stride(0), n_cols,
        ACTIVATION=activation, BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps,
    )
    return y.view(*shape)


def activation_backward(x, dy, activation):
    shape = x.shape
    x = x.reshape(-1, shape[-1]).contiguous()
    dy = dy.reshape(-1, shape[-1]).contiguous()
    n_rows, n_cols = x.shape
    BLOCK_SIZE, num_warps = calculate_settings(n_cols)
    dx = torch.empty_like(x)
    _activation_backward_kernel[(n_rows,)](
        x, dy, dx, x.stride(0), n_cols,
        ACTIVATION=activation, BLOCK_SIZE=BLOCK_SIZE, num_warps=num_warps,
    )
    return dx.view(*shape)


class LigerActivationFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, activation):
        ctx.save_for_backward(x)
        ctx.activation = activation
        return activation_forward(x, activation)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return activation_backward(x, dy, ctx.activation), None
'''

#: An autotuned, heuristic kernel reaching the dispatcher by relative import, with
#: positional arguments, and its wrapper: the shape real activation libraries have.
FUSED_ACTIVATION = '''\
"""The activation on a block of rows, autotuned."""

import torch
import triton
import triton.language as tl

from .activation_fns import apply_act


@triton.autotune(
    configs=[triton.Config({"BLOCK_ROWS": 1}, num_warps=4),
             triton.Config({"BLOCK_ROWS": 2}, num_warps=4)],
    key=["n_rows", "n_cols"],
)
@triton.heuristics({"EVEN_COLS": lambda args: args["n_cols"] % args["BLOCK_COLS"] == 0})
@triton.jit
def _fused_act_kernel(x_ptr, y_ptr, n_rows, n_cols, row_stride, act: tl.constexpr,
                      BLOCK_COLS: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                      EVEN_COLS: tl.constexpr):
    """
    Applies an activation to each row of a matrix, a block of rows per program.

    Args:
        x_ptr: Pointer to the input, of shape [n_rows, n_cols].
        y_ptr: Pointer to the output, of the same shape.
        n_rows: Number of rows.
        n_cols: Number of columns.
        row_stride: Stride between rows, for both.
        act: Name of the activation, one of those of apply_act.
        BLOCK_COLS: Columns per block, at least n_cols.
        BLOCK_ROWS: Rows per program (autotuned).
        EVEN_COLS: Whether n_cols fills the column block (a heuristic).
    """
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_COLS)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offsets = rows[:, None] * row_stride + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    y = apply_act(x, 0.0, 0, 0.0, act, False)
    tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)


def fused_act(x, act):
    shape = x.shape
    x = x.reshape(-1, shape[-1]).contiguous()
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    grid = lambda meta: (triton.cdiv(n_rows, meta["BLOCK_ROWS"]),)
    _fused_act_kernel[grid](x, y, n_rows, n_cols, x.stride(0), act,
                            BLOCK_COLS=triton.next_power_of_2(n_cols))
    return y.view(*shape)
'''

TESTS = {
    "tests/test_swiglu.py": '''\
        import pytest
        import torch
        import torch.nn.functional as F

        from ligerlite.ops.swiglu_ops import LigerSiLUMulFunction


        def pair(rows, cols):
            torch.manual_seed(0)
            a = torch.randn(rows, cols, device="cuda", requires_grad=True)
            b = torch.randn(rows, cols, device="cuda", requires_grad=True)
            return a, b


        @pytest.mark.parametrize("rows, cols", [(4, 64), (3, 100)])
        def test_swiglu_forward(rows, cols):
            a, b = pair(rows, cols)
            torch.testing.assert_close(LigerSiLUMulFunction.apply(a, b), F.silu(a) * b)


        def test_swiglu_backward():
            a, b = pair(4, 64)
            ar, br = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
            grad = torch.randn(4, 64, device="cuda")
            LigerSiLUMulFunction.apply(a, b).backward(grad)
            (F.silu(ar) * br).backward(grad)
            torch.testing.assert_close(a.grad, ar.grad, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(b.grad, br.grad, rtol=1e-4, atol=1e-4)
        ''',
    "tests/test_geglu.py": '''\
        import torch
        import torch.nn.functional as F

        from ligerlite.ops.geglu import LigerGELUMulFunction


        def test_geglu():
            torch.manual_seed(0)
            a = torch.randn(6, 64, device="cuda")
            b = torch.randn(6, 64, device="cuda")
            torch.testing.assert_close(LigerGELUMulFunction.apply(a, b),
                                       F.gelu(a, approximate="tanh") * b)
        ''',
    "tests/test_rms_norm.py": '''\
        import torch

        from ligerlite.ops.rms_norm import LigerRMSNormFunction


        def test_rms_norm():
            torch.manual_seed(0)
            x = torch.randn(4, 64, device="cuda")
            w = torch.randn(64, device="cuda")
            ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
            torch.testing.assert_close(
                LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False), ref)
        ''',
    "tests/test_softmax.py": '''\
        import torch

        from ligerlite.ops.softmax import LigerSoftmaxFunction


        def test_softmax_of_large_logits():
            torch.manual_seed(0)
            x = torch.randn(4, 64, device="cuda") * 100
            torch.testing.assert_close(LigerSoftmaxFunction.apply(x), torch.softmax(x, -1))
        ''',
    "tests/test_cross_entropy.py": '''\
        import torch
        import torch.nn.functional as F

        from ligerlite.ops.cross_entropy import LigerCrossEntropyFunction


        def test_cross_entropy_and_its_scaled_gradient():
            torch.manual_seed(0)
            logits = torch.randn(8, 128, device="cuda", requires_grad=True)
            target = torch.randint(0, 128, (8,), device="cuda")
            ref_logits = logits.detach().clone().requires_grad_()
            loss = LigerCrossEntropyFunction.apply(logits, target, None)[0]
            ref = F.cross_entropy(ref_logits, target)
            torch.testing.assert_close(loss, ref)
            (loss * 2.0).backward()
            (ref * 2.0).backward()
            torch.testing.assert_close(logits.grad, ref_logits.grad)
        ''',
    "tests/test_activation.py": '''\
        import pytest
        import torch
        import torch.nn.functional as F

        from ligerlite.ops.activation import LigerActivationFunction

        REFERENCES = {
            "identity": lambda x: x,
            "relu": F.relu,
            "relu6": F.relu6,
            "squared_relu": lambda x: F.relu(x) ** 2,
            "leaky_relu": lambda x: F.leaky_relu(x, 0.01),
            "elu": F.elu,
            "selu": F.selu,
            "sigmoid": torch.sigmoid,
            "hard_sigmoid": F.hardsigmoid,
            "silu": F.silu,
            "hard_swish": F.hardswish,
            "gelu": F.gelu,
            "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
            "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
            "tanh": torch.tanh,
            "hard_tanh": F.hardtanh,
            "softplus": F.softplus,
            "softsign": F.softsign,
            "mish": F.mish,
            "log_sigmoid": F.logsigmoid,
        }


        @pytest.mark.parametrize("dtype", [torch.float32], ids=["float32"])
        @pytest.mark.parametrize("act", sorted(REFERENCES))
        def test_act(act, dtype):
            torch.manual_seed(0)
            x = torch.randn(4, 64, device="cuda", dtype=dtype) * 3
            torch.testing.assert_close(LigerActivationFunction.apply(x, act),
                                       REFERENCES[act](x), rtol=1e-4, atol=1e-5)


        @pytest.mark.parametrize("act", sorted(REFERENCES))
        def test_act_grad(act):
            torch.manual_seed(0)
            x = (torch.randn(4, 64, device="cuda") * 3).requires_grad_()
            ref = x.detach().clone().requires_grad_()
            dy = torch.randn(4, 64, device="cuda")
            LigerActivationFunction.apply(x, act).backward(dy)
            REFERENCES[act](ref).backward(dy)
            torch.testing.assert_close(x.grad, ref.grad, rtol=1e-4, atol=1e-4)


        def test_swish_is_another_name_for_silu():
            torch.manual_seed(0)
            x = torch.randn(4, 64, device="cuda")
            torch.testing.assert_close(LigerActivationFunction.apply(x, "swish"),
                                       LigerActivationFunction.apply(x, "silu"))


        def test_an_unknown_name_is_the_identity():
            torch.manual_seed(0)
            x = torch.randn(4, 64, device="cuda")
            torch.testing.assert_close(LigerActivationFunction.apply(x, "no_such_act"), x)


        @pytest.mark.parametrize("cols", [1, 31, 100, 1000])
        @pytest.mark.parametrize("act", ["relu", "gelu_tanh", "softplus"])
        def test_rows_of_any_length(act, cols):
            # the block is the next power of two: the tail of each row is masked
            torch.manual_seed(0)
            x = torch.randn(3, cols, device="cuda") * 3
            torch.testing.assert_close(LigerActivationFunction.apply(x, act),
                                       REFERENCES[act](x), rtol=1e-4, atol=1e-5)


        def test_a_batch_of_sequences_keeps_its_shape():
            torch.manual_seed(0)
            x = torch.randn(2, 5, 64, device="cuda")
            y = LigerActivationFunction.apply(x, "mish")
            assert y.shape == x.shape
            torch.testing.assert_close(y, F.mish(x), rtol=1e-4, atol=1e-5)
        ''',
    "tests/test_fused_activation.py": '''\
        import pytest
        import torch
        import torch.nn.functional as F

        from ligerlite.ops.fused_activation import fused_act

        REFERENCES = {"relu": F.relu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
                      "silu": F.silu, "mish": F.mish, "softplus": F.softplus}


        @pytest.mark.parametrize("act", sorted(REFERENCES))
        @pytest.mark.parametrize("shape", [(5, 64)], ids=["5x64"])
        def test_fused_act(shape, act):
            torch.manual_seed(0)
            x = torch.randn(*shape, device="cuda") * 3
            torch.testing.assert_close(fused_act(x, act), REFERENCES[act](x), rtol=1e-4,
                                       atol=1e-5)
        ''',
    "tests/test_rms_norm_grad.py": '''\
        import torch

        from ligerlite.ops.rms_norm import LigerRMSNormFunction


        def _check_once(rows, cols):
            torch.manual_seed(0)
            x = torch.randn(rows, cols, device="cuda", requires_grad=True)
            w = torch.randn(cols, device="cuda", requires_grad=True)
            xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
            y = LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False)
            ref = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * wr
            torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
            dy = torch.randn_like(ref)
            y.backward(dy)
            ref.backward(dy)
            torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(w.grad, wr.grad, rtol=1e-4, atol=1e-4)


        def test_rms_norm_gradients():
            _check_once(6, 64)
        ''',
    "tests/test_rms_norm_paths.py": '''\
        """RMSNorm invariances: two paths through the same kernel must agree.

        The mean square of a row repeated twice is the mean square of the row, so the
        first half of the normalised repeated row is the normalised row; a Gemma offset
        is a weight shifted by one. Only the row length differs between the two paths.
        """

        import pytest
        import torch

        from ligerlite.ops.rms_norm import LigerRMSNormFunction

        EPS = 1e-6
        SHAPES = [(2, 4, 64), (1, 3, 96), (2, 1, 200), (4, 2, 128)]
        DTYPES = [(torch.float32, 1e-5, 1e-5)]


        def rms_norm(x, w, offset=0.0, casting_mode="llama", in_place=False):
            """The Liger kernel on a (batch, seq, hidden) input."""
            return LigerRMSNormFunction.apply(x, w, EPS, offset, casting_mode, in_place)


        def make_inputs(bs, sl, hd, dtype, seed=0):
            """Inputs on the test device, from a seeded generator."""
            generator = torch.Generator().manual_seed(seed)
            x = torch.randn(bs, sl, hd, generator=generator, dtype=dtype)
            w = torch.randn(hd, generator=generator, dtype=dtype)
            return x.to("cuda"), w.to("cuda")


        def repeated(x, w):
            """The input and weight with every row repeated twice along the hidden size."""
            return torch.cat([x, x], dim=-1), torch.cat([w, w])


        @pytest.mark.parametrize("bs, sl, hd", SHAPES)
        @pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
        def test_a_row_repeated_twice_normalises_like_the_row(bs, sl, hd, dtype, atol, rtol):
            x, w = make_inputs(bs, sl, hd, dtype)
            y1 = rms_norm(x, w)
            # the same kernel on rows twice as long: the mean square does not change
            y2 = rms_norm(*repeated(x, w))[..., :hd]
            assert torch.allclose(y1, y2, atol=atol, rtol=rtol)


        @pytest.mark.parametrize("bs, sl, hd", SHAPES[:2])
        @pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
        def test_a_gemma_offset_is_a_weight_shifted_by_one(bs, sl, hd, dtype, atol, rtol):
            x, w = make_inputs(bs, sl, hd, dtype, seed=1)
            y1 = rms_norm(x, w, offset=1.0, casting_mode="gemma")
            x2, w2 = repeated(x, w + 1.0)
            y2 = rms_norm(x2, w2, casting_mode="gemma")[..., :hd]
            assert torch.allclose(y1, y2, atol=atol, rtol=rtol)


        def test_an_unknown_casting_mode_is_refused():
            x, w = make_inputs(1, 2, 64, torch.float32)
            with pytest.raises(AssertionError, match="Invalid casting mode"):
                rms_norm(x, w, casting_mode="mistral")


        def test_the_weight_must_match_the_hidden_size():
            x, w = make_inputs(1, 2, 64, torch.float32)
            with pytest.raises(AssertionError, match="Incompatible hidden size"):
                rms_norm(x, w[:32])
        ''',
}

#: The scripted fixer: the fix only for what it was shown.
CONFTEST = '''\
import json
import os

from pytest_kernelfix.fixers.prompting import render_messages

BUG = json.loads(os.environ.get("KERNELFIX_BENCH_BUG", "null"))


def pytest_kernelfix_propose(request, config):
    if BUG is None:
        return None
    messages = render_messages(request)
    shown = "\\n".join(message["content"] for message in messages)
    visible = BUG["bad"] in shown
    with open(BUG["log"], "a", encoding="utf-8") as log:
        log.write(json.dumps({"round": request.round, "shown": visible,
                              "chars": len(shown), "prompt": shown if request.round == 1
                              else ""}) + "\\n")
    if visible:
        return json.dumps({"analysis": "the faulty line", "modifications": [
            {"file": BUG["file"], "old_string": BUG["bad"], "new_string": BUG["good"]}]})
    return json.dumps({"analysis": "the faulty code is not in what I was shown",
                       "modifications": []})
'''

#: For a baseline without kernelfix_select: every test is a kernel test.
MARK_ALL = '''

def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker("kernel")
'''

INI = """\
[pytest]
pythonpath = .
kernelfix_select = launched
"""


def _rewrite(text: str) -> str:
    return text.replace("from liger_kernel.", "from ligerlite.").replace(
        "import liger_kernel.", "import ligerlite.")


def _segments(source: str) -> tuple[list[str], list[tuple[ast.stmt, str]]]:
    """(header statements: imports and the import try-blocks, the other top-level nodes)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    header, nodes = [], []
    for node in tree.body:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        text = "\n".join(lines[start - 1:node.end_lineno])
        is_import = isinstance(node, (ast.Import, ast.ImportFrom)) or (
            isinstance(node, (ast.Try, ast.If)) and any(
                isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(node)))
        if is_import:
            header.append(text)
        else:
            nodes.append((node, text))
    return header, nodes


def _is_jit(node: ast.stmt) -> bool:
    return any("jit" in ast.unparse(d) for d in getattr(node, "decorator_list", []))


def build_project(root: Path, liger: Path) -> None:
    """The temporary project: liger modules, swiglu split in three, tests, fixer, ini."""
    files: dict[str, str] = {
        "ligerlite/__init__.py": "",
        "ligerlite/ops/__init__.py": "",
        "ligerlite/utils.py": _rewrite((liger / "utils.py").read_text()),
        "ligerlite/ops/utils.py": _rewrite((liger / "ops" / "utils.py").read_text()),
        "conftest.py": CONFTEST,
        "pytest.ini": INI,
    }
    for name in ("geglu", "rms_norm", "softmax", "cross_entropy"):
        files[f"ligerlite/ops/{name}.py"] = _rewrite((liger / "ops" / f"{name}.py").read_text())
    header, nodes = _segments(_rewrite((liger / "ops" / "swiglu.py").read_text()))
    kernels = [(n, t) for n, t in nodes if _is_jit(n) and getattr(n, "name", "") != "silu"]
    silu = [t for n, t in nodes if getattr(n, "name", "") == "silu"]
    rest = [t for n, t in nodes if _is_jit(n) is False]
    names = ", ".join(n.name for n, _ in kernels)  # type: ignore[attr-defined]
    files["ligerlite/ops/activations.py"] = (
        "import triton\nimport triton.language as tl\n\n\n" + "\n\n\n".join(silu) + "\n")
    files["ligerlite/ops/swiglu.py"] = (
        "\n".join(header) + "\n\nfrom ligerlite.ops.activations import silu\n\n\n"
        + "\n\n\n".join(t for _, t in kernels) + "\n")
    files["ligerlite/ops/swiglu_ops.py"] = (
        "\n".join(header) + f"\n\nfrom ligerlite.ops.swiglu import {names}\n\n\n"
        + "\n\n\n".join(rest) + "\n")
    files["ligerlite/ops/activation_fns.py"] = activation_fns()
    files["ligerlite/ops/activation.py"] = ACTIVATION
    files["ligerlite/ops/fused_activation.py"] = FUSED_ACTIVATION
    for name, text in TESTS.items():
        files[name] = textwrap.dedent(text)
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def inject(root: Path, bug: Bug) -> None:
    path = root / bug.file
    text = path.read_text()
    if bug.good not in text:
        raise SystemExit(f"{bug.name}: the line to break is not in {bug.file}")
    path.write_text(text.replace(bug.good, bug.bad, 1))


@dataclass(frozen=True)
class Outcome:
    bug: Bug
    healed: bool
    shown: bool
    prompt_chars: int
    prompt_tokens: int
    rounds: int
    seconds: float
    detail: str


def _tokens(text: str) -> int:
    """Tokens of ``text`` in o200k_base (GPT-4o's encoding), read offline from the copy
    litellm ships; -1 when it cannot be loaded."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("litellm")  # found, not imported (no network)
        if spec is not None and spec.submodule_search_locations:
            cache = Path(spec.submodule_search_locations[0]) / "litellm_core_utils" / "tokenizers"
            os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(cache))
        import tiktoken

        return len(tiktoken.get_encoding("o200k_base").encode(text))
    except Exception:
        return -1


def run_bug(pristine: Path, bug: Bug, work: Path, baseline: Path | None = None) -> Outcome:
    where = work / ("baseline-" + bug.name if baseline else bug.name)
    root = where / "project"
    shutil.copytree(pristine, root)
    inject(root, bug)
    log = where / "fixer.jsonl"
    env = {**os.environ, "KERNELFIX_BENCH_BUG": json.dumps(
        {"file": bug.file, "bad": bug.bad, "good": bug.good, "log": str(log)})}
    env.pop("TRITON_INTERPRET", None)
    if baseline is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(baseline), *filter(None, [os.environ.get("PYTHONPATH")])])
        with open(root / "conftest.py", "a", encoding="utf-8") as conftest:
            conftest.write(MARK_ALL)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", bug.tests, "-q", "-p", "no:cacheprovider",
         "-p", "no:randomly", "--kernelfix", "--kernelfix-rounds=2"],
        cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - started
    report_path = root / ".kernelfix" / "report.json"
    if not report_path.exists():
        tail = (done.stdout + done.stderr)[-1500:]
        return Outcome(bug, False, False, 0, 0, 0, seconds, f"no report: {tail}")
    report = json.loads(report_path.read_text())
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    first = next((call for call in calls if call["round"] == 1), None)
    healed = [b for b in report["bugs"] if b["status"] == "healed"
              and bug.file in b["changed_files"]]
    chars = first["chars"] if first else 0
    detail = "; ".join(f"{b['id']}: {b['status']}: {b['reason'][:120]}" for b in report["bugs"])
    return Outcome(
        bug, bool(healed), bool(first and first["shown"]), chars,
        _tokens(first["prompt"]) if first else 0,
        max((b["rounds"] for b in healed), default=0), seconds, detail)


# -- measured in this process -------------------------------------------------------------


LAUNCH_TEST = '''\
import os
import time

import torch
import triton

from ligerlite.ops.swiglu import _swiglu_forward_kernel
from pytest_kernelfix.capture.launches import LaunchRecorder

A = torch.randn(4, 64)
ARGS = (A, A, torch.empty_like(A), 64, 1.0)
KWARGS = {"n_cols": 64, "BLOCK_SIZE": 64, "grid": (4,), "warmup": False}


def record_many(recorder, count):
    start = time.process_time()  # CPU time: other processes on a busy machine do not count
    for _ in range(count):
        recorder._record(_swiglu_forward_kernel, ARGS, KWARGS)
    return (time.process_time() - start) / count * 1e6


def wrapper(recorder, count):  # a project frame between the test and the launch
    return record_many(recorder, count)


def launch_many(count):
    start = time.process_time()
    for _ in range(count):
        _swiglu_forward_kernel[(4,)](*ARGS[:4], 1.0, n_cols=64, BLOCK_SIZE=64)
    return (time.process_time() - start) / count * 1e6


def test_measure():
    root = os.environ["BENCH_ROOT"]
    plain, sites = [], []
    for _ in range(15):  # interleaved, so a busy machine slows both alike
        plain.append(wrapper(LaunchRecorder(), 2000))
        sites.append(wrapper(LaunchRecorder(root), 2000))
    plain, sites = min(plain), min(sites)
    launch = min(launch_many(50) for _ in range(3))
    print(f"\\nRESULT {plain:.2f} {sites:.2f} {launch:.1f}")
'''


def launch_cost(pristine: Path, work: Path) -> tuple[float, float, float]:
    """Microseconds per recorded launch without and with launch sites, inside a pytest
    test (so the stack is a real test runner's), and per interpreted launch itself."""
    root = work / "launch-cost"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(pristine, root)
    (root / "tests" / "test_launch_cost.py").write_text(LAUNCH_TEST)
    env = {**os.environ, "BENCH_ROOT": str(root), "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_launch_cost.py", "-q", "-s",
         "-p", "no:cacheprovider", "--kernelfix-device=interpret"],
        cwd=root, env=env, capture_output=True, text=True, timeout=900)
    line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), "")
    if not line:
        raise SystemExit("the launch-cost test failed:\n" + done.stdout[-3000:])
    plain, sites, launch = (float(value) for value in line.split()[1:])
    return plain, sites, launch


def reach_cost(liger: Path, work: Path) -> list[tuple[str, int, int, float, float, float,
                                                    float]]:
    """Per large liger module (copied, since reach never reads installed packages): lines,
    kernels, CPU ms to index it cold, and per kernel the CPU ms to locate what it reaches
    cold (every module it reaches indexed on the way) and warm, and definitions found."""
    from pytest_kernelfix.locate.outline import parse_module
    from pytest_kernelfix.locate.reach import Reach, Seeds
    from pytest_kernelfix.project import Project

    root = work / "reach-cost"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(liger, root / "liger_kernel",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    rows = []
    modules = sorted((root / "liger_kernel" / "ops").glob("*.py"),
                     key=lambda p: -p.stat().st_size)
    modules = [path for path in modules if "@triton.jit" in path.read_text()][:6]
    for path in modules:
        text = path.read_text()
        timings = []
        for _ in range(3):
            parse_module.cache_clear()
            start = time.process_time()
            index = parse_module(text)
            timings.append((time.process_time() - start) * 1e3)
        kernels = [d for d in index.definitions if d.jit]
        cold, warm, found = [], [], []
        for kernel in kernels:
            parse_module.cache_clear()
            reach = Reach(Project(root))
            seeds = Seeds(kernels=((str(path), kernel.line),))
            start = time.process_time()
            located = reach.locate(seeds)
            cold.append((time.process_time() - start) * 1e3)
            start = time.process_time()
            reach.locate(seeds)
            warm.append((time.process_time() - start) * 1e3)
            found.append(len(located))
        rows.append((f"liger_kernel/ops/{path.name}", text.count("\n"), len(kernels),
                     min(timings), statistics.median(cold), statistics.median(warm),
                     statistics.median(found)))
    return rows


def extract(rev: str, work: Path) -> Path:
    """The plugin as it was at ``rev``, importable from the returned directory."""
    target = work / "baseline-plugin"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev, "pytest_kernelfix",
                              "prompts"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    prompts = target / "pytest_kernelfix" / "prompts"  # the wheel's layout
    shutil.move(str(target / "prompts"), str(prompts))
    (prompts / "__init__.py").write_text("")
    return target


def summary(label: str, outcomes: list[Outcome]) -> None:
    outside = [o for o in outcomes if o.bug.where != "kernel module"]
    wrong = [o.bug.name for o in outcomes if not (o.shown and o.healed)]
    print(f"{label}: healed {sum(o.healed for o in outcomes)} / {len(outcomes)} "
          f"({sum(o.healed for o in outside)} / {len(outside)} outside the kernel's module); "
          f"faulty code in the first prompt {sum(o.shown for o in outcomes)} / {len(outcomes)}; "
          f"wrong (not shown or not healed) {len(wrong)}" + (f": {', '.join(wrong)}" if wrong
                                                            else ""))
    sizes = [o.prompt_chars for o in outcomes if o.prompt_chars]
    tokens = [o.prompt_tokens for o in outcomes if o.prompt_tokens > 0]
    if sizes:
        print(f"  first prompt: median {statistics.median(sizes):.0f} chars, max {max(sizes)}; "
              f"under {PROMPT_BUDGET}: {sum(size < PROMPT_BUDGET for size in sizes)} / "
              f"{len(sizes)}")
    if tokens:
        print(f"  in o200k_base tokens: median {statistics.median(tokens):.0f}, max "
              f"{max(tokens)}; under {TOKEN_BUDGET}: "
              f"{sum(count < TOKEN_BUDGET for count in tokens)} / {len(tokens)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--keep", type=Path, default=None, help="keep the projects here")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also heal every bug with the plugin as it was at REV")
    options = parser.parse_args()
    import liger_kernel

    liger = Path(liger_kernel.__file__).parent
    work = options.keep or Path(tempfile.mkdtemp(prefix="kernelfix-reach-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    pristine = work / "pristine"
    shutil.rmtree(pristine, ignore_errors=True)
    build_project(pristine, liger)
    sane = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--kernelfix-device=interpret"], cwd=pristine,
                          capture_output=True, text=True, timeout=1800)
    if sane.returncode != 0:
        raise SystemExit("the unbroken project does not pass:\n" + sane.stdout[-3000:])
    print(f"unbroken project: {sane.stdout.strip().splitlines()[-1]}")
    bugs = [b for b in BUGS if options.only is None or b.name in options.only]
    started = time.monotonic()
    with ThreadPoolExecutor(options.jobs) as pool:
        outcomes = list(pool.map(lambda bug: run_bug(pristine, bug, work), bugs))
    total = time.monotonic() - started
    before: list[Outcome] = []
    if options.baseline:
        plugin = extract(options.baseline, work)
        with ThreadPoolExecutor(options.jobs) as pool:
            before = list(pool.map(lambda bug: run_bug(pristine, bug, work, plugin), bugs))
    print()
    print("| bug | kind | where | faulty line in first prompt | healed | rounds | "
          "first prompt chars | o200k tokens | seconds |")
    print("|---|---|---|---|---|---:|---:|---:|---:|")
    for o in outcomes:
        print(f"| {o.bug.name} | {o.bug.kind} | {o.bug.where} | {'yes' if o.shown else 'no'} | "
              f"{'yes' if o.healed else 'no'} | {o.rounds} | {o.prompt_chars} | "
              f"{o.prompt_tokens} | {o.seconds:.0f} |")
    print()
    summary("this tree", outcomes)
    if before:
        print()
        print(f"| bug | baseline ({options.baseline}): faulty line shown | healed | first "
              "prompt chars | o200k tokens |")
        print("|---|---|---|---:|---:|")
        for o in before:
            print(f"| {o.bug.name} | {'yes' if o.shown else 'no'} | "
                  f"{'yes' if o.healed else 'no'} | {o.prompt_chars} | {o.prompt_tokens} |")
        summary(f"baseline {options.baseline}", before)
    print(f"wall time, this tree: {total:.0f} s with {options.jobs} job(s)")
    for o in outcomes:
        if not o.healed:
            print(f"not healed: {o.bug.name}: {o.detail}")
    without, with_sites, launch = launch_cost(pristine, work)
    print()
    print(f"launch recording, inside a pytest test: {without:.1f} us per launch without sites, "
          f"{with_sites:.1f} us with sites ({with_sites / without:.2f}x); one interpreted "
          f"launch of the swiglu kernel itself: {launch:.0f} us")
    print()
    print("| module | lines | kernels | index ms | locate ms, cold | locate ms, warm | "
          "definitions found |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, lines, kernels, index_ms, cold, warm, found in reach_cost(liger, work):
        print(f"| {name} | {lines} | {kernels} | {index_ms:.1f} | {cold:.1f} | {warm:.2f} | "
              f"{found:.0f} |")
    if options.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
