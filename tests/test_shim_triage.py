"""A failure that is the interpreter's bf16, not the kernel's, is reported and never healed."""

from __future__ import annotations

import json
import textwrap

import pytest

from pytest_kernelfix.capture.errors import ErrorInfo
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.capture.records import Failure
from pytest_kernelfix.shim.limits import bf16_kernels, bf16_limitation


def failure(error: ErrorInfo, *signatures: tuple[str, str]) -> Failure:
    launch = KernelLaunch("mul_kernel", "/p/kernels/mul.py", 7, signature=signatures)
    return Failure("tests/test_mul.py::test_mul", "/p/tests/test_mul.py", error, "", (launch,))


MISMATCH = ErrorInfo("AssertionError", "Tensor-likes are not close!")
BF16 = (("x_ptr", "*bf16"), ("n", "i32"), ("BLOCK", "constexpr"))
FP32 = (("x_ptr", "*fp32"), ("n", "i32"))


def test_a_bf16_kernel_on_raw_storage_is_the_interpreters_failure() -> None:
    reason = bf16_limitation(failure(MISMATCH, *BF16), bf16_exact=False)
    assert reason.startswith("interpreter limitation: mul_kernel takes bf16 tensors")
    assert "nothing to heal" in reason


def test_exact_bf16_or_no_bf16_kernel_leaves_the_failure_to_healing() -> None:
    assert bf16_limitation(failure(MISMATCH, *BF16), bf16_exact=True) == ""
    assert bf16_limitation(failure(MISMATCH, *FP32), bf16_exact=False) == ""
    assert bf16_kernels(failure(MISMATCH, *FP32)) == ()


def test_a_limitation_the_shim_raised_is_reported_with_its_message() -> None:
    raised = ErrorInfo("InterpreterLimitation", "mul_kernel takes bf16 tensors, and ...")
    reason = bf16_limitation(failure(raised, *FP32), bf16_exact=True)
    assert reason == ("interpreter limitation: mul_kernel takes bf16 tensors, and ...; "
                      "nothing to heal")


def test_a_torch_cuda_call_the_shim_refused_is_not_the_kernels_to_heal() -> None:
    raised = ErrorInfo("CudaNotEmulated", "torch.cuda.CUDAGraph is not emulated by ...")
    reason = bf16_limitation(failure(raised, *FP32), bf16_exact=True)
    assert reason == ("interpreter limitation: torch.cuda.CUDAGraph is not emulated by ...; "
                      "nothing to heal")


KERNEL = """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def mul_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x * y, mask=mask)


    def mul(x, y):
        out = torch.empty_like(x)
        mul_kernel[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
        return out
"""

TEST = """
    import pytest
    import torch

    from kernels.mul import mul


    @pytest.mark.kernel
    @pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
    def test_mul(dtype):
        x = torch.randn(300, device="cuda", dtype=dtype)
        y = torch.randn(300, device="cuda", dtype=dtype)
        torch.testing.assert_close(mul(x, y), x * y)
"""

CONFTEST = """
    from pathlib import Path

    from pytest_kernelfix import shim

    if {raw}:  # the interpreter as Triton ships it: bf16 on raw 16-bit storage
        shim.install(bf16=False)


    def pytest_kernelfix_propose(request, config):
        with open(Path(__file__).parent / "asked.txt", "a") as asked:
            asked.write(request.context.group_id + "\\n")
        return None
"""


def project(pytester: pytest.Pytester, *, raw: bool) -> None:
    pytester.makeini("[pytest]\npythonpath = .\n")
    pytester.mkpydir("kernels")
    (pytester.path / "kernels" / "mul.py").write_text(textwrap.dedent(KERNEL))
    pytester.makeconftest(textwrap.dedent(CONFTEST.format(raw=raw)))
    pytester.makepyfile(test_mul=textwrap.dedent(TEST))


def test_a_correct_bf16_kernel_failing_on_raw_storage_is_not_healed(
    pytester: pytest.Pytester,
) -> None:
    project(pytester, raw=True)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--kernelfix",
        "--kernelfix-device=interpret")
    result.assert_outcomes(passed=1, failed=1)  # the failure stays a failure
    report = json.loads((pytester.path / ".kernelfix" / "report.json").read_text())
    (bug,) = report["bugs"]
    assert bug["status"] == "skipped", bug["reason"]
    assert bug["reason"].startswith("interpreter limitation: mul_kernel takes bf16 tensors")
    assert bug["rounds"] == 0 and bug["calls"] == 0
    assert not (pytester.path / "asked.txt").exists()  # the fixer was never asked


def test_with_exact_bf16_the_same_kernel_passes(pytester: pytest.Pytester) -> None:
    project(pytester, raw=False)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--kernelfix",
        "--kernelfix-device=interpret")
    result.assert_outcomes(passed=2)
    assert not (pytester.path / "asked.txt").exists()
