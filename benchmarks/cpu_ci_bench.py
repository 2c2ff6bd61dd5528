"""What running GPU kernel tests on a CPU-only CI costs: interpreter and compile gate.

Runs the passing tests of ``example_project`` on the Triton interpreter with the CPU
shim (``--kernelfix-device interpret``) and reports seconds per test, then compiles
every kernel those tests launched for a GPU target (the compile gate), cold and cached.

    .venv/bin/python benchmarks/cpu_ci_bench.py [--target cuda:90]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = ROOT / "example_project"
#: The example project's two broken kernels fail on purpose; measure the healthy ones.
HEALTHY = ["tests/test_add.py", "tests/test_matmul.py", "tests/test_layernorm.py",
           "tests/test_autotuned_matmul.py", "tests/test_softmax.py::test_softmax",
           "-k", "not large"]

GATE_SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, {project!r})
    from pytest_kernelfix import shim
    shim.install()
    import torch
    from pytest_kernelfix.capture.launches import LaunchRecorder
    from pytest_kernelfix.rerun.probes.gate import compile_launch, parse_target
    recorder = LaunchRecorder()
    recorder.install()
    import pytest
    pytest.main(["-q", "-p", "no:kernelfix", "-p", "no:cacheprovider", "--rootdir",
                 {project!r}, *{tests!r}], plugins=[])
    target = parse_target({target!r})
    rows = []
    for label in ("cold", "cached"):
        for launch, kernel in recorder.kernels.items():
            if not launch.file.startswith({project!r}):
                continue
            result = compile_launch(kernel, launch, target, cache_dir={cache!r})
            rows.append({{"pass": label, "kernel": launch.name, "ok": result.ok,
                          "seconds": result.seconds, "cached": result.cached,
                          "shared": result.shared}})
    print("GATE-JSON " + json.dumps(rows))
""")


def run_tests(durations_file: Path) -> dict[str, float]:
    """Per-test call seconds of the healthy tests under the interpreter + shim."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--kernelfix-device=interpret", f"--junitxml={durations_file}", *HEALTHY],
        cwd=PROJECT, env=env, check=True, capture_output=True, text=True,
    )
    import xml.etree.ElementTree as ElementTree

    tree = ElementTree.parse(durations_file)
    return {f"{case.get('classname')}::{case.get('name')}": float(case.get("time", 0))
            for case in tree.iter("testcase")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="cuda:90")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        times = run_tests(Path(tmp) / "junit.xml")
        wall = time.perf_counter() - started
        by_module: dict[str, list[float]] = {}
        for name, seconds in times.items():
            by_module.setdefault(name.split("::")[0].rsplit(".", 1)[-1], []).append(seconds)
        print(f"interpreter + CPU shim: {len(times)} tests, {sum(times.values()):.2f} s in tests, "
              f"{wall:.1f} s wall (with interpreter start-up)")
        print("| test module | tests | mean s/test | max s/test |")
        print("|---|---|---|---|")
        for module, values in sorted(by_module.items()):
            print(f"| {module} | {len(values)} | {statistics.mean(values):.3f} | "
                  f"{max(values):.3f} |")
        script = GATE_SCRIPT.format(project=str(PROJECT), tests=HEALTHY, target=args.target,
                                    cache=str(Path(tmp) / "gate-cache"))
        out = subprocess.run([sys.executable, "-c", script], cwd=PROJECT, capture_output=True,
                             text=True, check=True).stdout
    rows = json.loads(next(line for line in out.splitlines()
                           if line.startswith("GATE-JSON "))[len("GATE-JSON "):])
    print()
    print(f"compile gate ({args.target}): {sum(r['pass'] == 'cold' for r in rows)} distinct "
          "launches")
    print("| kernel | launches | cold s (sum) | cold s (max) | cached s (sum) | max shared bytes |")
    print("|---|---|---|---|---|---|")
    for kernel in sorted({r["kernel"] for r in rows}):
        cold = [r for r in rows if r["kernel"] == kernel and r["pass"] == "cold"]
        warm = [r for r in rows if r["kernel"] == kernel and r["pass"] == "cached"]
        assert all(r["ok"] for r in cold), cold
        assert all(r["cached"] for r in warm), warm
        print(f"| {kernel} | {len(cold)} | {sum(r['seconds'] for r in cold):.2f} | "
              f"{max(r['seconds'] for r in cold):.2f} | {sum(r['seconds'] for r in warm):.3f} | "
              f"{max(r['shared'] for r in cold)} |")


if __name__ == "__main__":
    main()
