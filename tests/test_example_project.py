"""The example project: its healthy kernels run green on CPU, its demo heals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "example_project"


def run_pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",
                                                              "PYTEST_ADDOPTS")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--tb=short",
         "-p", "no:randomly", *args],
        cwd=project, env=env, capture_output=True, text=True, timeout=900,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy, so nothing (caches, reports) is written into the repository."""
    copy = tmp_path / "example_project"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns(".kernelfix", "__pycache__"))
    return copy


def test_healthy_kernels_run_green_on_cpu_with_the_shim(project: Path) -> None:
    """add, softmax, matmul, layer norm and the autotuned matmul (several configs: it
    needs the shim's CPU driver), with the device chosen by the project's ini."""
    done = run_pytest(project, "-k", "not gelu and not large", "-rA")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "34 passed" in done.stdout
    for module in ("test_add", "test_softmax", "test_matmul", "test_layernorm",
                   "test_autotuned_matmul"):
        assert f"PASSED tests/{module}.py::" in done.stdout


def test_the_two_broken_kernels_fail_as_documented(project: Path) -> None:
    done = run_pytest(project, "-k", "gelu or large")
    assert done.returncode == 1
    assert "12 failed" in done.stdout
    assert "module 'triton.language' has no attribute 'tanh'" in done.stdout
    assert "Tensor-likes are not close!" in done.stdout


@pytest.mark.slow
def test_the_demo_cassette_heals_both_bugs(project: Path) -> None:
    done = run_pytest(project, "--kernelfix", "--kernelfix-model=replay:cassettes/demo.jsonl")
    assert done.returncode == 1  # the failing tests stay failed
    report = json.loads((project / ".kernelfix" / "report.json").read_text())
    assert report["totals"]["healed"] == 2 == report["totals"]["bugs"]
    rounds = {bug["kernel"]: bug["rounds"] for bug in report["bugs"]}
    assert rounds == {"gelu_kernel": 1, "softmax_kernel": 2}
    for bug in report["bugs"]:
        check = subprocess.run(["git", "apply", "--check", f".kernelfix/{bug['patch']}"],
                               cwd=project, capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
