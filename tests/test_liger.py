"""Real liger-kernel ops run green on the CPU with the shim, and not without it.

liger's wrappers allocate on ``device="cuda"``, call ``libdevice.rsqrt`` / ``tanh``,
pass float ``eps`` arguments to ``.to(tl.float32)``, autotune DyT over several configs
and ask ``torch.cuda`` for SM counts: each op here needs one or more shim pieces. The
ops run in a child interpreter (``kernels_catalog/liger_ops.py``) so that the shim is
installed before liger's kernels are decorated; each is checked against torch, forward
and, where liger has one, backward.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kernels_catalog.liger_ops import OPS

pytest.importorskip("liger_kernel")

SCRIPT = Path(__file__).parent / "kernels_catalog" / "liger_ops.py"
FALSE_FAILURES = ("has no attribute 'to'", "0 active drivers", "NoneType")


def run_ops(*flags: str) -> dict[str, Any]:
    path = os.pathsep.join(filter(None, [str(SCRIPT.parent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}  # the caller's code, not an installed copy
    done = subprocess.run(
        [sys.executable, "-W", "ignore", str(SCRIPT), *flags],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def with_shim() -> dict[str, Any]:
    return run_ops()


@pytest.fixture(scope="module")
def without_shim() -> dict[str, Any]:
    return run_ops("--no-shim")


@pytest.mark.parametrize("op", sorted(OPS))
def test_liger_op_matches_torch_with_the_shim(with_shim: dict[str, Any], op: str) -> None:
    assert with_shim[op] == "ok"
    assert with_shim["_launches"][op], f"{op} launched no Triton kernel"


def test_every_liger_launch_compiles_for_an_h100(with_shim: dict[str, Any]) -> None:
    verdicts = with_shim["_gate"]
    rejected = [v for v in verdicts if not v["ok"]]
    compiled = [v for v in verdicts if not v["error"]]
    assert not rejected, rejected
    assert len(compiled) >= len(OPS)  # most launches are exact enough to compile


@pytest.mark.parametrize("op", ["rms_norm", "geglu", "dyt"])
def test_without_the_shim_the_interpreter_fails_falsely(
    without_shim: dict[str, Any], op: str
) -> None:
    assert any(reason in without_shim[op] for reason in FALSE_FAILURES), without_shim[op]
