"""Whole sessions on a project split the way real Triton libraries are, with tests that
mark nothing ``kernel``: a jit helper module, a kernel module (long enough to be shown
focused), and a wrapper module in another package. A bug in each module heals through
a conftest fixer that can only fix what the prompt shows it. And a kernel that crashes
its xdist worker heals too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kernel_project import ORACLE_CONFTEST, git_apply_check, git_init, report_of

from pytest_kernelfix.locate.context import PROMPT_BUDGET

HELPERS = '''\
import triton
import triton.language as tl


@triton.jit
def silu(x):
    return x * tl.sigmoid(x)


@triton.jit
def relu(x):
    return tl.maximum(x, 0.0)
'''

FILLER = "".join(
    f"\n\n@triton.jit\ndef unrelated_{i}(x):\n    y = x * {i}\n    return y + {i}\n"
    for i in range(30)
)

KERNELS = '''\
import triton
import triton.language as tl

from .helpers import silu
''' + FILLER + '''

@triton.jit
def gated_kernel(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask)
    b = tl.load(b_ptr + offs, mask=mask)
    tl.store(c_ptr + offs, silu(a) * b, mask=mask)
'''

WRAPPER = '''\
import torch
import triton

from kernels.gated import gated_kernel


def block_for(n):
    return 64


def gated(a, b):
    c = torch.empty_like(a)
    n = a.numel()
    BLOCK = block_for(n)
    grid = (triton.cdiv(n, BLOCK),)
    gated_kernel[grid](a, b, c, n, BLOCK=BLOCK)
    return c
'''

TESTS = '''\
import pytest
import torch

from ops.gated import gated


@pytest.mark.parametrize("n", [100, 256])
def test_gated(n):
    a = torch.linspace(-3, 3, n)
    b = torch.linspace(1, 2, n)
    torch.testing.assert_close(gated(a, b), torch.nn.functional.silu(a) * b)
'''

CONFTEST = ORACLE_CONFTEST

INI = "[pytest]\npythonpath = .\n"

#: (module, good line, bad line): a numerics bug in the kernel, in the helper imported
#: from another module (no traceback frame there), a wrong grid in the wrapper.
BUGS = {
    "kernel": ("kernels/gated.py", "    tl.store(c_ptr + offs, silu(a) * b, mask=mask)",
               "    tl.store(c_ptr + offs, silu(a) + b, mask=mask)"),
    "helper": ("kernels/helpers.py", "    return x * tl.sigmoid(x)",
               "    return x * tl.sigmoid(x) * 0.5"),
    "wrapper": ("ops/gated.py", "    grid = (triton.cdiv(n, BLOCK),)",
                "    grid = (n // BLOCK,)"),
}


def make_split_project(root: Path, bug: str) -> str:
    files = {
        "kernels/__init__.py": "", "kernels/helpers.py": HELPERS, "kernels/gated.py": KERNELS,
        "ops/__init__.py": "", "ops/gated.py": WRAPPER, "tests/test_gated.py": TESTS,
        "conftest.py": CONFTEST, "pytest.ini": INI,
    }
    path, good, bad = BUGS[bug]
    assert good in files[path]
    files[path] = files[path].replace(good, bad)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return json.dumps({"file": path, "bad": bad, "good": good})


@pytest.mark.parametrize("bug", [
    pytest.param(bug, marks=[pytest.mark.slow] if bug == "kernel" else []) for bug in sorted(BUGS)
])
def test_a_bug_in_each_module_heals_in_an_unmarked_suite(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, bug: str
) -> None:
    monkeypatch.setenv("KERNELFIX_TEST_BUG", make_split_project(pytester.path, bug))
    git_init(pytester.path)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kernelfix", "--kernelfix-select=launched",
        "--kernelfix-rounds=2")
    failed = 1 if bug == "wrapper" else 2  # n=256 fills whole blocks: the grid bug hides
    result.assert_outcomes(failed=failed, passed=2 - failed)
    (report,) = report_of(pytester.path)["bugs"]
    assert report["status"] == "healed", (report["reason"], report["round_details"])
    path = BUGS[bug][0]
    assert report["changed_files"] == [path] and report["rounds"] == 1
    assert report["first_prompt_chars"] <= PROMPT_BUDGET
    shown = report["shown"]
    assert "kernels/gated.py:gated_kernel" in shown  # 200 lines: shown focused
    assert "kernels/helpers.py" in shown and "ops/gated.py" in shown
    patch = pytester.path / ".kernelfix" / report["patch"]
    assert git_apply_check(pytester.path, patch).returncode == 0


#: A dispatcher on a constexpr name over activations in a long module, and its kernel:
#: a launch with ``ACT="silu"`` runs only the silu branch.
ACTS = ("relu", "gelu", "silu", "tanh", "softsign")
ACT_HELPERS = "import triton\nimport triton.language as tl\n" + FILLER.replace(
    "unrelated_", "spare_") + "".join(
    f"\n\n@triton.jit\ndef {name}(x):\n    return {body}\n" for name, body in zip(ACTS, (
        "tl.maximum(x, 0.0)", "0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))",
        "x * tl.sigmoid(x)", "2.0 * tl.sigmoid(2.0 * x) - 1.0", "x / (1.0 + tl.abs(x))"),
        strict=True)) + "\n\n@triton.jit\ndef activate(x, KIND: tl.constexpr):\n" + "".join(
    f"    {'if' if i == 0 else 'elif'} KIND == \"{name}\":\n        y = {name}(x)\n"
    for i, name in enumerate(ACTS)) + "    else:\n        y = x\n    return y\n"

ACT_OPS = '''\
import torch
import triton
import triton.language as tl

from kernels.acts import activate


@triton.jit
def act_kernel(x_ptr, y_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, activate(x, ACT), mask=offs < n)


def act(x, name):
    y = torch.empty_like(x)
    act_kernel[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), ACT=name, BLOCK=64)
    return y
'''

ACT_TESTS = '''\
import pytest
import torch
import torch.nn.functional as F

from ops.act import act

REFERENCES = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "tanh": torch.tanh,
              "softsign": F.softsign}


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_act(name):
    x = torch.linspace(-3, 3, 100)
    torch.testing.assert_close(act(x, name), REFERENCES[name](x), rtol=1e-4, atol=1e-5)
'''


def test_a_helper_behind_a_constexpr_dispatcher_is_shown_and_its_siblings_are_not(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, bad = "    return x * tl.sigmoid(x)\n", "    return x * tl.sigmoid(x * 0.5)\n"
    files = {"kernels/__init__.py": "", "kernels/acts.py": ACT_HELPERS.replace(good, bad),
             "ops/__init__.py": "", "ops/act.py": ACT_OPS, "tests/test_act.py": ACT_TESTS,
             "conftest.py": CONFTEST, "pytest.ini": INI}
    for name, text in files.items():
        (pytester.path / name).parent.mkdir(parents=True, exist_ok=True)
        (pytester.path / name).write_text(text)
    monkeypatch.setenv("KERNELFIX_TEST_BUG", json.dumps(
        {"file": "kernels/acts.py", "bad": bad, "good": good}))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kernelfix", "--kernelfix-select=launched",
        "--kernelfix-rounds=2")
    result.assert_outcomes(failed=1, passed=len(ACTS) - 1)
    (report,) = report_of(pytester.path)["bugs"]
    assert report["status"] == "healed", (report["reason"], report["round_details"])
    assert report["changed_files"] == ["kernels/acts.py"] and report["rounds"] == 1
    shown = report["shown"]
    assert "kernels/acts.py:silu" in shown and "kernels/acts.py:activate" in shown
    assert not {f"kernels/acts.py:{name}" for name in ACTS if name != "silu"} & set(shown)



@pytest.mark.parametrize("xdist", [
    pytest.param((), id="plain"),
    pytest.param(("-n", "2"), id="xdist", marks=pytest.mark.slow),
])
def test_an_unmarked_suite_is_left_alone_by_default_and_the_summary_says_so(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, xdist: tuple[str, ...]
) -> None:
    monkeypatch.setenv("KERNELFIX_TEST_BUG", make_split_project(pytester.path, "kernel"))
    summary = pytester.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kernelfix", "-q",
                                           *xdist)
    result.assert_outcomes(failed=2)
    assert "kernelfix: healing" not in result.stdout.str()
    result.stdout.fnmatch_lines([  # even under -q: the failures were not forgotten
        "*= kernelfix =*",
        "2 failing test(s) not selected for healing (not marked kernel; kernelfix_select = "
        "kernel), first tests/test_gated.py::test_gated[[]*[]]",
        "  to heal them: --kernelfix-select kernel,launched (or kernelfix_select = "
        "kernel,launched in the ini file; 2 of them reached a Triton kernel of the project), "
        "a nodeid glob, as in --kernelfix-select 'kernel,tests/test_gated.py::[*]' or "
        "@pytest.mark.kernel on the tests",
        "::notice title=kernelfix left 2 failing test(s) unselected::2 failing test(s) not "
        "selected*%0ATo heal them: --kernelfix-select kernel,launched*",
    ])
    # CI gets a summary all the same: nothing was healed, and how to opt in
    report = report_of(pytester.path)
    assert report["bugs"] == [] and report["unselected"]["count"] == 2
    markdown = (pytester.path / ".kernelfix" / "report.md").read_text()
    assert summary.read_text() == markdown
    assert ("**Nothing was healed: no failing test was selected for healing.** Not selected "
            "for healing: 2 failing test(s)") in markdown
    assert "`kernelfix_select = kernel,launched` in the ini file" in markdown


@pytest.mark.parametrize("xdist", [
    pytest.param((), id="plain"),
    pytest.param(("-n", "2"), id="xdist", marks=pytest.mark.slow),
])
def test_failures_a_glob_leaves_out_are_counted_beside_the_healed_bug(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, xdist: tuple[str, ...]
) -> None:
    monkeypatch.setenv("KERNELFIX_TEST_BUG", make_split_project(pytester.path, "kernel"))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kernelfix", "--kernelfix-select=*::test_gated?100?",
        "--kernelfix-rounds=1", *xdist)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "healed    gated_kernel-*",
        "1 failing test(s) not selected for healing (matched no glob; kernelfix_select = "
        "[*]::test_gated?100?), first tests/test_gated.py::test_gated[[]256[]]",
    ])
    report = report_of(pytester.path)
    (bug,) = report["bugs"]
    assert bug["status"] == "healed" and bug["nodeids"] == ["tests/test_gated.py::test_gated[100]"]
    assert report["unselected"] == {
        "count": 1, "reasons": {"matched no glob": 1}, "launched_project_kernel": 1,
        "nodeids": ["tests/test_gated.py::test_gated[256]"], "select": ["*::test_gated?100?"],
        "hint": "--kernelfix-select *::test_gated?100?,launched (or kernelfix_select = "
                "*::test_gated?100?,launched in the ini file; 1 of them reached a Triton "
                "kernel of the project) or a nodeid glob, as in --kernelfix-select "
                "'*::test_gated?100?,tests/test_gated.py::*'",
    }
    markdown = (pytester.path / ".kernelfix" / "report.md").read_text()
    assert ("Not selected for healing: 1 failing test(s) not selected for healing (matched no "
            "glob; `kernelfix_select = *::test_gated?100?`), first "
            "`tests/test_gated.py::test_gated[256]`.") in markdown


CRASHING = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    tl.store(y_ptr + offsets * 1000000007, x * 2)


def scale(x):
    y = torch.empty_like(x)
    scale_kernel[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
    return y
'''

CRASH_TESTS = '''\
import pytest
import torch

from kernels.ops import scale


@pytest.mark.kernel
def test_scale():
    x = torch.arange(100, dtype=torch.float32)
    torch.testing.assert_close(scale(x), x * 2)


def test_unrelated():
    assert True
'''


def test_a_kernel_that_crashes_its_xdist_worker_is_healed(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    (pytester.path / "kernels").mkdir()
    (pytester.path / "kernels" / "__init__.py").write_text("")
    (pytester.path / "kernels" / "ops.py").write_text(CRASHING)
    (pytester.path / "tests").mkdir()
    (pytester.path / "tests" / "test_ops.py").write_text(CRASH_TESTS)
    (pytester.path / "pytest.ini").write_text(INI)
    fix = {"analysis": "unmasked store far out of bounds", "modifications": [{
        "file": "kernels/ops.py",
        "old_string": "    tl.store(y_ptr + offsets * 1000000007, x * 2)",
        "new_string": "    tl.store(y_ptr + offsets, x * 2, mask=offsets < n)"}]}
    tape = pytester.path / "tape.jsonl"
    tape.write_text(json.dumps({"response": json.dumps(fix)}) + "\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "xdist", "-n", "1", "--kernelfix",
        f"--kernelfix-model=replay:{tape}")
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*crashed while running*tests/test_ops.py::test_scale*"])
    (report,) = report_of(pytester.path)["bugs"]
    assert report["status"] == "healed", (report["reason"], report["round_details"])
    assert report["error"].startswith("SIGSEGV: The test process died with SIGSEGV")
    assert report["kernel"] == "scale_kernel" and report["changed_files"] == ["kernels/ops.py"]


def test_without_xdist_the_header_says_how_to_heal_crashes(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest_subprocess("--kernelfix", "--kernelfix-device=interpret",
                                           "--co", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["kernelfix: a kernel that crashes the test process*"
                                 "(-n 1, or -p xdist -n 1)*"])
