"""Stop interpreted device-function calls from leaking their ``triton.language`` patches.

The interpreter patches ``triton.language`` (and ``triton.language.core`` when a
function's globals hold it) for the length of a kernel run and restores it afterwards.
A call to another ``@triton.jit`` function, Triton's own ``tl.sum`` / ``tl.max`` /
``tl.sigmoid`` among them, patches the callee's modules too but never restores them
(``InterpretedFunction.__call__`` drops the scope). ``triton.language.core`` then keeps
interpreter lambdas for good, and a later GPU compile in the same process fails in
odd ways (``'value' object has no attribute 'dtype'``). The shim restores that scope
when the call returns.
"""

from __future__ import annotations

import inspect
from typing import Any

from pytest_kernelfix.shim._patches import Patches

_patches = Patches()


def install() -> None:
    from triton.runtime import interpreter

    if _patches:
        return
    cls = interpreter.InterpretedFunction
    source = inspect.getsource(cls.__call__)
    if "_patch_lang(self.fn)" not in source or ".restore()" in source:
        return  # fixed upstream, or changed beyond what this patch knows: leave it alone

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # the helper's error, not the shim's
        scope = interpreter._patch_lang(self.fn)
        try:
            fn = self.rewrite()
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                raise interpreter.InterpreterError(repr(e)) from e
        finally:
            scope.restore()

    __call__.__wrapped__ = cls.__call__  # type: ignore[attr-defined]
    _patches.set(cls, "__call__", __call__)


def uninstall() -> None:
    _patches.restore()


def installed() -> bool:
    return bool(_patches)
