"""From captured failures to a session report: one healing session, start to end.

:func:`run_healing` reruns alone the tests that crashed their xdist worker, groups the
failures into bugs, heals each (:func:`pytest_kernelfix.session.bug.heal_bug`) in a
sandbox, and ends with the report (:func:`pytest_kernelfix.session.finish.finish`); with
``--kernelfix-apply`` the healed files are then written from it
(:func:`pytest_kernelfix.report.writeback.write_healed`). Bugs whose files do not overlap heal
at the same time on up to ``--kernelfix-workers`` threads, each with its own sandbox
(:mod:`pytest_kernelfix.session.schedule`); bugs that share a file heal in order, each
from the text the one before left; the report keeps the grouping order. Knows no pytest
hooks: the controller hands it plain data and the parts a caller may swap
(:mod:`pytest_kernelfix.session.inputs`). The runner's warm servers belong to whoever made
the runner.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from pytest_kernelfix.capture.records import PassedTest, Selection
from pytest_kernelfix.fixers.base import Fixer
from pytest_kernelfix.fixers.budget import Budget, BudgetedFixer
from pytest_kernelfix.heal.outcomes import HEALED, HealResult
from pytest_kernelfix.locate.grouping import BugGroup, group_failures
from pytest_kernelfix.locate.reach import Reach
from pytest_kernelfix.report.folder import make_report_dir
from pytest_kernelfix.report.model import SessionReport
from pytest_kernelfix.report.writeback import write_healed
from pytest_kernelfix.rerun.launcher import RerunSetup, RerunStats
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.root import outside_note
from pytest_kernelfix.session.bug import Winner, heal_bug, interrupted, skipped
from pytest_kernelfix.session.counted import CountedRunner
from pytest_kernelfix.session.crashes import reproduce_crashes
from pytest_kernelfix.session.finish import finish
from pytest_kernelfix.session.inputs import SessionInputs, Stages, sandbox_exclude
from pytest_kernelfix.session.interrupt import interrupt_name, shielded
from pytest_kernelfix.session.schedule import (
    chains,
    cpu_count,
    rerun_jobs,
    visible_gpus,
    worker_count,
    worker_env,
)
from pytest_kernelfix.verify.sample import representative


class Early(Protocol):
    """A bug whose heal started while the tests ran (:mod:`pytest_kernelfix.session.overlap`)."""

    def outcome(self) -> tuple[HealResult, RerunStats]:
        """Its result once it has been checked against the bug's final tests (waits)."""
        ...

    def retune(self, setup: RerunSetup) -> None:
        """Rerun the session's way from now on (its jobs, full priority)."""
        ...


class HeadStart(Protocol):
    """Healing that began while the tests ran: the session's reach and budget (shared),
    and the bugs already under way."""

    reach: Reach
    budget: Budget
    fixer: Fixer | None  # the session's fixer behind the budget, once made
    began: float | None  # when the first heal began (``time.monotonic()``)

    def assign(self, groups: Sequence[BugGroup], passed: Sequence[PassedTest]
               ) -> Mapping[int, Early]:
        """The bugs of ``groups`` (the final grouping) already under way, by index; each
        is told its final failing and regression tests."""
        ...


def run_healing(inputs: SessionInputs, stages: Stages, *,
                head: HeadStart | None = None) -> SessionReport:
    """Heal every bug of the session, then, in apply mode, write the healed files; the
    report, for the controller to publish. ``head``: bugs already under way."""
    started = time.monotonic()
    settings = inputs.settings
    project = inputs.project
    reach = head.reach if head is not None else Reach(project)
    make_report_dir(settings.report_dir, settings.rootdir)  # before backups, locks, cache
    make_report_dir(settings.cache_root, settings.rootdir)  # a cache dir of its own too
    exclude = sandbox_exclude(settings, project)
    cancel = stages.cancel
    if head is not None and head.fixer is not None:
        budget, stages = head.budget, replace(stages, fixer=head.fixer)
    else:
        budget = Budget(settings.max_cost, settings.max_tokens)
        stages = replace(stages, fixer=BudgetedFixer(stages.fixer, budget))
    if any(failure.crashed for failure in inputs.failures) and not cancel.is_set():
        try:
            inputs = _reproduce_crashes(inputs, stages, exclude)
        except KeyboardInterrupt as stop:
            cancel.set(interrupt_name(stop))
    said = inputs.changes.said([failure.nodeid for failure in inputs.failures])
    inputs = replace(inputs, notes=inputs.notes + said)
    groups = group_failures(inputs.failures, project, reach, inputs.passed)
    lanes = chains(groups)
    early = head.assign(groups, inputs.passed) if head is not None else {}
    gpus = visible_gpus() if inputs.device == "cuda" else ()
    workers = max(1, min(worker_count(settings.workers, inputs.device, gpus), len(lanes)))
    jobs = rerun_jobs(settings.rerun_jobs, workers, inputs.device, cpu_count())
    inputs = replace(inputs, setup=replace(inputs.setup, jobs=jobs))
    for bug in early.values():  # a bug under way counts as one of the workers
        bug.retune(inputs.setup)
    session = Session(inputs, stages, groups, exclude, workers, gpus, reach, budget)
    session.early = early
    try:
        if cancel.is_set():  # interrupted before healing began: only what heals already
            _heal_in_order(sorted(early), session)
        elif workers == 1:
            _heal_in_order([i for lane in lanes for i in lane], session)
        else:
            _heal_in_parallel(lanes, session)
    except KeyboardInterrupt as stop:  # between two steps of the main thread's heal
        cancel.set(interrupt_name(stop))
    if cancel.is_set():
        stages.progress(f"interrupted ({cancel.why}): writing the report of what was healed")
    results = [(group, session.results.get(index) or skipped(
        group, f"not healed: the session was interrupted ({cancel.why}) before its turn"))
        for index, group in enumerate(groups)]
    began = head.began if head is not None and head.began is not None else started
    with shielded(cancel):  # apply mode writes every healed bug whole, or none of it
        report = finish(inputs, results, time.monotonic() - min(began, started),
                        reruns=session.reruns, workers=workers,
                        interrupted=cancel.why if cancel.is_set() else "")
        return write_healed(report, inputs.project) if settings.apply else report


def _reproduce_crashes(inputs: SessionInputs, stages: Stages, exclude: Sequence[str]) -> (
    SessionInputs
):
    """Rerun the tests that crashed their xdist worker alone in a sandbox, so that what
    they launched before the crash is known when the failures are grouped."""
    stages.progress("rerunning the tests that crashed their worker, alone in the sandbox")
    with Sandbox.create(inputs.project.root, exclude=exclude) as sandbox:
        failures, notes = reproduce_crashes(inputs.failures, inputs.setup, sandbox.root,
                                            stages.runner, inputs.project,
                                            Selection.of(inputs.settings.select))
    return replace(inputs, failures=failures, notes=inputs.notes + notes)


def _heal_in_order(order: Sequence[int], session: Session) -> None:
    """One worker: every bug in grouping order, in one sandbox (removed whole even when
    an interrupt arrives as it is)."""
    if not order:
        return
    sandbox = None
    try:
        sandbox = session.heal_chain(sorted(order), None, 0)
    finally:
        if sandbox is not None:
            with shielded(session.stages.cancel):
                sandbox.close()


def _heal_in_parallel(lanes: Sequence[Sequence[int]], session: Session) -> None:
    """``session.workers`` threads take chains from a queue, each with its own sandbox;
    the first error of any worker is raised once all have stopped."""
    pending = list(lanes)
    taken = threading.Lock()
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        sandbox: Sandbox | None = None
        try:
            while not errors and not session.stages.cancel.is_set():
                with taken:
                    if not pending:
                        return
                    chain = pending.pop(0)
                sandbox = session.heal_chain(chain, sandbox, worker)
        except BaseException as error:  # handed to the caller's thread below
            errors.append(error)
        finally:
            if sandbox is not None:
                sandbox.close()

    threads = [threading.Thread(target=work, args=(worker,), name=f"kernelfix-worker-{worker}",
                                daemon=True) for worker in range(session.workers)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except KeyboardInterrupt as stop:  # the workers stop at their next step; wait for them
        session.stages.cancel.set(interrupt_name(stop))
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]


NO_EDITABLE_SOURCE = (
    "no editable source: the failure is not in project code (it is in a test, a conftest "
    "or an installed package), or its files are symlinks, binary, over 256 KiB or outside "
    "kernelfix_paths"
)


def no_editable_source(group: BugGroup, root: Path) -> str:
    """:data:`NO_EDITABLE_SOURCE`, and where the failure's code lies when that is outside
    the project root (the root is chosen before any failure; see :mod:`pytest_kernelfix.root`)."""
    paths = [path for failure in group.failures for path in (
        *(frame.path for frame in failure.error.frames),
        *(launch.file for launch in failure.launches))]
    outside = outside_note(root, paths)
    return f"{NO_EDITABLE_SOURCE}; {outside}" if outside else NO_EDITABLE_SOURCE


@dataclass
class Session:
    """The mutable state of one healing run, shared by its workers."""

    inputs: SessionInputs
    stages: Stages
    groups: list[BugGroup]
    exclude: list[str]
    workers: int
    gpus: tuple[str, ...]
    reach: Reach
    budget: Budget
    results: dict[int, HealResult] = field(default_factory=dict)
    reruns: dict[int, RerunStats] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: Bugs that began a heal of their own (``--kernelfix-max-groups`` bounds them; a bug
    #: an earlier patch heals is not one).
    claimed: int = 0
    #: Bugs whose heal started while the tests ran, by index (see :class:`HeadStart`).
    early: Mapping[int, Early] = field(default_factory=dict)

    def claim(self) -> str:
        """A place for one more bug of its own, or why there is none."""
        limit = self.inputs.settings.max_groups
        with self.lock:
            if self.claimed < limit:
                self.claimed += 1
                return ""
        return f"over the limit of {limit} bugs per session (--kernelfix-max-groups)"

    def say(self, group: BugGroup, line: str, *, first: bool = False) -> None:
        """A progress line; with several workers each names its bug."""
        if not first:
            line = f"{group.id}: {line}" if self.workers > 1 else f"  {line}"
        with self.lock:
            self.stages.progress(line)

    def heal_chain(self, chain: Sequence[int], sandbox: Sandbox | None, worker: int) -> (
        Sandbox | None
    ):
        """Heal a chain of bugs in order in one sandbox (made on first need)."""
        stages = self.stages
        inputs = self.inputs
        pinned = worker_env(worker, self.gpus, self.workers)
        if pinned:
            setup = replace(inputs.setup, env={**inputs.setup.env, **pinned})
            inputs = replace(inputs, setup=setup)
        winners: list[Winner] = []
        cancel = stages.cancel
        for index in chain:
            group = self.groups[index]
            if cancel.is_set() and index not in self.early:  # reported as not started
                continue
            if index in self.early:  # healed while the tests ran: its last check runs there
                self.say(group, f"healing {group.id} ({len(group.nodeids)} test(s); "
                                f"{', '.join(group.editable)})", first=True)
                with self.lock:
                    self.claimed += 1
                result, self.reruns[index] = self.early[index].outcome()
                self.results[index] = result
                if result.status == HEALED and result.changed_files:
                    winners.append(Winner(group.id, result.final, frozenset(result.verified),
                                          {path: result.final[path]
                                           for path in result.changed_files}))
                continue
            spent = self.budget.exhausted()
            if spent:
                self.results[index] = skipped(group, spent)
                continue
            self.say(group, f"healing {group.id} ({len(group.nodeids)} test(s); "
                            f"{', '.join(group.editable) or 'no editable file'})", first=True)
            if group.unreadable:
                result = skipped(group, "cannot heal: " + "; ".join(group.unreadable))
            elif not group.editable:
                result = skipped(group, no_editable_source(group, inputs.project.root))
            else:
                def progress(line: str, group: BugGroup = group) -> None:
                    self.say(group, line.strip())

                counted = CountedRunner(stages.runner, progress, cancel)
                try:
                    sandbox = sandbox or Sandbox.create(inputs.project.root,
                                                        exclude=self.exclude)
                    change = inputs.changes.for_test(representative(group), inputs.project)
                    result = heal_bug(group, inputs, sandbox,
                                      replace(stages, runner=counted, progress=progress),
                                      self.reach, winners, claim=self.claim, change=change,
                                      exclude=self.exclude)
                except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM, or another thread's
                    cancel.set(interrupt_name(stop))
                    result = interrupted(group, stop, cancel.why)
                finally:
                    self.reruns[index] = counted.stats
                if result.status == HEALED and result.changed_files:
                    winners.append(Winner(group.id, result.final, frozenset(result.verified),
                                          {path: result.final[path]
                                           for path in result.changed_files}))
            self.say(group, f"{result.status}: {result.reason}")
            self.results[index] = result
        return sandbox
