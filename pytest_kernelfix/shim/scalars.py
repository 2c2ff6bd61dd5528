"""Pass float kernel arguments to interpreted kernels as fp32 scalars, as a GPU launch does.

A compiled kernel receives a Python float argument as an ``fp32`` scalar tensor, so
``eps.to(tl.float32)`` and fp32 type promotion work. The interpreter converts ints,
bools and tensors (``interpreter._implicit_cvt``) but hands floats through as Python
floats, which have no ``.to``. The shim wraps ``_implicit_cvt`` to convert floats too;
everything else, and constexpr parameters (never converted), are left alone.

The same holds for the index of a loop over ``range`` / ``tl.range``: compiled, it is an
``int32`` tensor (the loop is an ``scf.for``), so kernels write ``i.to(tl.int64)``; the
interpreter iterated a Python ``range`` and ``i.to`` raised ``AttributeError: 'int' object
has no attribute 'to'`` (flash-linear-attention's DeltaFormer and log-linear attention
kernels). The interpreter's rewrite of each kernel's syntax tree now makes such an index a
tensor at the top of the loop body; ``tl.static_range`` indices stay Python ints, as they
are constexprs when compiled.

A load or store mask of an integer dtype is converted to ``i1`` (non-zero is true) when
compiled; the interpreter's C loader refused it (``ValueError: mask has unsupported
dtype``, flash-linear-attention's log-linear attention). Masks now reach it as booleans.
"""

from __future__ import annotations

import ast
from typing import Any

from pytest_kernelfix.shim._patches import Patches

_patches = Patches()


def float_scalar(value: float) -> Any:
    """An interpreter ``tl.tensor`` holding ``value`` as fp32, like a compiled launch."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    return tl.tensor(TensorHandle(np.array([value], dtype=np.float32), tl.float32), tl.float32)


def _runtime_range(iterator: ast.expr) -> bool:
    """``range(...)`` or ``tl.range(...)``: a loop whose index is a tensor when compiled."""
    if not isinstance(iterator, ast.Call):
        return False
    func = iterator.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
    return name == "range"


def visit_for(transformer: ast.NodeTransformer, node: ast.For) -> ast.AST:
    """Make the index of a ``range`` loop an interpreter tensor, as a compiled loop has it."""
    node = transformer.generic_visit(node)  # type: ignore[assignment]
    if isinstance(node.target, ast.Name) and _runtime_range(node.iter):
        index = node.target.id
        convert = ast.Call(
            func=ast.Attribute(value=ast.Name(id="interpreter_semantic", ctx=ast.Load()),
                               attr="to_tensor", ctx=ast.Load()),
            args=[ast.Name(id=index, ctx=ast.Load()), ast.Constant(value=False)], keywords=[])
        assign = ast.Assign(targets=[ast.Name(id=index, ctx=ast.Store())], value=convert)
        node.body.insert(0, ast.copy_location(assign, node))
    return node


class BoolMasks:
    """The interpreter's C ``load`` / ``store`` with integer masks made boolean."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def load(self, ptrs: Any, mask: Any, other: Any, dtype: Any) -> Any:
        return self.inner.load(ptrs, _boolean(mask), other, dtype)

    def store(self, ptrs: Any, value: Any, mask: Any) -> Any:
        return self.inner.store(ptrs, value, _boolean(mask))


def _boolean(mask: Any) -> Any:
    kind = getattr(getattr(mask, "dtype", None), "kind", "b")
    return mask if kind == "b" else mask != 0


def install() -> None:
    from triton.runtime import interpreter

    if _patches:
        return
    if hasattr(interpreter, "ASTTransformer") and hasattr(interpreter, "interpreter_semantic"):
        _patches.set(interpreter.ASTTransformer, "visit_For", visit_for)
    if hasattr(interpreter, "_interpreter"):
        _patches.set(interpreter, "_interpreter", BoolMasks(interpreter._interpreter))
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
