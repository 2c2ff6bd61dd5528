"""The libdevice piece: libdevice functions compute real values on the interpreter."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
from kernels_catalog import shim_kernels
from triton.language.extra import libdevice
from triton.language.extra.cuda import libdevice as cuda_libdevice

from pytest_kernelfix.shim import libdevice as piece
from pytest_kernelfix.shim.libdevice_numpy import evaluate, implementation

N = 300


@pytest.fixture
def shimmed() -> Iterator[None]:
    already = piece.installed()
    piece.install()
    yield
    if not already:
        piece.uninstall()


def run_unary(fn: Callable[..., object], x: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=out_dtype)
    shim_kernels.unary[(triton_cdiv(x.numel(), 128),)](x, out, x.numel(), FN=fn, BLOCK=128)
    return out


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def sample(low: float, high: float, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(N, generator=generator) * (high - low) + low


UNARY = [
    ("tanh", torch.tanh, (-6, 6)),
    ("erf", torch.erf, (-3, 3)),
    ("erfc", torch.erfc, (-3, 3)),
    ("exp", torch.exp, (-20, 20)),
    ("exp2", torch.exp2, (-20, 20)),
    ("log", torch.log, (1e-3, 1e3)),
    ("log1p", torch.log1p, (-0.9, 10)),
    ("expm1", torch.expm1, (-5, 5)),
    ("rsqrt", torch.rsqrt, (1e-2, 1e2)),
    ("sqrt", torch.sqrt, (0, 1e2)),
    ("sin", torch.sin, (-10, 10)),
    ("cos", torch.cos, (-10, 10)),
    ("atan", torch.atan, (-10, 10)),
    ("asinh", torch.asinh, (-10, 10)),
    ("sinh", torch.sinh, (-5, 5)),
    ("floor", torch.floor, (-10, 10)),
    ("trunc", torch.trunc, (-10, 10)),
    ("lgamma", torch.lgamma, (0.1, 10)),
    ("erfinv", torch.erfinv, (-0.99, 0.99)),
    ("fast_expf", torch.exp, (-20, 20)),
    ("fast_logf", torch.log, (1e-3, 1e3)),
    ("cbrt", lambda t: torch.sign(t) * t.abs().pow(1 / 3), (-10, 10)),
]


@pytest.mark.parametrize(("name", "reference", "domain"), UNARY, ids=[u[0] for u in UNARY])
def test_unary_functions_match_torch(
    shimmed: None, name: str, reference: Callable[[torch.Tensor], torch.Tensor],
    domain: tuple[float, float],
) -> None:
    x = sample(*domain)
    out = run_unary(getattr(libdevice, name), x, torch.float32)
    torch.testing.assert_close(out, reference(x), rtol=2e-6, atol=1e-6)


BINARY = [
    ("pow", torch.pow, (0.1, 4), (-3, 3)),
    ("atan2", torch.atan2, (-5, 5), (-5, 5)),
    ("hypot", torch.hypot, (-5, 5), (-5, 5)),
    ("fmod", torch.fmod, (-10, 10), (1, 3)),
    ("copysign", torch.copysign, (-5, 5), (-5, 5)),
]


@pytest.mark.parametrize(("name", "reference", "xs", "ys"), BINARY, ids=[b[0] for b in BINARY])
def test_binary_functions_match_torch(
    shimmed: None, name: str, reference: Callable[..., torch.Tensor],
    xs: tuple[float, float], ys: tuple[float, float],
) -> None:
    x, y = sample(*xs, seed=1), sample(*ys, seed=2)
    out = torch.empty(N)
    shim_kernels.binary[(3,)](x, y, out, N, FN=getattr(libdevice, name), BLOCK=128)
    torch.testing.assert_close(out, reference(x, y), rtol=2e-6, atol=1e-6)


def test_predicates_return_int32_like_libdevice(shimmed: None) -> None:
    x = sample(-5, 5)
    x[::7] = math.nan
    x[::11] = math.inf
    isnan = run_unary(libdevice.isnan, x, torch.int32)
    isinf = run_unary(libdevice.isinf, x, torch.int32)
    assert torch.equal(isnan != 0, torch.isnan(x))
    assert torch.equal(isinf != 0, torch.isinf(x))


def test_float64_and_the_cuda_module_work_too(shimmed: None) -> None:
    x = sample(-3, 3).double()
    out = run_unary(cuda_libdevice.tanh, x, torch.float64)
    torch.testing.assert_close(out, torch.tanh(x), rtol=1e-12, atol=1e-12)
    out = run_unary(cuda_libdevice.erf, x.float(), torch.float32)
    torch.testing.assert_close(out, torch.erf(x.float()))


def test_a_type_libdevice_lacks_fails_as_on_a_gpu(shimmed: None) -> None:
    x = sample(-3, 3).half()  # libdevice tanh has fp32 / fp64 overloads only
    with pytest.raises(Exception, match=r"fp16|float16"):
        run_unary(libdevice.tanh, x, torch.float16)


def test_uninstalled_libdevice_is_the_triton_stub_again() -> None:
    if piece.installed():
        pytest.skip("a session-wide shim holds the libdevice piece")
    stub = libdevice.tanh
    builtin = cuda_libdevice.tanh
    piece.install()
    assert libdevice.tanh is not stub
    assert libdevice.tanh.__module__ == stub.__module__ == "triton.language.extra.libdevice"
    assert libdevice.tanh.__name__ == "tanh"
    assert cuda_libdevice.tanh.__triton_builtin__  # the compiler still sees a builtin
    piece.uninstall()
    assert libdevice.tanh is stub
    assert cuda_libdevice.tanh is builtin
    assert stub(1.0) is None  # what the interpreter used to get


@pytest.mark.parametrize(
    ("symbol", "args", "dtype", "expected"),
    [
        ("__nv_fmaf_rn", ([2.0], [3.0], [1.0]), np.float32, [7.0]),
        ("__nv_float2int_rz", ([-2.7, 2.7],), np.int32, [-2, 2]),
        ("__nv_float2int_rd", ([-2.2, 2.7],), np.int32, [-3, 2]),
        ("__nv_float2int_rn", ([2.5, 3.5],), np.int32, [2, 4]),
        ("__nv_roundf", ([2.5, -2.5],), np.float32, [3.0, -3.0]),
        ("__nv_clz", (np.array([1, 0, -1], np.int32),), np.int32, [31, 32, 0]),
        ("__nv_popc", (np.array([7, -1], np.int32),), np.int32, [3, 32]),
        ("__nv_ffs", (np.array([8, 0], np.int32),), np.int32, [4, 0]),
        ("__nv_brev", (np.array([1], np.int32),), np.int32, [-(2**31)]),
        ("__nv_umulhi", (np.array([2**31], np.uint32), np.array([4], np.uint32)), np.uint32, [2]),
        ("__nv_powif", ([2.0], np.array([10], np.int32)), np.float32, [1024.0]),
        ("__ocml_tanh_f32", ([0.5],), np.float32, [math.tanh(0.5)]),
        ("__ockl_popcount_u32", (np.array([255], np.uint32),), np.int32, [8]),
        ("__triton_hip_fast_tanhf", ([0.5],), np.float32, [math.tanh(0.5)]),
        ("__nv_float_as_int", (np.array([1.0], np.float32),), np.int32, [0x3F800000]),
        ("__nv_saturatef", ([-1.0, 0.5, 2.0],), np.float32, [0.0, 0.5, 1.0]),
    ],
)
def test_symbols_map_to_numpy(
    symbol: str, args: tuple[object, ...], dtype: type, expected: list[float]
) -> None:
    arrays = [np.asarray(a, dtype=getattr(a, "dtype", np.float32)) for a in args]
    result = evaluate(symbol, arrays, np.dtype(dtype))
    assert result.dtype == np.dtype(dtype)
    np.testing.assert_allclose(result, np.asarray(expected, dtype=dtype), rtol=1e-6)


def test_an_unknown_symbol_says_so() -> None:
    assert implementation("__nv_byte_perm") is None
    with pytest.raises(NotImplementedError, match="__nv_byte_perm"):
        evaluate("__nv_byte_perm", [np.zeros(1)], np.dtype(np.int32))
