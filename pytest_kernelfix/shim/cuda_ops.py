"""torch overloads that only have a CUDA kernel, computed on the CPU for CUDA tensors.

``torch.mm``, ``addmm``, ``bmm`` and ``baddbmm`` take ``out_dtype=torch.float32`` on a
GPU (fp16 / bf16 operands, fp32 accumulation and result; liger-kernel's fused linear
losses use it); on the CPU torch raises ``Could not run 'aten::mm.dtype' with arguments
from the 'CPU' backend``. For the CUDA piece's tensors the operands are widened to
``out_dtype`` first: fp16 and bf16 products are exact in fp32, so the result is the
GPU's up to summation order. Like the CUDA overload, this is not autocast.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Functions whose ``out_dtype`` overload has a CUDA kernel only.
OUT_DTYPE_MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm"})


def needs_emulation(func: Any, kwargs: Mapping[str, Any]) -> bool:
    """Whether this call asks for an overload the CPU does not have."""
    return (kwargs.get("out_dtype") is not None
            and getattr(func, "__name__", "") in OUT_DTYPE_MATMULS)


def run(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``func`` with its tensor operands widened to ``out_dtype`` (and ``out=`` filled)."""
    __tracebackhide__ = True  # a bad call is the caller's error, as on a GPU
    import torch

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
