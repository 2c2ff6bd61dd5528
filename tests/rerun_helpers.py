"""Helpers for tests that run real reruns: a project on disk, its sandbox, a spec.

With the ``sandboxed`` and ``reruns`` fixtures of ``tests/conftest.py``. The module holds
no assertions (PYTEST_DONT_REWRITE).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pytest_kernelfix.rerun.launcher import RerunSetup, RerunSpec
from pytest_kernelfix.rerun.plan import DevicePlan
from pytest_kernelfix.rerun.sandbox import Sandbox

INTERPRET = DevicePlan(interpret=True)
#: Both ways a rerun child starts; tests of the guarantees every rerun keeps run in both.
#: A fresh interpreter costs seconds of imports per child, so its runs are marked slow
#: (``make test-all`` runs them; ``make test`` the forked ones).
MODES = ("fork", pytest.param("subprocess", marks=pytest.mark.slow))


def write_files(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def spec_for(
    sandbox: Sandbox, *nodeids: str, timeout: float = 60.0, device: DevicePlan = INTERPRET,
    **setup: object,
) -> RerunSpec:
    return RerunSpec(RerunSetup(sandbox.source, timeout, device, **setup),  # type: ignore[arg-type]
                     sandbox.root, tuple(nodeids))


def make_sandbox(root: Path, sandboxes: list[Sandbox], files: dict[str, str]) -> Sandbox:
    write_files(root, files)
    sandbox = Sandbox.create(root)
    sandboxes.append(sandbox)
    return sandbox


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
