"""Correct bf16 arithmetic on the Triton interpreter.

The interpreter stores bf16 values as their raw 16-bit patterns (NumPy has no bf16) and
hands those integers to NumPy: a bf16 ``x * y`` multiplies two integers, ``tl.dot``
multiplies integers converted to floats, ``tl.sum`` adds integers, a comparison orders
negative numbers above positive ones, and fp32 -> bf16 conversions truncate instead of
rounding. A correct kernel returns zeros, NaN or 1e30, with no error.

This piece decodes bf16 operands to fp32, computes there, and encodes results as a GPU
stores them: round to nearest even, NaN kept NaN. For +, -, *, /, fma and sqrt that is
the correctly rounded bf16 result (fp32 has more than 2 * 8 + 2 significant bits, so the
double rounding is innocuous), what a GPU computes with native bf16 instructions or by
widening to fp32. Reductions and scans accumulate in fp32 (at least as accurate as a
GPU's bf16 tree). Patched where the data is touched: ``InterpreterBuilder`` binary,
unary, fma, clamp, cast, fp-to-fp, dot, atomic add, print and NaN-padded descriptor
loads; ``ReduceOps`` sum and min/max; ``ScanOps`` cumsum and cumprod.

Where the interpreter stores bf16 some other way this piece does not know, nothing is
patched: if its bf16 is a real float type (an upstream fix) bf16 is exact already;
otherwise launching a kernel with bf16 tensors raises :class:`InterpreterLimitation`
rather than computing garbage, and ``exact()`` is False (the CUDA piece then answers
``torch.cuda.is_bf16_supported()`` with False).
"""

from __future__ import annotations

from typing import Any

from pytest_kernelfix.shim._patches import Patches
from pytest_kernelfix.shim.limits import InterpreterLimitation

_patches = Patches()
_state: dict[str, str] = {}

#: ``exact()`` is True in these states.
PATCHED = "patched"
NATIVE = "native"
GUARDED = "guarded"  # an interpreter this piece does not know: bf16 launches are refused


def to_float32(bits: Any) -> Any:
    """fp32 values of bf16 bit patterns (exact: bf16 is the top half of fp32)."""
    import numpy as np

    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def from_float32(values: Any, *, toward_zero: bool = False) -> Any:
    """bf16 bit patterns of fp32 values, rounded to nearest even (or toward zero).

    NaN becomes the quiet NaN 0x7FC0 (payloads are not kept); overflow rounds to infinity.
    """
    import numpy as np

    array = np.asarray(values, dtype=np.float32)
    bits = array.view(np.uint32)
    if toward_zero:
        rounded = bits >> np.uint32(16)
    else:
        bias = ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
        rounded = (bits + bias) >> np.uint32(16)
    return np.where(np.isnan(array), np.uint16(0x7FC0), rounded.astype(np.uint16))


def _is_bf16(handle: Any) -> bool:
    import triton.language as tl

    dtype = getattr(handle, "dtype", None)
    return getattr(dtype, "scalar", None) == tl.bfloat16


def _result(values: Any, dtype: Any) -> Any:
    """A bf16 handle: fp32 results re-encoded, comparison booleans kept as they are."""
    import numpy as np
    from triton.runtime.interpreter import TensorHandle

    values = np.asarray(values)
    return TensorHandle(values if values.dtype == np.bool_ else from_float32(values), dtype)


def _binary_op(original: Any) -> Any:
    def binary_op(self: Any, lhs: Any, rhs: Any, op: Any) -> Any:
        if not (_is_bf16(lhs) and _is_bf16(rhs)):
            return original(self, lhs, rhs, op)
        return _result(op(to_float32(lhs.data), to_float32(rhs.data)), lhs.dtype.scalar)

    return binary_op


def _unary_op(original: Any) -> Any:
    def unary_op(self: Any, arg: Any, op: Any) -> Any:
        if not _is_bf16(arg):
            return original(self, arg, op)
        return _result(op(to_float32(arg.data)), arg.dtype.scalar)

    return unary_op


def _math(original: Any, fn_name: str) -> Any:
    """``create_erf`` / ``create_rsqrt``, which read ``arg.data`` themselves."""

    def create(self: Any, arg: Any) -> Any:
        if not _is_bf16(arg):
            return original(self, arg)
        import numpy as np
        from triton.runtime.interpreter import TensorHandle

        values = to_float32(arg.data)
        if fn_name == "create_rsqrt":
            result = np.float32(1) / np.sqrt(values)
        else:
            import math

            result = np.vectorize(math.erf, otypes=[np.float32])(values)
        return TensorHandle(from_float32(result), arg.dtype.scalar)

    return create


def _create_fma(original: Any) -> Any:
    def create_fma(self: Any, x: Any, y: Any, z: Any) -> Any:
        if not _is_bf16(z):
            return original(self, x, y, z)
        import numpy as np
        from triton.runtime import interpreter

        operands = np.broadcast_arrays(*(to_float32(h.data) for h in (x, y, z)))
        result = interpreter._interpreter.fma_fp32(*operands)
        return interpreter.TensorHandle(from_float32(result), z.dtype.scalar)

    return create_fma


def _create_clampf(original: Any) -> Any:
    def create_clampf(self: Any, arg: Any, lo: Any, hi: Any, propagate_nans: Any) -> Any:
        if not _is_bf16(arg):
            return original(self, arg, lo, hi, propagate_nans)
        import numpy as np
        from triton.runtime import interpreter

        value, low, high = (to_float32(h.data) for h in (arg, lo, hi))
        if propagate_nans == interpreter._ir.PROPAGATE_NAN.NONE:
            result = np.fmin(np.fmax(value, low), high)
        else:
            result = np.clip(value, low, high)
        return interpreter.TensorHandle(from_float32(result), arg.dtype.scalar)

    return create_clampf


def _cast_impl(original: Any) -> Any:
    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        import triton.language as tl

        src_bf16, dst_bf16 = _is_bf16(src), dst_type.scalar == tl.bfloat16
        if src_bf16 == dst_bf16:
            return original(self, src, dst_type)
        import numpy as np
        from triton.runtime.interpreter import TensorHandle, _get_np_dtype

        values = to_float32(src.data) if src_bf16 else src.data
        if dst_bf16:
            return TensorHandle(from_float32(values.astype(np.float32)), tl.bfloat16)
        return TensorHandle(values.astype(_get_np_dtype(dst_type)), dst_type.scalar)

    return cast_impl


def _create_fp_to_fp(original: Any) -> Any:
    def create_fp_to_fp(self: Any, src: Any, dst_type: Any, rounding_mode: Any) -> Any:
        import triton.language as tl
        from triton.runtime import interpreter

        src_bf16, dst_bf16 = _is_bf16(src), dst_type.scalar == tl.bfloat16
        if src_bf16 == dst_bf16:
            return original(self, src, dst_type, rounding_mode)
        if src_bf16:  # through fp32, exact, then the interpreter's own fp32 conversion
            wide = interpreter.TensorHandle(to_float32(src.data), tl.float32)
            if dst_type.scalar == tl.float32:
                return wide
            return original(self, wide, dst_type, rounding_mode)
        if src.dtype.scalar != tl.float32:
            src = original(self, src, tl.float32, rounding_mode)  # fp8 / fp16: exact in fp32
        toward_zero = rounding_mode == interpreter._ir.ROUNDING_MODE.RTZ
        return interpreter.TensorHandle(from_float32(src.data, toward_zero=toward_zero),
                                        tl.bfloat16)

    return create_fp_to_fp


def _create_dot(original: Any) -> Any:
    def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any,
                   max_num_imprecise_acc: Any) -> Any:
        if not (_is_bf16(a) or _is_bf16(b)):
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        import numpy as np
        from triton.runtime.interpreter import TensorHandle

        lhs = to_float32(a.data) if _is_bf16(a) else a.data.astype(np.float32)
        rhs = to_float32(b.data) if _is_bf16(b) else b.data.astype(np.float32)
        if _is_bf16(d):  # an accumulator held in bf16: add in fp32, store rounded
            total = np.matmul(lhs, rhs, dtype=np.float32) + to_float32(d.data)
            return TensorHandle(from_float32(total), d.dtype.scalar)
        return TensorHandle(np.matmul(lhs, rhs, dtype=d.data.dtype) + d.data, d.dtype.scalar)

    return create_dot


def _create_atomic_rmw(original: Any) -> Any:
    def create_atomic_rmw(self: Any, rmwOp: Any, ptr: Any, val: Any, mask: Any, sem: Any,
                          scope: Any) -> Any:
        from triton.runtime import interpreter

        if not _is_bf16(val) or rmwOp != interpreter._ir.ATOMIC_OP.FADD:
            return original(self, rmwOp, ptr, val, mask, sem, scope)
        import numpy as np

        # Programs run one at a time, so element by element in order is one valid order
        # of a GPU's atomics; the old values come back as a GPU returns them.
        pointers, values, enabled = np.broadcast_arrays(ptr.data, val.data, mask.data)
        old = np.zeros(values.shape, dtype=np.uint16)
        one, on = np.zeros(1, dtype=np.uint16), np.ones(1, dtype=bool)
        for index in np.ndindex(values.shape):
            if not enabled[index]:
                continue
            address = np.array([pointers[index]], dtype=np.uint64)
            current = interpreter._interpreter.load(address, on, one, np.dtype(np.uint16))
            old[index] = current[0]
            total = from_float32(to_float32(current) + to_float32(values[index]))
            interpreter._interpreter.store(address, total, on)
        return interpreter.TensorHandle(old, val.dtype.scalar)

    return create_atomic_rmw


def _create_print(original: Any) -> Any:
    def create_print(self: Any, prefix: Any, hex: Any, values: Any, isSigned: Any) -> Any:
        if not hex:
            import triton.language as tl
            from triton.runtime.interpreter import TensorHandle

            values = [TensorHandle(to_float32(v.data), tl.float32) if _is_bf16(v) else v
                      for v in values]
        return original(self, prefix, hex, values, isSigned)

    return create_print


def _create_descriptor_load(original: Any) -> Any:
    def create_descriptor_load(self: Any, desc: Any, indices: Any, cache_policy: Any) -> Any:
        import triton.language as tl
        from triton.runtime import interpreter

        padding = getattr(desc, "padding", None)
        if (desc.base.dtype.element_ty != tl.bfloat16
                or padding != interpreter._ir.PADDING_OPTION.PAD_NAN):
            return original(self, desc, indices, cache_policy)
        import numpy as np

        pointers, mask = desc.materialize_pointers(indices)  # NaN padding as bf16 NaN bits
        nan = interpreter.TensorHandle(np.full(pointers.data.shape, 0x7FC0, dtype=np.uint16),
                                       tl.bfloat16)
        return self.create_masked_load(pointers, mask, nan, cache_policy, False)

    return create_descriptor_load


def _reduce_sum(original: Any) -> Any:
    def sum(self: Any, input: Any) -> Any:
        if not _is_bf16(input.handle):
            return original(self, input)
        import numpy as np

        total = np.sum(to_float32(input.handle.data), axis=self.axis, keepdims=self.keep_dims,
                       dtype=np.float32)
        return self.to_tensor(from_float32(total), input.dtype)

    return sum


def _reduce_min_max(original: Any) -> Any:
    def min_max(self: Any, input: Any, val_reduce_op: Any, idx_reduce_op: Any = None) -> Any:
        single = input[0] if isinstance(input, tuple) else input
        if not _is_bf16(single.handle):
            return original(self, input, val_reduce_op, idx_reduce_op)
        import triton.language as tl

        data = to_float32(single.handle.data)
        found = []
        if val_reduce_op:
            value = val_reduce_op(data, axis=self.axis, keepdims=self.keep_dims)
            found.append(self.to_tensor(from_float32(value), single.dtype))
        if idx_reduce_op:
            index = idx_reduce_op(data, axis=self.axis, keepdims=self.keep_dims)
            found.append(self.to_tensor(index, tl.int32))
        if not found:
            raise ValueError("val_reduce_op and idx_reduce_op are both None")
        return tuple(found) if len(found) == 2 else found[0]

    return min_max


def _scan(original: Any, numpy_name: str) -> Any:
    def scan(self: Any, input: Any) -> Any:
        if not _is_bf16(input.handle):
            return original(self, input)
        import numpy as np

        accumulate = getattr(np, numpy_name)
        values = accumulate(to_float32(input.handle.data), axis=self.axis, dtype=np.float32)
        return [self.to_tensor(from_float32(values), input.dtype)]

    return scan


_BUILDER = {
    "binary_op": _binary_op,
    "unary_op": _unary_op,
    "create_fma": _create_fma,
    "create_clampf": _create_clampf,
    "cast_impl": _cast_impl,
    "create_fp_to_fp": _create_fp_to_fp,
    "create_dot": _create_dot,
    "create_atomic_rmw": _create_atomic_rmw,
    "create_print": _create_print,
    "create_descriptor_load": _create_descriptor_load,
}


def _layout() -> str:
    """How the interpreter holds bf16: ``uint16`` (patchable), ``native`` or ``unknown``."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    try:
        held = interpreter._get_np_dtype(tl.bfloat16)
    except Exception:  # a reshaped interpreter: leave it alone
        return "unknown"
    if held == np.dtype(np.uint16):
        needed = {
            "InterpreterBuilder": [*_BUILDER, "create_erf", "create_rsqrt"],
            "ReduceOps": ["sum", "min_max"],
            "ScanOps": ["cumsum", "cumprod"],
        }
        known = all(hasattr(getattr(interpreter, owner, None), name)
                    for owner, names in needed.items() for name in names)
        return "uint16" if known else "unknown"
    return "native" if np.issubdtype(held, np.floating) else "unknown"


def _guarded_run(original: Any) -> Any:
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # the limitation is the message; this frame adds nothing
        for value in (*args, *kwargs.values()):
            if str(getattr(value, "dtype", "")) == "torch.bfloat16":
                name = getattr(getattr(self, "fn", None), "__name__", "kernel")
                raise InterpreterLimitation(
                    f"{name} takes bf16 tensors, and this Triton interpreter computes bf16 "
                    "on the raw 16-bit storage in a way kernelfix cannot correct; run the "
                    "test on a GPU")
        return original(self, *args, **kwargs)

    run.__wrapped__ = original  # type: ignore[attr-defined]
    return run


def install() -> None:
    """Patch the interpreter's bf16 arithmetic (or guard it where it cannot be patched)."""
    from triton.runtime import interpreter

    if _state:
        return
    layout = _layout()
    if layout == "native":
        _state["mode"] = NATIVE
        return
    if layout == "unknown":
        cls = interpreter.InterpretedFunction
        _patches.set(cls, "run", _guarded_run(cls.run))
        _state["mode"] = GUARDED
        return
    builder = interpreter.InterpreterBuilder
    for name, wrap in _BUILDER.items():
        _patches.set(builder, name, wrap(getattr(builder, name)))
    for name in ("create_erf", "create_rsqrt"):
        _patches.set(builder, name, _math(getattr(builder, name), name))
    reduce_ops, scan_ops = interpreter.ReduceOps, interpreter.ScanOps
    _patches.set(reduce_ops, "sum", _reduce_sum(reduce_ops.sum))
    _patches.set(reduce_ops, "min_max", _reduce_min_max(reduce_ops.min_max))
    _patches.set(scan_ops, "cumsum", _scan(scan_ops.cumsum, "cumsum"))
    _patches.set(scan_ops, "cumprod", _scan(scan_ops.cumprod, "cumprod"))
    _state["mode"] = PATCHED


def uninstall() -> None:
    _patches.restore()
    _state.clear()


def installed() -> bool:
    return bool(_state)


def mode() -> str:
    """``patched``, ``native``, ``guarded``, or "" when not installed."""
    return _state.get("mode", "")


def exact() -> bool:
    """Whether interpreted kernels compute bf16 as a GPU does (patched, or natively)."""
    return mode() in (PATCHED, NATIVE)
