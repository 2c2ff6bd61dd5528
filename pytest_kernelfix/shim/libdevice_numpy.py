"""NumPy versions of the libdevice / ocml functions, keyed by their extern symbol.

The interpreter receives a libdevice call as ``create_extern_elementwise(symbol, args)``
with symbols such as ``__nv_tanhf``, ``__nv_fmaf_rn`` or ``__ocml_tanh_f32``;
``implementation(symbol)`` finds the NumPy function for one. Values are computed in
the argument precision or better (special functions in float64, then cast back by the
caller), so results are at least as accurate as on the GPU. Directed rounding modes
(``_rz``, ``_rd``, ``_ru``) of arithmetic are computed round-to-nearest; float-to-int
conversions honour them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np

Array = Any  # numpy arrays; numpy's own typing is too strict for ufunc soup
NumpyFn = Callable[..., Array]

_PREFIXES = ("__nv_", "__ocml_", "__ockl_", "__triton_hip_")
_WIDTH_SUFFIX = re.compile(r"_(?:f16|f32|f64|u32|u64|i32|i64)$")
_ROUNDING = re.compile(r"_(rn|rz|rd|ru)$")
_CONVERSION = re.compile(r"^(float|double|int|uint|ll|ull)2(float|double|int|uint|ll|ull)$")


def _vectorize(fn: Callable[[float], float]) -> NumpyFn:
    def apply(x: Array) -> Array:
        def safe(v: float) -> float:
            try:
                return fn(v)
            except (ValueError, OverflowError):
                return math.inf if v > 0 else math.nan

        return np.vectorize(safe, otypes=[np.float64])(np.asarray(x, dtype=np.float64))

    return apply


def _torch_special(name: str) -> NumpyFn:
    """Functions NumPy lacks (Bessel, erfinv), borrowed from torch.special on the CPU."""

    def apply(x: Array) -> Array:
        import torch

        fn = getattr(torch.special, name)
        return fn(torch.from_numpy(np.asarray(x, dtype=np.float64))).numpy()

    return apply


def _float64(fn: NumpyFn) -> NumpyFn:
    return lambda *args: fn(*(np.asarray(a, dtype=np.float64) for a in args))


_erf = _vectorize(math.erf)
_erfc = _vectorize(math.erfc)
_erfinv = _torch_special("erfinv")


def _round_half_away(x: Array) -> Array:
    return np.copysign(np.floor(np.abs(x) + 0.5), x)


def _ieee_remainder(x: Array, y: Array) -> Array:
    x64, y64 = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return x64 - np.rint(x64 / y64) * y64


def _ilogb(x: Array) -> Array:
    _, exponent = np.frexp(np.asarray(x, dtype=np.float64))
    return exponent - 1


def _bits(x: Array) -> int:
    return int(np.asarray(x).dtype.itemsize * 8)


def _unsigned(x: Array) -> Array:
    x = np.asarray(x)
    return x.view(np.uint64 if x.dtype.itemsize == 8 else np.uint32)


def _int_map(x: Array, fn: Callable[[int, int], int]) -> Array:
    bits = _bits(x)
    return np.vectorize(lambda v: fn(int(v), bits), otypes=[np.int64])(_unsigned(x))


def _brev(x: Array) -> Array:
    bits = _bits(x)
    rev = np.vectorize(
        lambda v: int(format(int(v), f"0{bits}b")[::-1], 2), otypes=[np.uint64]
    )(_unsigned(x))
    return rev.astype(_unsigned(x).dtype).view(np.asarray(x).dtype)


def _mulhi(a: Array, b: Array) -> Array:
    bits = _bits(a)
    return np.vectorize(lambda p, q: (int(p) * int(q)) >> bits, otypes=[np.int64])(a, b)


def _umulhi(a: Array, b: Array) -> Array:
    return _mulhi(_unsigned(a), _unsigned(b))


def _mul24(a: Array, b: Array) -> Array:
    low = lambda v: ((np.asarray(v, dtype=np.int64) & 0xFFFFFF) ^ 0x800000) - 0x800000  # noqa: E731
    return low(a) * low(b)


def _umul24(a: Array, b: Array) -> Array:
    return (_unsigned(a).astype(np.uint64) & 0xFFFFFF) * (_unsigned(b).astype(np.uint64) & 0xFFFFFF)


def _wide(fn: Callable[[Array, Array], Array]) -> NumpyFn:
    return lambda a, b: fn(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))


def _powi(x: Array, n: Array) -> Array:
    return np.power(np.asarray(x, dtype=np.float64), np.asarray(n, dtype=np.float64))


def _bessel_n(kind: str) -> NumpyFn:
    """J_n / Y_n by upward recurrence from orders 0 and 1 (fine for the small n kernels use)."""
    first = _torch_special(f"bessel_{kind}0")
    second = _torch_special(f"bessel_{kind}1")

    def apply(n: Array, x: Array) -> Array:
        x64 = np.asarray(x, dtype=np.float64)
        order = np.broadcast_to(np.asarray(n, dtype=np.int64), x64.shape)
        prev, cur = first(x64), second(x64)
        out: Array = np.where(order == 0, prev, cur)
        for k in range(1, int(order.max(initial=1))):
            prev, cur = cur, (2 * k / x64) * cur - prev
            out = np.where(order == k + 1, cur, out)
        return out

    return apply


_FLOAT: dict[str, NumpyFn] = {
    "abs": np.abs, "fabs": np.abs, "acos": np.arccos, "acosh": np.arccosh,
    "asin": np.arcsin, "asinh": np.arcsinh, "atan": np.arctan, "atanh": np.arctanh,
    "cbrt": np.cbrt, "rcbrt": lambda x: 1 / np.cbrt(x), "ceil": np.ceil, "cos": np.cos,
    "cosh": np.cosh, "cospi": lambda x: np.cos(np.pi * np.asarray(x, dtype=np.float64)),
    "sinpi": lambda x: np.sin(np.pi * np.asarray(x, dtype=np.float64)),
    "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(10.0, np.float64(1) * x),
    "expm1": np.expm1, "floor": np.floor, "log": np.log, "log10": np.log10,
    "log1p": np.log1p, "log2": np.log2, "logb": lambda x: np.floor(np.log2(np.abs(x))),
    "ilogb": _ilogb, "rint": np.rint, "nearbyint": np.rint, "round": _round_half_away,
    "llrint": np.rint, "llround": _round_half_away, "trunc": np.trunc, "sin": np.sin,
    "sinh": np.sinh, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "tan": np.tan,
    "tanh": np.tanh, "erf": _erf, "erfc": _erfc,
    "erfcx": lambda x: np.exp(np.float64(1) * x * x) * _erfc(x),
    "erfinv": _erfinv, "erfcinv": lambda x: _erfinv(1 - np.asarray(x, dtype=np.float64)),
    "normcdf": lambda x: 0.5 * _erfc(-np.asarray(x, dtype=np.float64) / math.sqrt(2)),
    "normcdfinv": lambda p: math.sqrt(2) * _erfinv(2 * np.asarray(p, dtype=np.float64) - 1),
    "lgamma": _vectorize(math.lgamma), "tgamma": _vectorize(math.gamma),
    "j0": _torch_special("bessel_j0"), "j1": _torch_special("bessel_j1"),
    "y0": _torch_special("bessel_y0"), "y1": _torch_special("bessel_y1"),
    "jn": _bessel_n("j"), "yn": _bessel_n("y"),
    "cyl_bessel_i0": _float64(np.i0), "i0": _float64(np.i0),
    "cyl_bessel_i1": _torch_special("i1"), "i1": _torch_special("i1"),
    "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite, "finite": np.isfinite,
    "signbit": np.signbit, "saturate": lambda x: np.clip(x, 0, 1),
    "atan2": np.arctan2, "copysign": np.copysign, "fdim": lambda a, b: np.maximum(a - b, 0),
    "fmod": np.fmod, "hypot": np.hypot, "rhypot": lambda a, b: 1 / np.hypot(a, b),
    "nextafter": np.nextafter, "pow": np.power, "powi": _powi, "pown": _powi,
    "remainder": _ieee_remainder, "ldexp": lambda x, e: np.ldexp(x, np.asarray(e, np.int32)),
    "scalbn": lambda x, e: np.ldexp(x, np.asarray(e, np.int32)),
    "fma": _float64(lambda a, b, c: a * b + c),
    "norm3d": _float64(lambda a, b, c: np.sqrt(a * a + b * b + c * c)),
    "rnorm3d": _float64(lambda a, b, c: 1 / np.sqrt(a * a + b * b + c * c)),
    "norm4d": _float64(lambda a, b, c, d: np.sqrt(a * a + b * b + c * c + d * d)),
    "rnorm4d": _float64(lambda a, b, c, d: 1 / np.sqrt(a * a + b * b + c * c + d * d)),
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "rcp": lambda x: 1 / x, "dividef": np.divide,
}

_INT: dict[str, NumpyFn] = {
    "clz": lambda x: _int_map(x, lambda v, bits: bits - v.bit_length()),
    "popc": lambda x: _int_map(x, lambda v, bits: bin(v).count("1")),
    "popcount": lambda x: _int_map(x, lambda v, bits: bin(v).count("1")),
    "ffs": lambda x: _int_map(x, lambda v, bits: (v & -v).bit_length()),
    "brev": _brev, "mulhi": _mulhi, "umulhi": _umulhi, "mul64hi": _mulhi,
    "umul64hi": _umulhi, "mul24": _mul24, "umul24": _umul24, "iabs": np.abs, "llabs": np.abs,
    "hadd": _wide(lambda a, b: (a + b) >> 1), "rhadd": _wide(lambda a, b: (a + b + 1) >> 1),
    "uhadd": lambda a, b: (_unsigned(a).astype(np.uint64) + _unsigned(b)) >> 1,
    "urhadd": lambda a, b: (_unsigned(a).astype(np.uint64) + _unsigned(b) + 1) >> 1,
    "sad": lambda a, b, c: np.abs(np.asarray(a, np.int64) - b) + np.asarray(c, np.int64),
    "usad": lambda a, b, c: (
        np.abs(_unsigned(a).astype(np.int64) - _unsigned(b)) + _unsigned(c).astype(np.int64)
    ),
}

_FAST = ("exp", "exp10", "log", "log2", "log10", "pow", "sin", "cos", "tan", "tanh")
_TABLE: dict[str, NumpyFn] = {
    **_FLOAT,
    **_INT,
    **{f"fast_{name}": _FLOAT[name] for name in _FAST},
    "fast_fdivide": np.divide,
    "fast_divide": np.divide,
    **{f"{p}{op}": _FLOAT[op] for p in "fd" for op in ("add", "sub", "mul", "div", "rcp")},
    "fsqrt": np.sqrt, "dsqrt": np.sqrt, "frsqrt": _FLOAT["rsqrt"],
}

_ROUNDERS: dict[str, NumpyFn] = {"rn": np.rint, "rz": np.trunc, "rd": np.floor, "ru": np.ceil}
_BITCASTS = {
    "float_as_int": np.int32, "float_as_uint": np.uint32, "int_as_float": np.float32,
    "uint_as_float": np.float32, "double_as_longlong": np.int64,
    "longlong_as_double": np.float64,
}


def _conversion(kind_from: str, kind_to: str, mode: str) -> NumpyFn:
    to_float = kind_to in ("float", "double")
    from_float = kind_from in ("float", "double")
    if from_float and not to_float:
        return _ROUNDERS[mode]
    return lambda x: x  # the caller casts to the result type


def _bitcast(target: Any) -> NumpyFn:
    return lambda x: np.ascontiguousarray(x).view(target)


def _double_halves(name: str) -> NumpyFn | None:
    if name == "double2hiint":
        return lambda x: (np.asarray(x, np.float64).view(np.int64) >> 32).astype(np.int32)
    if name == "double2loint":
        return lambda x: (np.asarray(x, np.float64).view(np.int64) & 0xFFFFFFFF).astype(np.uint32)
    if name == "hiloint2double":
        return lambda hi, lo: (
            (np.asarray(hi, np.int64) << 32) | (np.asarray(lo, np.int64) & 0xFFFFFFFF)
        ).view(np.float64)
    return None


def implementation(symbol: str) -> NumpyFn | None:
    """The NumPy function behind an extern symbol, or None if the shim has none."""
    name = symbol
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    name = _WIDTH_SUFFIX.sub("", name)
    mode = "rn"
    rounding = _ROUNDING.search(name)
    if rounding:
        mode, name = rounding.group(1), name[: rounding.start()]
    if name in _BITCASTS:
        return _bitcast(_BITCASTS[name])
    halves = _double_halves(name)
    if halves is not None:
        return halves
    conversion = _CONVERSION.match(name)
    if conversion:
        return _conversion(conversion.group(1), conversion.group(2), mode)
    candidates = [name]
    if name.endswith("ll"):
        candidates.append(name[:-2])
    if name.endswith(("f", "d")):
        candidates.append(name[:-1])
    for candidate in candidates:
        if candidate in _TABLE:
            return _TABLE[candidate]
    return None


def evaluate(symbol: str, args: list[Array], out_dtype: Any) -> Array:
    """Apply the symbol's function to NumPy arrays and cast to ``out_dtype``."""
    fn = implementation(symbol)
    if fn is None:
        raise NotImplementedError(
            f"libdevice function {symbol} has no interpreter implementation in the kernelfix shim"
        )
    with np.errstate(all="ignore"):
        result = np.asarray(fn(*args))
    if result.dtype == out_dtype:
        return result
    if result.dtype.kind == "f" and np.dtype(out_dtype).kind in "iu":
        result = np.nan_to_num(result, nan=0, posinf=np.iinfo(out_dtype).max,
                               neginf=np.iinfo(out_dtype).min)
        info = np.iinfo(out_dtype)
        result = np.clip(result, info.min, info.max)
    return result.astype(out_dtype)
