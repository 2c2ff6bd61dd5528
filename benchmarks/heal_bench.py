"""The fast loop, measured in one run, as ratios against baselines of the same run.

(a) a naive fresh ``python -m pytest NODEID`` of one passing kernel test;
(b) one plugin rerun of the same test (``run_tests``: sandbox, agent, CPU shim, compile
    gate), forked from the warm rerun server, and as a fresh subprocess for reference;
    the overhead is the rerun's wall time beyond the test's own (setup + call + teardown);
(c) a whole ``pytest --kernelfix`` session with 4 independent recipe-fixable bugs (one
    ``tl.tanh`` kernel per file), with ``--kernelfix-workers`` 1 and 2;
(d) two small bugs (two kernels, two failing tests each), healed by a default session: its
    healing time (report.json) and what it adds to a plain ``pytest`` of the same project,
    as ratios to a naive ``pytest NODEID`` of one of its failing tests; with ``--baseline
    REV`` the plugin as it was at REV too, sessions alternating.

Every measurement is repeated; the table gives medians and the min-max spread, and the
machine's load average before and after. A generated project (nothing copied in), on the
Triton interpreter, so it runs on any machine:

    .venv/bin/python benchmarks/heal_bench.py [--repeat 7] [--sessions 3]
    .venv/bin/python benchmarks/heal_bench.py --only d --baseline REV[,REV] [--sessions 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

KERNEL = '''
import torch
import triton
import triton.language as tl


@triton.jit
def {name}_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, {tanh}, mask=mask)


def {name}(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    {name}_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
    return out
'''
BROKEN = "tl.tanh(x)"  # no tanh in triton.language 3.x: the recipes fix it
FIXED = "2 * tl.sigmoid(2 * x) - 1"

TEST = '''
import pytest
import torch

from kernels.{name} import {name}


@pytest.mark.kernel
@pytest.mark.parametrize("n", [300, 1000])
def test_{name}(n):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.linspace(-3, 3, n, device=device)
    torch.testing.assert_close({name}(x), torch.tanh(x))
'''

PYPROJECT = """
[tool.pytest.ini_options]
pythonpath = ["."]
markers = ["kernel: launches a Triton kernel"]
kernelfix_device = "interpret"
"""


def write_project(root: Path, names: Sequence[str], *, broken: bool) -> Path:
    (root / "kernels").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "kernels" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text(PYPROJECT)
    for name in names:
        body = KERNEL.format(name=name, tanh=BROKEN if broken else FIXED)
        (root / "kernels" / f"{name}.py").write_text(body)
        (root / "tests" / f"test_{name}.py").write_text(TEST.format(name=name))
    return root


def load() -> str:
    return "load average " + ", ".join(f"{value:.2f}" for value in os.getloadavg())


def spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


# -- (a) and (b): one test --------------------------------------------------------------------

NODEID = "tests/test_k1.py::test_k1[300]"


def naive(project: Path, *, ok: bool = True) -> float:
    """A fresh ``python -m pytest -q NODEID`` (it must pass when ``ok``, else fail)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           NODEID], cwd=project, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != (0 if ok else 1):
        raise SystemExit(f"the naive run ended with {done.returncode}:\n{done.stdout}\n"
                         f"{done.stderr}")
    return seconds


class Reruns:
    """Plugin reruns of the test, as a session's verifier makes them."""

    def __init__(self, project: Path) -> None:
        from pytest_kernelfix.rerun.launcher import RerunSetup
        from pytest_kernelfix.rerun.plan import device_plan
        from pytest_kernelfix.rerun.sandbox import Sandbox

        self.sandbox = Sandbox.create(project)
        self.project = project
        self.plan = device_plan(device="interpret", cuda_shim=True, target="cuda:90",
                                cache_dir=project / ".kernelfix" / "cache")
        self.setup = {mode: RerunSetup(project, 300.0, self.plan,
                                       inifile=project / "pyproject.toml", mode=mode)
                      for mode in ("fork", "subprocess")}
        self.tests: dict[str, list[float]] = {"fork": [], "subprocess": []}
        self.phases: dict[str, list[dict[str, float]]] = {"fork": [], "subprocess": []}
        from pytest_kernelfix.rerun.runner import Reruns

        self.reruns = Reruns()  # owns the warm server the fork reruns come from

    def once(self, mode: str) -> float:
        from pytest_kernelfix.rerun.launcher import RerunSpec

        started = time.perf_counter()
        result = self.reruns(RerunSpec(self.setup[mode], self.sandbox.root, (NODEID,)))
        seconds = time.perf_counter() - started
        if result.mode != mode or not result.passed([NODEID]):
            raise SystemExit(f"the {mode} rerun failed ({result.mode}, {result.fallback}):\n"
                             f"{result.output}")
        self.tests[mode].append(sum(o.duration for o in result.outcomes))
        phases = dict(result.report.phases)
        phases["exit"] = seconds
        self.phases[mode].append(phases)
        return seconds

    def close(self) -> None:
        self.reruns.close()
        self.sandbox.close()


# -- (c): whole sessions ------------------------------------------------------------------------


def session(template: Path, workers: int, scratch: Path, *, bugs: int = 4,
            plugin: Path | None = None, heal: bool = True
            ) -> tuple[float, float, dict]:  # type: ignore[type-arg]
    """Wall seconds, healing seconds and report.json of one session in a fresh copy (the
    plugin from ``plugin`` when given; without ``heal``, a plain run: 0 and {})."""
    project = scratch / f"session-{workers}-{time.monotonic_ns()}"
    shutil.copytree(template, project)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELFIX_")}
    if plugin is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(plugin), *filter(None, [
            env.get("PYTHONPATH")])])
    options = ["--kernelfix"] + ([f"--kernelfix-workers={workers}"] if workers else [])
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         *(options if heal else [])],
        cwd=project, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if not heal:
        shutil.rmtree(project, ignore_errors=True)
        return wall, 0.0, {}
    report = json.loads((project / ".kernelfix" / "report.json").read_text())
    healed = report["totals"]["healed"]
    if done.returncode != 1 or healed != bugs:
        raise SystemExit(f"the session healed {healed} of {bugs}:\n{done.stdout[-3000:]}")
    shutil.rmtree(project, ignore_errors=True)
    return wall, float(report["seconds"]), report


def two_bugs(scratch: Path, sessions: int, baseline: str | None) -> None:
    """(d): a default session healing two small bugs, against a naive run of one of its
    failing tests and a plain run of the project, alternating (and the plugin at
    ``baseline``)."""
    from reach_bench import extract

    broken = write_project(scratch / "two", ["k1", "k2"], broken=True)
    plugins: dict[str, Path | None] = {}
    for rev in filter(None, (baseline or "").split(",")):
        plugins[f"at {rev[:7]}"] = extract(rev, scratch / rev)
    plugins["this tree"] = None
    naive_s: list[float] = []
    plain: list[float] = []
    rows: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in plugins}
    overlapped: list[float] = []
    for index in range(sessions):
        naive_s.append(naive(broken, ok=False))
        plain.append(session(broken, 0, scratch, heal=False)[0])
        order = list(plugins)[index % len(plugins):] + list(plugins)[:index % len(plugins)]
        for name in order:
            wall, heal, report = session(broken, 0, scratch, bugs=2, plugin=plugins[name])
            rows[name][0].append(heal)
            rows[name][1].append(wall)
            if plugins[name] is None and "overlap" in report:
                overlapped.append(report["overlap"]["after_tests"])
    print(f"(d) done; {load()}\n")
    base = statistics.median(naive_s)
    plain_median = statistics.median(plain)
    print(f"(d) two small bugs (k1, k2: two failing tests each), default options, "
          f"{sessions} sessions per plugin, alternating; medians (min-max), seconds\n")
    print(f"naive `python -m pytest NODEID` of one failing test: {spread(naive_s)}; plain "
          f"`pytest` of the project: {spread(plain)}\n")
    print("| plugin | healing s | session s | session - plain s | healing / naive | "
          "(session - plain) / naive |\n|---|---:|---:|---:|---:|---:|")
    for name, (heals, walls) in rows.items():
        added = statistics.median(walls) - plain_median
        print(f"| {name} | {spread(heals)} | {spread(walls)} | {added:.2f} | "
              f"{statistics.median(heals) / base:.2f} | {added / base:.2f} |")
    if overlapped:
        print(f"\nthis tree: healing went on {spread(overlapped)} s after the last test "
              "(report.json overlap.after_tests)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs of (a) and (b) each")
    parser.add_argument("--sessions", type=int, default=3, help="sessions per worker count")
    parser.add_argument("--only", choices=("abc", "d"), default=None,
                        help="run only (a)-(c), or only (d)")
    parser.add_argument("--baseline", default=None, metavar="REV[,REV]",
                        help="(d): also heal with the plugin as it was at each REV")
    args = parser.parse_args()
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; {load()}")
    with tempfile.TemporaryDirectory(prefix="heal-bench-") as tmp:
        scratch = Path(tmp)
        if args.only != "abc":
            two_bugs(scratch, args.sessions, args.baseline)
        if args.only == "d":
            return
        healthy = write_project(scratch / "healthy", ["k1"], broken=False)
        broken = write_project(scratch / "broken", ["k1", "k2", "k3", "k4"], broken=True)

        reruns = Reruns(healthy)
        try:
            first_fork = reruns.once("fork")  # starts the server, compiles the gate's cache
            reruns.once("subprocess")
            for mode in reruns.tests:
                reruns.tests[mode].clear()
                reruns.phases[mode].clear()
            a, fork, sub = [], [], []
            for _ in range(args.repeat):  # interleaved: load spikes hit all three alike
                a.append(naive(healthy))
                fork.append(reruns.once("fork"))
                sub.append(reruns.once("subprocess"))
        finally:
            reruns.close()
        print(f"(a)/(b) done; {load()}")

        walls: dict[int, list[float]] = {1: [], 2: []}
        heals: dict[int, list[float]] = {1: [], 2: []}
        modes: set[str] = set()
        for index in range(args.sessions):
            for workers in ((1, 2) if index % 2 == 0 else (2, 1)):
                wall, heal, report = session(broken, workers, scratch)
                walls[workers].append(wall)
                heals[workers].append(heal)
                modes.add(report["reruns"]["mode"])
        print(f"(c) done; {load()}\n")

    test_fork = statistics.median(reruns.tests["fork"])
    overhead = [total - own for total, own in zip(fork, reruns.tests["fork"], strict=True)]
    overhead_sub = [total - own for total, own in
                    zip(sub, reruns.tests["subprocess"], strict=True)]
    naive_median = statistics.median(a)
    rows = [
        ("(a) naive `python -m pytest NODEID`", spread(a), "1.00"),
        ("(b) plugin rerun, forked (warm server)", spread(fork),
         f"{statistics.median(fork) / naive_median:.2f}"),
        ("(b) plugin rerun, fresh subprocess", spread(sub),
         f"{statistics.median(sub) / naive_median:.2f}"),
        ("the test's own time in a forked rerun", spread(reruns.tests["fork"]), ""),
        ("rerun overhead beyond the test, forked", spread(overhead),
         f"{statistics.median(overhead) / naive_median:.2f}"),
        ("rerun overhead beyond the test, subprocess", spread(overhead_sub),
         f"{statistics.median(overhead_sub) / naive_median:.2f}"),
        ("first forked rerun, server start included", f"{first_fork:.2f}", ""),
    ]
    print(f"(a), (b): {args.repeat} runs each, interleaved; medians (min-max), seconds\n")
    print("| measurement | seconds | vs (a) |\n|---|---:|---:|")
    for label, value, ratio in rows:
        print(f"| {label} | {value} | {ratio} |")
    print(f"\n(a) / (b) forked: {naive_median / statistics.median(fork):.1f}x; test's own "
          f"time {test_fork:.3f} s")
    print("\nwhere a forked rerun's time goes (median seconds since the session launched it):")
    print("  " + phase_line(reruns.phases["fork"]))
    print("where a subprocess rerun's time goes:")
    print("  " + phase_line(reruns.phases["subprocess"]))

    heal_ratio = statistics.median(heals[2]) / statistics.median(heals[1])
    wall_ratio = statistics.median(walls[2]) / statistics.median(walls[1])
    print(f"\n(c) 4 bugs, {args.sessions} sessions per worker count (alternating), reruns: "
          f"{', '.join(sorted(modes))}\n")
    print("| workers | healing s | whole session s |\n|---:|---:|---:|")
    for workers in (1, 2):
        print(f"| {workers} | {spread(heals[workers])} | {spread(walls[workers])} |")
    print(f"| 2 vs 1 | {heal_ratio:.2f}x | {wall_ratio:.2f}x |")


def phase_line(samples: Sequence[dict[str, float]]) -> str:
    names = [name for name in ("main", "device", "configured", "collected", "tests", "gate",
                               "end", "exit") if all(name in s for s in samples)]
    return ", ".join(f"{name} {statistics.median(s[name] for s in samples):.2f}"
                     for name in names)


if __name__ == "__main__":
    main()
