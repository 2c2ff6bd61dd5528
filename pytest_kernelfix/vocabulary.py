"""The words the stages share: how a bug ends, what a verdict on a candidate says, how a
step of its verification ended, what a poisoned rerun shows.

Each is defined here once, as a str-valued enum: a member compares equal to its string,
hashes, formats and is written to JSON as it, so ``report.json`` reads as it always did
(``tests/test_vocabulary.py`` checks the values against ``report.schema.json``). The
records a verdict is made of (:class:`Verdict`, :class:`Phase`) live beside them, so that
judging a rerun needs none of the loop that asks for the judgement.

The standard library only, and nothing else of the package: every stage may use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Word(str, Enum):
    """A str-valued enum: wherever a member is shown or written, it is its value."""

    def __str__(self) -> str:
        return str(self.value)


class BugStatus(Word):
    """How a bug ends, in report order."""

    HEALED = "healed"  #: a candidate passed every check: its patch is the fix
    MASKED = "masked"  #: the only candidate that made the tests pass masks the kernel's output
    UNHEALED = "unhealed"  #: no candidate passed within the rounds
    DECLINED = "declined"  #: the model said the failure is not a kernel bug
    SKIPPED = "skipped"  #: not healed here: not the kernel's, not reproduced, cannot be told


class VerdictKind(Word):
    """What a verdict on a candidate says, most fundamental problem first."""

    PASSED = "passed"  #: every check passed
    TAMPERED = "tampered"  #: test or data files changed
    TIMEOUT = "timeout"  #: the rerun did not finish
    CRASH = "crash"  #: the test process died
    COLLECTION = "collection"  #: the tests could not be collected
    RERUN = "rerun"  #: the rerun itself could not say anything
    FAILING = "failing"  #: failing tests still fail
    REGRESSION = "regression"  #: tests that passed before fail
    INTEGRITY = "integrity"  #: what the tests check with was changed while they ran
    BYPASS = "bypass"  #: the tests pass without launching a kernel
    GATE = "gate"  #: the kernel does not compile for a real GPU
    INSENSITIVE = "insensitive"  #: the tests pass with the kernel's output poisoned
    UNCERTIFIABLE = "uncertifiable"  #: the tests cannot tell a fix from a cheat
    MASKED = "masked"  #: the kernel's output is unchanged; the candidate masks it


class StepOutcome(Word):
    """How a step ended that judged nothing. A step that judged a candidate ends with the
    :class:`VerdictKind` of its verdict instead."""

    RAN = "ran"  #: a run of the original code (a baseline, a culprit trial)


class JudgementState(Word):
    """What one poisoned rerun shows (:mod:`pytest_kernelfix.verify.sensitivity`)."""

    SENSITIVE = "sensitive"  #: the tests fail with the kernel's output poisoned
    BYPASS = "bypass"  #: the values the tests check do not come from the kernel
    UNMEASURED = "unmeasured"  #: nothing was poisoned, or the poison cannot show here
    BLIND = "blind"  #: NaN cannot tell (the scrambled values decide)
    DOUBT = "doubt"  #: not judged per kernel: which check reads it cannot be told
    UNCERTIFIABLE = "uncertifiable"  #: the tests do not depend on the kernel's output


@dataclass(frozen=True)
class Phase:
    """One step of verifying a candidate (or of triage): which tests it ran, how long it
    took, how its tests ended (``results``: ``1 passed``, ``2 failed``...) and how the step
    ended (``outcome``: :attr:`StepOutcome.RAN` for a run of the original code, else the
    kind of the verdict it reached).

    The two are not the same thing: with the kernel's output poisoned the tests must
    fail for the step to pass. :func:`phase_text` says both, in the one wording the
    terminal and the reports share.
    """

    name: str
    nodeids: tuple[str, ...]
    seconds: float
    outcome: VerdictKind | StepOutcome
    results: str = ""


def step_outcome(outcome: str) -> str:
    """A step's outcome in words: ``step passed``, ``step rejected (regression)`` or ``ran``
    (a run of the original code, which judges nothing)."""
    if outcome in (StepOutcome.RAN, ""):
        return "ran"
    return "step passed" if outcome == VerdictKind.PASSED else f"step rejected ({outcome})"


def phase_text(phase: Phase) -> str:
    """``sensitivity (nan): 1 test(s), 1 failed → step passed`` (a run of the original
    code: ``baseline: 1 test(s), 1 failed``)."""
    tests = f"{len(phase.nodeids)} test(s)" + (f", {phase.results}" if phase.results else "")
    step = step_outcome(phase.outcome)
    return f"{phase.name}: {tests}" + ("" if step == "ran" else f" → {step}")


@dataclass(frozen=True)
class Verdict:
    """How a candidate fared: ``ok`` only when every check passed.

    ``summary`` is one line for the report; ``feedback`` is what the model is shown
    next round (the new failure, the crash, the broken tests). ``kind`` names the
    check that decided (:attr:`VerdictKind.PASSED` when ``ok``; a failed verdict given
    no kind is :attr:`VerdictKind.FAILING`). ``notes`` are remarks on the candidate's
    shape (torch math or arithmetic after the launch...) that reject nothing but go into
    the report and to the model. A verdict of kind :attr:`VerdictKind.UNCERTIFIABLE`
    ends the bug as skipped. ``phases`` are the steps the verification ran, in order.
    """

    ok: bool
    summary: str
    feedback: str = ""
    kind: VerdictKind | None = None
    notes: tuple[str, ...] = ()
    phases: tuple[Phase, ...] = ()

    def __post_init__(self) -> None:
        if self.kind is None:
            default = VerdictKind.PASSED if self.ok else VerdictKind.FAILING
            object.__setattr__(self, "kind", default)
        elif self.ok != (self.kind is VerdictKind.PASSED):
            raise ValueError(f"a verdict with ok={self.ok} cannot be of kind {self.kind}")
