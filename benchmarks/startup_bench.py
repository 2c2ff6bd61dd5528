"""What the preflight check adds to a session's start-up.

Runs a one-test green project (nothing to heal) in fresh pytest processes, interleaved,
three ways: the plugin idle (no ``--kernelfix``), healing with ``recipes`` (device
set-up and the checks that need no litellm), and healing with a litellm model (litellm
imported to resolve the provider and check the key; a dummy key is set, nothing is
called). Reports the median wall time of each and its ratio to the ``recipes`` run of
the same batch: the extra is what checking a litellm model at start-up costs.

    .venv/bin/python benchmarks/startup_bench.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "idle (no --kernelfix)": (),
    "--kernelfix, recipes": ("--kernelfix", "--kernelfix-model=recipes"),
    "--kernelfix, litellm model": ("--kernelfix", "--kernelfix-model=openai/gpt-4o-mini"),
}


def run(project: Path, args: tuple[str, ...]) -> float:
    env = dict(os.environ, OPENAI_API_KEY="sk-benchmark-not-a-real-key",
               TRITON_INTERPRET="1")
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         *args],
        cwd=project, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        project = Path(folder)
        (project / "pytest.ini").write_text("[pytest]\n")
        (project / "test_green.py").write_text("def test_green():\n    assert True\n")
        times: dict[str, list[float]] = {name: [] for name in CASES}
        run(project, ())  # warm the file cache once, unmeasured
        for _ in range(options.repeats):
            for name, args in CASES.items():
                times[name].append(run(project, args))
    base = statistics.median(times["--kernelfix, recipes"])
    print(f"{'session':<28} {'median s':>9} {'min s':>7} {'max s':>7} {'x recipes':>10}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:<28} {median:>9.2f} {min(values):>7.2f} {max(values):>7.2f} "
              f"{median / base:>10.2f}")


if __name__ == "__main__":
    main()
