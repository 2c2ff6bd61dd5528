"""A small real Triton project for end-to-end sessions, written with pytester.

``kernels/ops.py`` holds a scale kernel whose bug is chosen per test; the tests are
marked ``kernel`` and parametrized, so one bug fails several of them. Sizes are small:
every launch is two program instances on the interpreter.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

GOOD_LINE = "    y = x * factor"
BUGS = {
    "offset": "    y = x + factor",  # a numerics bug: assert_close fails, no kernel frame
    "tanh": "    y = x * factor + tl.tanh(x) * 0",  # AttributeError inside the kernel
}

KERNEL = '''\
import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, factor, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
{line}
    tl.store(y_ptr + offsets, y, mask=mask)


def scale(x, factor):
    y = torch.empty_like(x)
    n = x.numel()
    scale_kernel[(triton.cdiv(n, 128),)](x, y, n, factor, BLOCK=128)
    return y
'''

TESTS = '''\
import pytest
import torch

from kernels.ops import scale


@pytest.mark.kernel
@pytest.mark.parametrize("n", [100, 256])
@pytest.mark.parametrize("factor", [2.0, 3.0])
def test_scale(n, factor):
    x = torch.arange(n, dtype=torch.float32)
    torch.testing.assert_close(scale(x, factor), x * factor)


@pytest.mark.kernel
def test_scale_zeros_by_zero():
    x = torch.zeros(64)
    torch.testing.assert_close(scale(x, 0.0), x)
'''

INI = """\
[pytest]
pythonpath = .
markers =
    kernel: launches a Triton kernel
"""


def make_project(pytester: pytest.Pytester, bug: str = "offset", *, extra: str = "") -> Path:
    """Write the project into ``pytester.path`` and return the kernel file."""
    root = pytester.path
    (root / "kernels").mkdir(exist_ok=True)
    (root / "kernels" / "__init__.py").write_text("")
    kernel = root / "kernels" / "ops.py"
    kernel.write_text(KERNEL.format(line=BUGS[bug]))
    (root / "tests").mkdir(exist_ok=True)
    (root / "tests" / "test_ops.py").write_text(TESTS + extra)
    (root / "pytest.ini").write_text(INI)
    return kernel


def answer(old: str, new: str, *, file: str = "kernels/ops.py", reason: str = "fix") -> str:
    """A model-style JSON answer with one edit."""
    return json.dumps(
        {
            "analysis": reason,
            "modifications": [
                {"file": file, "old_string": old, "new_string": new, "reason": reason}
            ],
            "summary": reason,
        }
    )


def write_cassette(path: Path, responses: Iterable[str], group: str = "*") -> Path:
    lines = [
        json.dumps({"group": group, "response": text, "model": "scripted",
                    "usage": {"prompt_tokens": 100, "completion_tokens": 20}, "cost": 0.0})
        for text in responses
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def report_of(root: Path) -> dict[str, Any]:
    return json.loads((root / ".kernelfix" / "report.json").read_text())  # type: ignore[no-any-return]


def git_init(root: Path) -> None:
    """Commit the project so patches can be checked with ``git apply``."""
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "start")


def git_status(root: Path) -> str:
    """``git status --porcelain``, untracked files listed one by one."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=root,
                          check=True, capture_output=True, text=True).stdout


def git_apply_check(root: Path, patch: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "apply", "--check", str(patch)], cwd=root,
                          capture_output=True, text=True)


#: The fixer answers only when the faulty line is in what it was shown.
ORACLE_CONFTEST = '''\
import json
import os

from pytest_kernelfix.fixers.answer import read_answer
from pytest_kernelfix.fixers.base import Usage
from pytest_kernelfix.fixers.prompting import render_messages

BUG = json.loads(os.environ["KERNELFIX_TEST_BUG"])


def pytest_kernelfix_propose(request, config):
    """A model that can fix only what it is shown; it says what it was sent."""
    messages = render_messages(request)
    shown = "\\n".join(message["content"] for message in messages)
    if BUG["bad"].strip() in shown:
        answer = json.dumps({"analysis": "found it", "modifications": [
            {"file": BUG["file"], "old_string": BUG["bad"], "new_string": BUG["good"]}]})
    else:
        answer = json.dumps({"analysis": "the faulty code is not shown", "modifications": []})
    sent = sum(len(message["content"]) for message in messages)
    return read_answer(answer, usage=Usage(calls=1, prompt_chars=sent), source="model")
'''
