"""bf16 on the Triton interpreter: correct kernels give torch's bf16 results."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
import triton
from kernels_catalog import bf16_kernels as kernels

from pytest_kernelfix.shim import bf16, cuda
from pytest_kernelfix.shim.limits import InterpreterLimitation

N = 1000  # not a multiple of the block: masks matter


@pytest.fixture
def exact() -> Iterator[None]:
    """The bf16 piece installed for the test; a session-wide install stays as it was."""
    had = bf16.installed()
    bf16.install()
    assert bf16.mode() == bf16.PATCHED
    yield
    if not had:
        bf16.uninstall()


@pytest.fixture
def raw() -> Iterator[None]:
    """The interpreter as Triton ships it: bf16 computed on raw storage."""
    had = bf16.installed()
    bf16.uninstall()
    yield
    if had:
        bf16.install()


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x, y = (torch.randn(N, generator=generator).bfloat16() for _ in range(2))
    z = (y.float() + torch.randn(N, generator=generator).abs()).bfloat16()  # clamp: y <= z
    return x, y, z


def run_elementwise(op: str, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    kernels.elementwise[(triton.cdiv(N, 256),)](x, y, z, out, N, OP=op, BLOCK=256)
    return out


def torch_elementwise(op: str, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return {
        "mul": lambda: x * y,
        "add": lambda: x + y,
        "sub": lambda: x - y,
        "neg": lambda: -x,
        "maximum": lambda: torch.maximum(x, y),
        "minimum": lambda: torch.minimum(x, y),
        "where": lambda: torch.where(x > y, x, y * z),
        "fma": lambda: (x.float() * y.float() + z.float()).bfloat16(),  # x*y is exact in fp32
        "clamp": lambda: torch.clamp(x, y, z),
        "scale": lambda: x * 1.5 + y,
        "fp32_roundtrip": lambda: (x.float() * y.float()).bfloat16(),
    }[op]()


@pytest.mark.parametrize("op", kernels.ELEMENTWISE)
def test_elementwise_bf16_is_bit_exact(exact: None, op: str) -> None:
    x, y, z = inputs()
    got = run_elementwise(op, x, y, z)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, torch_elementwise(op, x, y, z)), op


@pytest.mark.parametrize("op", ["mul", "add", "where"])
def test_the_raw_interpreter_gets_them_wrong(raw: None, op: str) -> None:
    x, y, z = inputs()
    assert not torch.equal(run_elementwise(op, x, y, z), torch_elementwise(op, x, y, z))


@pytest.mark.parametrize("op", ["sum", "max", "min", "argmax"])
def test_reductions_match_torch(exact: None, op: str) -> None:
    x = torch.randn(6, 100, generator=torch.Generator().manual_seed(1)).bfloat16()
    out = torch.empty(6, dtype=torch.bfloat16)
    kernels.row_reduce[(6,)](x, out, 100, OP=op, BLOCK=128)
    expected = {"sum": lambda: x.sum(1), "max": lambda: x.amax(1), "min": lambda: x.amin(1),
                "argmax": lambda: x.argmax(1).bfloat16()}[op]()
    if op == "sum":  # accumulation order differs; both round once from fp32
        torch.testing.assert_close(out, expected, atol=0.05, rtol=0.02)
    else:
        assert torch.equal(out, expected)


def test_cumsum_matches_torch(exact: None) -> None:
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    out = torch.empty_like(x)
    kernels.row_cumsum[(4,)](x, out, BLOCK=64)
    torch.testing.assert_close(out, x.float().cumsum(1).bfloat16(), atol=0.05, rtol=0.02)


def test_dot_accumulates_bf16_products_in_fp32(exact: None) -> None:
    generator = torch.Generator().manual_seed(3)
    a = torch.randn(40, 72, generator=generator).bfloat16()
    b = torch.randn(72, 24, generator=generator).bfloat16()
    c = torch.empty(40, 24, dtype=torch.bfloat16)
    kernels.matmul[(triton.cdiv(40, 16), triton.cdiv(24, 16))](
        a, b, c, 40, 24, 72, BLOCK_M=16, BLOCK_N=16, BLOCK_K=32)
    torch.testing.assert_close(c, (a.float() @ b.float()).bfloat16(), atol=0.05, rtol=0.02)
    torch.testing.assert_close(c, a @ b)  # and with torch's own bf16 matmul, at bf16 tolerance


def test_atomic_add_on_bf16(exact: None) -> None:
    x = torch.randn(64, generator=torch.Generator().manual_seed(4)).bfloat16()
    out = torch.zeros(4, dtype=torch.bfloat16)
    kernels.atomic_accumulate[(4,)](x, out, 64, BLOCK=16)
    torch.testing.assert_close(out, x.float().view(16, 4).sum(0).bfloat16(), atol=0.1, rtol=0.05)


def test_conversions_to_and_from_integers(exact: None) -> None:
    x = (torch.randn(N, generator=torch.Generator().manual_seed(5)) * 300).bfloat16()
    ints = torch.empty(N, dtype=torch.int32)
    kernels.to_int[(4,)](x, ints, N, BLOCK=256)
    assert torch.equal(ints, x.to(torch.int32))
    back = torch.empty(N, dtype=torch.bfloat16)
    kernels.from_int[(4,)](ints * 7, back, N, BLOCK=256)
    assert torch.equal(back, (ints * 7).bfloat16())


def test_nan_padding_of_a_tensor_descriptor_is_nan(exact: None) -> None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    x = torch.randn(8, 8).bfloat16()
    out = torch.empty(16, 16, dtype=torch.bfloat16)
    desc = TensorDescriptor.from_tensor(x, [16, 16], padding="nan")
    kernels.descriptor_copy[(1,)](desc, out, BLOCK=16)
    assert torch.equal(out[:8, :8], x)
    assert out[8:].isnan().all() and out[:, 8:].isnan().all()


def test_fp32_to_bf16_rounds_as_torch_does() -> None:
    generator = torch.Generator().manual_seed(6)
    values = torch.cat([
        torch.randn(20000, generator=generator) * 10.0 ** torch.randint(-40, 39, (20000,)),
        torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 3.4e38, -3.4e38, 1e-45, 1e-40,
                      1.00390625, 1.01171875]),  # ties: round to the even neighbour
        torch.arange(-(1 << 16), 1 << 16).view(torch.float32)[::97],  # subnormals, specials
    ]).float()
    ours = torch.from_numpy(bf16.from_float32(values.numpy()).view(np.int16))
    nan = values.isnan()
    assert nan.any() and torch.equal(ours[~nan], values[~nan].bfloat16().view(torch.int16))
    assert ours[nan].view(torch.bfloat16).isnan().all()  # NaN payloads may differ, as on GPUs
    decoded = torch.from_numpy(bf16.to_float32(values.bfloat16().view(torch.int16).numpy()))
    torch.testing.assert_close(decoded, values.bfloat16().float(), rtol=0, atol=0, equal_nan=True)
    assert np.isnan(bf16.to_float32(bf16.from_float32(np.float32("nan"))))


def test_an_unknown_interpreter_layout_refuses_bf16_launches(
    raw: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bf16, "_layout", lambda: "unknown")
    bf16.install()
    try:
        assert bf16.mode() == bf16.GUARDED and not bf16.exact()
        x, y, z = inputs()
        with pytest.raises(InterpreterLimitation, match="elementwise takes bf16 tensors"):
            run_elementwise("mul", x, y, z)
        fp32 = torch.ones(N)
        run_elementwise("mul", fp32, fp32, fp32)  # other dtypes run as before
    finally:
        bf16.uninstall()
    assert bf16.mode() == ""


@pytest.mark.skipif(torch.cuda.is_available() and not cuda.installed(), reason="a real GPU")
def test_bf16_is_announced_only_where_it_is_computed_right(raw: None) -> None:
    held = cuda.capability()
    cuda.uninstall()
    try:
        assert cuda.install((9, 0))
        assert not torch.cuda.is_bf16_supported()  # raw storage arithmetic: not announced
        bf16.install()
        assert torch.cuda.is_bf16_supported()
        cuda.uninstall()
        assert cuda.install((7, 5))
        assert not torch.cuda.is_bf16_supported()  # a T4 has no bf16 either way
    finally:
        cuda.uninstall()
        bf16.uninstall()
        if held is not None:
            cuda.install(held)
