"""A small Triton project for whole-session tests: one broken scale kernel per name.

Each ``kernels/<name>.py`` computes ``x + factor`` where its test expects
``x * factor``; :data:`FIX` is the one-line heal. Kernels are tiny (300 elements, two
programs), so a session and its reruns stay fast on the Triton interpreter.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

KERNEL = '''"""Scale a vector: out = x * factor."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def {name}_kernel(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + factor, mask=mask)


def {name}(x: torch.Tensor, factor: float) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    {name}_kernel[(triton.cdiv(n, 256),)](x, out, n, factor, BLOCK=256)
    return out
'''

TEST = '''import pytest
import torch

from kernels.{name} import {name}


@pytest.mark.kernel
def test_{name}() -> None:
    x = torch.arange(300, dtype=torch.float32)
    torch.testing.assert_close({name}(x, 2.0), x * 2.0)
'''

INI = """[pytest]
pythonpath = .
markers =
    kernel: the test launches a Triton kernel
kernelfix_device = interpret
kernelfix_target = off
"""

BUG = "    tl.store(out_ptr + offsets, x + factor, mask=mask)"
FIX = "    tl.store(out_ptr + offsets, x * factor, mask=mask)"


def write_project(root: Path, *names: str, passing: bool = True) -> Path:
    """Write the project into ``root``: a broken kernel and its test per name."""
    (root / "kernels").mkdir(parents=True, exist_ok=True)
    (root / "tests").mkdir(exist_ok=True)
    (root / "kernels" / "__init__.py").write_text("")
    (root / "pytest.ini").write_text(INI)
    for name in names:
        (root / "kernels" / f"{name}.py").write_text(KERNEL.format(name=name))
        (root / "tests" / f"test_{name}.py").write_text(TEST.format(name=name))
    if passing:
        (root / "tests" / "test_plain.py").write_text("def test_plain() -> None:\n    pass\n")
    return root


def fix_answer(name: str, analysis: str = "The kernel adds the factor; it must multiply.") -> str:
    """The model answer that heals ``kernels/<name>.py``."""
    return json.dumps({
        "analysis": analysis,
        "modifications": [{"file": f"kernels/{name}.py", "old_string": BUG,
                           "new_string": FIX, "reason": "scale, not shift"}],
        "summary": "Multiply by the factor.",
    })


def report(root: Path, report_dir: str = ".kernelfix") -> dict[str, dict]:  # type: ignore[type-arg]
    """report.json's bugs by kernel name (``k1`` for ``k1_kernel``)."""
    data = json.loads((root / report_dir / "report.json").read_text())
    return {bug["kernel"].removesuffix("_kernel"): bug for bug in data["bugs"]}


def expected_rerun_mode() -> str:
    """How this test run's sessions rerun: ``KERNELFIX_RERUN=subprocess`` (or fork where it
    is not the default) runs the hostile and fault suites the other way."""
    chosen = os.environ.get("KERNELFIX_RERUN", "auto")
    if chosen == "subprocess" or (chosen == "auto" and not sys.platform.startswith("linux")):
        return "subprocess"
    return "fork"


def rerun_mode(root: Path, report_dir: str = ".kernelfix") -> str:
    """How the session's reruns started, from report.json (fallbacks spelt out)."""
    reruns = json.loads((root / report_dir / "report.json").read_text())["reruns"]
    return f"{reruns['mode']}{' ' + str(reruns['fallbacks']) if reruns['fallbacks'] else ''}"
