"""The round loop for one bug: propose, apply, guard, verify, feed back, pick the winner.

Knows nothing of pytest: a fixer proposes, ``verify`` runs the tests on a candidate, and
``guard`` rejects candidates that cheat. Each round builds on the last accepted
candidate, and the model sees that cumulative change, so it can refine or revert it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from pytest_kernelfix.context import BugContext, SourceFile
from pytest_kernelfix.engine.files import apply_proposal, cumulative_diff
from pytest_kernelfix.engine.parse import FORMAT_HINT
from pytest_kernelfix.fixers.base import (
    Attempt,
    Fixer,
    FixerError,
    Proposal,
    ProposalRequest,
    Usage,
)
from pytest_kernelfix.outcomes import (
    HEALED,
    SKIPPED,
    UNCERTIFIABLE,
    UNHEALED,
    EditOutcome,
    Guard,
    HealResult,
    RoundRecord,
    Verdict,
)
from pytest_kernelfix.redact import redact

_RAW_KEEP = 4000


def _digest(files: Mapping[str, str]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + files[path].encode() + b"\0")
    return digest.hexdigest()


def _views(files: Mapping[str, str]) -> tuple[SourceFile, ...]:
    return tuple(SourceFile(path, redact(text)) for path, text in files.items())


def heal(
    context: BugContext,
    originals: Mapping[str, str],
    *,
    fixer: Fixer,
    verify: Callable[[Mapping[str, str]], Verdict],
    rounds: int,
    guard: Guard | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> HealResult:
    """Run up to ``rounds`` rounds on one bug and return how it ended."""
    started = clock()
    current = dict(originals)
    feedback = ""
    history: list[Attempt] = []
    records: list[RoundRecord] = []
    usage = Usage()
    tried: dict[str, str] = {}

    def finish(status: str, reason: str, final: Mapping[str, str] | None = None) -> HealResult:
        return HealResult(
            group_id=context.group_id,
            status=status,
            reason=redact(reason),
            rounds=tuple(records),
            original=dict(originals),
            final=dict(final) if final is not None else {},
            usage=usage,
            seconds=clock() - started,
        )

    for number in range(1, rounds + 1):
        request = ProposalRequest(
            context=context,
            round=number,
            files=_views(current),
            cumulative_diff=redact(cumulative_diff(originals, current)),
            feedback=redact(feedback),
            history=tuple(history),
        )
        try:
            proposal = fixer.propose(request)
        except Exception as error:  # a fixer or a hook that fails ends this bug, not the run
            source = getattr(fixer, "name", "")
            why = str(error) if isinstance(error, FixerError) else (
                f"the fixer failed: {type(error).__name__}: {error}")
            records.append(RoundRecord(number, source, (), redact(f"no answer: {why}")))
            return finish(UNHEALED, f"round {number}: {why}")
        usage = usage + proposal.usage
        outcome, feedback, accepted = _play_round(proposal, current, tried, verify, guard)
        records.append(
            RoundRecord(
                number,
                proposal.source,
                tuple(replace(e, error=redact(e.error)) for e in outcome.edits),
                redact(outcome.summary),
                proposal.usage,
                redact(proposal.raw[:_RAW_KEEP]),
                tuple(redact(note) for note in outcome.notes),
            )
        )
        if on_round is not None:
            on_round(records[-1])
        history.append(Attempt(number, redact(outcome.summary), redact(outcome.diff)))
        if accepted is not None:
            current = dict(accepted)
        if outcome.ok:
            return finish(HEALED, f"healed in round {number}", current)
        if outcome.kind == UNCERTIFIABLE:  # no candidate can be told from a cheat
            return finish(SKIPPED, outcome.summary)
    last = records[-1].outcome if records else "no rounds ran"
    return finish(UNHEALED, f"not healed after {rounds} round(s); last: {last}")


@dataclass(frozen=True)
class _RoundOutcome:
    ok: bool
    summary: str
    edits: tuple[EditOutcome, ...] = ()
    diff: str = ""
    kind: str = ""
    notes: tuple[str, ...] = ()


def _play_round(
    proposal: Proposal,
    current: Mapping[str, str],
    tried: dict[str, str],
    verify: Callable[[Mapping[str, str]], Verdict],
    guard: Guard | None,
) -> tuple[_RoundOutcome, str, Mapping[str, str] | None]:
    """One round after the answer arrived: (outcome, feedback for next round, new base)."""
    if proposal.parse_error:
        detail = proposal.parse_error.replace(FORMAT_HINT, "").strip().splitlines()[0][:200]
        return (
            _RoundOutcome(False, f"answer could not be read: {detail}"),
            f"Your previous answer could not be read: {proposal.parse_error}",
            None,
        )
    if not proposal.modifications:
        return (
            _RoundOutcome(False, "answer held no edits"),
            "Your previous answer held no edits. Answer with at least one modification.",
            None,
        )
    applied = apply_proposal(proposal.modifications, current)
    unmatched = ""
    if applied.errors:
        unmatched = "These edits did not apply:\n" + "\n".join(
            f"- {error}" for error in applied.errors
        )
    candidate = applied.files
    diff = cumulative_diff(current, candidate)
    # Guarded before "changed nothing": an edit aimed at a test file is refused as such.
    if guard is not None:
        rejection = guard(current, candidate, proposal.modifications)
        if rejection:
            return (
                _RoundOutcome(False, f"rejected: {rejection}", applied.edits, diff),
                _join(f"The candidate was rejected: {rejection}", unmatched),
                None,
            )
    if dict(candidate) == dict(current):
        summary = "no edit applied" if applied.errors else "edits changed nothing"
        return (
            _RoundOutcome(False, summary, applied.edits),
            unmatched or "Your edits changed nothing; the failure is unchanged.",
            None,
        )
    key = _digest(candidate)
    if key in tried:
        return (
            _RoundOutcome(False, f"repeats an earlier candidate: {tried[key]}", applied.edits,
                          diff),
            _join(f"This exact change was already tried and failed: {tried[key]}", unmatched),
            None,
        )
    verdict = verify(candidate)
    tried[key] = verdict.summary
    summary = verdict.summary
    notes = "\n".join(f"- {note}" for note in verdict.notes)
    feedback = _join(verdict.feedback or verdict.summary, unmatched,
                     f"Notes on the candidate's shape:\n{notes}" if notes else "")
    return (_RoundOutcome(verdict.ok, summary, applied.edits, diff, verdict.kind, verdict.notes),
            feedback, candidate)


def _join(*parts: str) -> str:
    return "\n\n".join(part for part in parts if part)
