"""One root cause is one bug, through a whole session.

Twenty kernels, each in its own module, call one broken ``@triton.jit`` helper: one bug,
one model call, one patch. One kernel reached through two wrappers in two modules: one
bug, one call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_llm import FakeLLM, Reply
from hostile.project import INI
from rerun_helpers import write_files

KERNELS = [f"k{index:02d}" for index in range(20)]

HELPER = '''import triton
import triton.language as tl


@triton.jit
def scaled(x, factor):
    return tl.scale(x, factor)
'''
HELPER_BUG = "    return tl.scale(x, factor)"
HELPER_FIX = "    return x * factor"

KERNEL = '''import torch
import triton
import triton.language as tl

from kernels.common import scaled


@triton.jit
def {name}_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, scaled(x, factor) + {offset}, mask=mask)


def {name}(x: torch.Tensor, factor: float) -> torch.Tensor:
    out = torch.empty_like(x)
    {name}_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), factor, BLOCK=64)
    return out
'''

KERNEL_TESTS = f'''import importlib

import pytest
import torch


@pytest.mark.kernel
@pytest.mark.parametrize("name", {KERNELS!r})
def test_kernel(name: str) -> None:
    run = getattr(importlib.import_module(f"kernels.{{name}}"), name)
    x = torch.arange(100, dtype=torch.float32)
    torch.testing.assert_close(run(x, 2.0), x * 2.0 + int(name[1:]))
'''

SHARED = '''import triton
import triton.language as tl


@triton.jit
def shared_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + factor, mask=mask)
'''
SHARED_BUG = "    tl.store(out_ptr + offsets, x + factor, mask=mask)"
SHARED_FIX = "    tl.store(out_ptr + offsets, x * factor, mask=mask)"

WRAPPER = '''import torch
import triton

from kernels.shared import shared_kernel


def {name}(x: torch.Tensor, factor: float) -> torch.Tensor:
    out = torch.empty_like(x)
    shared_kernel[(triton.cdiv(x.numel(), {block}),)](x, out, x.numel(), factor,
                                                       BLOCK={block})
    return out
'''

WRAPPER_TESTS = '''import pytest
import torch

from ops.via_a import via_a
from ops.via_b import via_b


@pytest.mark.kernel
@pytest.mark.parametrize("wrapper", [via_a, via_b])
def test_wrapper(wrapper) -> None:
    x = torch.arange(100, dtype=torch.float32)
    torch.testing.assert_close(wrapper(x, 2.0), x * 2.0)
'''


def answer(file: str, old: str, new: str) -> str:
    return json.dumps({"analysis": "fix", "modifications": [
        {"file": file, "old_string": old, "new_string": new, "reason": "fix"}],
        "summary": "fix"})


def write(root: Path) -> None:
    files = {"pytest.ini": INI, "kernels/__init__.py": "", "kernels/common.py": HELPER,
             "kernels/shared.py": SHARED, "ops/__init__.py": "",
             "ops/via_a.py": WRAPPER.format(name="via_a", block=64),
             "ops/via_b.py": WRAPPER.format(name="via_b", block=128),
             "tests/test_kernels.py": KERNEL_TESTS, "tests/test_wrappers.py": WRAPPER_TESTS,
             "tests/test_plain.py": "def test_plain() -> None:\n    pass\n"}
    files.update({f"kernels/{name}.py": KERNEL.format(name=name, offset=int(name[1:]))
                  for name in KERNELS})
    write_files(root, files)


def test_twenty_kernels_sharing_a_broken_helper_are_one_bug_one_call_one_patch(
    pytester: pytest.Pytester, fake_llm: FakeLLM
) -> None:
    write(pytester.path)
    fake_llm.script(Reply(answer("kernels/common.py", HELPER_BUG, HELPER_FIX)),
                    Reply(answer("kernels/shared.py", SHARED_BUG, SHARED_FIX)))
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--kernelfix",
        "--kernelfix-model=openai/fake-model", f"--kernelfix-api-base={fake_llm.url}",
        "--kernelfix-llm-retries=0", "--kernelfix-rounds=1", "--kernelfix-workers=1",
        "--kernelfix-max-groups=2", timeout=300)
    result.assert_outcomes(failed=22, passed=1)
    data = json.loads((pytester.path / ".kernelfix" / "report.json").read_text())
    helper, wrappers = data["bugs"]
    assert data["totals"]["bugs"] == 2 and data["totals"]["calls"] == len(fake_llm.requests)
    assert len(helper["nodeids"]) == 20 and helper["files"][0] == "kernels/common.py"
    assert helper["status"] == "healed" and helper["calls"] == 1
    assert helper["changed_files"] == ["kernels/common.py"]
    assert sorted(wrappers["nodeids"]) == ["tests/test_wrappers.py::test_wrapper[via_a]",
                                           "tests/test_wrappers.py::test_wrapper[via_b]"]
    assert wrappers["status"] == "healed" and wrappers["calls"] == 1
    assert wrappers["changed_files"] == ["kernels/shared.py"]
    assert {"ops/via_a.py", "ops/via_b.py"} <= set(wrappers["files"])
    assert len(fake_llm.requests) == 2  # one question per root cause
    assert sorted(p.name for p in (pytester.path / ".kernelfix").glob("*.patch")) == sorted(
        [helper["patch"], wrappers["patch"]])
