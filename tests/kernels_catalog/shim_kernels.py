"""Kernels written for a GPU, used by the shim tests on the interpreter (test data)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def scale_by_eps(x_ptr, out_ptr, n, eps, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = x * eps.to(tl.float32)
    tl.static_assert(y.dtype == tl.float32)  # an fp32 scalar promotes fp16, as on a GPU
    tl.store(out_ptr + offs, y, mask=mask)


@triton.jit
def scale_by_constexpr(x_ptr, out_ptr, n, ALPHA: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if ALPHA > 1.0:  # a constexpr float stays a Python value
        x = x * ALPHA
    tl.store(out_ptr + offs, x, mask=mask)


@triton.jit
def unary(x_ptr, out_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, FN(tl.load(x_ptr + offs, mask=mask)), mask=mask)


@triton.jit
def binary(x_ptr, y_ptr, out_ptr, n, FN: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, FN(x, y), mask=mask)


@triton.jit
def double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


def _configs(*blocks: int) -> list[triton.Config]:
    return [triton.Config({"BLOCK": block}, num_warps=4) for block in blocks]


double_small_first = triton.autotune(configs=_configs(32, 64, 128), key=["n"])(double)
double_large_first = triton.autotune(configs=_configs(128, 64, 32), key=["n"])(double)


@triton.jit
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


def gpu_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A wrapper written for CUDA, as found in GPU code bases."""
    assert x.is_cuda and y.is_cuda, "inputs must be on the GPU"
    assert x.device == triton.runtime.driver.active.get_active_torch_device()
    out = torch.empty_like(x)
    n = x.numel()
    add[(triton.cdiv(n, 128),)](x, y, out, n, BLOCK=128)
    torch.cuda.synchronize()
    return out


@triton.jit
def sum_in_strides(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Sums ``x`` block by block; the loop index is widened with ``.to`` as compiled code can."""
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        offsets = start.to(tl.int64) + cols
        acc += tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    for unrolled in tl.static_range(2):  # a constexpr index: stays a Python int
        acc = acc * (unrolled + 1)
    tl.store(out_ptr + cols, acc)


@triton.jit
def copy_rows_below_level(x_ptr, out_ptr, n, levels, BLOCK: tl.constexpr, LEVEL: tl.constexpr):
    """Copies the first ``n`` rows when ``LEVEL < levels``: the mask is a boolean block and
    a comparison with a constexpr, which the interpreter's ``&`` makes int32."""
    rows = tl.arange(0, BLOCK)
    mask = (rows < n)[:, None] & (levels > LEVEL)
    values = tl.load(x_ptr + rows[:, None], mask=mask, other=0.0)
    tl.store(out_ptr + rows[:, None], values, mask=mask)


@triton.jit
def _lowest(dtype):
    """The smallest value of ``dtype``; compiled, ``dtype`` arrives as a constexpr."""
    kind = dtype.value
    if kind.is_floating():
        low: tl.constexpr = float("-inf")
        return low
    bits: tl.constexpr = kind.int_bitwidth
    low_int: tl.constexpr = -(2 ** (bits - 1))
    return low_int


@triton.jit
def running_max(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """The maximum of ``x``, starting from the lowest value of its dtype."""
    cols = tl.arange(0, BLOCK)
    kind = x_ptr.dtype.element_ty
    best = tl.full((BLOCK,), _lowest(kind), dtype=kind)
    values = tl.load(x_ptr + cols, mask=cols < n, other=_lowest(kind))
    best = tl.maximum(best, values)
    tl.store(out_ptr, tl.max(best, axis=0))


@triton.jit
def copy_inside(x_ptr, out_ptr, rows, cols, BLOCK: tl.constexpr, CHECK: tl.constexpr):
    """Copies the ``rows x cols`` top-left corner of a ``BLOCK x BLOCK`` tile; the mask is
    written with ``and`` (the compiler combines tensors elementwise), and a constexpr
    ``CHECK`` in front of it short-circuits."""
    r = tl.arange(0, BLOCK)[:, None]
    c = tl.arange(0, BLOCK)[None, :]
    inside = CHECK and r < rows and c < cols
    outside = r >= rows or c >= cols
    values = tl.load(x_ptr + r * BLOCK + c, mask=inside, other=-1.0)
    tl.store(out_ptr + r * BLOCK + c, tl.where(outside, -2.0, values))
