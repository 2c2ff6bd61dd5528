"""The session header says where kernels run, what the CUDA shim does, what the gate targets."""

from __future__ import annotations

import pytest

from pytest_kernelfix.device import header_line
from pytest_kernelfix.shim import ShimState


def test_interpret_mode_names_the_shim_and_the_gate_target() -> None:
    line = header_line("interpret", cuda_shim=True, target="cuda:80",
                       state=ShimState(True, (8, 0), True, autocast=True, bf16_exact=True))
    assert line.startswith("kernelfix: device interpret (Triton interpreter on the CPU")
    assert "CUDA shim on" in line and "NVIDIA A100" in line and "sm_80" in line
    assert "autocast emulated" in line and "bf16 exact" in line
    assert line.endswith("compile gate target cuda:80")


def test_what_is_off_is_said_to_be_off() -> None:
    line = header_line("interpret", cuda_shim=False, target="off")
    assert "CUDA shim off" in line and line.endswith("compile gate off")
    real_gpu = header_line("interpret", cuda_shim=True, target="cuda:90",
                           state=ShimState(True, (9, 0), False))
    assert "CUDA shim not needed (torch sees a real GPU)" in real_gpu
    inexact = header_line("interpret", cuda_shim=True, target="cuda:90",
                          state=ShimState(True, (9, 0), True, bf16_exact=False))
    assert "bf16 inexact" in inexact
    assert header_line("cuda", cuda_shim=True, target="cuda:90") == (
        "kernelfix: device cuda (kernels compiled and run on the GPU)")


def test_the_header_shows_in_a_session_and_only_with_the_plugin_at_work(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    shimmed = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                            "--kernelfix-device=interpret",
                                            "--kernelfix-target=cuda:89")
    shimmed.stdout.fnmatch_lines([
        "kernelfix: device interpret (Triton interpreter on the CPU*; CUDA shim on (*NVIDIA L4,"
        " sm_89; autocast emulated; bf16 exact); compile gate target cuda:89",
    ])
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert "kernelfix:" not in plain.stdout.str()
