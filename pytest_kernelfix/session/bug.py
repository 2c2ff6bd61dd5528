"""The heal of one bug, from its failure to its winner (:func:`heal_bug`).

In order: a free fixer's first answer (a bug it cannot answer ends with no rerun), the
baseline and triage (:meth:`Verifier.triage` skips what is not the kernel's to heal), the
patch of an earlier bug of its chain that touched its files (a bug it heals has no patch
of its own), the experiment on a change since the base (the hunks whose revert makes the
test pass), then the round loop (:func:`pytest_kernelfix.heal.loop.heal`) from the text
those leave. A bug whose heal began while its tests ran is followed until they are all
known: those that join it are shown from the next round, and its winner is checked on
them. The after-the-run session (:mod:`pytest_kernelfix.session.pipeline`) and healing
while the tests run (:mod:`pytest_kernelfix.session.overlap`) both heal a bug here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from pytest_kernelfix.capture.logs import clean_log
from pytest_kernelfix.fixers.base import Proposal, is_free
from pytest_kernelfix.heal.loop import Resume, heal
from pytest_kernelfix.heal.outcomes import (
    DECLINED,
    HEALED,
    SKIPPED,
    UNHEALED,
    HealInterrupted,
    HealResult,
    Phase,
    RoundRecord,
    Verdict,
)
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
from pytest_kernelfix.locate.grouping import BugGroup, regression_nodeids
from pytest_kernelfix.locate.need import NeedResolver
from pytest_kernelfix.locate.reach import Reach
from pytest_kernelfix.project import encoding_problem
from pytest_kernelfix.rerun.launcher import RerunSpec
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.session.asking import (
    AnnouncedFixer,
    Shown,
    answer_first,
    checks_for,
    test_own_failure,
)
from pytest_kernelfix.session.inputs import SessionInputs, Stages
from pytest_kernelfix.verify.culprit import find_culprits
from pytest_kernelfix.verify.triage import raised_in_kernel
from pytest_kernelfix.verify.verifier import Verifier
from pytest_kernelfix.vocabulary import StepOutcome


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
    one = _BugHeal(group, inputs, sandbox, stages, reach, change, exclude, tests)
    result = one.heal(winners, claim, verifier, ask_first)
    return one.follow(result) if tests is not None else result


class _BugHeal:
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
        """The context without a change since a base (or before the experiment)."""
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
        """The bug up to its result, one step after the other (see :func:`heal_bug`)."""
        group, inputs, stages, project = self.group, self.inputs, self.stages, self.project
        try:
            originals = read_originals(project.root, self.widened.editable)
        except (OSError, ValueError) as error:
            return skipped(group, f"cannot read the editable source: {error}")
        base, earlier = build_on(originals, winners)
        over = "" if earlier else claim()
        if over:
            return skipped(group, over)
        self.verifier = verifier = verifier or make_verifier(self.widened, inputs,
                                                             self.sandbox, stages, self.reach)
        first: Proposal | None = None
        if (is_free(stages.fixer) if ask_first is None else ask_first) and not earlier and (
                self.change is None):
            announced = AnnouncedFixer(stages.fixer, stages.progress, stages.cancel)
            first, why = answer_first(announced, self.shown(), base)
            if why and not (inputs.setup.device.interpret and raised_in_kernel(group.first)):
                return self.done(HealResult(group.id, UNHEALED, why))
            if why:  # an error the interpreter raised: the baseline may say it is its own
                try:
                    why_not = verifier.triage(verifier.baseline(originals))
                finally:
                    verifier.restore()
                return self.done(replace(skipped(group, why_not) if why_not else HealResult(
                    group.id, UNHEALED, why), triage=tuple(verifier.phases)))
        try:
            why_not = verifier.triage(verifier.baseline(originals))
            triaged = tuple(verifier.phases)
            if why_not:
                return self.done(replace(skipped(group, why_not), triage=triaged))
            if earlier:
                healed = healed_by(group, verifier, base, earlier, stages,
                                    verified_by(originals, base, winners))
                if healed is not None:
                    return self.done(replace(healed, triage=triaged))
                over = claim()
                if over:
                    return self.done(replace(skipped(group, over), triage=triaged))
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
            fixer=AnnouncedFixer(stages.fixer, stages.progress, stages.cancel),
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
                       trial.tests or (regression.test,), trial.seconds, StepOutcome.RAN,
                       trial.outcome)
                 for trial in regression.trials)


def verified_by(originals: Mapping[str, str], base: Mapping[str, str],
                 winners: Sequence[Winner]) -> frozenset[str]:
    """The tests an earlier bug's patch was verified passing on, when ``base`` is that
    patch whole (the same files changed, to the same text): they need no second run."""
    change = {path: text for path, text in base.items() if originals.get(path) != text}
    for winner in reversed(winners):
        if winner.change and dict(winner.change) == change:
            return winner.verified
    return frozenset()


def healed_by(group: BugGroup, verifier: Verifier, base: Mapping[str, str],
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


def skipped(group: BugGroup, reason: str) -> HealResult:
    return HealResult(group_id=group.id, status=SKIPPED, reason=reason)


def interrupted(group: BugGroup, stop: KeyboardInterrupt, why: str) -> HealResult:
    """The bug a Ctrl-C or SIGTERM stopped: unhealed with the rounds it played and what
    they cost, or skipped when no fixer was asked yet."""
    if isinstance(stop, HealInterrupted):
        return replace(stop.result, reason=f"{stop.result.reason} ({why})")
    return skipped(group, f"interrupted ({why}) before it was healed")
