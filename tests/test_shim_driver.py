"""The CPU driver piece of the shim: driver.active, autotune and do_bench on the interpreter."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
import triton
from kernels_catalog import shim_kernels
from triton.runtime.driver import driver as triton_driver

from pytest_kernelfix.capture.launches import LaunchRecorder
from pytest_kernelfix.shim import driver


@contextmanager
def only_this_driver(capability: tuple[int, int] | None) -> Iterator[None]:
    """The piece alone with ``capability``; a session-wide one is put back afterwards."""
    held = driver.installed_driver()
    driver.uninstall()
    driver.install(capability)
    try:
        yield
    finally:
        driver.uninstall()
        if held is not None:
            driver.install(held.capability)


@pytest.fixture
def cpu_driver() -> Iterator[None]:
    with only_this_driver((8, 0)):
        yield


def test_active_driver_answers_for_the_cpu(cpu_driver: None) -> None:
    active = triton.runtime.driver.active
    assert active.get_active_torch_device() == torch.device("cuda", 0)
    target = active.get_current_target()
    assert (target.backend, target.arch, target.warp_size) == ("cuda", 80, 32)
    props = active.utils.get_device_properties(0)
    assert props["max_shared_mem"] == 166912
    assert props["multiprocessor_count"] == 108


def test_without_a_capability_the_driver_reports_the_cpu() -> None:
    with only_this_driver(None):
        active = triton_driver.active
        assert active.get_active_torch_device() == torch.device("cpu")
        assert active.get_current_target().backend == "cpu"


def test_uninstall_gives_back_the_previous_driver() -> None:
    with only_this_driver(None):
        driver.uninstall()
        before = getattr(triton_driver, "_active", None)
        driver.install((9, 0))
        assert triton_driver.active is driver.installed_driver()
        driver.uninstall()
        assert getattr(triton_driver, "_active", None) is before
        assert driver.installed_driver() is None


@pytest.mark.parametrize(
    ("kernel", "block"),
    [(shim_kernels.double_small_first, 32), (shim_kernels.double_large_first, 128)],
)
def test_autotune_keeps_the_first_config_without_benchmarking(
    cpu_driver: None, kernel: triton.runtime.Autotuner, block: int
) -> None:
    n = 200 + block  # a key of its own, so the autotuner has to choose
    x = torch.randn(n)
    out = torch.empty(n)
    recorder = LaunchRecorder()
    with recorder.recording():
        kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    assert kernel.best_config.kwargs == {"BLOCK": block}
    assert recorder.count == 1  # the chosen config ran once; no config was benchmarked
    torch.testing.assert_close(out, x * 2)


def test_do_bench_times_the_function_on_the_cpu(cpu_driver: None) -> None:
    calls = []

    def work() -> None:
        calls.append(1)
        torch.randn(64).sum()

    mean = triton.testing.do_bench(work, warmup=1, rep=5)
    low, mid, high = triton.testing.do_bench(work, warmup=1, rep=5, quantiles=[0.2, 0.5, 0.8])
    assert isinstance(mean, float)
    assert mean > 0
    assert 0 < low <= mid <= high
    assert len(calls) >= 2 * 7  # first call, 5 estimates, and at least one timed run each


def test_do_bench_runs_an_interpreted_kernel(cpu_driver: None) -> None:
    x = torch.randn(256)
    out = torch.empty(256)
    ms = triton.testing.do_bench(
        lambda: shim_kernels.double[(2,)](x, out, 256, BLOCK=128), warmup=1, rep=1
    )
    assert ms > 0
    torch.testing.assert_close(out, x * 2)
