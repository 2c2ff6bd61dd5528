"""What a rerun child runs first: map imports onto the sandbox, then start pytest.

:func:`main` is what ``python -c`` runs (see :data:`pytest_kernelfix.rerun.launcher.BOOTSTRAP`)
and what a child forked from the warm rerun server (:mod:`pytest_kernelfix.rerun.server`)
runs, with the same ``sys.argv``: whatever the agent
(:mod:`pytest_kernelfix.rerun.child.agent`) does in a rerun works the same in both.

PYTEST_DONT_REWRITE: imported before pytest starts.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time

import pytest

from pytest_kernelfix.rerun.child.imports import install_import_mapping
from pytest_kernelfix.rerun.plan import LAUNCHED_ENV, RerunPlan, load_plan

#: Seconds from the launch to each phase of this child (``ChildReport.phases``).
_phases: dict[str, float] = {}


def mark_phase(name: str) -> None:
    """Note when this child reached ``name``: where a rerun's time goes, for benchmarks."""
    with contextlib.suppress(KeyError, ValueError):
        _phases[name] = round(time.time() - float(os.environ[LAUNCHED_ENV]), 4)


def phases() -> dict[str, float]:
    return dict(_phases)


def main(*, forked: bool = False) -> None:
    """Entry point of the rerun child: ``python -c BOOTSTRAP pytest-args...``, or a child
    the rerun server forked (``forked``), with the same ``sys.argv``."""
    mark_phase("main")
    prepare_child(load_plan(), forked=forked)
    raise SystemExit(pytest.console_main())


def prepare_child(plan: RerunPlan | None, *, forked: bool = False) -> None:
    """The set-up before pytest starts, the same in a fresh and in a forked child.

    A fresh child drops the plugin's modules it imported: pytest marks its plugins'
    packages for assertion rewriting and would find them imported already. A forked
    child keeps what the server imported through the rewriter
    (:func:`pytest_kernelfix.rerun.server.warm_up`).
    """
    if plan is not None:
        install_import_mapping(plan.original_root, plan.sandbox_root, plan.alias_dir or None,
                               drop_loaded=not forked)
    if sys.path and sys.path[0] == "":
        sys.path[0] = os.getcwd()  # what ``python -m pytest`` puts there
    if forked:
        sys.path_importer_cache.clear()  # the server's finders saw its own directory
        return
    for name in [n for n in sys.modules if n == "pytest_kernelfix" or
                 n.startswith("pytest_kernelfix.")]:
        del sys.modules[name]
