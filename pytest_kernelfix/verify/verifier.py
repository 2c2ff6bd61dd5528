"""Judge a candidate by experiment: write it into the sandbox, order its reruns, judge.

Staged, so that a heal costs about one more run of the failing tests whatever their
number (``--kernelfix-verify staged``, the default). Each phase runs only when the ones
before it passed, and the first that rejects the candidate ends its verification:

1. **representative**: the cheapest failing test (:mod:`pytest_kernelfix.verify.sample`),
   its launches fingerprinted;
2. **failing**: the bug's other failing tests (a rerun stops at the first that still
   fails); a candidate that only masks the kernel's unchanged output stops here
   (:mod:`pytest_kernelfix.verify.masks`);
3. **regression**: the tests that passed before and use the files the bug may edit; one
   that fails is rerun on the original code, and it counts only if it passes there;
4. **sensitivity**: a few diverse failing tests with every project kernel's output
   poisoned (NaN, then scrambled values), their checks guarded so that each one runs:
   the tests, and the very check each failed at, must fail
   (:mod:`pytest_kernelfix.verify.sensitivity`); between the two, the first test with
   only the kernel its failure was attributed to poisoned.

The phases of one candidate run in one rerun child where the runner can open one
(:meth:`~pytest_kernelfix.rerun.runner.Reruns.open`): it collects, runs the conftest
files and imports the sandbox once, and each phase runs in a process forked from it
right after collection, so nothing one phase leaves behind reaches the next
(:mod:`pytest_kernelfix.rerun.phased`). The runs on the original code share a child of
their own. The poisoned phases then run one after another in that child (NaN, the
attributed kernel, scrambled values), the first that rejects ending the verification.

Before round 1 the unpatched code is rerun on the representative only (the baseline, read
by :mod:`pytest_kernelfix.verify.triage`); what the test run recorded stands for the
rest. What is known only from the original code (regression tests that fail there too,
integrity findings of the suite itself, which kernel a failed check reads) is measured
when a candidate's verdict would depend on it, not before. ``--kernelfix-verify thorough``
runs every failing test at each step instead (the baseline and the regression set up
front, the poisoned reruns on every failing test).
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from pytest_kernelfix.config import VERIFY_MODES
from pytest_kernelfix.fanout import fan_out
from pytest_kernelfix.heal.analysis import masking
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.locate.signals import expects_raise
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun.launcher import RerunSetup, RerunSpec
from pytest_kernelfix.rerun.plan import POISON_MODES, ProbePlan
from pytest_kernelfix.rerun.probes.checks import failing_site
from pytest_kernelfix.rerun.report import ChildReport, RerunResult, TestOutcome, merge_results
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.verify import sample
from pytest_kernelfix.verify.judge import (
    Expectations,
    integrity_findings,
    integrity_verdict,
    judge,
    still_failing,
)
from pytest_kernelfix.verify.masks import kernel_output_unchanged, masked_verdict
from pytest_kernelfix.verify.sensitivity import (
    BYPASS,
    DOUBT,
    UNCERTIFIABLE,
    UNMEASURED,
    Judgement,
    Runs,
    judge_kernel,
    judge_poisoned,
    poisoned_runs,
)
from pytest_kernelfix.verify.triage import CUDA_SHIM_LIMITATION, triage
from pytest_kernelfix.verify.workspace import Workspace
from pytest_kernelfix.vocabulary import Phase, StepOutcome, Verdict, VerdictKind, phase_text

#: Verdicts on the failing tests that the regression set may still overrule, as it would
#: in one combined rerun (:func:`judge` reaches them after the regression check). An
#: integrity finding is not among them: a candidate that changed what the tests check is
#: rejected for that, whatever the regression set says, so it costs no second rerun.
_JUDGED_AFTER_REGRESSION = (VerdictKind.PASSED, VerdictKind.BYPASS, VerdictKind.GATE)

#: Kernels tried, last launched first, to find which one a failed check reads.
_ATTRIBUTION_TRIES = 3

_PLAIN = ProbePlan()
_FINGERPRINT = ProbePlan(fingerprint=True)
#: The baseline: fingerprinted, and every check run, so that the original's outcome of
#: each run of a check is known (:func:`~pytest_kernelfix.verify.sensitivity.check_passed`).
_BASELINE = ProbePlan(fingerprint=True, reach=True)

Runner = Callable[[RerunSpec], RerunResult]
Say = Callable[[str], None]


class Child(Protocol):
    """A rerun child that collected its tests once and runs phases on request
    (:class:`~pytest_kernelfix.rerun.phased.PhasedChild`)."""

    def run(self, spec: RerunSpec, name: str = "") -> RerunResult | None: ...

    def close(self) -> None: ...


class Opener(Protocol):
    """A runner that can also open phased children (``Reruns.open``)."""

    def open(self, setup: RerunSetup, sandbox_root: Path, nodeids: Sequence[str]
             ) -> Child | None: ...


class _Rejected(Exception):
    """A phase's verdict ends the verification (raised inside :meth:`Verifier._verify`)."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.summary)
        self.verdict = verdict


class Verifier:
    """Reruns one bug's tests (and its regression set) on candidates, in one sandbox.

    Called with a candidate (path -> text), it returns the :class:`Verdict`, whose
    ``phases`` say which tests each step ran. ``say`` receives a line as each phase
    starts and ends.
    """

    def __init__(self, sandbox: Sandbox, setup: RerunSetup, group: BugGroup, project: Project,
                 *, regression: Sequence[str] = (), runner: Runner, mode: str = "staged",
                 say: Say = lambda line: None) -> None:
        if mode not in VERIFY_MODES:
            raise ValueError(f"unknown verify mode {mode!r}: not one of {VERIFY_MODES}")
        self.setup = setup
        self.group = group
        self.runner = runner
        self.mode = mode
        self.say = say
        self.nodeids = group.nodeids
        self.regression = tuple(n for n in regression if n not in self.nodeids)
        #: Regression tests known to fail on the original code too: not regressions.
        self.broken_before: set[str] = set()
        #: Regression tests known to pass on the original code.
        self.passed_before: set[str] = set()
        #: Tests a candidate must still launch a kernel in: not one that expected an
        #: exception, whose fix is to raise before the launch.
        self.launched = frozenset(f.nodeid for f in group.failures
                                  if f.launches and not expects_raise(f))
        self.baseline_findings: frozenset[str] = frozenset()
        self.project = project
        self.workspace = Workspace(sandbox, project.protected_files(
            f.test_path for f in group.failures))
        self.sandbox = sandbox
        self.originals: Mapping[str, str] = {}
        self.first = sample.representative(group)
        #: The line of the check each failing test failed at, on the original code.
        self.sites = {f.nodeid: failing_site([(fr.path, fr.lineno) for fr in f.error.frames],
                                             f.test_path) for f in group.failures}
        self.base: RerunResult | None = None  # the representative on the original code
        self._attributed: tuple[str, ...] | None = None
        #: The runs of the failed check that read the attributed kernel's output.
        self._reading: Runs = frozenset()
        self._seen: set[str] = set()  # tests whose findings on the original code are known
        self._verified: frozenset[str] = frozenset()  # passed on this candidate elsewhere
        self.phases: list[Phase] = []
        #: The open phased children: "original" (the bug's), "candidate" (this one's).
        self._children: dict[str, Child | None] = {}
        #: Outcomes already measured, per candidate and probe (:meth:`remember`).
        self.known: dict[tuple[str, ProbePlan], dict[str, tuple[TestOutcome, RerunResult]]] | None
        self.known = None
        self._code = ""  # the digest of the candidate being verified
        self._child_code = ""  # the candidate whose child stays open (outcomes kept)
        self._lock = threading.Lock()
        self._grown: tuple[BugGroup, tuple[str, ...]] | None = None
        #: The failing and regression tests of the last verification that ran to its end.
        self._verified_with: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())

    @property
    def thorough(self) -> bool:
        return self.mode == "thorough"

    @property
    def sensitive(self) -> tuple[str, ...]:
        """The failing tests the poisoned reruns use."""
        if self.thorough:
            return self.nodeids
        return sample.diverse(self.nodeids, self.first)

    def expectations(self, *, regression: Sequence[str] = ()) -> Expectations:
        """What a rerun must show: the bug's failing tests pass, ``regression`` too."""
        return Expectations(
            failing=self.nodeids,
            regression=tuple(regression),
            launched=self.launched | frozenset(self.regression),
            allowed_findings=self.baseline_findings,
            timeout=self.setup.timeout,
            gate_target=self.setup.device.gate_target,
        )

    # -- failures that arrive later (healing while the tests run) ---------------------

    def remember(self) -> None:
        """Keep every outcome a candidate's clean rerun measured, so that verifying the
        same candidate again (after :meth:`extend`) reruns only the tests it has not run
        yet with that probe: an outcome of a test does not depend on the tests run beside
        it (the split of a rerun across children already relies on that)."""
        if self.known is None:
            self.known = {}

    def extend(self, group: BugGroup, regression: Sequence[str]) -> None:
        """The bug has more failing tests (``group``, a superset) or more regression tests
        than when this verifier was made: the next verification covers them. Safe to call
        from another thread; it takes effect when the next verification starts. The
        representative, the baseline and what was measured on the original code stay."""
        with self._lock:
            self._grown = (group, tuple(regression))

    def covers(self, failing: Sequence[str], regression: Sequence[str]) -> bool:
        """Whether the last verification that ran to its end covered these tests."""
        done_failing, done_regression = self._verified_with
        return set(failing) <= done_failing and set(regression) <= done_regression

    def retune(self, setup: RerunSetup) -> None:
        """Rerun with ``setup`` from now on (the same suite: other jobs, priority)."""
        self.setup = setup

    def _grow(self) -> None:
        with self._lock:
            grown, self._grown = self._grown, None
        if grown is None:
            return
        group, regression = grown
        self.group = group
        self.nodeids = group.nodeids
        self.regression = tuple(n for n in regression if n not in self.nodeids)
        self.launched = frozenset(f.nodeid for f in group.failures if f.launches)
        self.sites = {**{f.nodeid: failing_site([(fr.path, fr.lineno) for fr in f.error.frames],
                                                f.test_path) for f in group.failures},
                      **self.sites}
        self.workspace.protect(self.project.protected_files(
            f.test_path for f in group.failures))

    def restore(self) -> None:
        """Put the original bytes back for every file this verifier wrote; end its
        children."""
        self._close()
        self.workspace.restore()

    def _close(self, *kinds: str) -> None:
        for kind in kinds or tuple(self._children):
            child = self._children.pop(kind, None)
            if child is not None:
                child.close()

    # -- running ---------------------------------------------------------------------

    def _run(self, name: str, nodeids: Sequence[str], *, probe: ProbePlan = _PLAIN,
             stop_early: bool = False, setup: RerunSetup | None = None,
             candidate: bool = True) -> RerunResult:
        """One phase's rerun, said as it starts and ends; a candidate's run that wrote
        test or data files is a rejection (the original code's runs are not judged)."""
        spec = self._spec(name, nodeids, probe, stop_early, setup)
        started = time.monotonic()
        if self.known is not None and candidate and setup is None:
            result = self._run_unknown(spec, name)
        else:
            result = self._fresh(spec, name, candidate and setup is None)
        return self._settle(name, spec.nodeids, time.monotonic() - started, result, candidate)

    def _fresh(self, spec: RerunSpec, name: str, candidate: bool) -> RerunResult:
        in_child = self._in_child(spec, name, candidate) if spec.setup is self.setup else None
        return in_child if in_child is not None else self.runner(spec)

    def _run_unknown(self, spec: RerunSpec, name: str) -> RerunResult:
        """Rerun only the tests this candidate has not run with this probe, and give
        back the result of all of them, in order (see :meth:`remember`)."""
        assert self.known is not None
        known = self.known.setdefault((self._code, spec.probe), {})
        todo = tuple(n for n in spec.nodeids if n not in known)
        fresh = self._fresh(replace(spec, nodeids=todo), name, True) if todo else None
        if fresh is not None and clean(fresh):
            for outcome in fresh.outcomes:
                if spec.probe.poison or outcome.outcome == "passed":
                    known[outcome.nodeid] = (outcome, fresh)
        measured = {o.nodeid: o for o in fresh.outcomes} if fresh is not None else {}
        outcomes = tuple(measured[n] if n in measured else known[n][0]
                         for n in spec.nodeids if n in measured or n in known)
        earlier = {id(run): run for n in spec.nodeids if n in known and n not in measured
                   for run in (known[n][1],)}
        base = fresh if fresh is not None else RerunResult((), 0, mode="fork", started=0)
        report = functools.reduce(ChildReport.merged,
                                  [run.report for run in earlier.values()] + [base.report])
        return replace(base, outcomes=outcomes, report=report)

    @property
    def _phased(self) -> bool:
        """Whether the runner opens phased children (else every phase is a rerun); a
        wrapper of another runner says so in ``can_open``."""
        return callable(getattr(self.runner, "open", None)) and bool(
            getattr(self.runner, "can_open", True))

    def _in_child(self, spec: RerunSpec, name: str, candidate: bool) -> RerunResult | None:
        """The rerun as a phase of the child of the code in the sandbox (the candidate's,
        or the original's), opened on first use; None where there is none or it cannot
        run these tests (then it is a rerun of its own). With outcomes kept
        (:meth:`remember`) the candidate's child collects whole test files and lives on
        while the candidate is checked again; one that lacks a new test is replaced."""
        if not self._phased:
            return None
        kind = "candidate" if candidate else "original"
        for attempt in (1, 2):
            if kind not in self._children:
                self._children[kind] = self._open(candidate)
            child = self._children[kind]
            result = child.run(spec, name) if child is not None else None
            if result is not None or attempt == 2 or not candidate or self.known is None:
                return result
            self._close(kind)  # collected before these tests failed: collect them now
        return None

    def _open(self, candidate: bool) -> Child | None:
        collect = self.nodeids + (self._kept() if candidate or self.thorough else ())
        if candidate and self.known is not None:
            collect = tuple(dict.fromkeys(nodeid.partition("::")[0] for nodeid in collect))
            self._child_code = self._code
        opener: Opener = self.runner  # type: ignore[assignment]
        return opener.open(self.setup, self.sandbox.root, collect)

    def _spec(self, name: str, nodeids: Sequence[str], probe: ProbePlan = _PLAIN,
              stop_early: bool = False, setup: RerunSetup | None = None) -> RerunSpec:
        self.say(f"{name}: running {len(tuple(nodeids))} test(s)")
        return RerunSpec(setup or self.setup, self.sandbox.root, tuple(nodeids), probe=probe,
                         stop_early=stop_early)

    def _together(self, runs: Sequence[tuple[str, Sequence[str], ProbePlan]], *,
                  candidate: bool = True) -> Iterator[RerunResult]:
        """Independent reruns of the same code, settled in the order given: one after
        another in the code's phased child, or when outcomes are kept (a caller that stops
        reading runs no more), else at the same time (each child a process of its own)."""
        if self._phased or self.known is not None:
            for name, nodeids, probe in runs:
                yield self._run(name, nodeids, probe=probe, candidate=candidate)
            return
        specs = [self._spec(name, nodeids, probe) for name, nodeids, probe in runs]

        def timed(spec: RerunSpec) -> tuple[RerunResult, float]:
            started = time.monotonic()
            return self.runner(spec), time.monotonic() - started

        done = fan_out(timed, specs, workers=max(1, self.setup.jobs),  # the cores reruns may use
                       name="kernelfix-probe")
        yield from [self._settle(name, spec.nodeids, ran[1], ran[0], candidate)
                    for (name, _, _), spec, ran in zip(runs, specs, done, strict=True)
                    if ran is not None]  # each ran: only an error stops this fan-out

    def _settle(self, name: str, nodeids: tuple[str, ...], seconds: float,
                result: RerunResult, candidate: bool = True) -> RerunResult:
        tampered = self.workspace.tampered() if candidate else ()
        if tampered:
            self.workspace.undo(tampered)
            self._record(name, nodeids, seconds, VerdictKind.TAMPERED)
            raise _Rejected(Verdict(
                False, f"the rerun changed test or data files: {', '.join(tampered)}",
                "Running the patched code changed files it must not touch: "
                + ", ".join(tampered), kind=VerdictKind.TAMPERED))
        results = tally(result, nodeids)
        self._record(name, nodeids, seconds, StepOutcome.RAN, results)
        self.say(f"{name}: {results} ({seconds:.1f} s)")
        return result

    def _record(self, name: str, nodeids: tuple[str, ...], seconds: float,
                outcome: VerdictKind | StepOutcome, results: str = "") -> None:
        self.phases.append(Phase(name, nodeids, round(seconds, 3), outcome, results))

    def _decide(self, verdict: Verdict, name: str = "") -> Verdict:
        """Mark the last phase (or the last one called ``name``) with the verdict's kind,
        and say how the step ended beside how its tests did (:func:`phase_text`)."""
        for index in range(len(self.phases) - 1, -1, -1):
            if not name or self.phases[index].name == name:
                outcome = verdict.kind or StepOutcome.RAN
                self.phases[index] = replace(self.phases[index], outcome=outcome)
                self.say(phase_text(self.phases[index]))
                break
        return verdict

    def _on_originals(self, candidate: Mapping[str, str], step: Callable[[], object]) -> None:
        """Run ``step`` with the original code in the sandbox, then the candidate again."""
        self.workspace.write(self.originals)
        try:
            step()
        finally:
            self.workspace.write(candidate)

    # -- before round 1 --------------------------------------------------------------

    def baseline(self, originals: Mapping[str, str]) -> RerunResult:
        """Rerun the unpatched code: does the failure reproduce? Staged: the representative
        only, unless it passes (then every failing test, and the first that still fails
        becomes the representative); thorough: every failing and regression test."""
        self.originals = dict(originals)
        self.workspace.write(originals)
        self.phases = []
        if self.thorough:
            result = as_run(self._run("baseline", self.nodeids + self.regression,
                                      probe=_BASELINE, candidate=False))
            self.passed_before = {n for n in self.regression if result.passed([n])}
            self.broken_before = set(self.regression) - self.passed_before
        else:
            result = as_run(self._run("baseline", (self.first,), probe=_BASELINE,
                                      candidate=False))
            if result.passed([self.first]) and len(self.nodeids) > 1:
                result = as_run(self._run("baseline", self.nodeids, probe=_BASELINE,
                                          candidate=False))
                self.first = next((n for n in self.nodeids if result.outcome(n) is not None
                                   and not result.passed([n])), self.first)
        self.base = result
        self.baseline_findings = integrity_findings(result)
        self._seen = {o.nodeid for o in result.outcomes}
        return result

    def triage(self, baseline: RerunResult) -> str:
        """Why the bug behind ``baseline`` is not the kernel's to heal, or "" (see
        :func:`~pytest_kernelfix.verify.triage.triage`); with the CUDA shim off, a failure
        that passes once it is on is the CPU mapping's."""
        device = self.setup.device
        ran = tuple(n for n in self.nodeids if baseline.outcome(n) is not None) or (self.first,)
        failure = next((f for f in self.group.failures if f.nodeid == self.first),
                       self.group.first)
        why_not = triage(baseline, failure, ran, device)
        if why_not or not device.interpret or device.cuda_shim:
            return why_not
        setup = replace(self.setup, device=replace(device, cuda_shim=True))
        shimmed = self._run("triage with the CUDA shim", (self.first,), setup=setup,
                            stop_early=True, candidate=False)
        return CUDA_SHIM_LIMITATION if shimmed.passed([self.first]) else ""

    # -- a candidate -----------------------------------------------------------------

    def __call__(self, candidate: Mapping[str, str], *,
                 verified: Collection[str] = ()) -> Verdict:
        """The verdict on ``candidate``. ``verified``: regression tests already verified
        passing on this very candidate (an earlier bug's patch, when it is the whole
        change): they are not rerun."""
        self._grow()
        self.phases = []
        self._verified = frozenset(verified)
        self._code = digest(candidate)
        if self._child_code != self._code:  # another candidate's child is of no use
            self._close("candidate")
        self.workspace.write(candidate)
        tampered = self.workspace.tampered()
        if tampered:
            return Verdict(False, f"test files changed: {', '.join(tampered)}",
                           kind=VerdictKind.TAMPERED)
        try:
            verdict = self._verify(candidate)
        except _Rejected as rejected:
            verdict = rejected.verdict
        finally:
            if self.known is None:
                self._close("candidate")
        self._verified_with = (frozenset(self.nodeids),
                               frozenset(self.regression) | frozenset(self.nodeids))
        return replace(verdict, phases=tuple(self.phases))

    def _verify(self, candidate: Mapping[str, str]) -> Verdict:
        staged = not self.thorough and len(self.nodeids) > 1
        result = self._representative(candidate) if staged else None
        masked = self._masked(candidate, result) if result is not None else None
        if masked is not None:
            return self._decide(masked)
        verdict, result = self._rest(candidate, result)
        if not verdict.ok:
            return verdict
        masked = None if staged else self._masked(candidate, result)
        if masked is not None:
            return self._decide(masked)
        return self._sensitivity(candidate, verdict)

    def _judge(self, candidate: Mapping[str, str], result: RerunResult,
               regression: Sequence[str] = ()) -> Verdict:
        """:func:`judge`, after learning the original code's integrity findings in tests
        the baseline did not run, when the verdict would otherwise blame the candidate."""
        verdict = judge(result, self.expectations(regression=regression))
        if verdict.kind is VerdictKind.INTEGRITY and self._learn_findings(candidate, result):
            verdict = judge(result, self.expectations(regression=regression))
        return verdict

    def _learn_findings(self, candidate: Mapping[str, str], result: RerunResult) -> bool:
        """Rerun on the original code the tests with findings never measured there; True
        when the original code has some of them too."""
        unseen = tuple(o.nodeid for o in result.outcomes if o.nodeid not in self._seen
                       and set(o.integrity) - self.baseline_findings)
        if not unseen:
            return False
        known = self.baseline_findings

        def measure() -> None:
            found = self._run("integrity on the original code", unseen, candidate=False)
            self.baseline_findings |= integrity_findings(found)
            self._seen.update(unseen)

        self._on_originals(candidate, measure)
        return self.baseline_findings != known

    def _representative(self, candidate: Mapping[str, str]) -> RerunResult:
        """The cheapest failing test first: a candidate that does not fix it goes no
        further."""
        first = self._run("representative", (self.first,), probe=_FINGERPRINT,
                          stop_early=True)
        verdict = self._judge(candidate, first)
        if verdict.kind is VerdictKind.FAILING and not first.passed([self.first]):
            raise _Rejected(self._decide(still_failing(first, self.nodeids, self.nodeids)))
        if verdict.kind not in (*_JUDGED_AFTER_REGRESSION, VerdictKind.FAILING):
            raise _Rejected(self._decide(verdict))
        self._decide(Verdict(True, "passes"))
        return first

    def _masked(self, candidate: Mapping[str, str], failing: RerunResult) -> Verdict | None:
        """A candidate that makes the tests pass only by masking the kernel's output,
        which is unchanged: measured (same launch inputs and outputs as on the original)
        where the launches can be compared, else read from the code."""
        found = masking(self.originals, candidate)
        if not found.only_masks or self.base is None:
            return None
        unchanged = kernel_output_unchanged(self.base, failing, self.first,
                                            self._attributed or ())
        if unchanged is False or (unchanged is None and not found.kernel_unchanged):
            return None
        return masked_verdict(found.statements, measured=unchanged is True)

    def _kept(self) -> tuple[str, ...]:
        return tuple(n for n in self.regression
                     if n not in self.broken_before and n not in self._verified)

    def passing(self) -> tuple[str, ...]:
        """The tests the last accepted candidate was verified passing on: the failing
        tests and the regression set, less the tests that fail on the original code."""
        return (*self.nodeids, *(n for n in self.regression if n not in self.broken_before))

    def _rest(self, candidate: Mapping[str, str], result: RerunResult | None
              ) -> tuple[Verdict, RerunResult]:
        """The failing tests not run yet and the regression set, in one rerun that stops
        at the first test that fails (failing tests first). A regression test that fails
        is checked on the original code; one that fails there too is no regression, and
        the tests the stopped rerun never reached run next."""
        name = "failing tests and regression" if self._kept() else "failing tests"
        pending = tuple(n for n in self.nodeids if result is None or result.outcome(n) is None)
        pending += self._kept()
        probe = _FINGERPRINT if self.first in pending else _PLAIN
        while True:
            run = self._run(name, pending, probe=probe, stop_early=True)
            result = run if result is None else merge_results(result, run)
            verdict = self._judge(candidate, result, self._kept())
            broken = [n for n in pending if n in self.regression
                      and run.outcome(n) is not None and not run.passed([n])]
            unknown = [n for n in broken if n not in self.passed_before]
            if verdict.kind is not VerdictKind.REGRESSION or not unknown:
                return self._decide(verdict), result
            self._on_originals(candidate, functools.partial(self._check_before, unknown))
            if not set(unknown) & self.broken_before:
                return self._decide(verdict, name), result
            result = replace(result, outcomes=tuple(o for o in result.outcomes
                                                    if o.nodeid not in self.broken_before))
            pending, name, probe = tuple(n for n in self._kept() if run.outcome(n) is None), \
                "regression", _PLAIN
            if not pending:
                return self._decide(self._judge(candidate, result, self._kept())), result

    def _check_before(self, nodeids: Sequence[str]) -> None:
        """Which of these regression tests pass on the original code."""
        result = self._run("regression on the original code", nodeids, candidate=False)
        for nodeid in nodeids:
            (self.passed_before if result.passed([nodeid]) else self.broken_before).add(nodeid)

    def _sensitivity(self, candidate: Mapping[str, str], passed: Verdict) -> Verdict:
        """Poisoned reruns, every check guarded (reach mode), run at the same time and
        judged in order: NaN on a few failing tests, the first with only the kernel its
        failed check reads poisoned, then scrambled values."""
        reps = self.sensitive
        sites = {n: self.sites.get(n, 0) for n in reps}
        before = {n: self.before(n) for n in reps}
        kernels = self.attributed(candidate)
        runs = [(f"sensitivity ({mode})", reps, ProbePlan(poison=mode, reach=True))
                for mode in POISON_MODES]
        runs[1:1] = [(f"sensitivity (nan, only {kernel.rpartition('::')[2]})", (self.first,),
                      ProbePlan(poison="nan", kernels=(kernel,), reach=True))
                     for kernel in kernels]
        notes: list[str] = []
        for (name, _, probe), result in zip(runs, self._together(runs), strict=False):
            unmeasured = False
            if probe.kernels:
                verdict = self._per_kernel(result, probe.kernels[0], notes)
            else:
                judgement = judge_poisoned(result, reps, probe.poison, sites, before)
                verdict = self._poisoned(judgement, result) or Verdict(True, judgement.summary)
                unmeasured = judgement.state == UNMEASURED
            self._decide(verdict, name)
            if not verdict.ok:
                return verdict
            if unmeasured:  # nothing was poisoned: the other poisons measured nothing either
                notes.append(judgement.summary)
                break
        summary = passed.summary + (f"; {notes[0]}" if notes else
                                    "; the tests fail once the kernel's output is poisoned")
        return replace(passed, summary=summary, notes=passed.notes + tuple(notes[1:]))

    def _poisoned(self, judgement: Judgement, result: RerunResult) -> Verdict | None:
        """The rejection a poisoned rerun makes, if any."""
        changed = integrity_verdict(result, self.baseline_findings)
        if changed is not None:
            return changed
        if judgement.state == BYPASS:
            return Verdict(False, judgement.summary, judgement.feedback,
                           kind=VerdictKind.INSENSITIVE)
        if judgement.state == UNCERTIFIABLE:
            return Verdict(False, judgement.summary, judgement.summary,
                           kind=VerdictKind.UNCERTIFIABLE)
        return None

    def before(self, nodeid: str) -> str:
        """How each run of the check ``nodeid`` failed at ended on the original code
        (``PFF``), where the baseline ran it; "" where it did not."""
        outcome = self.base.outcome(nodeid) if self.base is not None else None
        if outcome is None or outcome.probe is None:
            return ""
        site = outcome.probe.site(self.sites.get(nodeid, 0))
        return site.outcomes if site is not None else ""

    def attributed(self, candidate: Mapping[str, str]) -> tuple[str, ...]:
        """The kernel the representative's failed check reads on the original code: of
        the kernels it launched, the last launched whose NaN output reaches a run of
        that check that failed (measured once per bug, on the original code)."""
        if self._attributed is not None:
            return self._attributed
        self._attributed = ()
        line = self.sites.get(self.first, 0)
        outcome = self.base.outcome(self.first) if self.base is not None else None
        if not line or outcome is None or outcome.probe is None:
            return ()
        kernels = list(dict.fromkeys(f.kernel for f in reversed(outcome.probe.fingerprints)))
        if len(kernels) < 2:  # poisoning the one kernel is what the NaN rerun does already
            return ()

        def find() -> None:  # every try at once; the last launched that reaches it wins
            tries = kernels[:_ATTRIBUTION_TRIES]
            results = self._together(
                [(f"attribution ({kernel.rpartition('::')[2]})", (self.first,),
                  ProbePlan(poison="nan", kernels=(kernel,), reach=True)) for kernel in tries],
                candidate=False)
            before = self.before(self.first)
            for kernel, result in zip(tries, results, strict=True):
                runs = poisoned_runs(result, self.first, line, before)
                if runs is None or runs:
                    self._attributed, self._reading = (kernel,), runs
                    return

        self._on_originals(candidate, find)
        return self._attributed

    def _per_kernel(self, result: RerunResult, kernel: str, notes: list[str]) -> Verdict:
        """With only the attributed kernel poisoned, the first test's failed check must
        fail again; a kernel no longer launched is a note."""
        name = kernel.rpartition("::")[2]
        outcome = result.outcome(self.first)
        if outcome is not None and outcome.probe is not None and not outcome.probe.poisoned:
            notes.append(f"{name}, the kernel the failure was attributed to, wrote nothing the "
                         "candidate's tests read (it is no longer launched, or its output is "
                         "not used)")
            return Verdict(True, "not launched")
        judgement = judge_kernel(result, {self.first: self.sites.get(self.first, 0)}, kernel,
                                 {self.first: self.before(self.first)},
                                 {self.first: self._reading})
        if judgement.state == BYPASS:
            return Verdict(False, judgement.summary, judgement.feedback,
                           kind=VerdictKind.INSENSITIVE)
        if judgement.state == DOUBT:  # never a refusal: said beside the verdict
            notes.append(judgement.summary)
        return Verdict(True, judgement.summary)


def digest(files: Mapping[str, str]) -> str:
    """What identifies a candidate: its files' paths and texts."""
    data = hashlib.sha256()
    for path in sorted(files):
        data.update(path.encode() + b"\0" + files[path].encode() + b"\0")
    return data.hexdigest()


def clean(result: RerunResult) -> bool:
    """A rerun that ended by itself and said everything: its outcomes stand alone."""
    return not (result.timed_out or result.signal or result.collection_errors
                or result.report_error or result.report.integrity_error or result.running)


def as_run(result: RerunResult) -> RerunResult:
    """A rerun whose checks were guarded (reach mode), read as a plain one: a test with a
    failed check failed, as it would have without the guards."""
    return replace(result, outcomes=tuple(
        replace(o, outcome="failed") if o.outcome == "passed" and o.probe is not None
        and o.probe.check_failed else o for o in result.outcomes))


def tally(result: RerunResult, nodeids: Sequence[str]) -> str:
    """``3 passed, 1 failed, 2 not run``: how a rerun's tests ended (a guarded check that
    failed counts as a failure), and how the run itself ended when it did not finish."""
    counts: dict[str, int] = {}
    for outcome in as_run(result).outcomes:
        counts[outcome.outcome] = counts.get(outcome.outcome, 0) + 1
    missing = len(result.missing(nodeids))
    words = [f"{count} {kind}" for kind, count in counts.items()]
    words += [f"{missing} not run"] if missing else []
    if result.timed_out:
        words.append("timed out")
    elif result.signal:
        words.append(f"died with {result.signal}")
    return ", ".join(words) or "no outcome"
