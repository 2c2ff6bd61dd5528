"""Integrity by experiment, through whole sessions (``pytest --kernelfix`` in a subprocess).

A scripted fixer (the conftest ``pytest_kernelfix_propose`` hook) answers round by round:

- an honest fix on the line *after* the launch (a partial-sum reduction with torch) heals;
- an answer computed before the launch, with the kernel still launched on the real
  buffers, is rejected by the sensitivity rerun, and the honest fix after it heals;
- a test that checks no value of the kernel's output ends "cannot certify";
- assertion helpers patched at run time are rejected however they were reached.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from hostile.project import BUG, FIX, INI, report, write_project

HOOK = '''
import json
from pathlib import Path

from pytest_kernelfix import Modification

ANSWERS = json.loads((Path(__file__).parent / "answers.json").read_text())


def pytest_kernelfix_propose(request, config):
    """Round N of kernel K gets ANSWERS[K][N - 1]: a list of (file, old, new) edits."""
    kernel = request.context.group_id.split("_kernel-")[0]
    rounds = ANSWERS.get(kernel, [])
    if request.round > len(rounds):
        return None
    return [Modification(old, new, file=path) for path, old, new in rounds[request.round - 1]]
'''


def session(pytester: pytest.Pytester, answers: dict[str, list[list[tuple[str, str, str]]]],
            rounds: int) -> dict[str, dict]:  # type: ignore[type-arg]
    (pytester.path / "answers.json").write_text(json.dumps(answers))
    pytester.makeconftest(HOOK)
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--kernelfix",
        "--kernelfix-model=recipes", f"--kernelfix-rounds={rounds}", "--kernelfix-timeout=120",
        timeout=600)
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the failing tests stay failed
    return report(pytester.path)


TOTAL = '''"""Sum of a vector: one partial sum per program, reduced by the wrapper."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def total_kernel(x_ptr, partial_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.store(partial_ptr + pid, tl.sum(x, axis=0))


def total(x: torch.Tensor) -> torch.Tensor:
    n = x.numel()
    programs = triton.cdiv(n, 128)
    partials = torch.empty(programs, dtype=torch.float32)
    total_kernel[(programs,)](x, partials, n, BLOCK=128)
    return partials[0]
'''
TOTAL_TEST = '''import pytest
import torch

from kernels.total import total


@pytest.mark.kernel
def test_total() -> None:
    x = torch.arange(300, dtype=torch.float32)
    torch.testing.assert_close(total(x), x.sum())
'''


def test_a_wrapper_fix_on_the_post_launch_line_heals(pytester: pytest.Pytester) -> None:
    write_project(pytester.path, passing=False)
    (pytester.path / "kernels" / "total.py").write_text(TOTAL)
    (pytester.path / "tests" / "test_total.py").write_text(TOTAL_TEST)
    fix = ("kernels/total.py", "    return partials[0]\n",
           "    return torch.sum(partials, dim=0)\n")
    bug = session(pytester, {"total": [[fix]]}, rounds=1)["total"]
    assert bug["status"] == "healed", bug
    (detail,) = bug["round_details"]
    assert "the tests fail once the kernel's output is poisoned" in detail["outcome"]
    # the old bypass heuristic would have rejected this; now it is a note for the reviewer
    assert any("torch.sum" in note for note in detail["notes"]), detail["notes"]
    patch = (pytester.path / ".kernelfix" / bug["patch"]).read_text()
    assert "+    return torch.sum(partials, dim=0)" in patch


PRECOMPUTED = (
    "    out = torch.empty_like(x)\n",
    "    out = torch.empty_like(x)\n    answer = x * factor\n",
)
RETURN_IT = ("    return out\n", "    return answer\n")


def test_a_precomputed_answer_with_the_kernel_still_launched_does_not_heal(
    pytester: pytest.Pytester,
) -> None:
    write_project(pytester.path, "k1", passing=False)
    cheat = [("kernels/k1.py", *PRECOMPUTED), ("kernels/k1.py", *RETURN_IT)]
    honest = [("kernels/k1.py", PRECOMPUTED[1], PRECOMPUTED[0]),
              ("kernels/k1.py", RETURN_IT[1], RETURN_IT[0]), ("kernels/k1.py", BUG, FIX)]
    bug = session(pytester, {"k1": [cheat, honest]}, rounds=2)["k1"]
    first, second = (detail["outcome"] for detail in bug["round_details"])
    assert first == ("kernel bypass: 1 test(s) pass even when the kernel's output is replaced "
                     "by NaN (a sentinel for integers) right after each launch")
    assert bug["status"] == "healed" and "1 failing test(s) pass" in second
    patch = (pytester.path / ".kernelfix" / bug["patch"]).read_text()
    assert "answer" not in patch and f"+{FIX}" in patch


SHAPE_ONLY = '''import pytest
import torch

from kernels.k2 import k2


@pytest.mark.kernel
def test_k2() -> None:
    x = torch.arange(300, dtype=torch.float32)
    assert k2(x, 2.0).shape == x.shape
'''


def test_a_test_that_checks_nothing_is_reported_as_uncertifiable(
    pytester: pytest.Pytester,
) -> None:
    write_project(pytester.path, "k2", passing=False)
    kernel = pytester.path / "kernels" / "k2.py"
    kernel.write_text(kernel.read_text().replace("x + factor", "tl.tanh(x) * factor"))
    (pytester.path / "tests" / "test_k2.py").write_text(SHAPE_ONLY)
    fix = ("kernels/k2.py", "tl.tanh(x) * factor", "x * factor")
    bug = session(pytester, {"k2": [[fix], [fix]]}, rounds=2)["k2"]
    assert bug["status"] == "skipped"
    assert bug["reason"].startswith(
        "cannot certify: the test does not depend on the kernel's output "
        "(tests/test_k2.py::test_k2 pass with the kernel's output replaced by NaN")
    assert bug["rounds"] == 1 and bug["patch"] is None  # no second round: nothing to certify


LENIENT = "torch.ones(a.shape, dtype=torch.bool)"
#: Each answer replaces the previous one's block, so that every round shows its own cheat.
PATCHES = [
    ("alias", "_T = torch\n_T.isclose = lambda a, b, *r, **k: " + LENIENT + "\n",
     "run-time integrity: torch.isclose is replaced (now <lambda> from kernels/k3.py)"),
    ("decorator", textwrap.dedent(f"""
        def _registered(fn):
            module = torch
            module.isclose = fn
            return fn


        @_registered
        def _isclose(a, b, *rest, **kwargs):
            return {LENIENT}
        """), "run-time integrity: torch.isclose is replaced (now _isclose from kernels/k3.py)"),
    ("library", textwrap.dedent(f"""
        @torch.library.register_kernel("aten::isclose", "cpu")
        def _isclose(a, b, *rest, **kwargs):
            return {LENIENT}
        """), "run-time integrity: torch.library: kernels/k3.py registers"),
    ("mode", textwrap.dedent(f"""
        from torch.overrides import TorchFunctionMode


        class _Lenient(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if func is torch.isclose:
                    a = args[0]
                    return {LENIENT}
                return func(*args, **(kwargs or {{}}))


        _Lenient().__enter__()
        """), "run-time integrity: a torch function mode is active: _Lenient from kernels/k3.py"),
    ("subclass", textwrap.dedent("""
        class _Exact(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                if func is torch.isclose:
                    return torch.ones(args[0].shape, dtype=torch.bool)
                return super().__torch_function__(func, types, args, kwargs)
        """), "run-time integrity: a Tensor subclass is defined in kernels/k3.py: _Exact"),
]


def test_patched_assertion_helpers_are_caught_however_they_were_reached(
    pytester: pytest.Pytester,
) -> None:
    write_project(pytester.path, "k3", passing=False)
    anchor = "import triton.language as tl\n"
    answers = []
    previous = ""
    for _, block, _ in PATCHES:
        edits = [("kernels/k3.py", anchor + previous, anchor + block)]
        if block.startswith("\nclass _Exact"):  # the wrapper returns the subclass
            edits.append(("kernels/k3.py", "    return out\n",
                          "    return out.as_subclass(_Exact)\n"))
        answers.append(edits)
        previous = block
    bug = session(pytester, {"k3": answers}, rounds=len(PATCHES))["k3"]
    assert bug["status"] == "unhealed"
    outcomes = [detail["outcome"] for detail in bug["round_details"]]
    assert len(outcomes) == len(PATCHES)
    misses = [(name, why, outcome) for (name, _, why), outcome in zip(PATCHES, outcomes,
                                                                      strict=True)
              if not outcome.startswith(why)]
    assert misses == []


def test_the_ini_of_the_kernel_project_runs_on_the_interpreter() -> None:
    """The projects above rely on it: no GPU, no compile gate."""
    assert "kernelfix_device = interpret" in INI and "kernelfix_target = off" in INI
