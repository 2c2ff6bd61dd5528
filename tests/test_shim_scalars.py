"""The scalars piece: float kernel arguments behave like fp32 scalars on the interpreter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from kernels_catalog import shim_kernels
from triton.runtime.interpreter import InterpreterError

from pytest_kernelfix.shim import scalars

N = 200


@pytest.fixture
def shimmed() -> Iterator[None]:
    already = scalars.installed()
    scalars.install()
    yield
    if not already:
        scalars.uninstall()


def scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    out = torch.empty(x.shape, dtype=torch.float32)
    shim_kernels.scale_by_eps[(2,)](x, out, x.numel(), eps, BLOCK=128)
    return out


def test_float_argument_has_to(shimmed: None) -> None:
    x = torch.randn(N)
    torch.testing.assert_close(scale(x, 0.25), x * 0.25)


def test_float_argument_promotes_fp16_like_a_gpu(shimmed: None) -> None:
    x = torch.randn(N).half()
    torch.testing.assert_close(scale(x, 3.0), x.float() * 3.0)


def test_ints_and_constexpr_floats_are_untouched(shimmed: None) -> None:
    x = torch.randn(N)
    out = torch.empty(N)
    shim_kernels.scale_by_constexpr[(2,)](x, out, N, ALPHA=2.5, BLOCK=128)
    torch.testing.assert_close(out, x * 2.5)
    shim_kernels.scale_by_constexpr[(2,)](x, out, N, ALPHA=0.5, BLOCK=128)
    torch.testing.assert_close(out, x)  # ALPHA > 1.0 was decided at trace time


def test_without_the_piece_the_interpreter_still_fails() -> None:
    if scalars.installed():
        pytest.skip("a session-wide shim holds the scalars piece")
    with pytest.raises(InterpreterError, match="'float' object has no attribute 'to'"):
        scale(torch.randn(N), 0.25)


def test_a_range_loop_index_is_a_tensor_as_when_compiled(shimmed: None) -> None:
    x = torch.randn(300)
    out = torch.empty(64)
    shim_kernels.sum_in_strides[(1,)](x, out, x.numel(), BLOCK=64)
    padded = torch.cat([x, torch.zeros(20)]).view(5, 64).sum(0)
    torch.testing.assert_close(out, padded * 2)  # static_range indices 0 and 1: * 1 * 2


def test_an_integer_mask_is_read_as_a_boolean_one(shimmed: None) -> None:
    x = torch.arange(16, dtype=torch.float32)
    out = torch.full((16,), -1.0)
    shim_kernels.copy_rows_below_level[(1,)](x, out, 10, 3, BLOCK=16, LEVEL=1)
    assert out.tolist() == list(range(10)) + [-1.0] * 6
    shim_kernels.copy_rows_below_level[(1,)](x, out.fill_(-1.0), 10, 1, BLOCK=16, LEVEL=1)
    assert out.tolist() == [-1.0] * 16  # LEVEL < levels is false: nothing loaded or stored


def test_a_dtype_handed_to_a_jit_helper_answers_value_as_its_constexpr(shimmed: None) -> None:
    for dtype in (torch.float32, torch.int32):
        x = torch.tensor([-7, -3, -5], dtype=dtype)
        out = torch.zeros(1, dtype=dtype)
        shim_kernels.running_max[(1,)](x, out, x.numel(), BLOCK=8)
        assert out.item() == -3


def test_without_the_piece_a_dtype_has_no_value() -> None:
    if scalars.installed():
        pytest.skip("a session-wide shim holds the scalars piece")
    x = torch.tensor([-7.0, -3.0])
    with pytest.raises(InterpreterError, match=r"object has no attribute .*value"):
        shim_kernels.running_max[(1,)](x, torch.zeros(1), x.numel(), BLOCK=8)


def test_and_or_between_tensors_combine_elementwise_as_when_compiled(shimmed: None) -> None:
    x = torch.arange(16, dtype=torch.float32)
    out = torch.zeros(16)
    shim_kernels.copy_inside[(1,)](x, out, 3, 2, BLOCK=4, CHECK=True)
    grid = out.view(4, 4)
    assert grid[:3, :2].flatten().tolist() == [0.0, 1.0, 4.0, 5.0, 8.0, 9.0]
    assert (grid[3] == -2).all() and (grid[:, 2:] == -2).all()
