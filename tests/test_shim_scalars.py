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
