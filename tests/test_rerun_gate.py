"""The GPU compile gate: bugs the interpreter hides are caught by compiling for a GPU.

Every catalogue kernel is first run on the interpreter and checked against torch (it
passes: that is the point), then gated, with the error mapped to its file line.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import triton
import triton.language as tl
from kernels_catalog import gate_bugs as bugs
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from pytest_kernelfix.capture.launches import KernelLaunch, LaunchRecorder
from pytest_kernelfix.rerun.probes.gate import (
    GateResult,
    GpuTarget,
    compile_launch,
    compile_launches,
    parse_target,
)
from pytest_kernelfix.shim import libdevice as libdevice_piece

CATALOG = Path(inspect.getsourcefile(bugs) or "")
H100 = parse_target("cuda:90")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("gate-cache"))


def launched(kernel: Any, grid: tuple[int, ...], *args: Any, **kwargs: Any) -> tuple[
    KernelLaunch, Any
]:
    """Run ``kernel`` on the interpreter and return its launch record and live object."""
    recorder = LaunchRecorder()
    with recorder.recording():
        kernel[grid](*args, **kwargs)
    [(launch, live)] = recorder.kernels.items()
    return launch, live


def gate(
    record: tuple[KernelLaunch, Any], cache_dir: str | None, target: GpuTarget = H100
) -> GateResult:
    launch, live = record
    return compile_launch(live, launch, target, cache_dir=cache_dir)


def line_of(snippet: str) -> int:
    """The one catalogue line holding ``snippet`` (a whole stripped line, or a part of one)."""
    lines = CATALOG.read_text().splitlines()
    [line] = [n for n, text in enumerate(lines, 1) if text.strip() == snippet] or [
        n for n, text in enumerate(lines, 1) if snippet in text
    ]
    return line


def located(result: GateResult, snippet: str) -> bool:
    return f"{CATALOG}:{line_of(snippet)}:" in result.error


def elementwise(kernel: Any, n: int = 100, **kwargs: Any) -> tuple[
    tuple[KernelLaunch, Any], torch.Tensor, torch.Tensor
]:
    x = torch.randn(n)
    out = torch.empty(n)
    record = launched(kernel, (triton.cdiv(n, 128),), x, out, n, BLOCK=128, **kwargs)
    return record, x, out


# --- the catalogue -----------------------------------------------------------------------


@pytest.mark.parametrize(("k", "ok"), [(8, False), (16, True)])
def test_dot_needs_k_of_at_least_16(cache_dir: str, k: int, ok: bool) -> None:
    a = torch.randn(16, k, dtype=torch.float16)
    b = torch.randn(k, 16, dtype=torch.float16)
    c = torch.empty(16, 16)
    record = launched(bugs.dot_k8, (1,), a, b, c, M=16, N=16, K=k)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-3)
    result = gate(record, cache_dir)
    assert result.ok is ok
    if not ok:
        assert "K >= 16" in result.error
        assert located(result, "tl.dot(a, b)")


def test_python_global_is_refused_and_constexpr_global_accepted(cache_dir: str) -> None:
    record, x, out = elementwise(bugs.scale_global)
    torch.testing.assert_close(out, x * 2.0)
    result = gate(record, cache_dir)
    assert not result.ok
    assert "Cannot access global variable SCALE" in result.error
    assert located(result, "x * SCALE, mask=mask)")
    fixed, x, out = elementwise(bugs.scale_constexpr)
    torch.testing.assert_close(out, x * 2.0)
    assert gate(fixed, cache_dir).ok


def test_error_in_a_helper_points_at_the_helper_and_its_caller(cache_dir: str) -> None:
    record, x, out = elementwise(bugs.scale_in_helper)
    torch.testing.assert_close(out, x * 2.0)
    result = gate(record, cache_dir)
    assert not result.ok
    first, *rest = result.error.splitlines()
    assert first.startswith(f"{CATALOG}:{line_of('return x * SCALE')}:")
    assert f"called from {CATALOG}:{line_of('_times_scale(x), mask=mask')}:" in rest[-1]


def row_sums(kernel: Any, limit: int = 64) -> tuple[KernelLaunch, Any]:
    x = torch.randn(3, 100)
    out = torch.empty(3)
    record = launched(kernel, (3,), x, out, 100, limit, BLOCK=32)
    torch.testing.assert_close(out, x[:, :limit].sum(dim=1))
    return record


def test_break_is_refused_and_a_bounded_loop_accepted(cache_dir: str) -> None:
    result = gate(row_sums(bugs.row_sum_break), cache_dir)
    assert not result.ok
    assert "unsupported AST node type: Break" in result.error
    assert located(result, "break")
    fixed = gate(row_sums(bugs.row_sum_bounded), cache_dir)
    assert fixed.ok, fixed.error


def test_static_range_with_a_runtime_bound_is_refused(cache_dir: str) -> None:
    record, x, out = elementwise(bugs.repeat_static, times=3)
    torch.testing.assert_close(out, x * 3)
    result = gate(record, cache_dir)
    assert not result.ok
    assert "used as tl.static_range start value is not a constexpr" in result.error
    assert located(result, "for _ in tl.static_range(times):")
    fixed, x, out = elementwise(bugs.repeat_range, times=3)
    torch.testing.assert_close(out, x * 3)
    assert gate(fixed, cache_dir).ok


def test_a_kernel_that_returns_a_value_is_refused(cache_dir: str) -> None:
    record, x, out = elementwise(bugs.copy_returns)
    torch.testing.assert_close(out, x)
    result = gate(record, cache_dir)
    assert not result.ok
    assert "failed to legalize operation 'tt.return'" in result.error
    assert f"{CATALOG}:{line_of('return x')}:" in result.error  # MLIR's own location


@pytest.mark.parametrize(("warps", "ok"), [(3, False), (4, True)])
def test_num_warps_must_be_a_power_of_two(cache_dir: str, warps: int, ok: bool) -> None:
    record, x, out = elementwise(bugs.copy, num_warps=warps)
    torch.testing.assert_close(out, x)
    assert dict(record[0].options) == {"num_warps": warps}
    result = gate(record, cache_dir)
    assert result.ok is ok
    if not ok:
        assert "num_warps must be a power of 2" in result.error


def run_matmul(stages: int, block_k: int) -> tuple[KernelLaunch, Any]:
    a = torch.randn(128, 128, dtype=torch.float16)
    b = torch.randn(128, 128, dtype=torch.float16)
    c = torch.empty(128, 128, dtype=torch.float16)
    record = launched(
        bugs.matmul, (1, 1), a, b, c, 128, 128, 128,
        BLOCK_M=128, BLOCK_N=128, BLOCK_K=block_k, num_warps=8, num_stages=stages,
    )
    torch.testing.assert_close(c, (a.float() @ b.float()).half(), rtol=2e-2, atol=5e-2)
    return record


def test_shared_memory_over_the_limit_is_refused(cache_dir: str) -> None:
    result = gate(run_matmul(stages=4, block_k=128), cache_dir)
    assert not result.ok
    assert result.shared > H100.shared_limit == 232448
    assert f"out of resource: shared memory, Required: {result.shared}" in result.error
    assert "Hardware limit: 232448" in result.error
    fewer_stages = gate(run_matmul(stages=3, block_k=128), cache_dir)
    assert fewer_stages.ok, fewer_stages.error
    assert 0 < fewer_stages.shared <= 232448


def test_the_target_decides_the_shared_memory_limit(cache_dir: str) -> None:
    record = run_matmul(stages=7, block_k=64)
    assert gate(record, cache_dir, parse_target("cuda:90")).ok
    a100 = gate(record, cache_dir, parse_target("cuda:80"))
    assert not a100.ok
    assert "Hardware limit: 166912 (cuda:80)" in a100.error


# --- the machinery -----------------------------------------------------------------------


def test_results_are_cached_and_the_environment_is_restored(tmp_path: Path) -> None:
    before = {key: os.environ.get(key) for key in ("TRITON_CACHE_DIR", "TRITON_INTERPRET")}
    record, _, _ = elementwise(bugs.copy)
    first = gate(record, str(tmp_path))
    second = gate(record, str(tmp_path))
    assert (first.cached, second.cached) == (False, True)
    assert (first.ok, first.error, first.shared) == (second.ok, second.error, second.shared)
    assert {key: os.environ.get(key) for key in before} == before
    assert any((tmp_path / "triton").rglob("*.cubin"))  # compiled artifacts went here
    [stored] = (tmp_path / "kernelfix-gate").glob("*.json")
    assert GateResult.from_json(json.loads(stored.read_text())).ok
    assert not gate(record, str(tmp_path), parse_target("cuda:80")).cached  # another key


def test_the_interpreter_is_untouched_by_a_gate(cache_dir: str) -> None:
    assert gate(row_sums(bugs.row_sum_bounded), None).ok
    assert isinstance(tl.sum, InterpretedFunction)
    assert isinstance(bugs.row_sum_bounded, InterpretedFunction)
    assert triton.knobs.runtime.interpret
    x = torch.randn(2, 96)
    out = torch.empty(2)
    bugs.row_sum_bounded[(2,)](x, out, 96, 64, BLOCK=32)
    torch.testing.assert_close(out, x[:, :64].sum(dim=1))


def test_every_recorded_launch_is_gated_in_order(cache_dir: str) -> None:
    x = torch.randn(100)
    out = torch.empty(100)
    recorder = LaunchRecorder()
    with recorder.recording():
        bugs.copy[(1,)](x, out, 100, BLOCK=128)
        bugs.scale_global[(1,)](x, out, 100, BLOCK=128)
        bugs.copy[(1,)](x, out, 100, BLOCK=128)  # the same launch again: one record
    results = compile_launches(recorder.kernels, H100, cache_dir=cache_dir)
    assert [(r.kernel, r.ok) for r in results] == [("copy", True), ("scale_global", False)]


def test_without_a_cache_dir_nothing_is_cached() -> None:
    record, _, _ = elementwise(bugs.copy)
    assert not gate(record, None).cached
    assert not gate(record, None).cached


def test_inexact_launch_is_skipped_with_a_note(cache_dir: str) -> None:
    launch = KernelLaunch("copy", str(CATALOG), line_of("def copy("), exact=False)
    result = compile_launch(bugs.copy, launch, H100, cache_dir=cache_dir)
    assert result.ok
    assert "skipped" in result.error and "not known exactly" in result.error
    assert (result.kernel, result.line, result.shared) == ("copy", launch.line, 0)


def test_a_jit_function_is_gated_like_an_interpreted_one(cache_dir: str) -> None:
    launch, _ = elementwise(bugs.scale_global)[0]
    result = compile_launch(JITFunction(bugs.scale_global.fn), launch, H100, cache_dir=None)
    assert not result.ok
    assert "Cannot access global variable SCALE" in result.error


def test_libdevice_kernel_compiles_with_the_shim_in_place(cache_dir: str) -> None:
    already = libdevice_piece.installed()
    libdevice_piece.install()
    try:
        record, x, out = elementwise(bugs.tanh_libdevice)
    finally:
        if not already:
            libdevice_piece.uninstall()
    torch.testing.assert_close(out, torch.tanh(x))
    result = gate(record, cache_dir)
    assert result.ok, result.error


def test_hip_target_compiles(cache_dir: str) -> None:
    target = parse_target("hip:gfx942")
    assert target == GpuTarget("hip", "gfx942", 64, 65536)
    record, _, _ = elementwise(bugs.copy)
    assert gate(record, cache_dir, target).ok


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cuda:90", GpuTarget("cuda", 90, 32, 232448)),
        ("cuda", GpuTarget("cuda", 90, 32, 232448)),
        ("CUDA:80", GpuTarget("cuda", 80, 32, 166912)),
        ("cuda:sm_89", GpuTarget("cuda", 89, 32, 101376)),
        ("cuda:100", GpuTarget("cuda", 100, 32, 232448)),
        (" hip:gfx950 ", GpuTarget("hip", "gfx950", 64, 163840)),
    ],
)
def test_parse_target(text: str, expected: GpuTarget) -> None:
    assert parse_target(text) == expected
    assert str(expected).startswith(expected.backend + ":")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cuda:87", "unknown CUDA target"),
        ("cuda:abc", "unknown CUDA target"),
        ("hip:gfx1100", "unknown HIP target"),
        ("tpu:v5", "unknown GPU target"),
        ("", "unknown GPU target"),
    ],
)
def test_parse_target_rejects_junk(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_target(text)


def test_gate_result_round_trips_through_json() -> None:
    result = GateResult("k", "/x/k.py", 3, False, "boom", 1024, 0.25, True)
    data = json.loads(json.dumps(result.to_json()))
    assert GateResult.from_json(data) == result
    assert all(isinstance(v, (str, int, float, bool)) for v in data.values())


def test_installed_backends_are_found_without_importing_triton() -> None:
    """The preflight asks for the gate's backend on an xdist controller, which must not
    import triton: the backends are found where Triton itself finds them."""
    code = textwrap.dedent("""
        import sys
        from pytest_kernelfix.rerun.probes.gate import installed_backends
        found = installed_backends()
        print("triton" in sys.modules)
        import triton.backends
        print(found == frozenset(triton.backends.backends), sorted(found))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    assert out[0] == "False"
    assert out[1].startswith("True") and "nvidia" in out[1]
