"""What a heal costs on real code, as a ratio to one plain run of the same tests.

A project is made at run time from the installed ``liger-kernel`` (its RMSNorm and SwiGLU
ops and their helpers, imports pointed at the copy) with tests of liger's kind:
parametrized over shapes (96 to 256 rows of 256 to 1024 columns, so that a test costs
about what liger's own do on the interpreter), dtypes and modes, on ``device="cuda"``
mapped to the CPU.
Each bug is one line of liger's code changed and fails 10-30 of those tests:

- ``norm``: the RMSNorm forward kernel's mean square (a normalisation kernel);
- ``helper``: ``silu``, a ``@triton.jit`` helper of the SwiGLU kernels;
- ``settings``: ``calculate_settings``, the wrapper helper every op asks for its block size;
- ``norm-long`` (only with ``--only``): the ``norm`` bug in a selection whose plain run takes
  over a minute: a GEGLU test module runs first, the RMSNorm tests (failing) in the middle,
  more SwiGLU cases last. With ``--latency 20`` the scripted model answers after 20 s: what
  healing while the tests run hides of a model's latency.

For each bug, in its own copy of the project and in one run of this script (the machine is
shared: only ratios of one run mean anything):

1. a plain ``pytest`` of the whole selection, and of its failing tests alone;
2. ``pytest --kernelfix`` of the selection, a conftest hook answering the true fix at once
   (model time is zero, or ``--latency`` seconds): with ``--baseline REV``, first with the
   plugin as it was at REV (the "before"); then the exhaustive way (``--kernelfix-verify
   thorough --kernelfix-rerun-jobs 1``: every failing test at every step, one child per
   rerun) and the default way (``--modes`` chooses among them).

It prints, per bug and in total: the heal's seconds (report.json: triage and every rerun)
divided by the plain run of the failing tests, the whole session divided by the plain run
of the selection (and what it adds to it, in seconds), and the test executions per
verification phase.

    .venv/bin/python benchmarks/economy_bench.py [--only norm,helper] [--keep DIR] \
        [--baseline REV] [--modes staged] [--latency 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from integrity_bench import copy_liger, environment, replace_first
from reach_bench import extract

INI = """[pytest]
pythonpath = .
kernelfix_device = interpret
kernelfix_target = off
kernelfix_select = launched
"""

HOOK = '''import json
import os
import time
from pathlib import Path

from pytest_kernelfix import Modification

ANSWER = json.loads((Path(__file__).parent / "answer.json").read_text())


def pytest_kernelfix_propose(request, config):
    """The true fix, after KFX_LATENCY seconds (a scripted model: no model time)."""
    time.sleep(float(os.environ.get("KFX_LATENCY", "0")))
    return [Modification(old, new, file=path) for path, old, new in ANSWER]
'''

RMS_TEST = '''import pytest
import torch

from lk.ops.rms_norm import LigerRMSNormFunction

SHAPES = [(2, 64, 256), (1, 128, 512), (3, 48, 384)]
DTYPES = [(torch.float32, 1e-4, 1e-5), (torch.float16, 2e-2, 2e-2)]


def reference(x, w, eps, offset, casting):
    dtype = x.dtype
    if casting == "gemma":
        x, w = x.float(), w.float()
    y = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)
    return (y * (offset + w)).to(dtype)


@pytest.mark.parametrize("bs, sl, hd", SHAPES)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
@pytest.mark.parametrize("offset, casting", [(0.0, "llama"), (1.0, "gemma")])
def test_rms_norm_forward(bs, sl, hd, dtype, atol, rtol, offset, casting):
    torch.manual_seed(0)
    x = torch.randn(bs, sl, hd, device="cuda", dtype=dtype)
    w = torch.randn(hd, device="cuda", dtype=dtype)
    y = LigerRMSNormFunction.apply(x, w, 1e-6, offset, casting, False)
    torch.testing.assert_close(y, reference(x, w, 1e-6, offset, casting), atol=atol, rtol=rtol)


@pytest.mark.parametrize("bs, sl, hd", SHAPES)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES[:1])
def test_rms_norm_backward(bs, sl, hd, dtype, atol, rtol):
    torch.manual_seed(0)
    x = torch.randn(bs, sl, hd, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(hd, device="cuda", dtype=dtype, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    wr = w.detach().clone().requires_grad_(True)
    y = LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False)
    ref = reference(xr, wr, 1e-6, 0.0, "llama")
    torch.testing.assert_close(y, ref, atol=atol, rtol=rtol)
    g = torch.randn_like(y)
    y.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, xr.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(w.grad, wr.grad, atol=1e-4, rtol=1e-4)
'''

SWIGLU_TEST = '''import pytest
import torch

from lk.ops.swiglu import LigerSiLUMulFunction

SHAPES = [(2, 64, 256), (1, 128, 512), (3, 48, 384), (2, 32, 1024)]{more_shapes}


@pytest.mark.parametrize("bs, sl, hd", SHAPES)
@pytest.mark.parametrize("dtype, atol, rtol", [(torch.float32, 1e-5, 1e-5),
                                               (torch.float16, 1e-2, 1e-2)]{more_dtypes})
def test_silu_mul_forward(bs, sl, hd, dtype, atol, rtol):
    torch.manual_seed(0)
    a = torch.randn(bs, sl, hd, device="cuda", dtype=dtype)
    b = torch.randn(bs, sl, hd, device="cuda", dtype=dtype)
    c = LigerSiLUMulFunction.apply(a, b)
    torch.testing.assert_close(c, torch.nn.functional.silu(a) * b, atol=atol, rtol=rtol)


@pytest.mark.parametrize("bs, sl, hd", SHAPES)
def test_silu_mul_backward(bs, sl, hd):
    torch.manual_seed(0)
    a = torch.randn(bs, sl, hd, device="cuda", requires_grad=True)
    b = torch.randn(bs, sl, hd, device="cuda", requires_grad=True)
    ar = a.detach().clone().requires_grad_(True)
    br = b.detach().clone().requires_grad_(True)
    c = LigerSiLUMulFunction.apply(a, b)
    ref = torch.nn.functional.silu(ar) * br
    torch.testing.assert_close(c, ref)
    g = torch.randn_like(c)
    c.backward(g)
    ref.backward(g)
    torch.testing.assert_close(a.grad, ar.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.grad, br.grad, atol=1e-5, rtol=1e-5)
'''


#: The ``norm-long`` selection: more SwiGLU cases, and GEGLU's (which run first).
MORE_SHAPES = " + [(4, 64, 256), (2, 96, 512), (1, 256, 384), (3, 32, 1024)]"
MORE_DTYPES = " + [(torch.bfloat16, 2e-2, 2e-2)]"

GEGLU_TEST = '''import pytest
import torch

from lk.ops.geglu import LigerGELUMulFunction

SHAPES = [(2, 64, 256), (1, 128, 512), (3, 48, 384), (2, 32, 1024), (4, 64, 256),
          (2, 96, 512), (1, 256, 384), (3, 32, 1024)]


@pytest.mark.parametrize("bs, sl, hd", SHAPES)
@pytest.mark.parametrize("dtype, atol, rtol", [(torch.float32, 1e-5, 1e-5),
                                               (torch.float16, 1e-2, 1e-2),
                                               (torch.bfloat16, 2e-2, 2e-2)])
def test_gelu_mul_forward(bs, sl, hd, dtype, atol, rtol):
    torch.manual_seed(0)
    a = torch.randn(bs, sl, hd, device="cuda", dtype=dtype)
    b = torch.randn(bs, sl, hd, device="cuda", dtype=dtype)
    c = LigerGELUMulFunction.apply(a, b)
    ref = torch.nn.functional.gelu(a.float(), approximate="tanh") * b.float()
    torch.testing.assert_close(c, ref.to(dtype), atol=atol, rtol=rtol)


@pytest.mark.parametrize("bs, sl, hd", SHAPES)
def test_gelu_mul_backward(bs, sl, hd):
    torch.manual_seed(0)
    a = torch.randn(bs, sl, hd, device="cuda", requires_grad=True)
    b = torch.randn(bs, sl, hd, device="cuda", requires_grad=True)
    ar = a.detach().clone().requires_grad_(True)
    br = b.detach().clone().requires_grad_(True)
    c = LigerGELUMulFunction.apply(a, b)
    ref = torch.nn.functional.gelu(ar, approximate="tanh") * br
    g = torch.randn_like(c)
    c.backward(g)
    ref.backward(g)
    torch.testing.assert_close(a.grad, ar.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(b.grad, br.grad, atol=1e-4, rtol=1e-4)
'''


@dataclass(frozen=True)
class Bug:
    name: str
    path: str  # in the project
    old: str
    new: str
    long: bool = False  # the selection of over a minute (GEGLU first, more SwiGLU)


BUGS = (
    Bug("norm", "lk/ops/rms_norm.py",
        "    mean_square = tl.sum(X_row * X_row, axis=0) / n_cols\n",
        "    mean_square = tl.sum(X_row * X_row, axis=0) / (2 * n_cols)\n"),
    Bug("helper", "lk/ops/swiglu.py",
        "def silu(x):\n    return x * tl.sigmoid(x)",
        "def silu(x):\n    return x * tl.sigmoid(x + 0.25)"),
    Bug("settings", "lk/ops/utils.py",
        "    BLOCK_SIZE = triton.next_power_of_2(n)\n",
        "    BLOCK_SIZE = triton.next_power_of_2(n) // 2\n"),
    Bug("norm-long", "lk/ops/rms_norm.py",
        "    mean_square = tl.sum(X_row * X_row, axis=0) / n_cols\n",
        "    mean_square = tl.sum(X_row * X_row, axis=0) / (2 * n_cols)\n", long=True),
)
#: What a run without ``--only`` heals.
DEFAULT_BUGS = ("norm", "helper", "settings")

MODES = {
    "exhaustive": ("--kernelfix-verify=thorough", "--kernelfix-rerun-jobs=1"),
    "staged": (),
}


def build(root: Path, bug: Bug) -> None:
    copy_liger(root, ("rms_norm", "swiglu", "geglu") if bug.long else ("rms_norm", "swiglu"))
    target = root / bug.path
    target.write_text(replace_first(target.read_text(), bug.old, bug.new, bug.name))
    (root / "tests" / "test_rms_norm.py").write_text(RMS_TEST)
    (root / "tests" / "test_swiglu.py").write_text(SWIGLU_TEST.format(
        more_shapes=MORE_SHAPES if bug.long else "", more_dtypes=MORE_DTYPES if bug.long else ""))
    if bug.long:
        (root / "tests" / "test_geglu.py").write_text(GEGLU_TEST)
    (root / "pytest.ini").write_text(INI)
    (root / "conftest.py").write_text(HOOK)
    (root / "answer.json").write_text(json.dumps([[bug.path, bug.new, bug.old]]))


def pytest_run(root: Path, *args: str, plugin: Path | None = None
               ) -> tuple[float, subprocess.CompletedProcess[str]]:
    """``pytest ARGS`` in ``root``, with the plugin from ``plugin`` when given."""
    env = environment()
    if plugin is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(plugin), *filter(None, [
            env.get("PYTHONPATH")])])
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         *args], cwd=root, env=env, capture_output=True, text=True, timeout=4 * 3600)
    return time.monotonic() - started, done


def failing(root: Path) -> tuple[float, list[str], int, tuple[int, int]]:
    """A plain run of the selection: (seconds, failing nodeids, tests, the positions of
    the first and last failing test in the run, from 1)."""
    xml = root / "plain.xml"
    seconds, _ = pytest_run(root, f"--junitxml={xml}", "tests")
    failed, total, where = [], 0, []
    for case in ElementTree.parse(xml).iter("testcase"):
        total += 1
        if case.find("failure") is not None or case.find("error") is not None:
            path = case.get("classname", "").replace(".", "/") + ".py"
            failed.append(f"{path}::{case.get('name')}")
            where.append(total)
    return seconds, failed, total, (min(where, default=0), max(where, default=0))


def executions(bug: dict) -> Counter[str]:  # type: ignore[type-arg]
    """Test executions per phase, over the triage and every round."""
    count: Counter[str] = Counter()
    for phase in bug.get("triage", []):
        count[phase["name"]] += len(phase["tests"])
    for detail in bug["round_details"]:
        for phase in detail.get("phases", []):
            name = phase["name"].split(" (")[0] if phase["name"].startswith(
                ("attribution", "sensitivity")) else phase["name"]
            count[name] += len(phase["tests"])
    return count


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated bug names")
    parser.add_argument("--keep", type=Path, default=None, help="keep the projects here")
    parser.add_argument("--baseline", default=None, metavar="REV[,REV]",
                        help="also heal every bug with the plugin as it was at each REV")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default: all)")
    parser.add_argument("--latency", type=float, default=0.0, metavar="SECONDS",
                        help="the scripted model answers after this many seconds")
    args = parser.parse_args(argv)
    if args.latency:
        os.environ["KFX_LATENCY"] = str(args.latency)
    names = args.only.split(",") if args.only else DEFAULT_BUGS
    chosen = [b for b in BUGS if b.name in names]
    base = args.keep or Path(tempfile.mkdtemp(prefix="economy-"))
    base.mkdir(parents=True, exist_ok=True)
    modes: dict[str, tuple[tuple[str, ...], Path | None]] = {
        mode: (options, None) for mode, options in MODES.items()
        if mode in args.modes.split(",")}
    for rev in reversed([rev for rev in (args.baseline or "").split(",") if rev]):
        modes = {f"at {rev[:7]}": ((), extract(rev, base / rev)), **modes}
    print(f"load average before: {os.getloadavg()}")
    totals: dict[str, list[float]] = {mode: [0.0, 0.0, 0.0, 0.0] for mode in modes}
    started = time.monotonic()
    for bug in chosen:
        root = base / bug.name
        build(root, bug)
        plain_selection, failed, total, (first, last) = failing(root)
        plain_failing, _ = pytest_run(root, *failed)
        print(f"\n== {bug.name}: {len(failed)} of {total} selected tests fail (tests {first} to "
              f"{last} of the run); plain run of the selection {plain_selection:.1f} s, of the "
              f"failing tests {plain_failing:.1f} s")
        for mode, (options, plugin) in modes.items():
            report_dir = root / ".kernelfix"
            session, done = pytest_run(root, "--kernelfix", "--kernelfix-rounds=1",
                                       "--kernelfix-timeout=1200", *options, "tests",
                                       plugin=plugin)
            report = json.loads((report_dir / "report.json").read_text())
            bugs = report["bugs"]
            healed = sum(1 for b in bugs if b["status"] == "healed")
            heal = sum(b["seconds"] for b in bugs)
            runs: Counter[str] = Counter()
            for b in bugs:
                runs.update(executions(b))
            print(f"  {mode:<10} healed {healed}/{len(bugs)} bug(s); heal {heal:.1f} s = "
                  f"{heal / plain_failing:.2f}x the failing tests' plain run; session "
                  f"{session:.1f} s = {session / plain_selection:.2f}x the selection's "
                  f"(+{session - plain_selection:.1f} s); reruns {report['reruns']['count']} "
                  f"in {report['reruns'].get('children', '?')} children "
                  f"({report['reruns']['mode']}); overlap {report.get('overlap')}")
            print(f"  {'':<10} test executions per phase: "
                  + ", ".join(f"{name} {count}" for name, count in runs.items()))
            if healed != len(bugs) or done.returncode not in (0, 1):
                print("  !! " + "; ".join(f"{b['id']}: {b['status']}: {b['reason'][:200]}"
                                          for b in bugs))
            total_row = totals[mode]
            total_row[0] += heal
            total_row[1] += plain_failing
            total_row[2] += session
            total_row[3] += plain_selection
            (report_dir / "report.json").rename(root / f"report-{mode.replace(' ', '-')}.json")
    print("\n== total")
    for mode, (heal, plain_failing, session, plain_selection) in totals.items():
        print(f"  {mode:<10} heal / plain failing = {heal / plain_failing:.2f}x; session / plain "
              f"selection = {session / plain_selection:.2f}x (+{session - plain_selection:.1f} s)")
    print(f"whole benchmark {time.monotonic() - started:.0f} s; load average after: "
          f"{os.getloadavg()}")
    if args.keep is None:
        print(f"(projects in {base})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
