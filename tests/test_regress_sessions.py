"""Whole sessions of regression-aware healing: a change since a base, the lines whose
revert alone makes the failing test pass found by experiment, shown to the fixer and
named in the report, the terminal summary and the GitHub annotation.

The projects: a long kernel module (shown focused) whose change touches several
definitions, a helper module and a second kernel; the bug is one hunk of the change. A
conftest fixer answers with the fix only when the faulty line is in its prompt.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import pytest
from kernel_project import report_of

FILLER = "".join(
    f"\n\n@triton.jit\ndef unrelated_{i}(x):\n    y = x * {i}\n    return y + {i}\n"
    for i in range(30)
)

OPS = '''\
import torch
import triton
import triton.language as tl

from kernels.util import block_for
''' + FILLER + '''

@triton.jit
def scale_kernel(x_ptr, y_ptr, n, factor, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = x * factor
    tl.store(y_ptr + offsets, y, mask=mask)


def scale(x, factor):
    y = torch.empty_like(x)
    n = x.numel()
    BLOCK = block_for(n)
    scale_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, factor, BLOCK=BLOCK)
    return y
'''

UTIL = '''\
def block_for(n):
    return 64


def spare(n):
    return n + 1
'''

SHIFT = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def shift_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, x + 2.0, mask=mask)


def shift(x):
    y = torch.empty_like(x)
    shift_kernel[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
    return y
'''

TEST_OPS = '''\
import pytest
import torch

from kernels.ops import scale


@pytest.mark.kernel
@pytest.mark.parametrize("n", [100, 256])
def test_scale(n):
    x = torch.arange(n, dtype=torch.float32)
    torch.testing.assert_close(scale(x, 2.0), x * 2.0)
'''

TEST_SHIFT = '''\
import pytest
import torch

from kernels.shift import shift


@pytest.mark.kernel
def test_shift():
    x = torch.arange(100, dtype=torch.float32)
    torch.testing.assert_close(shift(x), x + 1.0)
'''

#: A model that can fix only what it is shown: the faulty line of each bug.
CONFTEST = '''\
import json

from pytest_kernelfix.fixers.answer import read_answer
from pytest_kernelfix.fixers.base import Usage
from pytest_kernelfix.fixers.prompting import render_messages

FIXES = {FIXES}


def pytest_kernelfix_propose(request, config):
    messages = render_messages(request)
    shown = "\\n".join(message["content"] for message in messages)
    edits = [{{"file": path, "old_string": bad, "new_string": good}}
             for path, bad, good in FIXES if bad.strip() in shown]
    seen = config.rootpath / "seen"
    seen.mkdir(exist_ok=True)
    (seen / f"{{request.context.group_id}}-{{request.round}}.txt").write_text(shown)
    answer = json.dumps({{"analysis": "fix what is shown", "modifications": edits[:1]}})
    sent = sum(len(message["content"]) for message in messages)
    return read_answer(answer, usage=Usage(calls=1, prompt_chars=sent), source="model")
'''

INI = "[pytest]\npythonpath = .\nmarkers =\n    kernel: launches a Triton kernel\n"

GOOD = "    y = x * factor\n"
BAD = "    y = x * factor + 0.5\n"


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t",
                           *args], cwd=root, check=True, capture_output=True,
                          text=True).stdout


def commit(root: Path, message: str) -> None:
    git(root, "add", "-A")
    git(root, "commit", "-qm", message)


def fixer(*fixes: tuple[str, str, str]) -> str:
    return CONFTEST.replace("{FIXES}", json.dumps([list(fix) for fix in fixes])).replace(
        "{{", "{").replace("}}", "}")


def changed_ops(bug: bool = True) -> str:
    """The change: a comment in an unrelated kernel, the bug, a line in the wrapper."""
    text = OPS.replace("    y = x * 3\n", "    y = x * 3  # three\n")
    text = text.replace("    BLOCK = block_for(n)\n", "    BLOCK = block_for(n)  # rows\n")
    return text.replace(GOOD, BAD) if bug else text


def prompt(root: Path, bug: dict) -> str:
    """The first prompt the fixer rendered for ``bug``."""
    return (root / "seen" / f"{bug['id']}-1.txt").read_text()


def bound(hunks: int) -> int:
    return 2 * math.ceil(math.log2(hunks)) + 2


def test_a_committed_change_is_bisected_to_the_culprit_hunk(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--kernelfix-base HEAD~1``: five hunks in three files, one of them the bug; the
    other kernel's bug was there before the change. In GitHub Actions."""
    root = pytester.path
    write(root, {"kernels/__init__.py": "", "kernels/ops.py": OPS, "kernels/util.py": UTIL,
                 "kernels/shift.py": SHIFT, "tests/test_ops.py": TEST_OPS,
                 "tests/test_shift.py": TEST_SHIFT, "pytest.ini": INI,
                 "conftest.py": fixer(("kernels/ops.py", BAD, GOOD),
                                      ("kernels/shift.py", "x + 2.0", "x + 1.0"))})
    git(root, "init", "-q")
    commit(root, "base")
    write(root, {"kernels/ops.py": changed_ops(),
                 "kernels/util.py": UTIL.replace("    return n + 1\n", "    return n + 2\n"),
                 "kernels/shift.py": SHIFT.replace("    mask = offsets < n\n",
                                                   "    mask = offsets < n  # tail\n")})
    commit(root, "change")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.delenv("GITHUB_BASE_REF", raising=False)
    result = pytester.runpytest_subprocess("--kernelfix", "--kernelfix-base", "HEAD~1",
                                           "--kernelfix-rounds=1")
    result.assert_outcomes(failed=3)
    report = report_of(root)
    scale, shift = sorted(report["bugs"], key=lambda bug: bug["kernel"])
    regression = scale["regression"]
    assert regression["verdict"] == "regression", regression
    assert regression["base"].startswith("HEAD~1 (")
    assert regression["hunks"] == 5
    assert regression["reruns"] <= bound(5), regression["trials"]
    (culprit,) = regression["culprits"]
    line = OPS.splitlines().index(GOOD.rstrip()) + 1
    assert (culprit["path"], culprit["start"], culprit["end"]) == ("kernels/ops.py", line, line)
    assert culprit["current"] == [BAD.rstrip()] and culprit["base"] == [GOOD.rstrip()]
    assert regression["trials"][0]["passed"] and len(regression["trials"][0]["reverted"]) == 5
    assert f"line {line} of kernels/ops.py introduced it" in regression["summary"]
    # shown pinned: the culprit's definition in full in the focused view, beside the base
    assert "kernels/ops.py:scale_kernel" in scale["shown"]
    text = prompt(root, scale)
    assert "## What changed since HEAD~1" in text
    culprit = text.split("### Reverting these lines alone makes the test pass")[1]
    culprit, rest = culprit.split("### The rest of the change")
    assert BAD.strip() in culprit and GOOD.strip() in culprit and "# rows" not in culprit
    # every other hunk's current lines are shown too, the culprit's own file first
    assert rest.index("# rows") < rest.index("# three") < rest.index("kernels/shift.py")
    assert "return n + 2" in rest
    assert "kernels/util.py" in scale["files"]  # what the change touched is editable
    assert scale["status"] == "healed" and scale["revert"] is True
    # the other bug was there before the change: said, and healed as without a base
    assert shift["regression"]["verdict"] == "not_regression"
    assert shift["status"] == "healed" and shift["revert"] is False
    assert "not a regression of the change since HEAD~1" in prompt(root, shift)
    out = result.stdout.str()
    assert re.search(rf"regression since HEAD~1 \([0-9a-f]+\): line {line} of kernels/ops.py "
                     "introduced it", out)
    assert "(a revert of the change)" in out
    # healing while the tests run gave way to the experiment, which needs the change
    assert "healing begins after the tests: the change since HEAD~1 (" in out
    notice = next(row for row in out.splitlines() if row.startswith("::notice")
                  and "scale_kernel" in row)
    assert f"file=kernels/ops.py,line={line}," in notice
    markdown = (root / ".kernelfix" / "report.md").read_text()
    assert "**Revert**" in markdown and f"-{GOOD.rstrip()}" in markdown


def test_uncommitted_edits_are_the_change_and_a_changed_test_is_declined(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``auto`` outside CI: the working tree against HEAD. The kernel's edit is a
    regression; the other test's own edit is what makes it fail."""
    root = pytester.path
    write(root, {"kernels/__init__.py": "", "kernels/ops.py": OPS, "kernels/util.py": UTIL,
                 "kernels/shift.py": SHIFT.replace("x + 2.0", "x + 1.0"),
                 "tests/test_ops.py": TEST_OPS, "tests/test_shift.py": TEST_SHIFT,
                 "pytest.ini": INI, "conftest.py": fixer(("kernels/ops.py", BAD, GOOD))})
    git(root, "init", "-q")
    commit(root, "base")
    write(root, {"kernels/ops.py": changed_ops(),
                 "tests/test_shift.py": TEST_SHIFT.replace("x + 1.0", "x + 3.0")})
    for name in ("GITHUB_BASE_REF", "CI_MERGE_REQUEST_DIFF_BASE_SHA", "KERNELFIX_BASE"):
        monkeypatch.delenv(name, raising=False)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kernelfix",
                                           "--kernelfix-rounds=1")
    result.assert_outcomes(failed=3)
    scale, shift = sorted(report_of(root)["bugs"], key=lambda bug: bug["kernel"])
    regression = scale["regression"]
    assert regression["base"] == "HEAD (uncommitted changes)"
    assert regression["verdict"] == "regression" and regression["hunks"] == 3
    assert [c["current"] for c in regression["culprits"]] == [[BAD.rstrip()]]
    assert regression["reruns"] <= bound(3)
    assert scale["status"] == "healed"
    assert shift["status"] == "declined" and shift["rounds"] == 0
    assert shift["regression"]["verdict"] == "test_changed"
    assert "the test changed since HEAD" in shift["reason"]
    assert shift["regression"]["culprits"][0]["path"] == "tests/test_shift.py"


def test_without_git_one_line_then_the_last_green_run_is_the_base(
    pytester: pytest.Pytester
) -> None:
    """No git: the first failure heals as without a base, with one line saying why; a
    green session records the files; the next failure is compared with that state. Then
    in git, a base the clone lacks: one line, and healing as without a base."""
    root = pytester.path
    write(root, {"kernels/__init__.py": "", "kernels/ops.py": OPS.replace(GOOD, BAD),
                 "kernels/util.py": UTIL, "tests/test_ops.py": TEST_OPS, "pytest.ini": INI,
                 "conftest.py": fixer(("kernels/ops.py", BAD, GOOD))})
    assert subprocess.run(["git", "rev-parse"], cwd=root, capture_output=True).returncode
    first = pytester.runpytest_subprocess("--kernelfix-apply", "--kernelfix-rounds=1")
    first.assert_outcomes(failed=2)
    (bug,) = report_of(root)["bugs"]
    assert bug["status"] == "healed" and bug["regression"] is None
    lines = [row for row in first.stdout.lines if "no base to compare" in row]
    assert len(lines) == 1 and "not in a git repository" in lines[0]
    green = pytester.runpytest_subprocess("--kernelfix")
    green.assert_outcomes(passed=2)
    store = root / ".pytest_cache" / "d" / "kernelfix-green"
    index = json.loads((store / "index.json").read_text())
    assert set(index["tests"]) == {"tests/test_ops.py::test_scale[100]",
                                   "tests/test_ops.py::test_scale[256]"}
    write(root, {"kernels/ops.py": changed_ops(),
                 "kernels/util.py": UTIL.replace("    return n + 1\n", "    return n + 2\n")})
    third = pytester.runpytest_subprocess("--kernelfix", "--kernelfix-rounds=1")
    third.assert_outcomes(failed=2)
    (bug,) = report_of(root)["bugs"]
    regression = bug["regression"]
    assert regression["base"].startswith("the last green run of tests/test_ops.py::test_scale")
    assert regression["verdict"] == "regression" and regression["hunks"] == 4
    assert [c["current"] for c in regression["culprits"]] == [[BAD.rstrip()]]
    assert bug["status"] == "healed"
    assert "no base to compare" not in third.stdout.str()
    # now in git, with a base the clone does not have: one line, healed as without one
    git(root, "init", "-q")
    commit(root, "a clone without the target branch")
    fourth = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kernelfix",
                                           "--kernelfix-base", "origin/main",
                                           "--kernelfix-rounds=1")
    fourth.assert_outcomes(failed=2)
    (bug,) = report_of(root)["bugs"]
    assert bug["status"] == "healed" and bug["regression"] is None
    lines = [row for row in fourth.stdout.lines if "origin/main" in row]
    assert len(lines) == 1 and "is not in this clone" in lines[0], lines
    assert "healing goes on without a base" in lines[0]
