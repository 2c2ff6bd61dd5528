"""torch ops whose CUDA kernel the CPU lacks or computes differently, for CUDA tensors.

``torch.mm``, ``addmm``, ``bmm`` and ``baddbmm`` take ``out_dtype=torch.float32`` on a
GPU (fp16 / bf16 operands, fp32 accumulation and result; liger-kernel's fused linear
losses use it); on the CPU torch raises ``Could not run 'aten::mm.dtype' with arguments
from the 'CPU' backend``. For the CUDA piece's tensors the operands are widened to
``out_dtype`` first: fp16 and bf16 products are exact in fp32, so the result is the
GPU's up to summation order. Like the CUDA overload, this is not autocast.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

#: Functions whose ``out_dtype`` overload has a CUDA kernel only.
OUT_DTYPE_MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm"})


def needs_emulation(func: Any, kwargs: Mapping[str, Any],
                    args: tuple[Any, ...] = ()) -> bool:
    """Whether this call asks for an overload the CPU does not have, or for a gradient
    the CPU computes differently."""
    if (kwargs.get("out_dtype") is not None
            and getattr(func, "__name__", "") in OUT_DTYPE_MATMULS):
        return True
    return _hardswish_with_grad(func, args, kwargs)


def _hardswish_with_grad(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    import torch

    if func is not torch.nn.functional.hardswish:
        return False
    x = args[0] if args else kwargs.get("input")
    inplace = args[1] if len(args) > 1 else kwargs.get("inplace", False)
    return (isinstance(x, torch.Tensor) and not inplace and x.requires_grad
            and torch.is_grad_enabled())


@functools.cache
def _hardswish_function() -> Any:
    import torch

    class HardswishCuda(torch.autograd.Function):
        """``F.hardswish`` with the gradient of CUDA's kernel: ``grad * (x / 3 + 1/2)``
        on the closed band ``[-3, 3]``, computed in fp32 for fp16 and bf16 inputs."""

        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            ctx.save_for_backward(x)
            return torch._C._nn.hardswish(x)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            (x,) = ctx.saved_tensors
            wide = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
            xw, gw = x.to(wide), grad.to(wide)
            inside = gw * (xw / 3.0 + 0.5)
            result = torch.where(xw < -3.0, torch.zeros_like(gw),
                                 torch.where(xw <= 3.0, inside, gw))
            return result.to(grad.dtype)

    return HardswishCuda


def run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func`` as a GPU computes it: operands widened to ``out_dtype`` (and ``out=``
    filled), or hardswish with CUDA's gradient."""
    __tracebackhide__ = True  # a bad call is the caller's error, as on a GPU
    import torch

    if _hardswish_with_grad(func, args, kwargs):
        return _hardswish_function().apply(args[0] if args else kwargs["input"])
    kwargs = dict(kwargs)
    dtype = kwargs.pop("out_dtype")
    out = kwargs.pop("out", None)
    widened = [a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a
               for a in args]
    result = func(*widened, **kwargs)
    if out is None:
        return result
    out.copy_(result)
    return out
