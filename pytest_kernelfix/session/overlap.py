"""Heal while the tests run (``--kernelfix-overlap``, on by default).

A red CI job used to pay for healing after its test run: the triage, the baseline, the
model's answer (30 to 60 s) and the verification, all after the last test. Here the
first failure of a bug starts that work at once, beside the test run:

- **Where it runs.** On the cores the test run leaves: the test run keeps one core per
  test process (xdist workers, else one), the bugs heal on the others, at most one bug
  per spare core (``--kernelfix-workers`` caps it), and the helper process that heals
  (:mod:`pytest_kernelfix.session.helper`) runs at a lower priority (``nice`` 10), with
  all it starts, so it takes what the tests leave even when no core is spare. On
  a GPU, reruns use only the GPUs beyond those of the test processes; without one they
  wait for the end of the run, and the model is asked first meanwhile.
- **Later failures.** Each failure that arrives is grouped with all the failures so far
  (:func:`~pytest_kernelfix.locate.grouping.group_failures`): one that joins a bug under
  way is added to its verification (a candidate not yet verified is verified on it; a
  winner already verified is checked on it, rerunning only the tests it has not run:
  :meth:`~pytest_kernelfix.verify.verifier.Verifier.remember`); passing tests that use
  its files join its regression set the same way. A failure of a new bug starts its
  own heal, unless it shares a file with a bug under way (it heals after it, at the end,
  from that bug's patch, as bugs that share files always do).
- **Bugs that turn out to be one.** At the end the failures are grouped once more, as
  without overlap. A bug under way is the bug of the final group that holds its first
  failure; when one group holds the first failures of several, the first one's heal is
  the group's, checked against all its tests, and the others are dropped (one bug, one
  patch, before any patch is written). A final group no heal began for heals then.
- **What does not change.** Patches, reports and every other output are written once,
  at the end, from the final grouping; test outcomes and the exit status are never
  touched. A winner counts only once it passed every failing and regression test of the
  final group; one that fails a test that failed later goes on to its next round.

The progress lines of the bugs go to a queue that the controller prints between test
results (:class:`pytest_kernelfix.session.controller.HealingController`), never from
these threads. :meth:`Overlap.stop` ends it all early (an interrupted session).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from pytest_kernelfix.capture.records import Failure, PassedTest
from pytest_kernelfix.config import Settings
from pytest_kernelfix.fixers.base import Fixer, FixerError, Proposal, ProposalRequest
from pytest_kernelfix.fixers.budget import Budget, BudgetedFixer
from pytest_kernelfix.heal.outcomes import HEALED, UNHEALED, HealResult
from pytest_kernelfix.locate.base import Changes
from pytest_kernelfix.locate.grouping import BugGroup, group_failures, regression_nodeids
from pytest_kernelfix.locate.reach import Reach
from pytest_kernelfix.project import Project
from pytest_kernelfix.report.model import Overlapped
from pytest_kernelfix.rerun.launcher import RerunSetup, RerunSpec, RerunStats
from pytest_kernelfix.rerun.report import RerunResult
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.session.bug import heal_bug, interrupted, make_verifier
from pytest_kernelfix.session.counted import CountedRunner
from pytest_kernelfix.session.inputs import SessionInputs, Stages, sandbox_exclude
from pytest_kernelfix.session.interrupt import Cancel, interrupt_name
from pytest_kernelfix.session.schedule import cpu_count, visible_gpus, worker_count
from pytest_kernelfix.verify.sample import representative
from pytest_kernelfix.verify.verifier import Child, Opener, Runner, Verifier

#: Seconds between two regroupings of the failures while they arrive.
REGROUP_EVERY = 0.25


def spare_cores(test_processes: int, cores: int | None = None) -> int:
    """Cores the test run leaves (0 when it uses them all)."""
    return max(0, (cores if cores is not None else cpu_count()) - max(1, test_processes))


class _Cancelled(FixerError):
    """The bug's heal was dropped (its group merged into another, or the session ends)."""


class _Unit:
    """One bug whose heal began at its first failure, in a thread of its own."""

    def __init__(self, seed: str, group: BugGroup, regression: tuple[str, ...]) -> None:
        self.seed = seed
        self.group = group
        self.regression = regression
        self.final_group: BugGroup | None = None
        self.cond = threading.Condition()
        self.posted: tuple[BugGroup, tuple[str, ...]] | None = None
        self.final = False
        self.cancelled = False
        self.thread: threading.Thread | None = None
        self.result: HealResult | None = None
        self.stats = RerunStats()
        self.done = threading.Event()
        self.verifier: Verifier | None = None
        self.setup: RerunSetup | None = None  # the session's, once the tests ran

    @property
    def files(self) -> set[str]:
        return set(self.group.editable)

    def grow(self, group: BugGroup, regression: tuple[str, ...], *, final: bool = False
             ) -> None:
        """Its bug now has these failing and regression tests (and, ``final``, no more
        will come)."""
        with self.cond:
            known = self.posted or (self.group, self.regression)
            if (group.nodeids, regression) != (known[0].nodeids, known[1]):
                self.posted = (group, regression)
                if self.verifier is not None:  # a candidate not verified yet covers them
                    self.verifier.extend(group, regression)
            self.final = self.final or final
            self.cond.notify_all()

    def latest(self) -> BugGroup:
        """Its bug as known now (failing tests may have joined it since it was taken)."""
        with self.cond:
            return self.posted[0] if self.posted is not None else self.group

    def take(self) -> tuple[tuple[BugGroup, tuple[str, ...]] | None, bool]:
        """The growth not checked yet (waits for some, or for the end), and whether it
        is the last; nothing, and the end, once its heal was dropped."""
        with self.cond:
            while self.posted is None and not self.final:
                self.cond.wait()
            if self.cancelled:
                return None, True
            posted, self.posted = self.posted, None
            if posted is not None:
                self.group, self.regression = posted
            return posted, self.final

    def cancel(self) -> None:
        with self.cond:
            self.cancelled = True
            self.final = True
            self.cond.notify_all()
        if self.thread is None:
            self.done.set()

    def retune(self, setup: RerunSetup) -> None:
        with self.cond:
            self.setup = setup
            if self.verifier is not None:
                self.verifier.retune(replace(self.verifier.setup, jobs=setup.jobs, nice=0))

    def outcome(self) -> tuple[HealResult, RerunStats]:
        self.done.wait()
        if self.result is None:  # its thread failed: the session reports it
            raise RuntimeError(f"the heal of {self.group.id} stopped without a result")
        group = self.final_group or self.group
        result = replace(self.result, group_id=group.id)
        if result.status == HEALED and self.verifier is not None and not self.verifier.covers(
                group.nodeids, ()):  # an interrupt came before its check on later failures
            result = replace(result, status=UNHEALED, reason=(
                "interrupted before its patch was checked on the tests that failed later"))
        return result, self.stats


class _Checked:
    """The unit's fixer: nothing is asked once its heal was dropped."""

    def __init__(self, fixer: Fixer, unit: _Unit) -> None:
        self.fixer = fixer
        self.unit = unit
        self.name = fixer.name
        self.free = getattr(fixer, "free", False)

    def propose(self, request: ProposalRequest) -> Proposal:
        if self.unit.cancelled:
            raise _Cancelled("healing stopped: the session ended or the bug was merged")
        return self.fixer.propose(request)


class _AfterTheRun:
    """A runner whose reruns wait for the end of the test run (a GPU with no GPU free)."""

    def __init__(self, runner: Runner, ended: threading.Event) -> None:
        self.runner = runner
        self.ended = ended
        self.can_open = callable(getattr(runner, "open", None))

    def __call__(self, spec: RerunSpec) -> RerunResult:
        self.ended.wait()
        return self.runner(spec)

    def open(self, setup: RerunSetup, sandbox_root: Path, nodeids: Sequence[str]
             ) -> Child | None:
        self.ended.wait()
        opener: Opener = self.runner  # type: ignore[assignment]
        return opener.open(setup, sandbox_root, nodeids)


class Overlap:
    """Heals bugs while the tests run; :meth:`assign` hands them to the session's end
    (it is the :class:`~pytest_kernelfix.session.pipeline.HeadStart` of
    :func:`~pytest_kernelfix.session.pipeline.run_healing`).

    The controller calls :meth:`failed` and :meth:`passed` from pytest's hooks (the main
    thread); everything else runs in a coordinating thread and one thread per bug.
    """

    def __init__(self, *, settings: Settings, project: Project, setup: RerunSetup,
                 stages: Callable[[], Stages], test_processes: int = 1,
                 progress: Callable[[str], None] = lambda line: None,
                 cancel: Cancel | None = None, changes: Changes | None = None) -> None:
        self.cancel = cancel if cancel is not None else Cancel()
        self.settings = settings
        self.changes = changes if changes is not None else Changes()
        self.project = project
        self.reach = Reach(project)
        self.budget = Budget(settings.max_cost, settings.max_tokens)
        self.fixer: Fixer | None = None
        self._stages_factory = stages
        self._stages: Stages | None = None
        self.progress = progress
        self.exclude = sandbox_exclude(settings, project)
        self.device = setup.device.mode
        spare = spare_cores(test_processes)
        gpus = visible_gpus() if self.device == "cuda" else ()
        free_gpus = tuple(gpus[max(1, test_processes):]) if gpus else ()
        self.slots = max(1, min(worker_count(settings.workers, self.device, free_gpus),
                                spare or 1))
        env = dict(setup.env)
        if free_gpus:
            env["CUDA_VISIBLE_DEVICES"] = free_gpus[0]
        self.setup = replace(setup, jobs=max(1, (spare or 1) // self.slots), env=env)
        self.tests_ended = threading.Event()
        self.wait_for_gpu = self.device == "cuda" and not free_gpus
        self.failures: list[Failure] = []
        self.passes: list[PassedTest] = []
        self.units: dict[str, _Unit] = {}
        self.events: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.coordinator: threading.Thread | None = None
        self.ended_at = 0.0
        self.began: float | None = None
        self.stopped = False

    # -- the main thread ---------------------------------------------------------------

    def failed(self, failure: Failure) -> None:
        """A selected failure (not a crash: those are rerun alone at the end)."""
        if self.stopped or failure.crashed:
            return
        self.events.put(("failed", failure))
        if self.coordinator is None:
            self.coordinator = threading.Thread(target=self._coordinate,
                                                name="kernelfix-overlap", daemon=True)
            self.coordinator.start()

    def passed(self, test: PassedTest) -> None:
        if test.launches and not self.stopped:  # only tests that launched can be regression
            self.events.put(("passed", test))

    def tests_done(self) -> None:
        """The last test ran: reruns need not wait for a GPU any more, nor yield."""
        self.ended_at = time.monotonic()
        self.tests_ended.set()

    @property
    def started(self) -> int:
        return sum(1 for unit in self.units.values() if unit.thread is not None)

    # -- coordinating ------------------------------------------------------------------

    def stages(self) -> Stages:
        if self._stages is None:
            stages = self._stages_factory()
            self.fixer = self.fixer or BudgetedFixer(stages.fixer, self.budget)
            self._stages = replace(stages, fixer=self.fixer, cancel=self.cancel)
        return self._stages

    def _coordinate(self) -> None:
        try:
            self.stages()
        except Exception as error:  # the end of the session heals without a head start
            self.progress(f"healing while the tests run is off: {type(error).__name__}: "
                          f"{error}")
            self.stopped = True
            return
        last = 0.0
        while True:
            kind, value = self.events.get()
            batch = [(kind, value)]
            with contextlib.suppress(queue.Empty):
                while True:
                    batch.append(self.events.get_nowait())
            ending = any(kind == "end" for kind, _ in batch)
            with self.lock:
                for kind, value in batch:
                    if kind == "failed":
                        self.failures.append(value)  # type: ignore[arg-type]
                    elif kind == "passed":
                        self.passes.append(value)  # type: ignore[arg-type]
            if ending or self.stopped:
                return
            wait = last + REGROUP_EVERY - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            last = time.monotonic()
            try:
                self._regroup()
            except Exception as error:  # grouping again at the end will say it
                self.progress(f"healing while the tests run stopped: {type(error).__name__}: "
                              f"{error}")
                return

    def _regroup(self) -> None:
        """Group the failures so far: bugs under way learn their new tests, new bugs
        start where a slot is free."""
        with self.lock:
            failures, passes = tuple(self.failures), tuple(self.passes)
        groups = group_failures(failures, self.project, self.reach)
        for group in groups[:self.settings.max_groups]:
            mine = [unit for seed, unit in self.units.items()
                    if seed in group.nodeids and not unit.cancelled]
            regression = regression_nodeids(group, passes, self.project, self.reach)
            if mine:
                mine[0].grow(group, regression)
                for other in mine[1:]:  # one root cause after all: one heal
                    if other.thread is None:
                        other.cancel()
                continue
            if not group.editable or any(set(group.editable) & unit.files
                                         for unit in self.units.values() if not unit.cancelled):
                continue  # no file to edit, or another bug's files: healed at the end
            self.units[group.first.nodeid] = _Unit(group.first.nodeid, group, regression)
        running = sum(1 for unit in self.units.values()
                      if unit.thread is not None and not unit.done.is_set())
        for unit in self.units.values():
            if running >= self.slots:
                break
            if unit.thread is None and not unit.cancelled and not self.stopped:
                self.began = self.began or time.monotonic()
                unit.thread = threading.Thread(target=self._heal, args=(unit,),
                                               name=f"kernelfix-overlap-{unit.group.id}",
                                               daemon=True)
                unit.thread.start()
                running += 1

    # -- one bug -----------------------------------------------------------------------

    def _say(self, unit: _Unit, line: str) -> None:
        """A bug's line: named when more than one bug heals (as with several workers)."""
        named = len(self.units) > 1 or self.settings.workers > 1
        self.progress(f"{unit.group.id}: {line.strip()}" if named else f"  {line.strip()}")

    def _inputs(self) -> SessionInputs:
        with self.lock:
            failures, passes = tuple(self.failures), tuple(self.passes)
        return SessionInputs(failures, passes, self.settings, self.setup, self.project)

    def _heal(self, unit: _Unit) -> None:
        """Heal the unit's bug, then check its winner on the tests that join it, until
        the session's end says the bug's final tests."""
        stages = self.stages()
        counted = CountedRunner(_AfterTheRun(stages.runner, self.tests_ended)
                           if self.wait_for_gpu else stages.runner,
                           lambda line: self._say(unit, line), self.cancel)
        stages = replace(stages, runner=counted, fixer=_Checked(stages.fixer, unit),
                         progress=lambda line: self._say(unit, line))
        sandbox: Sandbox | None = None
        result: HealResult | None = None
        try:
            sandbox = Sandbox.create(self.project.root, exclude=self.exclude)
            inputs = self._inputs()
            with unit.cond:  # the tests known now
                if unit.posted is not None:
                    (unit.group, unit.regression), unit.posted = unit.posted, None
            verifier = make_verifier(unit.group, inputs, sandbox, stages, self.reach)
            verifier.remember()
            with unit.cond:
                unit.verifier = verifier
                if unit.posted is not None:
                    verifier.extend(*unit.posted)
                if unit.setup is not None:
                    verifier.retune(replace(verifier.setup, jobs=unit.setup.jobs, nice=0))
            self.progress(f"healing {unit.group.id} while the tests run "
                          f"({len(unit.group.nodeids)} test(s) so far; "
                          f"{', '.join(unit.group.editable)})")
            change = self.changes.for_test(representative(unit.group), self.project)
            result = heal_bug(unit.group, inputs, sandbox, stages, self.reach, change=change,
                              exclude=self.exclude, verifier=verifier,
                              ask_first=self.wait_for_gpu or None, tests=unit)
            unit.result = result
            self._say(unit, f"{result.status}: {result.reason}")
        except KeyboardInterrupt as stop:  # the session was interrupted: what is healed stays
            why = self.cancel.why or interrupt_name(stop)
            unit.result = result if result is not None else interrupted(unit.group, stop, why)
        except Exception as error:  # the bug is reported as it ended; the session goes on
            unit.result = HealResult(unit.group.id, UNHEALED,
                                     f"healing stopped: {type(error).__name__}: {error}")
        finally:
            if unit.verifier is not None:
                unit.verifier.restore()  # its children end
            unit.stats = counted.stats
            if sandbox is not None:
                sandbox.close()
            unit.done.set()

    # -- the session's end -------------------------------------------------------------

    def assign(self, groups: Sequence[BugGroup], passed: Sequence[PassedTest]
               ) -> dict[int, _Unit]:
        """The bugs under way that the final grouping keeps, by the index of their group:
        each is told its final tests and reruns at full speed from now on; the others
        stop (a merged group's second heal, one that never started)."""
        self.tests_done()
        self.events.put(("end", None))
        if self.coordinator is not None:
            self.coordinator.join()
        early: dict[int, _Unit] = {}
        claimed: set[str] = set()
        for index, group in enumerate(groups):
            mine = [unit for seed, unit in self.units.items()
                    if seed in group.nodeids and seed not in claimed and not unit.cancelled]
            if not mine:
                continue
            unit = mine[0]
            if unit.thread is None:
                continue  # never started: it heals now, as without overlap
            claimed.add(unit.seed)
            unit.final_group = group
            unit.grow(group, regression_nodeids(group, passed, self.project, self.reach),
                      final=True)
            early[index] = unit
        for seed, unit in self.units.items():
            if seed not in claimed:
                unit.cancel()
        return early

    def overlapped(self) -> Overlapped:
        ended = self.ended_at or time.monotonic()
        return Overlapped(self.started, max(0.0, time.monotonic() - ended))

    def stop(self) -> None:
        """End every heal now (the session's end): no fixer is asked again, the threads
        are left to end with their reruns (the caller closes the servers)."""
        self.stopped = True
        self.cancel.set(self.cancel.why or "the session ended")
        self.tests_done()
        self.events.put(("end", None))
        for unit in self.units.values():
            unit.cancel()

    def join(self, timeout: float = 30.0) -> None:
        """Wait for the heals' threads (their sandboxes are removed as they end)."""
        deadline = time.monotonic() + timeout
        for unit in list(self.units.values()):
            if unit.thread is not None:
                unit.thread.join(max(0.0, deadline - time.monotonic()))

