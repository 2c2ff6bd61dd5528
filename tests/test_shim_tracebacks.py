"""Errors raised under the CPU shim read as the code's errors, not the plugin's."""

from __future__ import annotations

import textwrap

import pytest

SUITE = """
    import pytest
    import torch
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    @triton.jit
    def helper(x):
        return x + tl.arange(0, 64)  # shapes 128 and 64 do not broadcast

    @triton.jit
    def calls_helper(x_ptr, out_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, helper(tl.load(x_ptr + offs)))

    @triton.jit
    def fp16_libdevice(x_ptr, out_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, libdevice.rsqrt(tl.load(x_ptr + offs)))

    def test_torch_error():
        torch.mm(torch.randn(2, 3, device="cuda"), torch.randn(2, 3, device="cuda"))

    def test_autocast_refusal():
        p = torch.rand(4, device="cuda")
        with torch.autocast("cuda"):
            torch.nn.functional.binary_cross_entropy(p, p)

    def test_helper_error():
        x = torch.randn(128, device="cuda")
        calls_helper[(1,)](x, torch.empty_like(x), BLOCK=128)

    def test_libdevice_error():
        x = torch.randn(128, device="cuda", dtype=torch.float16)
        fp16_libdevice[(1,)](x, torch.empty_like(x), BLOCK=128)
"""


def test_no_shim_frame_in_the_reported_tracebacks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_suite=textwrap.dedent(SUITE))
    result = pytester.runpytest_subprocess(
        "--kernelfix-device=interpret", "-p", "no:cacheprovider", "-p", "no:randomly",
        "--tb=long")
    result.assert_outcomes(failed=4)
    output = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*mat1 and mat2 shapes cannot be multiplied*",
        "*unsafe to autocast*",
        "*return x + tl.arange(0, 64)*",  # the helper's own line, reached through the shim
        "*Cannot make_shape_compatible*",
        "*libdevice.rsqrt(tl.load(x_ptr + offs))*",
    ])
    assert "pytest_kernelfix/shim" not in output
    assert "pytest_kernelfix" not in output.split("short test summary")[0].replace(
        "kernelfix:", "")  # no plugin frame anywhere in the tracebacks
