"""One rerun child for many phases: collect once, then run each phase on request.

A candidate's verification is several reruns of the same code (the representative, the
other failing tests and the regression set, the poisoned runs), each only when the ones
before it passed. :class:`PhasedChild` starts one child for all of them, forked from the
warm server where the setup allows it: it collects every test the verification may run,
runs the suite's conftest files and imports the sandbox once, then runs each phase the
verifier asks for, in processes forked from its collected state
(:mod:`pytest_kernelfix.rerun.child.phases`), and reports after each (the same JSON-lines
events as a one-shot rerun, one results file per slice, then a ``phase_end`` line).
:meth:`PhasedChild.run` gives each phase back as the
:class:`~pytest_kernelfix.rerun.report.RerunResult` a one-shot child of its own would
have given, so the verifier judges it the same way, and stops at the first phase that
decides (it simply asks for no more).

A phase the child cannot run is answered ``None``, and the caller runs it as a one-shot
rerun (:func:`pytest_kernelfix.rerun.launcher.run_tests`): tests it did not collect, a
child whose collection reported errors or that ended early, a child that could not fork
its phases (after the one phase it ran itself). A child whose ``ready`` or ``phase_end``
event cannot be read (:class:`~pytest_kernelfix.rerun.plan.Ready`,
:class:`~pytest_kernelfix.rerun.plan.PhaseEnd`) is ended, and the phase's result says
why in its ``report_error``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pytest_kernelfix.fields import FieldError
from pytest_kernelfix.rerun.launcher import (
    OUTPUT_TAIL,
    PROGRESS_EVERY,
    RerunSetup,
    RerunSpec,
    _launch,
    _path_mapper,
    build_command,
    child_env,
    rerun_plan,
)
from pytest_kernelfix.rerun.plan import PhaseCommand, PhaseEnd, Ready, SliceEnd, phase_results
from pytest_kernelfix.rerun.report import (
    EventTail,
    FinishedTests,
    RerunResult,
    fold_events,
    read_events,
    signal_name,
)
from pytest_kernelfix.rerun.server import ForkResult, ServerPool
from pytest_kernelfix.rerun.split import Part, merge_parts, split_nodeids

#: The fewest tests worth a slice of their own in a split phase: a slice is a fork of
#: the collected child, not a child that starts pytest and imports the sandbox.
MIN_TESTS_PER_SLICE = 2
#: How long a phased child may live: the session closes it; this only bounds a leak.
LIFETIME = 24 * 3600.0
#: Seconds beyond a phase's timeout before the session stops waiting for the child.
GRACE = 15.0
#: Pause between two looks at the child's results file while a phase runs.
POLL = 0.005


class PhasedChild:
    """A rerun child that collects ``nodeids`` once and runs phases on request.

    Used by one thread at a time; :meth:`close` ends it (the server kills its process
    group) and removes its directory.
    """

    def __init__(self, setup: RerunSetup, sandbox_root: Path, nodeids: Sequence[str], *,
                 python: str, pool: ServerPool | None) -> None:
        self.setup = setup
        self.sandbox_root = Path(sandbox_root)
        self.nodeids = tuple(dict.fromkeys(nodeids))
        self.work = Path(tempfile.mkdtemp(prefix="kernelfix-rerun-"))
        self.control = self.work / "commands.jsonl"
        self.control.touch()
        self.log = self.work / "output.log"
        spec = RerunSpec(replace(setup, timeout=LIFETIME), self.sandbox_root, self.nodeids)
        plan = replace(rerun_plan(spec, self.work), control=str(self.control))
        plan_file = self.work / "plan.json"
        plan.write(plan_file)
        self.output = Path(plan.output)
        self.events = EventTail(self.output)
        self.stop = threading.Event()
        self.ended: ForkResult | None = None
        self.mode = "fork"
        self.fallback = ""
        self.ready: Ready | None = None
        self.unreadable = ""  # why an event of the child could not be read
        self.collection_errors: list[str] = []
        self.index = 0
        self.started = False  # a phase result has counted this child's start
        self.served = True  # whether the child still takes phases
        self.unsandbox = _path_mapper(self.sandbox_root, Path(setup.original_root))
        command = build_command(spec, python)
        env = child_env(os.environ, setup, plan_file)
        self.thread = threading.Thread(target=self._run, args=(spec, command, env, python, pool),
                                       name="kernelfix-phased-child", daemon=True)
        self.thread.start()

    def _run(self, spec: RerunSpec, command: list[str], env: dict[str, str], python: str,
             pool: ServerPool | None) -> None:
        try:
            self.mode, self.fallback, self.ended = _launch(
                spec, command, env, self.log, python, pool, self.stop)
        except BaseException:  # the child is gone either way; its phases fall back
            self.ended = ForkResult(-9, False, True)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    # -- phases ---------------------------------------------------------------------------

    def run(self, spec: RerunSpec, name: str = "") -> RerunResult | None:
        """Run ``spec``'s tests as one phase of this child: the result a one-shot rerun
        of ``spec`` would give, or None when this child cannot run it."""
        started = time.monotonic()
        if not self._wait_ready(started + self.setup.timeout) or self.unreadable:
            # collection hung (the phase timed out, as a one-shot rerun would), or the
            # child's ready event could not be read
            if self.alive or self.unreadable:
                self.close()
                return RerunResult((), -9, timed_out=not self.unreadable,
                                   output=self._tail(0), seconds=time.monotonic() - started,
                                   mode=self.mode, fallback=self.fallback,
                                   report_error=self.unreadable, started=self._count())
            return None
        collected = set(self.ready.nodeids) if self.ready else set()
        if not self.served or self.collection_errors or not set(spec.nodeids) <= collected:
            return None
        index = self.index
        self.index += 1
        slices = split_nodeids(spec.nodeids, spec.setup.jobs, MIN_TESTS_PER_SLICE)
        if self.ready and not self.ready.fork:
            slices = (spec.nodeids,)
            self.served = False  # it runs this one phase itself, then ends
        offset = _size(self.log)
        command = PhaseCommand(index, name, slices, spec.probe, spec.stop_early,
                               self.setup.timeout)
        with open(self.control, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(command.to_json()) + "\n")
        end, overran = self._wait_phase(index, spec, slices, started)
        if end is None:  # the child died, or overran the phase: it is stopped
            self.stop.set()
            self.thread.join()
            how = self.ended if self.ended is not None else ForkResult(-9, True)
            statuses = [SliceEnd(how.returncode, timed_out=overran)] * len(slices)
            self.served = False
        else:
            statuses = list(end.slices)
        statuses += [SliceEnd(-9)] * (len(slices) - len(statuses))
        parts = [Part(nodeids, self._slice(index, part, statuses[part]), statuses[part].stopped)
                 for part, nodeids in enumerate(slices)]
        merged = merge_parts(parts, seconds=time.monotonic() - started,
                             output_budget=OUTPUT_TAIL)
        return replace(merged, output=self._tail(offset), started=self._count(),
                       report_error="; ".join(filter(None, (merged.report_error,
                                                            self.unreadable))))

    def _count(self) -> int:
        """1 for the first result of this child (it started a process), then 0."""
        counted = 0 if self.started else 1
        self.started = True
        return counted

    def _tail(self, offset: int) -> str:
        return self.unsandbox(_read_from(self.log, offset, OUTPUT_TAIL))

    def _wait_ready(self, deadline: float) -> bool:
        """Wait for the child's collection; False when it ended or hung first."""
        while self.ready is None:
            for event in self.events.new():
                kind = event.get("event")
                if kind == "collection_error":
                    self.collection_errors.append(str(event.get("text", "")))
                elif kind == "ready":
                    try:
                        self.ready = Ready.from_json(event)
                    except FieldError as error:
                        self.ready = Ready((), False)
                        self.unreadable = f"the rerun child's ready event is malformed: {error}"
            if self.ready is not None:
                break
            if not self.alive or time.monotonic() >= deadline:
                return False
            time.sleep(POLL)
        return self.alive

    def _wait_phase(self, index: int, spec: RerunSpec, slices: Sequence[Sequence[str]],
                    started: float) -> tuple[PhaseEnd | None, bool]:
        """(the ``phase_end`` event of phase ``index``, False), or (None, whether the
        child overran the phase's timeout) when it ended or overran first, or when that
        event could not be read (:attr:`unreadable` says why)."""
        limit = started + self.setup.timeout + GRACE
        files = [FinishedTests(phase_results(self.output, index, part))
                 for part in range(len(slices))]
        total = sum(len(part) for part in slices)
        tick = started + PROGRESS_EVERY
        while True:
            for event in self.events.new():
                if event.get("event") == "phase_end" and event.get("index") == index:
                    try:
                        return PhaseEnd.from_json(event), False
                    except FieldError as error:
                        self.unreadable = ("the rerun child's phase_end event is malformed: "
                                           f"{error}")
                        return None, False
            now = time.monotonic()
            if not self.alive or now >= limit or (spec.cancel is not None
                                                   and spec.cancel.is_set()):
                return None, now >= limit
            if spec.progress is not None and now >= tick:
                finished = sum(counter.count() for counter in files)
                spec.progress(min(finished, total), total, now - started)
                tick = now + PROGRESS_EVERY
            time.sleep(POLL)

    def _slice(self, index: int, part: int, status: SliceEnd) -> RerunResult:
        """One slice of a phase, read back like a one-shot child."""
        child = fold_events(self.unsandbox(read_events(phase_results(self.output, index,
                                                                     part))))
        code, timed_out = status.returncode, status.timed_out
        return RerunResult(
            outcomes=child.tests, returncode=code, timed_out=timed_out,
            signal="" if timed_out or status.stopped else signal_name(code),
            collection_errors=child.collection_errors, running=child.running,
            report=child.report, running_launches=child.running_launches, mode=self.mode,
            fallback=self.fallback, report_error=child.report_error)

    def close(self) -> None:
        """End the child (its whole process group) and remove its directory."""
        self.stop.set()
        self.thread.join()
        shutil.rmtree(self.work, ignore_errors=True)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int, size: int) -> str:
    """The last ``size`` bytes of ``path`` written after ``offset``."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            end = handle.tell()
            handle.seek(max(offset, end - size))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""

