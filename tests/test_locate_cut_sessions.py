"""A whole session on a launch wrapper too long for the prompt, raising an error about a
name long after its launch: the shape of an ``UnboundLocalError`` in a real library's
wrapper (a variable bound on one branch of an ``if``/``else`` in its middle).

The fixer can fix only what the first prompt shows it and answers with the true fix when
it does; the tests mark nothing ``kernel`` (``kernelfix_select = launched``).
"""

from __future__ import annotations

import json

import pytest
from kernel_project import ORACLE_CONFTEST, report_of

from pytest_kernelfix.locate.context import PROMPT_BUDGET

KERNEL = '''\
import triton
import triton.language as tl


@triton.jit
def rowsum_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):  # one block of columns after the other
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))
'''


def _steps(prefix: str, count: int) -> str:
    """Lines a real wrapper spends on checks, shapes and bookkeeping."""
    return "".join(f"    {prefix}_{i} = n_rows * {i} + n_cols  # {prefix} bookkeeping, step {i}\n"
                   for i in range(count))


#: The branch that binds ``scale`` (the fix), and the same without it (the fault).
GOOD = ("    if dtype is None:\n        scale = 1.0\n    else:\n"
        "        scale = float(torch.ones((), dtype=dtype).item())\n"
        "        out = out.to(dtype)\n")
BAD = "    if dtype is None:\n        scale = 1.0\n    else:\n        out = out.to(dtype)\n"

OPS = ('import torch\n\nfrom sumlib.kernels import rowsum_kernel\n\n\n'
       'def rowsum(x, dtype=None):\n    """Row sums of ``x`` by the kernel, cast to ``dtype``."""\n'
       '    n_rows, n_cols = x.shape\n' + _steps("check", 60)
       + '    out = torch.empty(n_rows, dtype=x.dtype)\n'
       '    rowsum_kernel[(n_rows,)](x, out, n_cols, BLOCK=16)\n'
       + _steps("shape", 100) + GOOD + _steps("stats", 120) + '    return out * scale\n')

TESTS = '''\
import torch

from sumlib.ops import rowsum


def test_rowsum():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    torch.testing.assert_close(rowsum(x), x.sum(dim=1))


def test_rowsum_cast():
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    torch.testing.assert_close(rowsum(x, torch.float32), x.sum(dim=1))
'''

INI = "[pytest]\npythonpath = .\nkernelfix_select = launched\n"


def test_an_error_about_a_name_deep_in_a_long_wrapper_is_shown_and_named_after_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The 290-line wrapper launches its kernel, then reads ``scale``, which its middle
    binds only when no dtype is given: the first prompt cuts the wrapper for length but
    keeps every line about ``scale`` and the branches around them, the bug is named after
    the wrapper (not the kernel it launched before), and the true fix heals it."""
    assert len(OPS.splitlines()) > 280 and len(OPS) > PROMPT_BUDGET // 2
    pytester.makepyfile(**{"sumlib/__init__": "", "sumlib/kernels": KERNEL,
                           "sumlib/ops": OPS.replace(GOOD, BAD), "tests/test_rowsum": TESTS})
    (pytester.path / "conftest.py").write_text(ORACLE_CONFTEST)
    (pytester.path / "pytest.ini").write_text(INI)
    monkeypatch.setenv("KERNELFIX_TEST_BUG", json.dumps(
        {"file": "sumlib/ops.py", "bad": BAD, "good": GOOD}))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kernelfix",
                                           "--kernelfix-rounds=1")
    result.assert_outcomes(failed=1, passed=1)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["kernel"] == "rowsum" and bug["id"].startswith("rowsum-unboundlocalerror-")
    assert bug["status"] == "healed", (bug["reason"], bug["round_details"])
    assert bug["rounds"] == 1 and bug["changed_files"] == ["sumlib/ops.py"]
    assert bug["first_prompt_chars"] <= PROMPT_BUDGET
    assert "sumlib/ops.py:rowsum" in bug["shown"]
