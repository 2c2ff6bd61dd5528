"""From captured failures to a session report: one healing session, start to end.

A pipeline of plain stages: group the failures into bugs, heal each bug in a sandbox (a
baseline rerun first: :meth:`Verifier.triage` skips what is not the kernel's to heal),
and with ``--kernelfix-apply`` write the healed files. Bugs whose files do not overlap
heal at the same time on up to ``--kernelfix-workers`` threads, each with its own sandbox
(:mod:`pytest_kernelfix.session.schedule`); the report keeps the grouping order. The
report is data: the controller publishes it (:func:`pytest_kernelfix.report.publish.publish`).
Knows no pytest hooks: the controller hands it plain data (:class:`SessionInputs`) and
the parts a caller may swap (:class:`Stages`: the fixer, the guard, the rerun runner,
the progress lines), so the whole session runs in a unit test with a fake runner. The
runner's warm servers belong to whoever made the runner.
"""

from __future__ import annotations

import linecache
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from pytest_kernelfix.capture.logs import clean_log
from pytest_kernelfix.capture.records import Failure, PassedTest, Selection, Unselected
from pytest_kernelfix.config import Settings
from pytest_kernelfix.fixers.base import Fixer, FixerError, Proposal, ProposalRequest, is_free
from pytest_kernelfix.fixers.budget import Budget, BudgetedFixer
from pytest_kernelfix.heal.loop import Resume, heal
from pytest_kernelfix.heal.outcomes import (
    DECLINED,
    HEALED,
    MASKED,
    SKIPPED,
    UNHEALED,
    Guard,
    HealInterrupted,
    HealResult,
    Phase,
    RoundRecord,
    Verdict,
)
from pytest_kernelfix.locate.base import Changes
from pytest_kernelfix.locate.change import (
    NOT_REGRESSION,
    REGRESSION,
    TEST_CHANGED,
    Change,
    Regression,
    change_view,
    reverts_only,
    with_change,
)
from pytest_kernelfix.locate.context import BugContext, build_context
from pytest_kernelfix.locate.grouping import BugGroup, group_failures, regression_nodeids
from pytest_kernelfix.locate.need import NeedResolver
from pytest_kernelfix.locate.reach import Reach
from pytest_kernelfix.project import Project, encoding_problem
from pytest_kernelfix.redact import redact
from pytest_kernelfix.report.folder import make_report_dir
from pytest_kernelfix.report.model import BugReport, SessionReport
from pytest_kernelfix.report.patches import patch_name
from pytest_kernelfix.report.writeback import write_healed
from pytest_kernelfix.rerun.launcher import RerunSetup, RerunSpec, RerunStats, run_tests
from pytest_kernelfix.rerun.plan import DevicePlan
from pytest_kernelfix.rerun.report import RerunResult
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.session.crashes import reproduce_crashes
from pytest_kernelfix.session.interrupt import Cancel, interrupt_name, shielded
from pytest_kernelfix.session.schedule import (
    chains,
    cpu_count,
    rerun_jobs,
    visible_gpus,
    worker_count,
    worker_env,
)
from pytest_kernelfix.verify.culprit import find_culprits
from pytest_kernelfix.verify.sample import representative
from pytest_kernelfix.verify.triage import raised_in_kernel
from pytest_kernelfix.verify.verifier import Child, Opener, Runner, Verifier

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SessionInputs:
    """What the test run left for healing, and how reruns must be made.

    ``notes`` are the session's own remarks, written into ``report.json`` and
    ``report.md`` as well as shown on the terminal. ``changes``: the change since the
    base each failing test is compared with (:mod:`pytest_kernelfix.locate.base`), read
    once when the session started.
    """

    failures: tuple[Failure, ...]
    passed: tuple[PassedTest, ...]
    settings: Settings
    setup: RerunSetup
    project: Project
    notes: tuple[str, ...] = field(default_factory=tuple)
    unselected: tuple[Unselected, ...] = ()
    changes: Changes = field(default_factory=Changes)

    @property
    def device(self) -> str:
        """The resolved device, ``cuda`` or ``interpret`` (decided once, in the setup)."""
        return self.setup.device.mode


@dataclass(frozen=True)
class Stages:
    """The parts of a session a caller chooses: who proposes, what is refused statically,
    how tests are rerun, where progress lines go, and the stop request a Ctrl-C or
    SIGTERM sets (:class:`~pytest_kernelfix.session.interrupt.Cancel`): every healing
    thread stops at its next step, and the report keeps what was finished."""

    fixer: Fixer
    guard: Guard | None = None
    runner: Runner = run_tests
    progress: Progress = lambda line: None
    cancel: Cancel = field(default_factory=Cancel)


#: What every candidate that passes its rerun goes through, whatever the device.
INTEGRITY_CHECKS = (
    "The assertion helpers, torch, numpy and the names the tests imported must be the "
    "originals while the tests run (no patching, torch modes, Tensor subclasses or "
    "torch.library overrides).",
    "The failing tests are then rerun with every project kernel's output replaced (by NaN, "
    "then by scrambled values) right after each launch: they must fail, which proves that "
    "the result comes from the kernel.",
)


def checks_for(device: DevicePlan) -> tuple[str, ...]:
    """How candidates are verified, in words a prompt can pass on to the model."""
    if not device.interpret:
        return ("The failing tests and the tests that passed before are rerun on a CUDA GPU.",
                *INTEGRITY_CHECKS)
    checks = [
        "The failing tests and the tests that passed before are rerun on the Triton "
        "interpreter (TRITON_INTERPRET=1) on CPU; it cannot see GPU-only problems such as "
        "races, shared-memory limits, tl.dot shape limits or unsupported constructs."
    ]
    if device.gate:
        checks.append("Each launched kernel is then compiled for a real GPU target; "
                      "compile errors reject the fix.")
    return (*checks, *INTEGRITY_CHECKS)


NO_EDITABLE_SOURCE = (
    "no editable source: the failure is not in project code (it is in a test, a conftest "
    "or an installed package), or its files are symlinks, binary, over 256 KiB or outside "
    "kernelfix_paths"
)


def read_originals(root: Path, paths: Sequence[str]) -> dict[str, str]:
    """The exact text of each file (newlines untouched, so CRLF files stay CRLF); a file
    that is not UTF-8 raises ``ValueError`` naming it and its encoding."""
    texts = {}
    for path in paths:
        data = (root / path).read_bytes()
        try:
            texts[path] = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path} {encoding_problem(root / path)}") from None
    return texts


def _skipped(group: BugGroup, reason: str) -> HealResult:
    return HealResult(group_id=group.id, status=SKIPPED, reason=reason)


class _Counted:
    """A runner that keeps what one bug's reruns cost and how they ran, says how far a
    long rerun is, and stops (``KeyboardInterrupt``) once the session is interrupted: a
    rerun under way is cut short, its result is of no use. The phases of the phased
    children it opens count as reruns."""

    def __init__(self, runner: Runner, progress: Progress = lambda line: None,
                 cancel: Cancel | None = None) -> None:
        self.runner = runner
        self.progress = progress
        self.cancel = cancel if cancel is not None else Cancel()
        self.stats = RerunStats()
        self.lock = threading.Lock()  # a verifier may run reruns at the same time
        self.can_open = callable(getattr(runner, "open", None)) and bool(
            getattr(runner, "can_open", True))

    def _spec(self, spec: RerunSpec) -> RerunSpec:
        self.cancel.check()
        if spec.progress is None:
            spec = replace(spec, progress=lambda done, total, seconds: self.progress(
                f"rerun: {done} of {total} test(s) finished after {seconds:.0f} s"))
        return replace(spec, cancel=self.cancel.event)

    def add(self, result: RerunResult, started: float) -> RerunResult:
        with self.lock:  # timed here: the wall time of reruns that overlap is counted once
            self.stats = self.stats.add(result, (started, time.monotonic()))
        self.cancel.check()
        return result

    def __call__(self, spec: RerunSpec) -> RerunResult:
        spec = self._spec(spec)
        started = time.monotonic()
        return self.add(self.runner(spec), started)

    def open(self, setup: RerunSetup, sandbox_root: Path, nodeids: Sequence[str]
             ) -> _CountedChild | None:
        opener: Opener = self.runner  # type: ignore[assignment]
        child = opener.open(setup, sandbox_root, nodeids) if self.can_open else None
        return None if child is None else _CountedChild(child, self)


class _CountedChild:
    """A phased child whose phases are counted by the runner that opened it."""

    def __init__(self, child: Child, counted: _Counted) -> None:
        self.child = child
        self.counted = counted

    def run(self, spec: RerunSpec, name: str = "") -> RerunResult | None:
        spec = self.counted._spec(spec)
        started = time.monotonic()
        result = self.child.run(spec, name)
        return None if result is None else self.counted.add(result, started)

    def close(self) -> None:
        self.child.close()


@dataclass
class _Session:
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
                self.results[index] = _skipped(group, spent)
                continue
            self.say(group, f"healing {group.id} ({len(group.nodeids)} test(s); "
                            f"{', '.join(group.editable) or 'no editable file'})", first=True)
            if group.unreadable:
                result = _skipped(group, "cannot heal: " + "; ".join(group.unreadable))
            elif not group.editable:
                result = _skipped(group, NO_EDITABLE_SOURCE)
            else:
                def progress(line: str, group: BugGroup = group) -> None:
                    self.say(group, line.strip())

                counted = _Counted(stages.runner, progress, cancel)
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


def interrupted(group: BugGroup, stop: KeyboardInterrupt, why: str) -> HealResult:
    """The bug a Ctrl-C or SIGTERM stopped: unhealed with the rounds it played and what
    they cost, or skipped when no fixer was asked yet."""
    if isinstance(stop, HealInterrupted):
        return replace(stop.result, reason=f"{stop.result.reason} ({why})")
    return _skipped(group, f"interrupted ({why}) before it was healed")


def sandbox_exclude(settings: Settings, project: Project) -> list[str]:
    """What a sandbox copy leaves out: the configured globs, the report and cache dirs."""
    exclude = list(settings.sandbox_exclude)
    for folder in (settings.report_dir, settings.cache_root):
        if folder.is_relative_to(project.root):
            exclude.append(folder.relative_to(project.root).as_posix())
    return exclude


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
               ) -> dict[int, Early]:
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
    session = _Session(inputs, stages, groups, exclude, workers, gpus, reach, budget)
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
    results = [(group, session.results.get(index) or _skipped(
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


def _heal_in_order(order: Sequence[int], session: _Session) -> None:
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


def _heal_in_parallel(lanes: Sequence[Sequence[int]], session: _Session) -> None:
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


@dataclass(frozen=True)
class Winner:
    """A bug healed earlier in the same chain, and the files its patch leaves;
    ``verified``: the tests its patch was verified passing on, ``change``: the text of
    each file it changes (when a later bug's candidate is that change whole, those
    tests need no second run)."""

    group_id: str
    files: Mapping[str, str]
    verified: frozenset[str] = frozenset()
    change: Mapping[str, str] = field(default_factory=dict)


def build_on(originals: Mapping[str, str], winners: Sequence[Winner]) -> (
    tuple[dict[str, str], tuple[str, ...]]
):
    """The text a bug heals from: its files as the earlier winners of its chain left
    them (their patches apply first), and which winners touched them."""
    base = dict(originals)
    used = []
    for winner in winners:
        shared = {path: text for path, text in winner.files.items() if path in base}
        if shared and any(base[path] != text for path, text in shared.items()):
            base.update(shared)
            used.append(winner.group_id)
    return base, tuple(used)


def make_verifier(group: BugGroup, inputs: SessionInputs, sandbox: Sandbox, stages: Stages,
                  reach: Reach) -> Verifier:
    """The verifier of one bug: its failing tests, the regression set the session's
    passing tests give, the session's runner and verify mode."""
    project = inputs.project
    return Verifier(sandbox, inputs.setup, group, project,
                    regression=regression_nodeids(group, inputs.passed, project, reach),
                    runner=stages.runner, mode=inputs.settings.verify,
                    say=lambda line: stages.progress(f"  {line}"))


class Growing(Protocol):
    """The tests of a bug whose heal began before they were all known (healing while
    the tests run, :mod:`pytest_kernelfix.session.overlap`)."""

    def latest(self) -> BugGroup:
        """The bug as it is known now: failing tests may have joined it since."""
        ...

    def take(self) -> tuple[tuple[BugGroup, tuple[str, ...]] | None, bool]:
        """The failing and regression tests known since the last call, if they changed
        (waits for a change or for the end), and whether they are the last: the final
        group's, or none when the heal was dropped."""
        ...


class Shown:
    """What the fixer is shown of one bug: its context, built once for each set of
    failing tests the bug is known by (those of a bug healed while the tests run grow),
    from the files its heal began with, with the notes its heal added."""

    def __init__(self, group: BugGroup, build: Callable[[BugGroup], BugContext],
                 latest: Callable[[], BugGroup] | None = None) -> None:
        self.group = group
        self.build = build
        self.latest = latest
        self.notes: tuple[str, ...] = ()
        self._built: tuple[tuple[str, ...], BugContext] | None = None

    def tests(self) -> BugGroup:
        """The bug with the failing tests known now, its files as when its heal began."""
        grown = self.latest() if self.latest is not None else self.group
        if grown.nodeids == self.group.nodeids:
            return self.group
        return replace(self.group, failures=grown.failures, located=grown.located)

    def rebuild(self, build: Callable[[BugGroup], BugContext]) -> None:
        """Build the context this way from now on (after the experiment on a change)."""
        self.build = build
        self._built = None

    def note(self, note: str) -> None:
        if not note:
            return
        self.notes += (note,)
        if self._built is not None:
            nodeids, context = self._built
            self._built = (nodeids, replace(context, notes=(*context.notes, note)))

    def __call__(self) -> BugContext:
        group = self.tests()
        if self._built is None or self._built[0] != group.nodeids:
            context = self.build(group)
            self._built = (group.nodeids, replace(context, notes=(*context.notes,
                                                                  *self.notes)))
        return self._built[1]


def heal_bug(group: BugGroup, inputs: SessionInputs, sandbox: Sandbox, stages: Stages,
             reach: Reach, winners: Sequence[Winner] = (),
             claim: Callable[[], str] = lambda: "", *, change: Change | None = None,
             exclude: Sequence[str] = (), verifier: Verifier | None = None,
             ask_first: bool | None = None, tests: Growing | None = None) -> HealResult:
    """One bug, in the given sandbox: a free fixer's first answer, the baseline and
    triage, then (when earlier bugs of its chain healed files it shares) their patches as
    a candidate, then, with a ``change`` since a base, the experiment that finds the
    hunks whose revert makes the test pass, then the round loop from the text they
    leave.

    ``claim`` is asked before the bug heals on its own (not when an earlier patch heals
    it): it answers why not (``--kernelfix-max-groups``), or "". ``verifier`` is the
    bug's own when the caller keeps it; ``ask_first`` asks the fixer before the baseline
    even when it is not free (reruns that must wait). ``tests``: the bug's heal began
    while its tests ran (healing while they run), and those that join it later are shown
    from the next round on; once it healed, its winner is checked on them until they are
    all known, and one that fails goes on to its next round (the rounds it played count).
    """
    one = _OneBug(group, inputs, sandbox, stages, reach, change, exclude, tests)
    result = one.heal(winners, claim, verifier, ask_first)
    return one.follow(result) if tests is not None else result


class _OneBug:
    """The heal of one bug (:func:`heal_bug`): what its steps share."""

    def __init__(self, group: BugGroup, inputs: SessionInputs, sandbox: Sandbox,
                 stages: Stages, reach: Reach, change: Change | None,
                 exclude: Sequence[str], tests: Growing | None) -> None:
        self.group = group
        self.inputs = inputs
        self.project = inputs.project
        self.sandbox = sandbox
        self.stages = stages
        self.reach = reach
        self.change = change
        self.exclude = exclude
        self.tests = tests
        self.started = time.monotonic()
        self.widened = with_change(group, change, self.project) if change is not None else group
        self.checks = checks_for(inputs.setup.device)
        self.shown = Shown(group, self.plain, tests.latest if tests is not None else None)
        self.verifier: Verifier | None = None
        self.files: dict[str, str] = {}  # the text the rounds start from

    def plain(self, group: BugGroup) -> BugContext:
        return build_context(group, self.project, device=self.inputs.device,
                             checks=self.checks)

    def done(self, result: HealResult) -> HealResult:
        """The bug's whole time: its triage and every rerun included; a healed bug, the
        tests its patch passed."""
        assert self.verifier is not None
        verified = self.verifier.passing() if result.status == HEALED else ()
        return replace(result, seconds=time.monotonic() - self.started, verified=verified)

    def heal(self, winners: Sequence[Winner], claim: Callable[[], str],
             verifier: Verifier | None, ask_first: bool | None) -> HealResult:
        group, inputs, stages, project = self.group, self.inputs, self.stages, self.project
        try:
            originals = read_originals(project.root, self.widened.editable)
        except (OSError, ValueError) as error:
            return _skipped(group, f"cannot read the editable source: {error}")
        base, earlier = build_on(originals, winners)
        over = "" if earlier else claim()
        if over:
            return _skipped(group, over)
        self.verifier = verifier = verifier or make_verifier(self.widened, inputs,
                                                             self.sandbox, stages, self.reach)
        first: Proposal | None = None
        if (is_free(stages.fixer) if ask_first is None else ask_first) and not earlier and (
                self.change is None):
            first, why = _ask_first(_Announced(stages.fixer, stages.progress, stages.cancel),
                                    self.shown(), base)
            if why and not (inputs.setup.device.interpret and raised_in_kernel(group.first)):
                return self.done(HealResult(group.id, UNHEALED, why))
            if why:  # an error the interpreter raised: the baseline may say it is its own
                try:
                    why_not = verifier.triage(verifier.baseline(originals))
                finally:
                    verifier.restore()
                return self.done(replace(_skipped(group, why_not) if why_not else HealResult(
                    group.id, UNHEALED, why), triage=tuple(verifier.phases)))
        try:
            why_not = verifier.triage(verifier.baseline(originals))
            triaged = tuple(verifier.phases)
            if why_not:
                return self.done(replace(_skipped(group, why_not), triage=triaged))
            if earlier:
                healed = _healed_by(group, verifier, base, earlier, stages,
                                    _verified_by(originals, base, winners))
                if healed is not None:
                    return self.done(replace(healed, triage=triaged))
                over = claim()
                if over:
                    return self.done(replace(_skipped(group, over), triage=triaged))
            used, regression = group, None
            if self.change is not None:
                regression = self.experiment(triaged)
                triaged += trial_phases(regression)
                if regression is not None and regression.verdict == TEST_CHANGED:
                    return self.done(HealResult(group.id, DECLINED, f"{regression.summary}: "
                                                "nothing to heal in the kernel", triage=triaged,
                                                regression=regression))
                used = self.after(regression)
            self.shown.note(test_own_failure(verifier))
            self.files = {path: base[path] if path in base else read_originals(
                project.root, [path])[path] for path in used.editable}
            result = self.rounds(first)
            return self.done(replace(result, triage=triaged, regression=regression,
                                     revert=self.reverts(result), editable=used.editable
                                     if used.editable != group.editable else ()))
        finally:
            verifier.restore()

    def experiment(self, triaged: tuple[Phase, ...]) -> Regression | None:
        """The hunks of the change whose revert makes the representative pass."""
        verifier, stages, sandbox = self.verifier, self.stages, self.sandbox
        assert verifier is not None and self.change is not None
        return find_culprits(
            self.change, verifier.first, sandbox, RerunSpec(verifier.setup, sandbox.root, ()),
            runner=stages.runner, project=self.project, exclude=self.exclude,
            say=lambda line: stages.progress(f"  {line}"), jobs=verifier.setup.jobs,
            baseline_seconds=sum(phase.seconds for phase in triaged),
            others=[n for n in verifier.sensitive if n != verifier.first])

    def after(self, regression: Regression | None) -> BugGroup:
        """The bug as the rounds see it after the experiment, and what they are shown:
        with the culprit lines pinned and shown beside the base's after a regression; as
        without a base, plus a note, when the failure is not a regression of the change;
        with the change and what it touched when the experiment could not tell."""
        change, project = self.change, self.project
        assert change is not None
        if regression is not None and regression.verdict == NOT_REGRESSION:
            self.shown.note(f"{regression.summary}: the fault is probably older than the "
                            "change, in the code shown here.")
            return self.group
        culprits = regression.culprits if regression is not None and (
            regression.verdict == REGRESSION) else ()
        used = with_change(self.group, change, project, culprits)
        view = change_view(change, regression, used.editable)
        self.shown.rebuild(lambda group: build_context(
            with_change(group, change, project, culprits), project, device=self.inputs.device,
            checks=self.checks, change=view))
        return used

    def reverts(self, result: HealResult) -> bool:
        """Whether a healed bug's patch only puts back lines of the change."""
        return self.change is not None and result.status == HEALED and reverts_only(
            self.change, result.original, result.final)

    def rounds(self, first: Proposal | None, resume: Resume | None = None) -> HealResult:
        """The round loop of one bug, its lines said as each round ends."""
        stages, inputs = self.stages, self.inputs

        def on_round(record: RoundRecord) -> None:
            edits = ", ".join(e.level for e in record.edits) or "no edits"
            stages.progress(f"  round {record.round} ({edits}): {record.outcome}")

        roots = (*inputs.project.roots, str(self.sandbox.root))

        def tidy(text: str) -> str:
            return clean_log(text, roots)

        assert self.verifier is not None
        return heal(
            self.shown(), self.files,
            fixer=_Announced(stages.fixer, stages.progress, stages.cancel),
            verify=self.verifier, rounds=inputs.settings.rounds, guard=stages.guard,
            on_round=on_round, resolve_need=NeedResolver(inputs.project, self.reach),
            tidy=tidy, first=first, resume=resume, regroup=self.shown,
        )

    def follow(self, result: HealResult) -> HealResult:
        """Until the bug's tests are all known: a healed bug's winner checked on those
        that joined it."""
        assert self.tests is not None
        while True:
            posted, final = self.tests.take()
            if posted is not None and result.status == HEALED:
                result = self.recheck(result, *posted)
            if final:
                return result

    def recheck(self, result: HealResult, group: BugGroup, regression: tuple[str, ...]
                ) -> HealResult:
        """The winner on the bug's grown set of tests (only the new ones rerun); when it
        fails one, the heal goes on from it, its last round rejected, the tests that
        joined shown."""
        verifier = self.verifier
        assert verifier is not None
        if verifier.covers(group.nodeids, regression):  # its winner was verified on them
            return result
        self.stages.progress(f"checking the patch on {len(group.nodeids)} failing and "
                             f"{len(regression)} regression test(s) known now")
        verifier.extend(group, regression)
        verdict = verifier(result.final)  # its child lives on for the next check
        if verdict.ok:
            return still_healed(result, verdict)
        self.stages.progress(f"the patch fails tests known now: {verdict.summary}")
        started = time.monotonic()
        try:
            again = self.rounds(None, Resume(result, verdict))
        finally:
            verifier.restore()
        verified = verifier.passing() if again.status == HEALED else ()
        return replace(again, triage=result.triage, regression=result.regression,
                       revert=self.reverts(again), editable=result.editable,
                       verified=verified,
                       seconds=result.seconds + time.monotonic() - started)


def still_healed(result: HealResult, verdict: Verdict) -> HealResult:
    """``result`` with its winner's check on the grown set of tests added to its last
    round (whose outcome now counts every test)."""
    if not result.rounds:
        return result
    last: RoundRecord = result.rounds[-1]
    checked = replace(last, outcome=verdict.summary, phases=last.phases + verdict.phases)
    return replace(result, rounds=(*result.rounds[:-1], checked))


def trial_phases(regression: Regression | None) -> tuple[Phase, ...]:
    """The experiment's reruns as steps before round 1."""
    if regression is None:
        return ()
    return tuple(Phase(f"culprit search ({len(trial.reverted)} hunk(s) reverted)",
                       trial.tests or (regression.test,), trial.seconds, "ran", trial.outcome)
                 for trial in regression.trials)


#: Seconds between "still waiting" lines while a fixer thinks.
HEARTBEAT = 20.0


class _Announced:
    """A fixer whose every answer is announced, with a line every :data:`HEARTBEAT`
    seconds while it is awaited: a model can take minutes."""

    def __init__(self, fixer: Fixer, progress: Progress, cancel: Cancel | None = None) -> None:
        self.fixer = fixer
        self.progress = progress
        self.cancel = cancel if cancel is not None else Cancel()
        self.name = fixer.name
        self.free = is_free(fixer)

    def propose(self, request: ProposalRequest) -> Proposal:
        self.cancel.check()  # an interrupted session asks no more
        where = f"  round {request.round}"
        self.progress(f"{where}: asking {self.name}")
        started = time.monotonic()
        answered = threading.Event()

        def beat() -> None:
            while not answered.wait(HEARTBEAT):
                self.progress(f"{where}: still waiting for {self.name} "
                              f"({time.monotonic() - started:.0f} s)")

        heart = threading.Thread(target=beat, name="kernelfix-heartbeat", daemon=True)
        heart.start()
        try:
            proposal = self.fixer.propose(request)
        finally:
            answered.set()
            heart.join()
        seconds = time.monotonic() - started
        self.progress(f"{where}: answered from the answer cache, no call ({seconds:.1f} s)"
                      if proposal.usage.cache_hits else f"{where}: answered in {seconds:.1f} s")
        return proposal


def _ask_first(fixer: Fixer, context: BugContext, files: Mapping[str, str]) -> (
    tuple[Proposal | None, str]
):
    """Round 1's answer from a fixer that costs nothing (recipes, a cassette, a hook),
    before any rerun: a bug it cannot answer ends here, with no rerun at all."""
    request = ProposalRequest(context=context, round=1, files=tuple(
        context.view(path, redact(text)) for path, text in files.items()))
    try:
        return fixer.propose(request), ""
    except Exception as error:  # the loop would end the bug the same way
        why = str(error) if isinstance(error, FixerError) else (
            f"the fixer failed: {type(error).__name__}: {error}")
        return None, f"round 1: {why}"


def _verified_by(originals: Mapping[str, str], base: Mapping[str, str],
                 winners: Sequence[Winner]) -> frozenset[str]:
    """The tests an earlier bug's patch was verified passing on, when ``base`` is that
    patch whole (the same files changed, to the same text): they need no second run."""
    change = {path: text for path, text in base.items() if originals.get(path) != text}
    for winner in reversed(winners):
        if winner.change and dict(winner.change) == change:
            return winner.verified
    return frozenset()


def _healed_by(group: BugGroup, verifier: Verifier, base: Mapping[str, str],
               earlier: Sequence[str], stages: Stages,
               verified: frozenset[str] = frozenset()) -> HealResult | None:
    """The bug healed by the patches of earlier bugs (verified like any candidate, on
    the tests the earlier verification did not run), or None: no call, no patch of its
    own."""
    names = ", ".join(earlier)
    stages.progress(f"  trying the patch of {names}, which touches the same files")
    verdict = verifier(base, verified=verified)
    if not verdict.ok:
        stages.progress(f"  not healed by {names}: {verdict.summary}")
        return None
    skipped = sorted(set(verified) & set(verifier.regression))
    notes = verdict.notes + ((f"{len(skipped)} regression test(s) this patch was already "
                              f"verified passing on (for {names}) were not rerun",)
                             if skipped else ())
    record = RoundRecord(0, "earlier patch", (), verdict.summary, phases=verdict.phases,
                         notes=notes)
    return HealResult(group.id, HEALED, f"healed by the patch of {names}: {verdict.summary}",
                      rounds=(record,), original=dict(base), final=dict(base),
                      healed_by=names)


def test_own_failure(verifier: Verifier) -> str:
    """A failure raised in the test's own code by a check that compared no tensor value
    (a shape, a dtype, a length): the test's expectation may be what is wrong."""
    failure = next((f for f in verifier.group.failures if f.nodeid == verifier.first), None)
    base = verifier.base
    line = verifier.sites.get(verifier.first, 0)
    if failure is None or base is None or not line or not failure.error.frames:
        return ""
    if os.path.abspath(failure.error.frames[-1].path) != failure.test_path:
        return ""  # raised in project or library code
    outcome = base.outcome(verifier.first)
    probe = outcome.probe if outcome is not None else None
    site = probe.site(line) if probe is not None else None
    if probe is None or (site is not None and site.reads):
        return ""
    path = failure.test_path
    text = failure.error.frames[-1].line or linecache.getline(path, line).strip()
    return (f"The failing check is the test's own code ({os.path.basename(path)}:{line}: "
            f"`{text}`) and compares no tensor values (a shape, a dtype, a length or a Python "
            "value): the test's expectation may be what is wrong. If the kernel and its "
            "launch code are right, answer with not_a_kernel_bug and say why.")


def _builds_on(result: HealResult, finals: Mapping[str, tuple[str, str]]) -> tuple[str, ...]:
    """The earlier bugs whose patched text this bug's patch starts from."""
    return tuple(dict.fromkeys(
        bug for path, (bug, text) in finals.items()
        if path in result.changed_files and result.original.get(path) == text))


def finish(
    inputs: SessionInputs, results: Sequence[tuple[BugGroup, HealResult]], seconds: float,
    *, reruns: Mapping[int, RerunStats], workers: int, interrupted: str = "",
) -> SessionReport:
    """The session's report (apply mode writes the tree from it afterwards).

    ``reruns`` holds each bug's rerun statistics by its index in ``results``;
    ``interrupted`` says what stopped the session early (``Ctrl-C``, ``SIGTERM``), if
    anything did.
    """
    settings = inputs.settings
    bugs = []
    finals: dict[str, tuple[str, str]] = {}  # path -> (bug, text its patch leaves)
    for index, (group, result) in enumerate(results):
        builds_on = _builds_on(result, finals) if result.status == HEALED else ()
        if result.status == HEALED:
            finals.update((path, (group.id, result.final[path]))
                          for path in result.changed_files)
        keep = result.status in (HEALED, MASKED) and bool(result.patch)
        patch = patch_name(group, result.status) if keep else ""
        bugs.append(BugReport(group, result, patch, reruns=reruns.get(index, RerunStats()),
                              builds_on=builds_on))
    return SessionReport(
        bugs=tuple(bugs),
        rootdir=inputs.project.root,
        report_dir=settings.report_dir,
        mode="apply" if settings.apply else "report",
        device=inputs.device,
        model=settings.model,
        seconds=seconds,
        notes=inputs.notes + ((interrupted_note(interrupted, results),) if interrupted else ()),
        workers=workers,
        interrupted=bool(interrupted),
        max_cost=settings.max_cost,
        max_tokens=settings.max_tokens,
        unselected=inputs.unselected,
        select=settings.select,
    )


def interrupted_note(why: str, results: Sequence[tuple[BugGroup, HealResult]]) -> str:
    """What an interrupted session kept and what it left, in one sentence."""
    healed = sum(1 for _, result in results if result.status == HEALED)
    stopped = sum(1 for _, result in results
                  if result.status != HEALED and f"({why})" in result.reason)
    return (f"the session was interrupted ({why}): {healed} bug(s) healed before it keep "
            f"their patches; {stopped} bug(s) were stopped or not started")
