"""Reach benchmark: heal bugs injected into real Triton code, shown only what the plugin finds.

    .venv/bin/python benchmarks/reach_bench.py [--jobs 2] [--only NAME ...] [--keep DIR]
                                               [--baseline REV]

At run time it copies modules of the installed ``liger-kernel`` package into a temporary
project (nothing copied is committed) and lays them out the way many Triton libraries
are: liger's ``swiglu`` is split into a kernel module, a ``@triton.jit`` activation
helper module and a wrapper module (``ops/swiglu_ops.py``); ``geglu``, ``rms_norm``
(712 lines), ``softmax`` and ``cross_entropy`` (607 lines) stay whole, importing
liger's ``ops/utils.py``. Its tests mark nothing ``kernel``: the ini sets
``kernelfix_select = launched``.

Each bug is injected into a fresh copy, and ``pytest --kernelfix`` runs that op's tests.
The fixer is a conftest ``pytest_kernelfix_propose`` hook that can fix only what it is
shown: it renders the prompt the model would get, and answers with the fix only when
the faulty line is in it (else it answers with no edit, which is reported as the model
declining). So a bug heals only when the plugin showed its code. Printed per bug: healed
or not, whether the faulty line was in the first prompt, the first prompt's size
(characters, and tokens counted with tiktoken's o200k_base, which litellm ships for
offline use), rounds and seconds. Also measured in this run: the cost of recording a
launch with and without its launch sites, and how long reach takes on liger's modules.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

PROMPT_BUDGET = 22_000  # characters (pytest_kernelfix.locate.context.PROMPT_BUDGET)
TOKEN_BUDGET = 6_000


@dataclass(frozen=True)
class Bug:
    name: str
    kind: str
    file: str  # relative to the project
    where: str  # "kernel module" or where else it lives
    tests: str
    good: str
    bad: str


BUGS = (
    Bug("swiglu-forward", "numerics in the kernel", "ligerlite/ops/swiglu.py",
        "kernel module", "tests/test_swiglu.py",
        "    c_row = silu(a_row).cast(b_row.dtype) * b_row",
        "    c_row = silu(a_row).cast(b_row.dtype) + b_row"),
    Bug("swiglu-backward", "gradient in the kernel", "ligerlite/ops/swiglu.py",
        "kernel module", "tests/test_swiglu.py",
        "    db_row = dc_row * silu_a", "    db_row = dc_row * sig_a"),
    Bug("silu-helper", "numerics in a jit helper, no frame there",
        "ligerlite/ops/activations.py", "jit helper module", "tests/test_swiglu.py",
        "    return x * tl.sigmoid(x)", "    return x * tl.sigmoid(x * 0.5)"),
    Bug("silu-helper-attribute", "AttributeError in a jit helper",
        "ligerlite/ops/activations.py", "jit helper module", "tests/test_swiglu.py",
        "    return x * tl.sigmoid(x)", "    return x * tl.sigmoidal(x)"),
    Bug("swiglu-grid", "wrong launch grid in the wrapper", "ligerlite/ops/swiglu_ops.py",
        "wrapper module", "tests/test_swiglu.py",
        "        _swiglu_forward_kernel[(n_rows,)](",
        "        _swiglu_forward_kernel[(n_rows - 1,)]("),
    Bug("swiglu-stride", "wrong stride in the wrapper", "ligerlite/ops/swiglu_ops.py",
        "wrapper module", "tests/test_swiglu.py",
        "            dc.stride(-2),\n            float(gate_multiplier),\n"
        "            n_cols=n_cols,",
        "            dc.stride(-1),\n            float(gate_multiplier),\n"
        "            n_cols=n_cols,"),
    Bug("block-size-helper", "block size computed in a utils helper",
        "ligerlite/ops/utils.py", "utils module", "tests/test_swiglu.py",
        "    BLOCK_SIZE = triton.next_power_of_2(n)",
        "    BLOCK_SIZE = triton.next_power_of_2(n) // 4"),
    Bug("contiguous-decorator", "argument order in a utils decorator on the stack",
        "ligerlite/ops/utils.py", "utils module", "tests/test_swiglu.py",
        "        args = [maybe_to_contiguous(arg) for arg in args]",
        "        args = [maybe_to_contiguous(arg) for arg in reversed(args)]"),
    Bug("geglu-constant", "numerics in the kernel", "ligerlite/ops/geglu.py",
        "kernel module", "tests/test_geglu.py",
        "    sqrt_2_over_pi = 0.7978845608028654  # sqrt(2 / pi)\n    a_cubed = a_row * a_row "
        "* a_row\n    tanh_arg = sqrt_2_over_pi * (a_row + 0.044715 * a_cubed)\n    tanh_result "
        "= tanh(tanh_arg)\n    geglu_a = 0.5 * a_row * (1 + tanh_result)\n    c_row",
        "    sqrt_2_over_pi = 0.5978845608028654  # sqrt(2 / pi)\n    a_cubed = a_row * a_row "
        "* a_row\n    tanh_arg = sqrt_2_over_pi * (a_row + 0.044715 * a_cubed)\n    tanh_result "
        "= tanh(tanh_arg)\n    geglu_a = 0.5 * a_row * (1 + tanh_result)\n    c_row"),
    Bug("geglu-grid", "wrong launch grid, same module", "ligerlite/ops/geglu.py",
        "kernel module", "tests/test_geglu.py",
        "        _geglu_tanh_forward_kernel[(n_rows,)](",
        "        _geglu_tanh_forward_kernel[(n_rows // 2,)]("),
    Bug("rms-norm-mean", "numerics in a 712-line module", "ligerlite/ops/rms_norm.py",
        "kernel module", "tests/test_rms_norm.py",
        "    mean_square = tl.sum(X_row * X_row, axis=0) / n_cols\n    rstd = rsqrt(mean_square "
        "+ eps)\n\n    # We can save time",
        "    mean_square = tl.sum(X_row * X_row, axis=0) / (n_cols + 1)\n    rstd = "
        "rsqrt(mean_square + eps)\n\n    # We can save time"),
    Bug("softmax-max", "overflow: the row maximum is not subtracted",
        "ligerlite/ops/softmax.py", "kernel module", "tests/test_softmax.py",
        "    m = tl.max(x, axis=0)\n    e = tl.exp(x - m)",
        "    m = tl.max(x, axis=0)\n    e = tl.exp(x)"),
    Bug("cross-entropy-lse", "numerics in a 607-line module", "ligerlite/ops/cross_entropy.py",
        "kernel module", "tests/test_cross_entropy.py",
        "    lse = m + tl.log(d)", "    lse = m + tl.log(d + 1.0)"),
    Bug("element-mul", "kernel in utils launched by another module's wrapper",
        "ligerlite/ops/utils.py", "utils module (its own kernel)", "tests/test_cross_entropy.py",
        "        tl.store(X_ptrs, X_block * grad_output, mask=X_offsets < n_cols)",
        "        tl.store(X_ptrs, X_block * grad_output * 0.5, mask=X_offsets < n_cols)"),
)

TESTS = {
    "tests/test_swiglu.py": '''\
        import pytest
        import torch
        import torch.nn.functional as F

        from ligerlite.ops.swiglu_ops import LigerSiLUMulFunction


        def pair(rows, cols):
            torch.manual_seed(0)
            a = torch.randn(rows, cols, device="cuda", requires_grad=True)
            b = torch.randn(rows, cols, device="cuda", requires_grad=True)
            return a, b


        @pytest.mark.parametrize("rows, cols", [(4, 64), (3, 100)])
        def test_swiglu_forward(rows, cols):
            a, b = pair(rows, cols)
            torch.testing.assert_close(LigerSiLUMulFunction.apply(a, b), F.silu(a) * b)


        def test_swiglu_backward():
            a, b = pair(4, 64)
            ar, br = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
            grad = torch.randn(4, 64, device="cuda")
            LigerSiLUMulFunction.apply(a, b).backward(grad)
            (F.silu(ar) * br).backward(grad)
            torch.testing.assert_close(a.grad, ar.grad, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(b.grad, br.grad, rtol=1e-4, atol=1e-4)
        ''',
    "tests/test_geglu.py": '''\
        import torch
        import torch.nn.functional as F

        from ligerlite.ops.geglu import LigerGELUMulFunction


        def test_geglu():
            torch.manual_seed(0)
            a = torch.randn(6, 64, device="cuda")
            b = torch.randn(6, 64, device="cuda")
            torch.testing.assert_close(LigerGELUMulFunction.apply(a, b),
                                       F.gelu(a, approximate="tanh") * b)
        ''',
    "tests/test_rms_norm.py": '''\
        import torch

        from ligerlite.ops.rms_norm import LigerRMSNormFunction


        def test_rms_norm():
            torch.manual_seed(0)
            x = torch.randn(4, 64, device="cuda")
            w = torch.randn(64, device="cuda")
            ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
            torch.testing.assert_close(
                LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False), ref)
        ''',
    "tests/test_softmax.py": '''\
        import torch

        from ligerlite.ops.softmax import LigerSoftmaxFunction


        def test_softmax_of_large_logits():
            torch.manual_seed(0)
            x = torch.randn(4, 64, device="cuda") * 100
            torch.testing.assert_close(LigerSoftmaxFunction.apply(x), torch.softmax(x, -1))
        ''',
    "tests/test_cross_entropy.py": '''\
        import torch
        import torch.nn.functional as F

        from ligerlite.ops.cross_entropy import LigerCrossEntropyFunction


        def test_cross_entropy_and_its_scaled_gradient():
            torch.manual_seed(0)
            logits = torch.randn(8, 128, device="cuda", requires_grad=True)
            target = torch.randint(0, 128, (8,), device="cuda")
            ref_logits = logits.detach().clone().requires_grad_()
            loss = LigerCrossEntropyFunction.apply(logits, target, None)[0]
            ref = F.cross_entropy(ref_logits, target)
            torch.testing.assert_close(loss, ref)
            (loss * 2.0).backward()
            (ref * 2.0).backward()
            torch.testing.assert_close(logits.grad, ref_logits.grad)
        ''',
}

#: The scripted fixer: the fix only for what it was shown.
CONFTEST = '''\
import json
import os

from pytest_kernelfix.fixers.prompting import render_messages

BUG = json.loads(os.environ.get("KERNELFIX_BENCH_BUG", "null"))


def pytest_kernelfix_propose(request, config):
    if BUG is None:
        return None
    messages = render_messages(request)
    shown = "\\n".join(message["content"] for message in messages)
    visible = BUG["bad"] in shown
    with open(BUG["log"], "a", encoding="utf-8") as log:
        log.write(json.dumps({"round": request.round, "shown": visible,
                              "chars": len(shown), "prompt": shown if request.round == 1
                              else ""}) + "\\n")
    if visible:
        return json.dumps({"analysis": "the faulty line", "modifications": [
            {"file": BUG["file"], "old_string": BUG["bad"], "new_string": BUG["good"]}]})
    return json.dumps({"analysis": "the faulty code is not in what I was shown",
                       "modifications": []})
'''

#: For a baseline without kernelfix_select: every test is a kernel test.
MARK_ALL = '''

def pytest_collection_modifyitems(items):
    for item in items:
        item.add_marker("kernel")
'''

INI = """\
[pytest]
pythonpath = .
kernelfix_select = launched
"""


def _rewrite(text: str) -> str:
    return text.replace("from liger_kernel.", "from ligerlite.").replace(
        "import liger_kernel.", "import ligerlite.")


def _segments(source: str) -> tuple[list[str], list[tuple[ast.stmt, str]]]:
    """(header statements: imports and the import try-blocks, the other top-level nodes)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    header, nodes = [], []
    for node in tree.body:
        start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        text = "\n".join(lines[start - 1:node.end_lineno])
        is_import = isinstance(node, (ast.Import, ast.ImportFrom)) or (
            isinstance(node, (ast.Try, ast.If)) and any(
                isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(node)))
        if is_import:
            header.append(text)
        else:
            nodes.append((node, text))
    return header, nodes


def _is_jit(node: ast.stmt) -> bool:
    return any("jit" in ast.unparse(d) for d in getattr(node, "decorator_list", []))


def build_project(root: Path, liger: Path) -> None:
    """The temporary project: liger modules, swiglu split in three, tests, fixer, ini."""
    files: dict[str, str] = {
        "ligerlite/__init__.py": "",
        "ligerlite/ops/__init__.py": "",
        "ligerlite/utils.py": _rewrite((liger / "utils.py").read_text()),
        "ligerlite/ops/utils.py": _rewrite((liger / "ops" / "utils.py").read_text()),
        "conftest.py": CONFTEST,
        "pytest.ini": INI,
    }
    for name in ("geglu", "rms_norm", "softmax", "cross_entropy"):
        files[f"ligerlite/ops/{name}.py"] = _rewrite((liger / "ops" / f"{name}.py").read_text())
    header, nodes = _segments(_rewrite((liger / "ops" / "swiglu.py").read_text()))
    kernels = [(n, t) for n, t in nodes if _is_jit(n) and getattr(n, "name", "") != "silu"]
    silu = [t for n, t in nodes if getattr(n, "name", "") == "silu"]
    rest = [t for n, t in nodes if _is_jit(n) is False]
    names = ", ".join(n.name for n, _ in kernels)  # type: ignore[attr-defined]
    files["ligerlite/ops/activations.py"] = (
        "import triton\nimport triton.language as tl\n\n\n" + "\n\n\n".join(silu) + "\n")
    files["ligerlite/ops/swiglu.py"] = (
        "\n".join(header) + "\n\nfrom ligerlite.ops.activations import silu\n\n\n"
        + "\n\n\n".join(t for _, t in kernels) + "\n")
    files["ligerlite/ops/swiglu_ops.py"] = (
        "\n".join(header) + f"\n\nfrom ligerlite.ops.swiglu import {names}\n\n\n"
        + "\n\n\n".join(rest) + "\n")
    for name, text in TESTS.items():
        files[name] = textwrap.dedent(text)
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def inject(root: Path, bug: Bug) -> None:
    path = root / bug.file
    text = path.read_text()
    if bug.good not in text:
        raise SystemExit(f"{bug.name}: the line to break is not in {bug.file}")
    path.write_text(text.replace(bug.good, bug.bad, 1))


@dataclass(frozen=True)
class Outcome:
    bug: Bug
    healed: bool
    shown: bool
    prompt_chars: int
    prompt_tokens: int
    rounds: int
    seconds: float
    detail: str


def _tokens(text: str) -> int:
    """Tokens of ``text`` in o200k_base (GPT-4o's encoding), read offline from the copy
    litellm ships; -1 when it cannot be loaded."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("litellm")  # found, not imported (no network)
        if spec is not None and spec.submodule_search_locations:
            cache = Path(spec.submodule_search_locations[0]) / "litellm_core_utils" / "tokenizers"
            os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(cache))
        import tiktoken

        return len(tiktoken.get_encoding("o200k_base").encode(text))
    except Exception:
        return -1


def run_bug(pristine: Path, bug: Bug, work: Path, baseline: Path | None = None) -> Outcome:
    where = work / ("baseline-" + bug.name if baseline else bug.name)
    root = where / "project"
    shutil.copytree(pristine, root)
    inject(root, bug)
    log = where / "fixer.jsonl"
    env = {**os.environ, "KERNELFIX_BENCH_BUG": json.dumps(
        {"file": bug.file, "bad": bug.bad, "good": bug.good, "log": str(log)})}
    env.pop("TRITON_INTERPRET", None)
    if baseline is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [str(baseline), *filter(None, [os.environ.get("PYTHONPATH")])])
        with open(root / "conftest.py", "a", encoding="utf-8") as conftest:
            conftest.write(MARK_ALL)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", bug.tests, "-q", "-p", "no:cacheprovider",
         "-p", "no:randomly", "--kernelfix", "--kernelfix-rounds=2"],
        cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - started
    report_path = root / ".kernelfix" / "report.json"
    if not report_path.exists():
        tail = (done.stdout + done.stderr)[-1500:]
        return Outcome(bug, False, False, 0, 0, 0, seconds, f"no report: {tail}")
    report = json.loads(report_path.read_text())
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    first = next((call for call in calls if call["round"] == 1), None)
    healed = [b for b in report["bugs"] if b["status"] == "healed"
              and bug.file in b["changed_files"]]
    chars = first["chars"] if first else 0
    detail = "; ".join(f"{b['id']}: {b['status']}: {b['reason'][:120]}" for b in report["bugs"])
    return Outcome(
        bug, bool(healed), bool(first and first["shown"]), chars,
        _tokens(first["prompt"]) if first else 0,
        max((b["rounds"] for b in healed), default=0), seconds, detail)


# -- measured in this process -------------------------------------------------------------


LAUNCH_TEST = '''\
import os
import time

import torch
import triton

from ligerlite.ops.swiglu import _swiglu_forward_kernel
from pytest_kernelfix.capture.launches import LaunchRecorder

A = torch.randn(4, 64)
ARGS = (A, A, torch.empty_like(A), 64, 1.0)
KWARGS = {"n_cols": 64, "BLOCK_SIZE": 64, "grid": (4,), "warmup": False}


def record_many(recorder, count):
    start = time.process_time()  # CPU time: other processes on a busy machine do not count
    for _ in range(count):
        recorder._record(_swiglu_forward_kernel, ARGS, KWARGS)
    return (time.process_time() - start) / count * 1e6


def wrapper(recorder, count):  # a project frame between the test and the launch
    return record_many(recorder, count)


def launch_many(count):
    start = time.process_time()
    for _ in range(count):
        _swiglu_forward_kernel[(4,)](*ARGS[:4], 1.0, n_cols=64, BLOCK_SIZE=64)
    return (time.process_time() - start) / count * 1e6


def test_measure():
    root = os.environ["BENCH_ROOT"]
    plain, sites = [], []
    for _ in range(15):  # interleaved, so a busy machine slows both alike
        plain.append(wrapper(LaunchRecorder(), 2000))
        sites.append(wrapper(LaunchRecorder(root), 2000))
    plain, sites = min(plain), min(sites)
    launch = min(launch_many(50) for _ in range(3))
    print(f"\\nRESULT {plain:.2f} {sites:.2f} {launch:.1f}")
'''


def launch_cost(pristine: Path, work: Path) -> tuple[float, float, float]:
    """Microseconds per recorded launch without and with launch sites, inside a pytest
    test (so the stack is a real test runner's), and per interpreted launch itself."""
    root = work / "launch-cost"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(pristine, root)
    (root / "tests" / "test_launch_cost.py").write_text(LAUNCH_TEST)
    env = {**os.environ, "BENCH_ROOT": str(root), "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/test_launch_cost.py", "-q", "-s",
         "-p", "no:cacheprovider", "--kernelfix-device=interpret"],
        cwd=root, env=env, capture_output=True, text=True, timeout=900)
    line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), "")
    if not line:
        raise SystemExit("the launch-cost test failed:\n" + done.stdout[-3000:])
    plain, sites, launch = (float(value) for value in line.split()[1:])
    return plain, sites, launch


def reach_cost(liger: Path, work: Path) -> list[tuple[str, int, int, float, float, float,
                                                    float]]:
    """Per large liger module (copied, since reach never reads installed packages): lines,
    kernels, CPU ms to index it cold, and per kernel the CPU ms to locate what it reaches
    cold (every module it reaches indexed on the way) and warm, and definitions found."""
    from pytest_kernelfix.locate.outline import parse_module
    from pytest_kernelfix.locate.reach import Reach, Seeds
    from pytest_kernelfix.project import Project

    root = work / "reach-cost"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(liger, root / "liger_kernel",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    rows = []
    modules = sorted((root / "liger_kernel" / "ops").glob("*.py"),
                     key=lambda p: -p.stat().st_size)
    modules = [path for path in modules if "@triton.jit" in path.read_text()][:6]
    for path in modules:
        text = path.read_text()
        timings = []
        for _ in range(3):
            parse_module.cache_clear()
            start = time.process_time()
            index = parse_module(text)
            timings.append((time.process_time() - start) * 1e3)
        kernels = [d for d in index.definitions if d.jit]
        cold, warm, found = [], [], []
        for kernel in kernels:
            parse_module.cache_clear()
            reach = Reach(Project(root))
            seeds = Seeds(kernels=((str(path), kernel.line),))
            start = time.process_time()
            located = reach.locate(seeds)
            cold.append((time.process_time() - start) * 1e3)
            start = time.process_time()
            reach.locate(seeds)
            warm.append((time.process_time() - start) * 1e3)
            found.append(len(located))
        rows.append((f"liger_kernel/ops/{path.name}", text.count("\n"), len(kernels),
                     min(timings), statistics.median(cold), statistics.median(warm),
                     statistics.median(found)))
    return rows


def extract(rev: str, work: Path) -> Path:
    """The plugin as it was at ``rev``, importable from the returned directory."""
    target = work / "baseline-plugin"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    repo = Path(__file__).resolve().parents[1]
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev, "pytest_kernelfix",
                              "prompts"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    prompts = target / "pytest_kernelfix" / "prompts"  # the wheel's layout
    shutil.move(str(target / "prompts"), str(prompts))
    (prompts / "__init__.py").write_text("")
    return target


def summary(label: str, outcomes: list[Outcome]) -> None:
    outside = [o for o in outcomes if o.bug.where != "kernel module"]
    print(f"{label}: healed {sum(o.healed for o in outcomes)} / {len(outcomes)} "
          f"({sum(o.healed for o in outside)} / {len(outside)} outside the kernel's module); "
          f"faulty code in the first prompt {sum(o.shown for o in outcomes)} / {len(outcomes)}")
    sizes = [o.prompt_chars for o in outcomes if o.prompt_chars]
    tokens = [o.prompt_tokens for o in outcomes if o.prompt_tokens > 0]
    if sizes:
        print(f"  first prompt: median {statistics.median(sizes):.0f} chars, max {max(sizes)}; "
              f"under {PROMPT_BUDGET}: {sum(size < PROMPT_BUDGET for size in sizes)} / "
              f"{len(sizes)}")
    if tokens:
        print(f"  in o200k_base tokens: median {statistics.median(tokens):.0f}, max "
              f"{max(tokens)}; under {TOKEN_BUDGET}: "
              f"{sum(count < TOKEN_BUDGET for count in tokens)} / {len(tokens)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--keep", type=Path, default=None, help="keep the projects here")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also heal every bug with the plugin as it was at REV")
    options = parser.parse_args()
    import liger_kernel

    liger = Path(liger_kernel.__file__).parent
    work = options.keep or Path(tempfile.mkdtemp(prefix="kernelfix-reach-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    pristine = work / "pristine"
    shutil.rmtree(pristine, ignore_errors=True)
    build_project(pristine, liger)
    sane = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--kernelfix-device=interpret"], cwd=pristine,
                          capture_output=True, text=True, timeout=1800)
    if sane.returncode != 0:
        raise SystemExit("the unbroken project does not pass:\n" + sane.stdout[-3000:])
    print(f"unbroken project: {sane.stdout.strip().splitlines()[-1]}")
    bugs = [b for b in BUGS if options.only is None or b.name in options.only]
    started = time.monotonic()
    with ThreadPoolExecutor(options.jobs) as pool:
        outcomes = list(pool.map(lambda bug: run_bug(pristine, bug, work), bugs))
    total = time.monotonic() - started
    before: list[Outcome] = []
    if options.baseline:
        plugin = extract(options.baseline, work)
        with ThreadPoolExecutor(options.jobs) as pool:
            before = list(pool.map(lambda bug: run_bug(pristine, bug, work, plugin), bugs))
    print()
    print("| bug | kind | where | faulty line in first prompt | healed | rounds | "
          "first prompt chars | o200k tokens | seconds |")
    print("|---|---|---|---|---|---:|---:|---:|---:|")
    for o in outcomes:
        print(f"| {o.bug.name} | {o.bug.kind} | {o.bug.where} | {'yes' if o.shown else 'no'} | "
              f"{'yes' if o.healed else 'no'} | {o.rounds} | {o.prompt_chars} | "
              f"{o.prompt_tokens} | {o.seconds:.0f} |")
    print()
    summary("this tree", outcomes)
    if before:
        print()
        print(f"| bug | baseline ({options.baseline}): faulty line shown | healed | first "
              "prompt chars | o200k tokens |")
        print("|---|---|---|---:|---:|")
        for o in before:
            print(f"| {o.bug.name} | {'yes' if o.shown else 'no'} | "
                  f"{'yes' if o.healed else 'no'} | {o.prompt_chars} | {o.prompt_tokens} |")
        summary(f"baseline {options.baseline}", before)
    print(f"wall time, this tree: {total:.0f} s with {options.jobs} job(s)")
    for o in outcomes:
        if not o.healed:
            print(f"not healed: {o.bug.name}: {o.detail}")
    without, with_sites, launch = launch_cost(pristine, work)
    print()
    print(f"launch recording, inside a pytest test: {without:.1f} us per launch without sites, "
          f"{with_sites:.1f} us with sites ({with_sites / without:.2f}x); one interpreted "
          f"launch of the swiglu kernel itself: {launch:.0f} us")
    print()
    print("| module | lines | kernels | index ms | locate ms, cold | locate ms, warm | "
          "definitions found |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, lines, kernels, index_ms, cold, warm, found in reach_cost(liger, work):
        print(f"| {name} | {lines} | {kernels} | {index_ms:.1f} | {cold:.1f} | {warm:.2f} | "
              f"{found:.0f} |")
    if options.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
