"""Correct bf16 kernels, as a GPU suite has them (test data for ``tests/test_shim_bf16.py``).

Each computes in bf16 where Triton does: tensor-tensor arithmetic stays bf16 (both
operands bf16), ``tl.dot`` accumulates in fp32, ``tl.sum`` keeps the input type.
"""

from __future__ import annotations

import triton
import triton.language as tl

ELEMENTWISE = ("mul", "add", "sub", "neg", "maximum", "minimum", "where", "fma", "clamp",
               "scale", "fp32_roundtrip")


@triton.jit
def elementwise(x_ptr, y_ptr, z_ptr, out_ptr, n, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    z = tl.load(z_ptr + offs, mask=mask)
    if OP == "mul":
        r = x * y
    elif OP == "add":
        r = x + y
    elif OP == "sub":
        r = x - y
    elif OP == "neg":
        r = -x
    elif OP == "maximum":
        r = tl.maximum(x, y)
    elif OP == "minimum":
        r = tl.minimum(x, y)
    elif OP == "where":
        r = tl.where(x > y, x, y * z)
    elif OP == "fma":
        r = tl.fma(x, y, z)
    elif OP == "clamp":
        r = tl.clamp(x, y, z)
    elif OP == "scale":
        r = x * 1.5 + y
    else:
        r = (x.to(tl.float32) * y.to(tl.float32)).to(tl.bfloat16)  # rounded, not truncated
    tl.store(out_ptr + offs, r, mask=mask)


@triton.jit
def row_reduce(x_ptr, out_ptr, n_cols, OP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
    if OP == "sum":
        r = tl.sum(x, axis=0)
    elif OP == "max":
        r = tl.max(tl.where(cols < n_cols, x, -float("inf")), axis=0)
    elif OP == "min":
        r = tl.min(tl.where(cols < n_cols, x, float("inf")), axis=0)
    else:
        r = tl.argmax(tl.where(cols < n_cols, x, -float("inf")), axis=0).to(tl.bfloat16)
    tl.store(out_ptr + row, r)


@triton.jit
def row_cumsum(x_ptr, out_ptr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * BLOCK + cols)
    tl.store(out_ptr + row * BLOCK + cols, tl.cumsum(x, axis=0))


@triton.jit
def matmul(a_ptr, b_ptr, c_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
           BLOCK_K: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :],
                    mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :],
                    mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.bfloat16),
             mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def atomic_accumulate(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.atomic_add(out_ptr + offs % 4, tl.load(x_ptr + offs, mask=mask), mask=mask)


@triton.jit
def to_int(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask).to(tl.int32), mask=mask)


@triton.jit
def from_int(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask).to(tl.bfloat16), mask=mask)


@triton.jit
def descriptor_copy(desc, out_ptr, BLOCK: tl.constexpr):
    rows = tl.arange(0, BLOCK)
    tl.store(out_ptr + rows[:, None] * BLOCK + rows[None, :], desc.load([0, 0]))
