"""The verification rules through whole sessions (``pytest --kernelfix`` in a subprocess,
real Triton kernels on the interpreter), a scripted fixer answering round by round. One
session heals several bugs at once (one kernel module and test file each), so three
sessions cover:

- **per check**: a value computed with torch beside one the kernel still computes, in a
  test that checks both, is rejected whichever check comes first; the honest fix heals;
- **per kernel**: a gradient computed with torch from the statistics the forward kernel
  saved (the backward kernel launched and ignored) is rejected; the honest fix heals;
- **masks**: a clip after the launch of an unchanged kernel ends the bug as masked, with
  the patch kept for review, even when the fixer has no answer for the next round; after
  a mask the kernel fix heals; an honest post-launch divisor heals;
- **declines**: a test whose own expectation is wrong costs one call, ends declined, and
  its annotation points at the test's line;
- **one root cause, one patch**: a helper bug failing with two error types heals with one
  call and one patch.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hostile.project import INI

HOOK = '''
import json
from pathlib import Path

from pytest_kernelfix import Modification

HERE = Path(__file__).parent
ANSWERS = json.loads((HERE / "answers.json").read_text())


def pytest_kernelfix_propose(request, config):
    """Round N of the bug of test file T gets ANSWERS[T][N - 1]: edits, or a decline."""
    with open(HERE / "asked.jsonl", "a") as log:
        log.write(json.dumps({"bug": request.context.group_id, "round": request.round,
                              "notes": list(request.context.notes)}) + "\\n")
    test = Path(request.context.nodeids[0].split("::")[0]).stem
    rounds = ANSWERS.get(test, [])
    if request.round > len(rounds):
        return None
    answer = rounds[request.round - 1]
    if isinstance(answer, str):
        return json.dumps({"analysis": answer, "modifications": [], "not_a_kernel_bug": answer})
    return [Modification(old, new, file=path) for path, old, new in answer]
'''

Answers = dict[str, list[Any]]


def heal(pytester: pytest.Pytester, files: dict[str, str], answers: Answers, *,
         rounds: int = 1, args: tuple[str, ...] = ()) -> tuple[dict[str, Any], Path]:
    report, root, _ = heal_with_output(pytester, files, answers, rounds=rounds, args=args)
    return report, root


def heal_with_output(pytester: pytest.Pytester, files: dict[str, str], answers: Answers, *,
                     rounds: int = 1, args: tuple[str, ...] = ()
                     ) -> tuple[dict[str, Any], Path, str]:
    """Write the project, heal it in a subprocess: (report.json, root, terminal output)."""
    root = pytester.path
    (root / "kernels").mkdir()
    (root / "tests").mkdir()
    (root / "kernels" / "__init__.py").write_text("")
    (root / "pytest.ini").write_text(INI)
    for path, text in files.items():
        (root / path).write_text(textwrap.dedent(text))
    (root / "answers.json").write_text(json.dumps(answers))
    pytester.makeconftest(HOOK)
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--kernelfix",
        "--kernelfix-model=recipes", f"--kernelfix-rounds={rounds}",
        "--kernelfix-timeout=120", *args, timeout=900)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()[-3000:]
    report = json.loads((root / ".kernelfix" / "report.json").read_text())
    return report, root, result.stdout.str()


def by_test_file(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The session's bugs by the stem of their tests' file (one bug per file here)."""
    return {Path(bug["nodeids"][0].split("::")[0]).stem: bug for bug in report["bugs"]}


# -- per check ----------------------------------------------------------------------------

STATS = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def stats_kernel(x_ptr, sums_ptr, maxs_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + row * n + offs, mask=mask, other=0.0)
    tl.store(sums_ptr + row, tl.sum(x, axis=0) + 1.0)
    xm = tl.load(x_ptr + row * n + offs, mask=mask, other=-float("inf"))
    tl.store(maxs_ptr + row, tl.max(xm, axis=0))


def stats(x):
    rows, n = x.shape
    sums = torch.empty(rows)
    maxs = torch.empty(rows)
    stats_kernel[(rows,)](x, sums, maxs, n, BLOCK=triton.next_power_of_2(n))
    return sums, maxs
'''
STATS_TEST = '''\
import pytest
import torch

from kernels.stats import stats


@pytest.mark.kernel
@pytest.mark.parametrize("rows", [2, 4])
def test_stats(rows):
    torch.manual_seed(0)
    x = torch.randn(rows, 10)
    sums, maxs = stats(x)
    {first}
    {second}
'''
CHECK_SUMS = "torch.testing.assert_close(sums, x.sum(-1))"
CHECK_MAXS = "torch.testing.assert_close(maxs, x.max(-1).values)"
TORCH_SUMS = ("kernels/stats.py", "    return sums, maxs\n", "    return x.sum(-1), maxs\n")
HONEST_SUMS = ("kernels/stats.py", "tl.sum(x, axis=0) + 1.0", "tl.sum(x, axis=0)")


SUMS_AFTER = "stats_after"  # the same kernel in a second module, checked in the other order


def per_check_files() -> tuple[dict[str, str], Answers]:
    """Two bugs, one per order of the checks: the torch-computed sums first, or after the
    maxima the kernel still computes."""
    files: dict[str, str] = {}
    answers: Answers = {}
    for module, (first, second) in (("stats", (CHECK_SUMS, CHECK_MAXS)),
                                    (SUMS_AFTER, (CHECK_MAXS, CHECK_SUMS))):
        path = f"kernels/{module}.py"
        files[path] = STATS.replace("stats_kernel", f"{module}_kernel")
        files[f"tests/test_{module}.py"] = STATS_TEST.format(first=first, second=second).replace(
            "from kernels.stats import", f"from kernels.{module} import")
        cheat = (path, *TORCH_SUMS[1:])
        undo = (path, TORCH_SUMS[2], TORCH_SUMS[1])
        answers[f"test_{module}"] = [[cheat], [undo, (path, *HONEST_SUMS[1:])]]
    return files, answers


# -- per kernel -----------------------------------------------------------------------------

SCALE = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def forward_kernel(x_ptr, y_ptr, scale_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    s = 1.0 / (1.0 + x * x)
    tl.store(scale_ptr + offs, s, mask=mask)
    tl.store(y_ptr + offs, x * s, mask=mask)


@triton.jit
def backward_kernel(dy_ptr, x_ptr, scale_ptr, dx_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dy = tl.load(dy_ptr + offs, mask=mask)
    x = tl.load(x_ptr + offs, mask=mask)
    s = tl.load(scale_ptr + offs, mask=mask)
    tl.store(dx_ptr + offs, dy * (s - 2.0 * x * x * s * s) + 1.0, mask=mask)


class Squash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.empty_like(x)
        scale = torch.empty_like(x)
        n = x.numel()
        forward_kernel[(triton.cdiv(n, 128),)](x, y, scale, n, BLOCK=128)
        ctx.save_for_backward(x, scale)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, scale = ctx.saved_tensors
        dx = torch.empty_like(x)
        n = x.numel()
        backward_kernel[(triton.cdiv(n, 128),)](dy.contiguous(), x, scale, dx, n, BLOCK=128)
        return dx


def squash(x):
    return Squash.apply(x)
'''
SCALE_TEST = '''\
import pytest
import torch

from kernels.squash import squash


@pytest.mark.kernel
def test_squash():
    torch.manual_seed(0)
    x = torch.randn(200, requires_grad=True)
    ref_x = x.detach().clone().requires_grad_(True)
    y = squash(x)
    ref = ref_x / (1 + ref_x * ref_x)
    torch.testing.assert_close(y, ref)
    y.backward(torch.ones_like(y))
    ref.backward(torch.ones_like(ref))
    torch.testing.assert_close(x.grad, ref_x.grad)
'''
FROM_STATISTICS = ("kernels/squash.py", "        return dx\n",
                   "        return dy * (scale - 2.0 * x * x * scale * scale)\n")
HONEST_BACKWARD = ("kernels/squash.py", "* s * s) + 1.0, mask=mask)", "* s * s), mask=mask)")


def test_per_check_and_per_kernel_bypasses_are_rejected_and_the_kernel_fixes_heal(
    pytester: pytest.Pytester,
) -> None:
    files, answers = per_check_files()
    files.update({"kernels/squash.py": SCALE, "tests/test_squash.py": SCALE_TEST})
    undo = (FROM_STATISTICS[0], FROM_STATISTICS[2], FROM_STATISTICS[1])
    answers["test_squash"] = [[FROM_STATISTICS], [undo, HONEST_BACKWARD]]
    report, root = heal(pytester, files, answers, rounds=2)
    bugs = by_test_file(report)
    assert sorted(bugs) == ["test_squash", "test_stats", "test_stats_after"]

    for module in ("stats", SUMS_AFTER):  # per check, whichever check comes first
        bug = bugs[f"test_{module}"]
        cheat, honest = bug["round_details"]
        assert cheat["outcome"].startswith("kernel bypass: the check that failed "
                                           f"(tests/test_{module}.py:"), cheat["outcome"]
        assert "compares values the kernel no longer produces" in cheat["outcome"]
        assert bug["status"] == "healed", honest["outcome"]
        assert "+    return sums, maxs" not in (root / ".kernelfix" / bug["patch"]).read_text()

    bug = bugs["test_squash"]  # per kernel
    cheat, honest = bug["round_details"]
    assert "does not depend on backward_kernel" in cheat["outcome"], cheat["outcome"]
    (deciding,) = [phase["name"] for phase in cheat["phases"]
                   if phase["outcome"] == "insensitive"]
    assert deciding == "sensitivity (nan, only backward_kernel)"
    assert bug["status"] == "healed", honest["outcome"]


# -- masks ------------------------------------------------------------------------------------

RELU = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x, mask=mask)


def relu(x):
    out = torch.empty_like(x)
    n = x.numel()
    relu_kernel[(triton.cdiv(n, 128),)](x, out, n, BLOCK=128)
    return out
'''
RELU_TEST = '''\
import pytest
import torch

from kernels.relu import relu


@pytest.mark.kernel
def test_relu():
    x = torch.linspace(-3, 3, 300)
    torch.testing.assert_close(relu(x), torch.relu(x))
'''
CLIP = ("kernels/relu.py", "    return out\n", "    out = out.clip(min=0)\n    return out\n")
HONEST_RELU = ("kernels/relu.py", "tl.store(out_ptr + offs, x, mask=mask)",
               "tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)")


MEAN = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + row, tl.sum(x, axis=0))


def row_mean(x):
    rows, n = x.shape
    out = torch.empty(rows)
    row_sum_kernel[(rows,)](x, out, n, BLOCK=triton.next_power_of_2(n))
    return out
'''
MEAN_TEST = '''\
import pytest
import torch

from kernels.mean import row_mean


@pytest.mark.kernel
def test_row_mean():
    x = torch.arange(24, dtype=torch.float32).reshape(3, 8)
    torch.testing.assert_close(row_mean(x), x.mean(-1))
'''


# -- declines ---------------------------------------------------------------------------------

SHAPE_TEST = '''\
import pytest
import torch

from kernels.relu import relu


@pytest.mark.kernel
def test_relu_shape():
    x = torch.linspace(-3, 3, 300)
    out = relu(x)
    assert out.shape == (301,)
'''
FIXED_RELU = RELU.replace("tl.store(out_ptr + offs, x, mask=mask)",
                          "tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)")


def relu_module(name: str, text: str = RELU) -> tuple[str, str]:
    """``text`` as ``kernels/<name>.py`` with its kernel named ``<name>_kernel``: one bug
    per module."""
    return f"kernels/{name}.py", text.replace("relu_kernel", f"{name}_kernel")


def test_masks_end_masked_a_divisor_heals_and_a_test_bug_is_declined(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_WORKSPACE", str(pytester.path))
    clip = relu_module("relu")[0], *CLIP[1:]
    fix = relu_module("relu_fix")[0]
    files = dict([relu_module("relu"), relu_module("relu_fix"), relu_module("relu_ok", FIXED_RELU)])
    files.update({
        "tests/test_relu.py": RELU_TEST,
        "tests/test_relu_fix.py": RELU_TEST.replace("kernels.relu", "kernels.relu_fix"),
        "tests/test_relu_shape.py": SHAPE_TEST.replace("kernels.relu", "kernels.relu_ok"),
        "kernels/mean.py": MEAN, "tests/test_mean.py": MEAN_TEST,
    })
    answers: Answers = {
        "test_relu": [[clip]],  # then no answer: the mask is what the bug ends with
        "test_relu_fix": [[(fix, *CLIP[1:])], [(fix, CLIP[2], CLIP[1]), (fix, *HONEST_RELU[1:])]],
        "test_mean": [[("kernels/mean.py", "    return out\n", "    return out / n\n")]],
        "test_relu_shape": ["the test expects 301 elements for 300 inputs"],
    }
    report, root, output = heal_with_output(pytester, files, answers, rounds=3)
    bugs = by_test_file(report)
    assert sorted(bugs) == ["test_mean", "test_relu", "test_relu_fix", "test_relu_shape"]

    bug = bugs["test_relu"]  # a mask, then no answer
    assert bug["status"] == "masked", bug["reason"]
    masked, no_answer = bug["round_details"]
    assert masked["outcome"].startswith("masks the kernel's output (`out = out.clip(min=0)`)")
    assert any("masks the kernel's result after the launch" in n for n in masked["notes"])
    assert no_answer["outcome"].startswith("no answer")
    kept = (root / ".kernelfix" / bug["patch"]).read_text()
    assert bug["patch"].endswith(".masked.patch") and "+    out = out.clip(min=0)" in kept
    assert "Status: masked, kept for review" in kept
    assert "kept for review" in (root / ".kernelfix" / "report.md").read_text()

    bug = bugs["test_relu_fix"]  # a mask, then the kernel fix
    assert bug["status"] == "healed", bug["reason"]
    assert bug["round_details"][0]["outcome"].startswith("masks the kernel's output")

    assert bugs["test_mean"]["status"] == "healed", bugs["test_mean"]["reason"]

    bug = bugs["test_relu_shape"]  # the test's own bug
    assert bug["status"] == "declined"
    assert bug["reason"] == ("the model says this is not a kernel bug: the test expects 301 "
                             "elements for 300 inputs")
    asked = [json.loads(line) for line in (root / "asked.jsonl").read_text().splitlines()]
    declined = [entry for entry in asked if entry["bug"] == bug["id"]]
    assert [entry["round"] for entry in declined] == [1]  # one call, no identical second one
    assert any("compares no tensor values" in note for note in declined[0]["notes"])
    assert report["totals"]["declined"] == 1 and report["totals"]["masked"] == 1
    (warning,) = [line for line in output.splitlines()
                  if line.startswith("::warning") and "test_relu_shape.py" in line]
    assert "file=tests/test_relu_shape.py,line=11," in warning  # the test's line, not a def
    assert "not a kernel bug" in warning


# -- one root cause, one patch ------------------------------------------------------------------

HELPER = '''\
import triton
import triton.language as tl


@triton.jit
def cube(x):
    return x * x + x
'''
POWER = '''\
import torch
import triton
import triton.language as tl

from kernels.helpers import cube


@triton.jit
def cube_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, cube(tl.load(x_ptr + offs, mask=mask)), mask=mask)


def cubed(x):
    out = torch.empty_like(x)
    n = x.numel()
    cube_kernel[(triton.cdiv(n, 128),)](x, out, n, BLOCK=128)
    return out
'''
TWO_ERRORS_TEST = '''\
import pytest
import torch

from kernels.power import cubed


@pytest.mark.kernel
def test_close():
    x = torch.linspace(-2, 2, 200)
    torch.testing.assert_close(cubed(x), x * x * x)


@pytest.mark.kernel
def test_allclose():
    x = torch.linspace(-2, 2, 200)
    assert torch.allclose(cubed(x), x * x * x)
'''


def test_a_helper_bug_failing_with_two_error_types_heals_with_one_call_and_one_patch(
    pytester: pytest.Pytester,
) -> None:
    fix = ("kernels/helpers.py", "    return x * x + x\n", "    return x * x * x\n")
    report, root = heal(pytester, {"kernels/helpers.py": HELPER, "kernels/power.py": POWER,
                                   "tests/test_power.py": TWO_ERRORS_TEST},
                        {"test_power": [[fix]]})
    first, second = report["bugs"]
    assert first["status"] == second["status"] == "healed", (first["reason"], second["reason"])
    assert second["healed_by"] == first["id"] and second["patch"] is None
    asked = (root / "asked.jsonl").read_text().splitlines()
    assert len(asked) == 1  # one model call for one root cause
    assert sorted(p.name for p in (root / ".kernelfix").glob("*.patch")) == [first["patch"]]


# -- checks NaN cannot fail -------------------------------------------------------------------

SIZED = '''\
import torch
import triton
import triton.language as tl


def block_for(n):
    """The launch's block: one program per row, as liger's calculate_settings sizes it."""
    block = triton.next_power_of_2(n)
    if block > 64:
        raise RuntimeError(f"n = {n} exceeds the block size limit 64")
    return block


@triton.jit
def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


def double(x):
    out = torch.empty_like(x)
    n = x.numel()
    double_kernel[(1,)](x, out, n, BLOCK=block_for(n))
    return out
'''
SIZED_TEST = '''\
import pytest
import torch

from kernels.sized import double


@pytest.mark.kernel
def test_versus_torch():
    x = torch.linspace(-1, 1, 100)
    torch.testing.assert_close(double(x), x * 2)


@pytest.mark.kernel
def test_two_calls_agree():
    x = torch.linspace(-1, 1, 100)
    torch.testing.assert_close(double(x), double(x.clone()), equal_nan=True)
'''


def test_a_check_that_compares_two_kernel_outputs_with_equal_nan_is_no_bypass(
    pytester: pytest.Pytester,
) -> None:
    """liger's functional tests compare two entry points of one kernel, NaN equal to NaN:
    poisoned with NaN they pass, yet every value they read is the kernel's. The NaN run
    cannot tell; the scrambled run (two launches, two scrambles) fails them."""
    fix = ("kernels/sized.py", "    if block > 64:\n", "    if block > 65536:\n")
    report, _ = heal(pytester, {"kernels/sized.py": SIZED, "tests/test_sized.py": SIZED_TEST},
                     {"test_sized": [[fix]]})
    (bug,) = report["bugs"]
    assert len(bug["nodeids"]) == 2
    assert bug["status"] == "healed", bug["reason"]
