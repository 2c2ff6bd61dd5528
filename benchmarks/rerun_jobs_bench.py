"""One rerun of many kernel tests in one child and split across two, in one run.

A generated project of interpreter kernel tests (one tanh kernel per module, two tests
per module: n = 300 and 1000, each with ``--launches`` checked launches); the same rerun
(``run_tests``, forked from the warm server, or ``--mode subprocess``) of the first N
tests with ``jobs`` 1 and 2, interleaved, repeated. ``--per-child`` sets the fewest
tests a child gets, to measure splits the plugin's rule would not make.

It prints, per N, the medians and min-max spread of the wall time, the ratio of the
medians (jobs=2 / jobs=1) and the median of the ratios of each pair, and, from
single-test reruns, what one child costs beyond its test (its start, collection, gate
and exit). The machine's load average is printed before and after: on a machine busy
with other work, two children compete with it for the cores.

    .venv/bin/python benchmarks/rerun_jobs_bench.py [--tests 4,8,16] [--repeat 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from heal_bench import FIXED, KERNEL, PYPROJECT, load, spread

TEST = '''
import pytest
import torch

from kernels.{name} import {name}


@pytest.mark.parametrize("n", [300, 1000])
def test_{name}(n):
    x = torch.linspace(-3, 3, n)
    for _ in range({launches}):
        torch.testing.assert_close({name}(x), torch.tanh(x))
'''


def write_project(root: Path, modules: int, launches: int) -> tuple[Path, tuple[str, ...]]:
    """The project and its test nodeids, in module order."""
    (root / "kernels").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "kernels" / "__init__.py").write_text("")
    (root / "pyproject.toml").write_text(PYPROJECT)
    nodeids = []
    for index in range(1, modules + 1):
        name = f"k{index}"
        (root / "kernels" / f"{name}.py").write_text(KERNEL.format(name=name, tanh=FIXED))
        (root / "tests" / f"test_{name}.py").write_text(TEST.format(name=name,
                                                                    launches=launches))
        nodeids += [f"tests/test_{name}.py::test_{name}[{n}]" for n in (300, 1000)]
    return root, tuple(nodeids)


class Bench:
    def __init__(self, project: Path, mode: str) -> None:
        from pytest_kernelfix.rerun.launcher import RerunSetup
        from pytest_kernelfix.rerun.plan import device_plan
        from pytest_kernelfix.rerun.runner import Reruns
        from pytest_kernelfix.rerun.sandbox import Sandbox

        self.sandbox = Sandbox.create(project)
        plan = device_plan(device="interpret", cuda_shim=True, target="cuda:90",
                           cache_dir=project / ".kernelfix" / "cache")
        self.setup = RerunSetup(project, 300.0, plan, inifile=project / "pyproject.toml",
                                mode=mode)
        self.reruns = Reruns()
        self.mode = mode

    def once(self, nodeids: Sequence[str], jobs: int) -> tuple[float, float]:
        """Wall seconds of one rerun, and the tests' own seconds in it."""
        from dataclasses import replace

        from pytest_kernelfix.rerun.launcher import RerunSpec

        started = time.perf_counter()
        result = self.reruns(RerunSpec(replace(self.setup, jobs=jobs), self.sandbox.root,
                                       tuple(nodeids)))
        seconds = time.perf_counter() - started
        if result.mode != self.mode or not result.passed(nodeids):
            raise SystemExit(f"the rerun failed ({result.mode}, {result.fallback}):\n"
                             f"{result.output}")
        return seconds, sum(outcome.duration for outcome in result.outcomes)

    def close(self) -> None:
        self.reruns.close()
        self.sandbox.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", default="4,8,16", help="rerun sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=7, help="pairs of reruns per size")
    parser.add_argument("--launches", type=int, default=1, help="checked launches per test")
    parser.add_argument("--mode", choices=("fork", "subprocess"), default="fork")
    parser.add_argument("--per-child", type=int, default=0,
                        help="fewest tests per child (default: the plugin's rule)")
    args = parser.parse_args()
    if args.per_child:
        from pytest_kernelfix.rerun import split

        split.MIN_TESTS_PER_CHILD = split.MIN_TESTS_PER_FRESH_CHILD = args.per_child
    sizes = [int(size) for size in args.tests.split(",")]
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; {load()}")
    with tempfile.TemporaryDirectory(prefix="rerun-jobs-bench-") as tmp:
        project, nodeids = write_project(Path(tmp) / "project", (max(sizes) + 1) // 2,
                                         args.launches)
        bench = Bench(project, args.mode)
        try:
            bench.once(nodeids, 1)  # starts the server, fills the gate's cache
            alone = [bench.once(nodeids[:1], 1) for _ in range(args.repeat)]
            walls: dict[tuple[int, int], list[float]] = {}
            for size in sizes:
                for index in range(args.repeat):  # alternating: load hits both alike
                    for jobs in ((1, 2) if index % 2 == 0 else (2, 1)):
                        wall, _ = bench.once(nodeids[:size], jobs)
                        walls.setdefault((size, jobs), []).append(wall)
        finally:
            bench.close()
    print(f"done; {load()}\n")
    overhead = [wall - own for wall, own in alone]
    print(f"one test alone: {spread([wall for wall, _ in alone])} s, of which the child "
          f"beyond its test {spread(overhead)} s; the test itself "
          f"{spread([own for _, own in alone])} s ({args.mode}, {args.launches} launch(es) "
          "per test)\n")
    print(f"{args.repeat} pairs per size, alternating; medians (min-max), seconds\n")
    print("| tests | jobs=1 | jobs=2 | ratio of medians | median of pair ratios |")
    print("|---:|---:|---:|---:|---:|")
    for size in sizes:
        one, two = walls[(size, 1)], walls[(size, 2)]
        pairs = statistics.median(b / a for a, b in zip(one, two, strict=True))
        print(f"| {size} | {spread(one)} | {spread(two)} | "
              f"{statistics.median(two) / statistics.median(one):.2f} | {pairs:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
