"""The session's runner: one rerun, split across children where that pays, and the one
owner of the warm servers.

:func:`run_tests` runs one rerun: its tests split across up to ``RerunSetup.jobs``
children at the same time where they are enough to pay for each child's start
(:mod:`pytest_kernelfix.rerun.split`), each a child with one phase, its last
(:meth:`~pytest_kernelfix.rerun.phased.PhasedChild.finish`), their results given back as
one, in test order. :class:`Reruns` is what a session calls it through: it owns the warm
servers (:mod:`pytest_kernelfix.rerun.server`) children fork from, and opens the children
a candidate's phases run in (:meth:`Reruns.open`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pytest_kernelfix.fanout import fan_out
from pytest_kernelfix.rerun.launcher import (
    OUTPUT_TAIL,
    PROGRESS_EVERY,
    RerunSetup,
    RerunSpec,
    child_env,
    server_for,
)
from pytest_kernelfix.rerun.phased import PhasedChild
from pytest_kernelfix.rerun.report import RerunResult
from pytest_kernelfix.rerun.server import ServerPool, unavailable_reason
from pytest_kernelfix.rerun.split import (
    Part,
    merge_parts,
    min_tests_per_child,
    split_nodeids,
    stops_early,
)


def run_tests(spec: RerunSpec, *, python: str = sys.executable,
              pool: ServerPool | None = None) -> RerunResult:
    """Run ``spec.nodeids`` in the sandbox; never raises for what happens in a child.

    The tests are split across up to ``spec.setup.jobs`` children that run at the same
    time where they are enough to pay for each child's start
    (:func:`~pytest_kernelfix.rerun.split.split_nodeids`), each forked from
    ``pool``'s warm server where the setup allows it (without a pool, or where forking
    is refused, a fresh subprocess), each under its own timeout; their results come back
    as one, in test order (:func:`~pytest_kernelfix.rerun.split.merge_parts`). With
    ``stop_early`` the first child whose test fails stops the others; a set
    ``spec.cancel`` stops them all.
    """
    fresh = pool is None or bool(unavailable_reason(spec.setup.mode))
    stop = threading.Event()  # set: every child still running is stopped
    started = time.monotonic()
    children: list[PhasedChild] = []  # started so far, for the progress line

    def run_child(nodeids: tuple[str, ...]) -> Part:
        child = PhasedChild(spec.setup, spec.sandbox_root, nodeids, python=python, pool=pool,
                            probe=spec.probe, lifetime=spec.setup.timeout)
        children.append(child)
        try:
            result = child.finish(replace(spec, nodeids=nodeids, progress=None, cancel=stop))
            return Part(nodeids, result, child.stopped)
        finally:
            child.close()

    def tell() -> None:
        assert spec.progress is not None
        total = len(set(spec.nodeids))
        finished = sum(child.finished_tests() for child in children)
        spec.progress(min(finished, total), total, time.monotonic() - started)

    parts = fan_out(
        run_child,
        split_nodeids(spec.nodeids, spec.setup.jobs, min_tests_per_child(fresh=fresh)),
        stop=stop, cancel=spec.cancel,
        stop_when=(lambda part: stops_early(part.result)) if spec.stop_early else None,
        every=PROGRESS_EVERY if spec.progress is not None else 0.0, tick=tell,
        name="kernelfix-rerun")
    return merge_parts([part for part in parts if part is not None],
                       seconds=time.monotonic() - started, output_budget=OUTPUT_TAIL)


class Reruns:
    """How a session reruns tests, and the one owner of its warm servers.

    Call it with a :class:`RerunSpec` (it is a runner); :meth:`open` opens a child for
    many phases; :meth:`prestart` starts the server early so its imports overlap other
    work; :meth:`close` ends every server it started (use it as a context manager).
    """

    def __init__(self, *, python: str = sys.executable) -> None:
        self.python = python
        self.pool = ServerPool()

    def __call__(self, spec: RerunSpec) -> RerunResult:
        return run_tests(spec, python=self.python, pool=self.pool)

    def open(self, setup: RerunSetup, sandbox_root: Path, nodeids: Sequence[str]
             ) -> PhasedChild | None:
        """A child that collects ``nodeids`` once and runs phases on request
        (:class:`~pytest_kernelfix.rerun.phased.PhasedChild`); None where reruns do not
        fork (its phases fork from it), so each phase is a rerun of its own."""
        if unavailable_reason(setup.mode):
            return None
        return PhasedChild(setup, sandbox_root, nodeids, python=self.python, pool=self.pool)

    def prestart(self, setup: RerunSetup) -> None:
        """Start the server for ``setup`` now (one that cannot start is found again, and
        reported, by the first rerun)."""
        server_for(setup, child_env(os.environ, setup, Path(os.devnull)), self.python,
                   self.pool)

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> Reruns:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
