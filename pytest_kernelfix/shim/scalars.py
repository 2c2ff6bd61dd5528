"""Pass float kernel arguments to interpreted kernels as fp32 scalars, as a GPU launch does.

A compiled kernel receives a Python float argument as an ``fp32`` scalar tensor, so
``eps.to(tl.float32)`` and fp32 type promotion work. The interpreter converts ints,
bools and tensors (``interpreter._implicit_cvt``) but hands floats through as Python
floats, which have no ``.to``. The shim wraps ``_implicit_cvt`` to convert floats too;
everything else, and constexpr parameters (never converted), are left alone.
"""

from __future__ import annotations

from typing import Any

from pytest_kernelfix.shim._patches import Patches

_patches = Patches()


def float_scalar(value: float) -> Any:
    """An interpreter ``tl.tensor`` holding ``value`` as fp32, like a compiled launch."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    return tl.tensor(TensorHandle(np.array([value], dtype=np.float32), tl.float32), tl.float32)


def install() -> None:
    from triton.runtime import interpreter

    if _patches:
        return
    original = interpreter._implicit_cvt

    def implicit_cvt(arg: Any) -> Any:
        __tracebackhide__ = True
        if isinstance(arg, float):
            return float_scalar(arg)
        return original(arg)

    implicit_cvt.__wrapped__ = original  # type: ignore[attr-defined]
    _patches.set(interpreter, "_implicit_cvt", implicit_cvt)


def uninstall() -> None:
    _patches.restore()


def installed() -> bool:
    return bool(_patches)
