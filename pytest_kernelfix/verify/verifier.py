"""Judge a candidate by experiment: write it into the sandbox, order its reruns, judge.

Before round 1 the unpatched code is rerun once (the baseline, read by
:mod:`pytest_kernelfix.verify.triage`). After that a candidate passes only when every
failing test of the bug passes, no test that passed before breaks, the tests still
launch a Triton kernel, nothing the tests check with was changed while they ran, the
rerun neither crashed nor hung (all read by :func:`~pytest_kernelfix.verify.judge.judge`),
no test or data file was written, and, last, the failing tests fail again once the
kernel's output is poisoned (:mod:`pytest_kernelfix.verify.sensitivity`): only then does
the result come from the kernel.

A candidate's failing tests run first, and that rerun stops at the first one that still
fails (most candidates fail; the rest would only repeat it); the regression set runs in
a second rerun only once they all pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from pytest_kernelfix.heal.outcomes import Verdict, VerdictKind
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun.launcher import RerunSetup, RerunSpec
from pytest_kernelfix.rerun.plan import POISON_MODES
from pytest_kernelfix.rerun.report import RerunResult, merge_results
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.verify.judge import Expectations, integrity_findings, integrity_verdict, judge
from pytest_kernelfix.verify.sensitivity import BYPASS, UNMEASURED, judge_poisoned
from pytest_kernelfix.verify.triage import CUDA_SHIM_LIMITATION, triage
from pytest_kernelfix.verify.workspace import Workspace

#: Verdicts on the failing tests that the regression set may still overrule, as it would
#: in one combined rerun (:func:`judge` reaches them after the regression check). An
#: integrity finding is not among them: a candidate that changed what the tests check is
#: rejected for that, whatever the regression set says, so it costs no second rerun.
_JUDGED_AFTER_REGRESSION = (VerdictKind.PASSED, VerdictKind.BYPASS, VerdictKind.GATE)

Runner = Callable[[RerunSpec], RerunResult]


class Verifier:
    """Reruns one bug's tests (and its regression set) on candidates, in one sandbox.

    Called with a candidate (path -> text), it returns the :class:`Verdict`.
    """

    def __init__(self, sandbox: Sandbox, setup: RerunSetup, group: BugGroup, project: Project,
                 *, regression: Sequence[str] = (), runner: Runner) -> None:
        self.setup = setup
        self.group = group
        self.runner = runner
        self.nodeids = group.nodeids
        self.regression = tuple(n for n in regression if n not in self.nodeids)
        self.regression_baseline: frozenset[str] = frozenset(self.regression)
        self.launched = frozenset(f.nodeid for f in group.failures if f.launches)
        self.baseline_findings: frozenset[str] = frozenset()
        self.workspace = Workspace(sandbox, project.protected_files(
            f.test_path for f in group.failures))
        self.sandbox = sandbox

    def expectations(self, *, regression: bool = True) -> Expectations:
        """What a rerun must show: with ``regression``, the regression set's tests too."""
        kept = tuple(sorted(self.regression_baseline)) if regression else ()
        return Expectations(
            failing=self.nodeids,
            regression=kept,
            launched=self.launched | self.regression_baseline,
            allowed_findings=self.baseline_findings,
            timeout=self.setup.timeout,
            gate_target=self.setup.device.gate_target,
        )

    def _spec(self, nodeids: tuple[str, ...], setup: RerunSetup | None = None, *,
              stop_early: bool = False, poison: str = "") -> RerunSpec:
        return RerunSpec(setup or self.setup, self.sandbox.root, nodeids, poison=poison,
                         stop_early=stop_early)

    def restore(self) -> None:
        """Put the original bytes back for every file this verifier wrote."""
        self.workspace.restore()

    def baseline(self, originals: Mapping[str, str]) -> RerunResult:
        """Rerun the unpatched code: does the failure reproduce, which tests pass?"""
        self.workspace.write(originals)
        result = self.runner(self._spec(self.nodeids + self.regression))
        self.regression_baseline = frozenset(
            nodeid for nodeid in self.regression if result.passed([nodeid])
        )
        self.baseline_findings = integrity_findings(result)
        return result

    def triage(self, baseline: RerunResult) -> str:
        """Why the bug behind ``baseline`` is not the kernel's to heal, or "" (see
        :func:`~pytest_kernelfix.verify.triage.triage`); with the CUDA shim off, a failure
        that passes once it is on is the CPU mapping's."""
        device = self.setup.device
        why_not = triage(baseline, self.group.first, self.nodeids, device)
        if why_not or not device.interpret or device.cuda_shim:
            return why_not
        setup = replace(self.setup, device=replace(device, cuda_shim=True))
        passes = self.runner(self._spec(self.nodeids, setup, stop_early=True)).passed(
            self.nodeids)
        return CUDA_SHIM_LIMITATION if passes else ""

    def __call__(self, candidate: Mapping[str, str]) -> Verdict:
        self.workspace.write(candidate)
        tampered = self.workspace.tampered()
        if tampered:
            return Verdict(False, f"test files changed: {', '.join(tampered)}",
                           kind=VerdictKind.TAMPERED)
        first = self._run(self._spec(self.nodeids, stop_early=True))
        if isinstance(first, Verdict):
            return first
        verdict = judge(first, self.expectations(regression=False))
        if self.regression_baseline and verdict.kind in _JUDGED_AFTER_REGRESSION:
            # The failing tests pass: run the regression set too; a broken regression test
            # is reported before a bypass or a gate rejection, as in one combined rerun.
            second = self._run(self._spec(tuple(sorted(self.regression_baseline))))
            if isinstance(second, Verdict):
                return second
            verdict = judge(merge_results(first, second), self.expectations())
        return self.sensitivity(verdict) if verdict.ok else verdict

    def _run(self, spec: RerunSpec) -> RerunResult | Verdict:
        """Run, then check that the candidate's code wrote no test or data file."""
        result = self.runner(spec)
        tampered = self.workspace.tampered()
        if not tampered:
            return result
        self.workspace.undo(tampered)
        return Verdict(False, f"the rerun changed test or data files: {', '.join(tampered)}",
                       "Running the patched code changed files it must not touch: "
                       + ", ".join(tampered), kind=VerdictKind.TAMPERED)

    def sensitivity(self, passed: Verdict) -> Verdict:
        """Rerun the failing tests with the kernels' outputs poisoned: they must fail.

        Runs only for a candidate that passed everything else: one rerun per poison
        (NaN, then scrambled values), the second only when the first found no bypass.
        """
        notes: list[str] = []
        for mode in POISON_MODES:
            result = self._run(self._spec(self.nodeids, poison=mode))
            if isinstance(result, Verdict):
                return result
            changed = integrity_verdict(result, self.baseline_findings)
            if changed is not None:
                return changed
            judgement = judge_poisoned(result, self.nodeids, mode)
            if judgement.state == BYPASS:
                return Verdict(False, judgement.summary, judgement.feedback,
                               kind=VerdictKind.INSENSITIVE)
            if judgement.state == VerdictKind.UNCERTIFIABLE:
                return Verdict(False, judgement.summary, judgement.summary,
                               kind=VerdictKind.UNCERTIFIABLE)
            if judgement.state == UNMEASURED:
                notes.append(judgement.summary)
                break  # nothing was poisoned: another poison measures nothing either
        summary = passed.summary + (f"; {notes[0]}" if notes else
                                    "; the tests fail once the kernel's output is poisoned")
        return replace(passed, summary=summary)
