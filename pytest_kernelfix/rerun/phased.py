"""Every rerun child: it collects its tests once, then runs phases on request.

A candidate's verification is several reruns of the same code (the representative, the
other failing tests and the regression set, the poisoned runs), each only when the ones
before it passed. :class:`PhasedChild` starts one child for all of them
(:func:`~pytest_kernelfix.rerun.launcher.launch`: forked from the warm server where the
setup allows it): it collects every test the verification may run, runs the suite's
conftest files and imports the sandbox once, then runs each phase the verifier asks for,
in processes forked from its collected state (:mod:`pytest_kernelfix.rerun.child.phases`),
and reports after each (the tests' events, one results file per slice, then a
``phase_end`` line). :meth:`PhasedChild.run` gives each phase back as the
:class:`~pytest_kernelfix.rerun.report.RerunResult` a child of its own would have given,
so the verifier judges it the same way, and stops at the first phase that decides (it
simply asks for no more).

A one-shot rerun is a child with one phase, its last (:meth:`PhasedChild.finish`): the
phase runs in the collected child itself (no later phase needs its state), and the
result says how the child ended, as for any process: its exit status, its timeout or the
signal that killed it, and what it printed, whatever happened before its tests ran.

A phase a child opened for several cannot run is answered ``None``, and the caller runs
it in a child of its own: tests it did not collect, a child whose collection reported
errors or that ended early, a child that could not fork its phases (after the one phase
it ran itself). A child whose ``ready`` or ``phase_end`` event cannot be read
(:class:`~pytest_kernelfix.rerun.plan.Ready`, :class:`~pytest_kernelfix.rerun.plan.PhaseEnd`)
is ended, and the phase's result says why in its ``report_error``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_kernelfix.fields import FieldError
from pytest_kernelfix.rerun.launcher import (
    OUTPUT_TAIL,
    PROGRESS_EVERY,
    RerunSetup,
    RerunSpec,
    build_command,
    child_env,
    launch,
    path_mapper,
    read_tail,
    rerun_plan,
)
from pytest_kernelfix.rerun.plan import (
    PhaseCommand,
    PhaseEnd,
    ProbePlan,
    Ready,
    SliceEnd,
    phase_results,
)
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
#: How long a child opened for many phases may live: the session closes it; this only
#: bounds a leak.
LIFETIME = 24 * 3600.0
#: Seconds beyond a phase's timeout before the session stops waiting for the child.
GRACE = 15.0
#: Pause between two looks at the child's results file while a phase runs.
POLL = 0.005
#: What a child opened for many phases installs before it collects: every check of the
#: tests guarded, inert until a phase probes reach.
GUARDED = ProbePlan(reach=True)


class PhasedChild:
    """A rerun child that collects ``nodeids`` once and runs phases on request.

    ``probe`` is what the child installs before it collects (:data:`GUARDED` when the
    phases are not known yet; a one-shot rerun's own probe); the child lives at most
    ``lifetime`` seconds. Used by one thread at a time; :meth:`close` ends it (its whole
    process group) and removes its directory.
    """

    def __init__(self, setup: RerunSetup, sandbox_root: Path, nodeids: Sequence[str], *,
                 python: str, pool: ServerPool | None, probe: ProbePlan = GUARDED,
                 lifetime: float = LIFETIME) -> None:
        self.setup = setup
        self.sandbox_root = Path(sandbox_root)
        self.nodeids = tuple(dict.fromkeys(nodeids))
        self.work = Path(tempfile.mkdtemp(prefix="kernelfix-rerun-"))
        spec = RerunSpec(setup, self.sandbox_root, self.nodeids, probe=probe)
        plan = rerun_plan(spec, self.work)
        plan_file = self.work / "plan.json"
        plan.write(plan_file)
        self.control = Path(plan.control)
        self.control.touch()
        self.output = Path(plan.output)
        self.log = self.work / "output.log"
        self.events = EventTail(self.output)
        self.stop = threading.Event()
        self.ended: ForkResult | None = None
        self.error: BaseException | None = None
        self.mode = "fork"
        self.fallback = ""
        self.ready: Ready | None = None
        self.unreadable = ""  # why an event of the child could not be read
        self.collection_errors: list[str] = []
        self.index = 0
        self.offset = 0  # where the next phase's output begins in the log
        self.counted = False  # a phase result has counted this child's start
        self.served = True  # whether the child still takes phases
        self.finished: list[FinishedTests] = []  # the slices of the phase that runs
        self.born = time.monotonic()
        self.unsandbox = path_mapper(self.sandbox_root, Path(setup.original_root))
        self.thread = threading.Thread(
            target=self._launch,
            args=(build_command(spec, python), child_env(os.environ, setup, plan_file),
                  lifetime, python, pool),
            name="kernelfix-rerun-child", daemon=True)
        self.thread.start()

    def _launch(self, command: list[str], env: dict[str, str], lifetime: float, python: str,
                pool: ServerPool | None) -> None:
        try:
            self.mode, self.fallback, self.ended = launch(
                self.setup, self.sandbox_root, command, env, self.log, timeout=lifetime,
                python=python, pool=pool, stop=self.stop)
        except BaseException as error:  # the child is gone; raised by finish(), if asked
            self.error = error
            self.ended = ForkResult(-9, False, True)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    @property
    def stopped(self) -> bool:
        """Whether the child was ended on request (:meth:`close`, a cancel), not by
        itself or its timeout."""
        return self.ended is not None and self.ended.stopped

    def finished_tests(self) -> int:
        """How many tests of the running phase finished so far."""
        return sum(counter.count() for counter in self.finished)

    # -- phases ---------------------------------------------------------------------------

    def run(self, spec: RerunSpec, name: str = "") -> RerunResult | None:
        """Run ``spec``'s tests as one phase of this child: the result a child of its own
        would give for ``spec``, or None when this child cannot run it."""
        started = time.monotonic()
        if not self._wait_ready(started + self.setup.timeout) or self.unreadable:
            # collection hung (the phase timed out, as a child would have), or the child's
            # ready event could not be read
            if self.alive or self.unreadable:
                self.stop.set()
                self.thread.join()
                output = self._output()
                self.close()
                return RerunResult((), -9, timed_out=not self.unreadable, output=output,
                                   seconds=time.monotonic() - started, mode=self.mode,
                                   fallback=self.fallback, report_error=self.unreadable,
                                   started=self._count())
            return None
        collected = set(self.ready.nodeids) if self.ready else set()
        if not self.served or self.collection_errors or not set(spec.nodeids) <= collected:
            return None
        slices = split_nodeids(spec.nodeids, spec.setup.jobs, MIN_TESTS_PER_SLICE)
        if self.ready and not self.ready.fork:
            slices = (spec.nodeids,)
            self.served = False  # it runs this one phase itself, then ends
        index = self._send(spec, name, slices, end=False)
        end, overran = self._wait(spec, started, index)
        if end is None:  # the child died, overran the phase or was cancelled: stop it
            self.stop.set()
            self.thread.join()
            how = self.ended if self.ended is not None else ForkResult(-9, True)
            statuses = [SliceEnd(how.returncode, timed_out=overran or how.timed_out)
                        ] * len(slices)
            self.served = False
        else:
            statuses = list(end.slices)
        statuses += [SliceEnd(-9)] * (len(slices) - len(statuses))
        parts = [Part(nodeids, self._slice(index, part, statuses[part]), statuses[part].stopped)
                 for part, nodeids in enumerate(slices)]
        merged = merge_parts(parts, seconds=time.monotonic() - started,
                             output_budget=OUTPUT_TAIL)
        return replace(merged, output=self._output(), started=self._count(),
                       report_error="; ".join(filter(None, (merged.report_error,
                                                            self.unreadable))))

    def finish(self, spec: RerunSpec, name: str = "") -> RerunResult:
        """Run ``spec``'s tests as this child's last phase, in the collected child
        itself, and wait for the child to end: the result also holds what happened before
        the tests ran (collection errors, a crash or a hang at start-up), and how the
        child ended. Raises what stopped the child from starting at all."""
        index = self._send(spec, name, (spec.nodeids,), end=True)
        self.served = False
        self._wait(spec, self.born, None)
        self.stop.set()  # a cancel: the child is stopped (nothing when it ended)
        self.thread.join()
        if self.error is not None:
            raise self.error
        how = self.ended if self.ended is not None else ForkResult(-9, False, True)
        status = SliceEnd(how.returncode, timed_out=how.timed_out, stopped=how.stopped)
        result = self._slice(index, 0, status, before=read_events(self.output))
        return replace(result, output=self._output(), seconds=time.monotonic() - self.born,
                       started=self._count())

    def _send(self, spec: RerunSpec, name: str, slices: tuple[tuple[str, ...], ...], *,
              end: bool) -> int:
        """Append the phase's command to the control file; its index."""
        index = self.index
        self.index += 1
        self.finished = [FinishedTests(phase_results(self.output, index, part))
                         for part in range(len(slices))]
        command = PhaseCommand(index, name, slices, spec.probe, spec.stop_early,
                               self.setup.timeout, end=end)
        with open(self.control, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(command.to_json()) + "\n")
        return index

    def _count(self) -> int:
        """1 for the first result of this child (it started a process), then 0."""
        counted = 0 if self.counted else 1
        self.counted = True
        return counted

    def _output(self) -> str:
        """What the child printed since the last phase's output was read (the first:
        since it started)."""
        text = read_tail(self.log, OUTPUT_TAIL, self.offset)
        self.offset = _size(self.log)
        return self.unsandbox(text)

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

    def _wait(self, spec: RerunSpec, started: float, index: int | None
              ) -> tuple[PhaseEnd | None, bool]:
        """(the ``phase_end`` event of phase ``index``, False), or (None, whether the
        child overran the phase's timeout) when it ended, overran or was cancelled first,
        or when that event could not be read (:attr:`unreadable` says why). With ``index``
        None, until the child ends (its lifetime bounds it). Tells ``spec.progress`` how
        far the phase is."""
        limit = started + self.setup.timeout + GRACE
        total = len(set(spec.nodeids))
        tick = started + PROGRESS_EVERY
        while True:
            if index is not None:
                for event in self.events.new():
                    if event.get("event") == "phase_end" and event.get("index") == index:
                        try:
                            return PhaseEnd.from_json(event), False
                        except FieldError as error:
                            self.unreadable = ("the rerun child's phase_end event is "
                                               f"malformed: {error}")
                            return None, False
            now = time.monotonic()
            if (not self.alive or (spec.cancel is not None and spec.cancel.is_set())
                    or (index is not None and now >= limit)):
                return None, index is not None and now >= limit
            if spec.progress is not None and now >= tick:
                spec.progress(min(self.finished_tests(), total), total, now - started)
                tick = now + PROGRESS_EVERY
            if index is None:
                self.thread.join(POLL * 20)
            else:
                time.sleep(POLL)

    def _slice(self, index: int, part: int, status: SliceEnd,
               before: Sequence[Mapping[str, Any]] = ()) -> RerunResult:
        """One slice of a phase, read back like a child of its own (``before``: the
        child's events before its phases, when they are the slice's too)."""
        events = [*before, *read_events(phase_results(self.output, index, part))]
        child = fold_events(self.unsandbox(events))
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
