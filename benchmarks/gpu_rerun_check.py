"""On a real CUDA GPU: forked reruns work, the server never touches CUDA, caches are kept.

Checks, each a row of the table printed at the end (the exit status is 1 if any fails):

- the GPU count for workers comes from NVML, without a CUDA context in the session;
- reruns fork from the warm server, and their tests run kernels on the GPU;
- the server never initialised CUDA, however many children it forked: it holds no
  compute context in ``nvidia-smi``, its children initialised CUDA themselves (a child
  of a process that ran ``cuInit`` cannot), and the check the server makes before each
  fork names an initialised driver on this machine (checked in a scratch process);
- reruns share one Triton cache directory: a second rerun compiles nothing, a candidate
  that changed one kernel compiles only that kernel, a subprocess rerun hits it too;
- a whole ``pytest --kernelfix`` session heals on the GPU with forked reruns, and a
  second session reuses the first one's compiled kernels;

and timings: the first forked rerun (server start included), forked and subprocess
reruns. Needs torch with CUDA, triton, and pytest-kernelfix importable (installed, or
the checkout on ``PYTHONPATH``):

    python benchmarks/gpu_rerun_check.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KERNELS = '''
import torch
import triton
import triton.language as tl

FACTOR = {factor}


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * {factor}, mask=mask)


def add(x, y):
    out = torch.empty_like(x)
    add_kernel[(triton.cdiv(x.numel(), 256),)](x, y, out, x.numel(), BLOCK=256)
    return out


def scale(x):
    out = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
    return out
'''

TESTS = '''
import os

import torch

from kernels import ops


def test_on_the_gpu():
    x = torch.arange(1000.0, device="cuda")
    torch.testing.assert_close(ops.add(x, x), 2 * x)
    torch.testing.assert_close(ops.scale(x), x * ops.FACTOR)
    assert x.is_cuda and torch.cuda.is_initialized()
    with open(os.path.join(os.path.dirname(__file__), "..", "children.txt"), "a") as out:
        out.write(f"{os.getppid()} {os.getpid()} {torch.cuda.get_device_name()}\\n")
'''

BROKEN = '''
import torch
import triton
import triton.language as tl


@triton.jit
def tanh_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, tl.tanh(x), mask=mask)


def tanh(x):
    out = torch.empty_like(x)
    tanh_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
    return out
'''

BROKEN_TEST = '''
import pytest
import torch

from kernels.act import tanh


@pytest.mark.kernel
@pytest.mark.parametrize("n", [300, 1000])
def test_tanh(n):
    x = torch.linspace(-3, 3, n, device="cuda")
    torch.testing.assert_close(tanh(x), torch.tanh(x))
'''

INI = "[pytest]\npythonpath = .\nmarkers =\n    kernel: launches a Triton kernel\n"
NODEID = "tests/test_ops.py::test_on_the_gpu"


class Checks:
    def __init__(self) -> None:
        self.rows: list[tuple[str, bool, str]] = []

    def check(self, name: str, ok: bool, detail: str) -> bool:
        self.rows.append((name, bool(ok), detail))
        return bool(ok)

    def table(self) -> str:
        lines = ["| check | ok | detail |", "|---|---|---|"]
        lines += [f"| {name} | {'yes' if ok else 'NO'} | {detail} |"
                  for name, ok, detail in self.rows]
        return "\n".join(lines)

    @property
    def failed(self) -> bool:
        return not all(ok for _, ok, _ in self.rows)


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def gpu_count_without_context(checks: Checks) -> None:
    code = ("import torch; from pytest_kernelfix.session.schedule import visible_gpus; "
            "n = torch.cuda.device_count(); g = visible_gpus({}); "
            "print(n, len(g), torch.cuda.is_initialized())")
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    fields = done.stdout.split()
    ok = (done.returncode == 0 and len(fields) == 3 and int(fields[0]) >= 1
          and fields[0] == fields[1] and fields[2] == "False")
    seen = " ".join(fields) or done.stderr[-300:]
    checks.check("GPU count without a CUDA context", ok,
                 f"device_count, workers' GPUs, CUDA initialised: {seen}")


def reruns(checks: Checks, base: Path) -> dict[str, Any]:
    from pytest_kernelfix.rerun.launcher import RerunSetup, RerunSpec
    from pytest_kernelfix.rerun.plan import device_plan
    from pytest_kernelfix.rerun.runner import Reruns
    from pytest_kernelfix.rerun.sandbox import Sandbox

    project = write(base / "proj", {"kernels/__init__.py": "",
                                    "kernels/ops.py": KERNELS.format(factor=3.0),
                                    "tests/test_ops.py": TESTS, "pytest.ini": INI})
    cache = base / "cache"
    plan = device_plan(device="cuda", cuda_shim=True, target="cuda:90", cache_dir=cache)
    env = {"TRITON_CACHE_DIR": str(cache / "triton")}
    setups = {mode: RerunSetup(project, 300.0, plan, inifile=project / "pytest.ini", env=env,
                               mode=mode) for mode in ("fork", "subprocess")}
    timings: dict[str, list[float]] = {"fork": [], "subprocess": []}
    sandbox = Sandbox.create(project)
    runner = Reruns()  # owns the warm server the forked reruns come from

    def rerun(mode: str) -> Any:
        started = time.perf_counter()
        result = runner(RerunSpec(setups[mode], sandbox.root, (NODEID,)))
        timings[mode].append(time.perf_counter() - started)
        return result

    try:
        first = rerun("fork")
        first_seconds = timings["fork"].pop()
        checks.check("a forked rerun runs its test on the GPU",
                     first.mode == "fork" and first.passed([NODEID]),
                     f"mode {first.mode}, passed {first.passed([NODEID])}"
                     f"{', fallback: ' + first.fallback if first.fallback else ''}"
                     f"{'' if first.passed([NODEID]) else ', output: ' + first.output[-800:]}")
        launches = first.outcome(NODEID).launch_count if first.outcome(NODEID) else 0
        checks.check("its kernels were launched (and counted)", launches == 2,
                     f"{launches} launches")
        hits, lookups = first.compile_cache
        checks.check("a cold cache compiles both kernels", (hits, lookups) == (0, 2),
                     f"{hits} of {lookups} from the cache")
        again = rerun("fork")
        hits, lookups = again.compile_cache
        checks.check("the next rerun compiles nothing", (hits, lookups) == (2, 2),
                     f"{hits} of {lookups} from the cache")
        sandbox.write("kernels/ops.py", KERNELS.format(factor=5.0))  # a candidate
        candidate = rerun("fork")
        hits, lookups = candidate.compile_cache
        checks.check("a candidate compiles only the kernel it changed",
                     candidate.passed([NODEID]) and (hits, lookups) == (1, 2),
                     f"{hits} of {lookups} from the cache, passed {candidate.passed([NODEID])}")
        fresh = rerun("subprocess")
        hits, lookups = fresh.compile_cache
        checks.check("a subprocess rerun shares the cache", fresh.mode == "subprocess"
                     and (hits, lookups) == (2, 2), f"{hits} of {lookups} from the cache")
        for _ in range(4):
            rerun("fork")
            rerun("subprocess")
        children = [line.split() for line in (sandbox.root / "children.txt").read_text()
                    .splitlines()]
        forked = [row for row in children if row[0] != str(os.getpid())]
        servers = {row[0] for row in forked}
        checks.check("one server forked every forked rerun", len(servers) == 1
                     and len(forked) == 7, f"{len(forked)} forked children, servers {servers}")
        server = int(servers.pop()) if len(servers) == 1 else 0
        untouched(checks, server, len(forked))
        gpu = children[0][2:] if children else ["?"]
    finally:
        runner.close()
        sandbox.close()
    return {"first": first_seconds, "fork": timings["fork"], "subprocess": timings["subprocess"],
            "gpu": " ".join(gpu)}


def untouched(checks: Checks, server: int, children: int) -> None:
    """The server holds no CUDA context; its forked children initialised CUDA."""
    try:
        driver = "libcuda.so" in Path(f"/proc/{server}/maps").read_text()
    except OSError:
        driver = False
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.split()
    checks.check("the server never initialised CUDA", server > 0 and str(server) not in apps,
                 f"server {server}: no compute context (apps: {apps or 'none'}); "
                 f"{children} forked children initialised CUDA and ran kernels; libcuda "
                 f"{'loaded (by an import), not initialised' if driver else 'not loaded'}")


PROBE = """
import ctypes, torch
from pytest_kernelfix.rerun.server.server import fork_hazard
before = fork_hazard()
assert ctypes.CDLL("libcuda.so.1").cuInit(0) == 0
after_driver = fork_hazard()
torch.cuda.init()
print(repr(before), "|", after_driver, "|", fork_hazard())
"""


def hazard_probe(checks: Checks) -> None:
    """The server's check before each fork sees an initialised driver on this machine."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True)
    before, _, rest = done.stdout.strip().partition(" | ")
    driver, _, torch_cuda = rest.partition(" | ")
    ok = (before == "''" and "CUDA driver is initialised" in driver
          and "CUDA is initialised" in torch_cuda)
    checks.check("the fork check names an initialised driver", ok,
                 f"before: {before or done.stderr[-300:]}; after cuInit: {driver}; "
                 f"after torch.cuda.init: {torch_cuda}")


def sessions(checks: Checks, base: Path) -> list[float]:
    """Two healing sessions of one broken kernel; the second reuses compiled kernels."""
    project = write(base / "heal", {"kernels/__init__.py": "", "kernels/act.py": BROKEN,
                                    "tests/test_act.py": BROKEN_TEST, "pytest.ini": INI})
    seconds = []
    reports = []
    env = dict(os.environ)
    stubbed = _stub_rapidfuzz(base / "stubs", env)
    for _ in range(2):
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                   "--kernelfix", "--kernelfix-device=cuda"]
        if "pytest_kernelfix" not in _entry_points():
            command += ["-p", "pytest_kernelfix.plugin"]
        started = time.perf_counter()
        done = subprocess.run(command, cwd=project, capture_output=True, text=True, env=env)
        seconds.append(time.perf_counter() - started)
        try:
            reports.append(json.loads((project / ".kernelfix" / "report.json").read_text()))
        except OSError:
            summary = done.stdout.rpartition("= kernelfix =")[2] or done.stdout
            checks.check("a healing session on the GPU", False, summary[-1500:])
            return seconds
    first, second = reports
    bug = first["bugs"][0] if first["bugs"] else {}
    checks.check("a session heals on the GPU with forked reruns",
                 bug.get("status") == "healed" and first["reruns"]["mode"] == "fork",
                 f"{bug.get('status')}: {bug.get('reason')}; reruns {first['reruns']}"
                 + ("; rapidfuzz is not installed: a stub that fails if called stood in"
                    if stubbed else ""))
    checks.check("the next session reuses its compiled kernels",
                 second["reruns"]["cache_hits"] > 0,
                 f"hits {second['reruns']['cache_hits']} of {second['reruns']['cache_lookups']} "
                 f"(first session: {first['reruns']['cache_hits']} of "
                 f"{first['reruns']['cache_lookups']})")
    return seconds


def _stub_rapidfuzz(directory: Path, env: dict[str, str]) -> bool:
    """Where rapidfuzz is missing, a stand-in the edit engine can import: its fuzzy level
    fails if it is ever reached (a recipe's edit matches exactly)."""
    try:
        import rapidfuzz  # noqa: F401
    except ImportError:
        failing = "def _missing(*args, **kwargs):\n    raise ImportError('rapidfuzz')\n"
        write(directory, {"rapidfuzz/__init__.py": "from rapidfuzz import fuzz, process\n",
                          "rapidfuzz/fuzz.py": failing + "ratio = partial_ratio = _missing\n",
                          "rapidfuzz/process.py": failing + "cdist = extract = _missing\n"})
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(directory),
                                                          env.get("PYTHONPATH", "")]))
        return True
    return False


def _entry_points() -> set[str]:
    from importlib.metadata import entry_points

    return {entry.value.partition(".")[0] for entry in entry_points(group="pytest11")}


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU here: nothing to check")
        return 1
    checks = Checks()
    with tempfile.TemporaryDirectory(prefix="gpu-rerun-check-") as tmp:
        base = Path(tmp)
        gpu_count_without_context(checks)
        hazard_probe(checks)
        times = reruns(checks, base)
        session_seconds = sessions(checks, base)
    print(checks.table())
    fork, sub = times["fork"], times["subprocess"]
    print(f"\nGPU: {times['gpu']}; torch {torch.__version__}, Python {sys.version.split()[0]}")
    print("| rerun of one test (2 kernels) | median s | min-max s |\n|---|---:|---:|")
    print(f"| first forked rerun (server start) | {times['first']:.2f} | |")
    for label, values in (("forked, warm server", fork), ("fresh subprocess", sub)):
        print(f"| {label} | {statistics.median(values):.2f} | "
              f"{min(values):.2f}-{max(values):.2f} |")
    healed = " / ".join(f"{seconds:.1f}" for seconds in session_seconds)
    print(f"| heal sessions, cold then warm cache | {healed} | |")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
