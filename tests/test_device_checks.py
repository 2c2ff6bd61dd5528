"""Interpret mode tells the truth: the compile gate, the diagnosis, CPU-only GPU suites."""

from __future__ import annotations

import pytest
from kernel_project import answer, make_project, report_of, write_cassette

TANH = "    y = x * factor + tl.tanh(x) * 0"
GOOD = "    y = x * factor"


def heal(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kernelfix", *args)


def test_gate_rejects_a_fix_the_interpreter_accepts(pytester: pytest.Pytester) -> None:
    """Round 1 reads a plain Python global in the kernel: fine on the interpreter, a
    NameError when compiled for a GPU. The compiler's message goes back to the model."""
    kernel = make_project(pytester, bug="tanh")
    kernel.write_text(kernel.read_text().replace("@triton.jit", "ZERO = 0.0\n\n\n@triton.jit"))
    uses_global = answer(TANH, "    y = x * factor + ZERO")
    proper = answer("    y = x * factor + ZERO", GOOD)
    tape = write_cassette(pytester.path / "tape.jsonl", [uses_global, proper])
    result = heal(pytester, f"--kernelfix-model=replay:{tape}")
    result.assert_outcomes(failed=5)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed" and bug["rounds"] == 2, bug["reason"]
    first = bug["round_details"][0]["outcome"]
    assert first.startswith("passes on the interpreter but does not compile for cuda:90")
    assert "global" in first.lower()


@pytest.mark.slow
def test_gate_can_be_turned_off(pytester: pytest.Pytester) -> None:
    kernel = make_project(pytester, bug="tanh")
    kernel.write_text(kernel.read_text().replace("@triton.jit", "ZERO = 0.0\n\n\n@triton.jit"))
    tape = write_cassette(pytester.path / "tape.jsonl", [answer(TANH, "    y = x * factor + ZERO")])
    heal(pytester, f"--kernelfix-model=replay:{tape}", "--kernelfix-target=off")
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed" and bug["rounds"] == 1  # only the interpreter judged


INLINE_ASM = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def neg_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.inline_asm_elementwise("neg.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                  is_pure=True, pack=1)
    tl.store(y_ptr + offsets, y, mask=mask)


def neg(x):
    y = torch.empty_like(x)
    neg_kernel[(triton.cdiv(x.numel(), 128),)](x, y, x.numel(), BLOCK=128)
    return y
'''


def test_interpreter_limitation_is_reported_not_healed(pytester: pytest.Pytester) -> None:
    """Inline PTX compiles for a GPU but cannot run on the interpreter."""
    make_project(pytester)
    (pytester.path / "kernels" / "neg.py").write_text(INLINE_ASM)
    (pytester.path / "tests" / "test_ops.py").write_text(
        "import pytest, torch\nfrom kernels.neg import neg\n\n\n@pytest.mark.kernel\n"
        "def test_neg():\n    x = torch.randn(100)\n    torch.testing.assert_close(neg(x), -x)\n"
    )
    result = heal(pytester)
    result.assert_outcomes(failed=1)  # still a failure: the plugin never hides one
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "skipped"
    assert bug["reason"].startswith("interpreter limitation")
    assert "neg_kernel" in bug["reason"] and "compiles for cuda:90" in bug["reason"]


GPU_SUITE = '''\
import pytest
import torch
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})],
                 key=["n"])
@triton.jit
def double_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=mask), mask=mask)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.kernel
def test_double_on_cuda():
    x = torch.randn(1000, device="cuda")
    y = torch.empty_like(x)
    double_kernel[lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)](x, y, 1000)
    assert y.is_cuda and torch.cuda.get_device_capability() == (9, 0)
    torch.testing.assert_close(y, 2 * x)
'''


def test_gpu_suite_runs_on_cpu_with_the_device_option_alone(pytester: pytest.Pytester) -> None:
    """A suite written for CUDA (device="cuda", skipif without a GPU, autotune) runs
    green on a CPU-only machine with ``--kernelfix-device interpret`` and no healing."""
    pytester.makepyfile(test_gpu=GPU_SUITE)
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:kernelfix")
    plain.assert_outcomes(skipped=1)
    shimmed = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                            "--kernelfix-device=interpret")
    shimmed.assert_outcomes(passed=1)
    assert not (pytester.path / ".kernelfix").exists()
