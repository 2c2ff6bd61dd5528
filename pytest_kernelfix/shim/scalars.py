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

A ``tl.dtype`` handed to a ``@triton.jit`` helper arrives there as a ``tl.constexpr`` when
compiled, so helpers unwrap it with ``dtype.value`` (FlagGems' ``get_dtype_min`` /
``get_dtype_max``, called by its argmax, cummin, topk and sort kernels); the interpreter
passes the bare dtype and ``.value`` raised ``AttributeError: 'dtype' object has no
attribute 'value'``. A dtype now answers ``.value`` with itself, as its constexpr would.

``a and b`` / ``a or b`` between tensors is an elementwise ``logical_and`` / ``logical_or``
when compiled (with a deprecation warning); the interpreter ran Python's ``and``, which
asks ``bool(a)`` (are all its elements true?) and so returned one operand whole: the mask
``rows < M and cols < N`` of FlagGems' argmax was the column mask alone whenever a row
was out of range, and the kernel read past its input. The rewrite now applies the
compiler's rule: constexpr operands short-circuit, tensor operands combine elementwise.
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


BOOLEAN = "_kernelfix_boolean"  # the helper's name in a rewritten kernel's globals


def boolean(method: str, *operands: Any) -> Any:
    """``and`` / ``or`` of lazily evaluated operands as the compiler applies them: a
    non-tensor operand short-circuits (falsy for ``and``, truthy for ``or``) or drops
    out; tensors combine with ``logical_and`` / ``logical_or``."""
    import triton.language as tl

    tensors = []
    value = None
    for operand in operands:
        value = operand()
        if isinstance(value, tl.tensor):
            tensors.append(value)
        elif bool(value) is (method == "logical_or"):
            return value
    if not tensors:
        return value
    result = tensors[0]
    for other in tensors[1:]:
        result = getattr(result, method)(other)
    return result


def visit_bool_op(transformer: ast.NodeTransformer, node: ast.BoolOp) -> ast.AST:
    """``a and b`` as ``_kernelfix_boolean("logical_and", lambda: a, lambda: b)``."""
    node = transformer.generic_visit(node)  # type: ignore[assignment]
    method = "logical_and" if isinstance(node.op, ast.And) else "logical_or"
    no_arguments = ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[],
                                 defaults=[])
    call = ast.Call(func=ast.Name(id=BOOLEAN, ctx=ast.Load()),
                    args=[ast.Constant(value=method),
                          *(ast.Lambda(args=no_arguments, body=value) for value in node.values)],
                    keywords=[])
    return ast.copy_location(call, node)


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


def _itself(dtype: Any) -> Any:
    """``dtype.value``: the dtype, as ``tl.constexpr(dtype).value`` is when compiled."""
    return dtype


def install() -> None:
    import triton.language as tl
    from triton.runtime import interpreter

    if _patches:
        return
    if hasattr(interpreter, "ASTTransformer") and hasattr(interpreter, "interpreter_semantic"):
        _patches.set(interpreter.ASTTransformer, "visit_For", visit_for)
        _patches.set(interpreter.ASTTransformer, "visit_BoolOp", visit_bool_op)
        _patches.set(interpreter, BOOLEAN, boolean)  # the rewrite copies it into kernels
    if hasattr(interpreter, "_interpreter"):
        _patches.set(interpreter, "_interpreter", BoolMasks(interpreter._interpreter))
    if not hasattr(tl.dtype, "value"):
        _patches.set(tl.dtype, "value", property(_itself))
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
