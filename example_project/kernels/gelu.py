"""GELU with the tanh approximation, as used by GPT-2 style MLPs."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def gelu_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    # Compute in fp32 whatever the storage dtype: x**3 loses too much in fp16.
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    # 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    y = 0.5 * x * (1.0 + tl.tanh(u))
    tl.store(out_ptr + offsets, y.to(out_ptr.dtype.element_ty), mask=mask)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """``torch.nn.functional.gelu(x, approximate="tanh")`` as a Triton kernel."""
    x = x.contiguous()
    out = torch.empty_like(x)
    n_elements = out.numel()
    grid = (triton.cdiv(n_elements, 1024),)
    gelu_kernel[grid](x, out, n_elements, BLOCK_SIZE=1024)
    return out
