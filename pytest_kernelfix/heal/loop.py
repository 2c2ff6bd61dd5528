"""The round loop for one bug: propose, apply, guard, verify, feed back, pick the winner.

Knows nothing of pytest: a fixer proposes, ``verify`` runs the tests on a candidate, and
``guard`` rejects candidates that cheat. Each round builds on the last accepted
candidate, and the model sees that cumulative change, so it can refine or revert it.

Four answers are not edits to verify. An answer that asks for code (``need``) gets it
next round, within a budget, through ``resolve_need``. An answer that says the failure
is not a kernel bug (``not_a_kernel_bug``) ends the bug at once as declined, with its
reason. An answer with neither edits nor a request is the model seeing no fix, reported
with its analysis. Two identical answers in a row end the bug before its last round: a
third would be the same again.

A candidate that only masks the kernel's unchanged output is not a heal: it is fed back
and the rounds go on; when nothing better comes, the bug ends as masked, the candidate
kept for review.

Stale quotes: after round 1 a model often quotes the failing line as the error log
shows it, that is, the original text, not the current candidate. When an answer does
not apply to the current candidate but every one of its edits applies to the original
files, the whole answer is applied to the original instead (starting over from it);
edits are never mixed across the two bases, since one answer is one coherent change.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from pytest_kernelfix.engine.diff import cumulative_diff
from pytest_kernelfix.engine.files import EditOutcome, apply_proposal
from pytest_kernelfix.engine.parse import FORMAT_HINT
from pytest_kernelfix.fixers.base import (
    Attempt,
    Fixer,
    FixerError,
    Proposal,
    ProposalRequest,
    Usage,
)
from pytest_kernelfix.heal.outcomes import (
    DECLINED,
    HEALED,
    MASKED,
    SKIPPED,
    UNCERTIFIABLE,
    UNHEALED,
    Candidate,
    Exchange,
    Guard,
    HealInterrupted,
    HealResult,
    Phase,
    RoundRecord,
    Screening,
    Verdict,
    VerdictKind,
)
from pytest_kernelfix.locate.context import BugContext
from pytest_kernelfix.locate.need import NeedAnswer
from pytest_kernelfix.redact import redact
from pytest_kernelfix.vocabulary import BugStatus

_RAW_KEEP = 4000
_ANALYSIS_KEEP = 300

#: Resolves an answer's ``need``: (items, current files, focus per file) -> what to add.
NeedResolver = Callable[[Sequence[str], Mapping[str, str], Mapping[str, tuple[str, ...]]],
                        NeedAnswer]


def _digest(files: Mapping[str, str]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(path.encode() + b"\0" + files[path].encode() + b"\0")
    return digest.hexdigest()


def _same_answer(proposal: Proposal) -> tuple[object, ...]:
    """What makes two answers the same (a hook's answers may all have the same raw)."""
    return proposal.raw, proposal.modifications, proposal.need, proposal.declined


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
    resolve_need: NeedResolver | None = None,
    tidy: Callable[[str], str] = lambda text: text,
    first: Proposal | None = None,
    resume: Resume | None = None,
    regroup: Callable[[], BugContext] | None = None,
) -> HealResult:
    """Run up to ``rounds`` rounds on one bug and return how it ended.

    ``tidy`` cleans what the verifier says (paths, machinery frames) before the model
    reads it. The first round's prompt size is what the fixer says it sent. ``first`` is
    round 1's answer when it was asked for already (a fixer that costs nothing is asked
    before the baseline rerun). ``resume`` goes on from a heal whose winner a later
    verification rejected: its rounds are kept, its last one now ends with that verdict,
    and the next round starts from the winner with the verdict as feedback. ``regroup``
    gives the bug's context as its failing tests are known at the start of each round
    (the tests of a bug healed while they run join it later): a new one is shown from
    then on, with the code earlier answers asked for.
    """
    loop = RoundLoop(context, originals, fixer=fixer, verify=verify, guard=guard,
                     on_round=on_round, clock=clock, resolve_need=resolve_need, tidy=tidy,
                     regroup=regroup)
    if resume is not None:
        loop.resume(resume)
    return loop.run(rounds, first)


class RoundLoop:
    """The rounds of one bug and what they share: the current files, the feedback and
    history the next prompt shows, the records, the usage. Each way a round can end
    (healed, declined, given up, the fixer failed, interrupted) is one method."""

    def __init__(self, context: BugContext, originals: Mapping[str, str], *, fixer: Fixer,
                 verify: Callable[[Mapping[str, str]], Verdict], guard: Guard | None = None,
                 on_round: Callable[[RoundRecord], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 resolve_need: NeedResolver | None = None,
                 tidy: Callable[[str], str] = lambda text: text,
                 regroup: Callable[[], BugContext] | None = None) -> None:
        self.fixer = fixer
        self.verify = verify
        self.guard = guard
        self.on_round = on_round
        self.clock = clock
        self.resolve_need = resolve_need
        self.tidy = tidy
        self.regroup = regroup
        self.started = clock()
        self.context = context
        self.built = context  # the context as given or regrouped, before what answers asked
        self.needed: list[NeedAnswer] = []
        self.originals = dict(originals)
        self.current = dict(originals)
        self.feedback = ""
        self.history: list[Attempt] = []
        self.records: list[RoundRecord] = []
        self.usage = Usage()
        self.tried: dict[str, str] = {}
        self.first_prompt = 0
        self.previous: tuple[object, ...] | None = None  # the last answer, to tell a repeat
        self.masked: tuple[Mapping[str, str], str] | None = None  # (candidate, summary)

    def resume(self, resume: Resume) -> None:
        """Go on from a heal whose winner a later verification rejected: its rounds are
        kept, the last one ending with that verdict; the next starts from the winner."""
        self.current = {**self.current, **resume.result.final}
        summary = self.tidy(resume.verdict.summary)
        won = resume.result.rounds[-1]
        self.records = [*resume.result.rounds[:-1], replace(
            won, outcome=redact(summary), notes=won.notes + tuple(
                redact(note) for note in resume.verdict.notes),
            phases=won.phases + resume.verdict.phases)]
        self.usage = resume.result.usage
        self.first_prompt = resume.result.prompt_chars
        self.history = [Attempt(record.round, record.outcome) for record in self.records]
        self.tried[_digest(self.current)] = summary
        self.feedback = self.tidy(resume.verdict.feedback or resume.verdict.summary)

    # -- how a round is recorded, and how the rounds end ---------------------------------

    def record(self, number: int, outcome: str, *, proposal: Proposal | None = None,
               source: str = "", edits: Sequence[EditOutcome] = (),
               notes: Sequence[str] = (), phases: tuple[Phase, ...] = (),
               exchange: Exchange | None = None, shown: tuple[str, ...] = (),
               said: bool = True) -> RoundRecord:
        """Keep one round as reported (redacted), and say it (``on_round``) if ``said``."""
        record = RoundRecord(
            number,
            proposal.source if proposal is not None else source,
            tuple(replace(edit, error=redact(edit.error)) for edit in edits),
            redact(outcome),
            proposal.usage if proposal is not None else Usage(),
            redact(proposal.raw[:_RAW_KEEP]) if proposal is not None else "",
            tuple(redact(note) for note in notes),
            phases,
            exchange if exchange is not None else (
                Exchange.of(proposal) if proposal is not None else Exchange()),
            shown,
        )
        self.records.append(record)
        if said and self.on_round is not None:
            self.on_round(record)
        return record

    def end(self, status: BugStatus, reason: str, final: Mapping[str, str] | None = None
            ) -> HealResult:
        return HealResult(
            group_id=self.context.group_id,
            status=status,
            reason=redact(reason),
            rounds=tuple(self.records),
            original=dict(self.originals),
            final=dict(final) if final is not None else {},
            usage=self.usage,
            seconds=self.clock() - self.started,
            prompt_chars=self.first_prompt,
            shown=self.records[0].shown if self.records else shown_definitions(self.context),
        )

    def give_up(self, reason: str) -> HealResult:
        """Unhealed, unless an earlier round's candidate passed by masking the output:
        then that candidate is what the bug ends with, kept for review."""
        if self.masked is None:
            return self.end(UNHEALED, reason)
        candidate, summary = self.masked
        return self.end(MASKED, f"{reason}; the only candidate that made the tests pass "
                                f"masks the kernel's output ({summary}): kept for review",
                        candidate)

    def fixer_failed(self, number: int, error: Exception, shown: tuple[str, ...]
                     ) -> HealResult:
        """A fixer or a hook that fails ends this bug, not the run."""
        source = getattr(error, "source", "") or getattr(self.fixer, "name", "")
        why = str(error) if isinstance(error, FixerError) else (
            f"the fixer failed: {type(error).__name__}: {error}")
        self.record(number, f"no answer: {why}", source=source,
                    exchange=Exchange.failed(error), shown=shown, said=False)
        return self.give_up(f"round {number}: {why}")

    def interrupted(self, stop: KeyboardInterrupt, number: int,
                    answered: Proposal | None) -> HealInterrupted:
        """A Ctrl-C or SIGTERM while the fixer or the verifier worked: the rounds played,
        and an answer being tried, are kept with what they cost."""
        if isinstance(stop, HealInterrupted):
            return stop
        if answered is not None:
            self.record(number, "interrupted while its answer was being tried",
                        proposal=answered, shown=shown_definitions(self.context), said=False)
        return HealInterrupted(self.end(UNHEALED, f"interrupted in round {number}: nothing "
                                                  "more was tried"), *stop.args[:1])

    # -- the rounds ------------------------------------------------------------------------

    def run(self, rounds: int, first: Proposal | None = None) -> HealResult:
        """Up to ``rounds`` rounds (those a resumed heal played count); ``first`` is round
        1's answer when it was asked for already."""
        for number in range(len(self.records) + 1, rounds + 1):
            self.show_joined()
            shown = shown_definitions(self.context)  # this round's: a need may add to it
            try:
                proposal = first if number == 1 and first is not None else (
                    self.fixer.propose(self.request(number)))
            except Exception as error:
                return self.fixer_failed(number, error, shown)
            except KeyboardInterrupt as stop:
                raise self.interrupted(stop, number, None) from None
            ended = self.answered(number, proposal, shown, last=number == rounds)
            if ended is not None:
                return ended
        last = self.records[-1].outcome if self.records else "no rounds ran"
        return self.give_up(f"not healed after {rounds} round(s); last: {last}")

    def show_joined(self) -> None:
        """The context from now on, when failing tests joined the bug since the last
        round, with the code earlier answers asked for."""
        fresh = self.regroup() if self.regroup is not None else self.built
        if fresh is not self.built:
            self.built = self.context = fresh
            for answer in self.needed:
                self.context = _with_need(self.context, answer)

    def request(self, number: int) -> ProposalRequest:
        context, current = self.context, self.current
        return ProposalRequest(
            context=context,
            round=number,
            files=tuple(context.view(path, redact(text)) for path, text in current.items()),
            cumulative_diff=redact(cumulative_diff(self.originals, current)),
            feedback=redact(self.feedback),
            history=tuple(self.history),
        )

    def answered(self, number: int, proposal: Proposal, shown: tuple[str, ...], *,
                 last: bool) -> HealResult | None:
        """One round after its answer arrived: how the bug ended, or None to go on."""
        self.usage = self.usage + proposal.usage
        if number == 1:
            self.first_prompt = proposal.usage.prompt_chars
        key = _same_answer(proposal)
        if key == self.previous and not last:  # in the last round it ends the bug anyway
            before = self.records[-1].outcome if self.records else ""
            self.record(number, f"the same answer as round {number - 1}: stopped",
                        proposal=proposal, shown=shown)
            return self.give_up(f"the model gave the same answer twice in a row (rounds "
                                f"{number - 1} and {number}); last: {before}")
        self.previous = key
        if proposal.not_a_kernel_bug and not proposal.modifications:
            reason = " ".join(proposal.not_a_kernel_bug.split())[:_ANALYSIS_KEEP]
            self.record(number, f"not a kernel bug: {reason}", proposal=proposal, shown=shown)
            return self.end(DECLINED, f"the model says this is not a kernel bug: {reason}")
        try:
            outcome, self.feedback, accepted = _play_round(
                proposal, self.current, self.originals, self.tried, self.verify, self.guard,
                self.tidy)
        except KeyboardInterrupt as stop:
            raise self.interrupted(stop, number, proposal) from None
        self.serve_need(proposal)
        self.record(number, outcome.summary, proposal=proposal, edits=outcome.edits,
                    notes=outcome.notes, phases=outcome.phases, shown=shown)
        self.history.append(Attempt(number, redact(outcome.summary), redact(outcome.diff)))
        if accepted is not None:
            self.current = {**self.current, **accepted}
        if outcome.ok:
            return self.end(HEALED, f"healed in round {number}", self.current)
        if outcome.kind == UNCERTIFIABLE:  # no candidate can be told from a cheat
            return self.end(SKIPPED, outcome.summary)
        if outcome.kind == VerdictKind.MASKED and outcome.candidate is not None:
            self.masked = (outcome.candidate, f"round {number}: {outcome.summary}")
        return None

    def serve_need(self, proposal: Proposal) -> None:
        """An answer's request for more code: shown from the next round on."""
        if not proposal.need:
            return
        if self.resolve_need is None:
            self.feedback = _join(self.feedback, "Requests for more code cannot be served "
                                                 "here.")
            return
        answer = self.resolve_need(proposal.need, self.current, self.context.focus)
        self.context = _with_need(self.context, answer)
        self.needed.append(answer)
        for path, text in answer.files.items():
            self.originals.setdefault(path, text)
            self.current.setdefault(path, text)
        self.feedback = _join(self.feedback, answer.describe())


@dataclass(frozen=True)
class Resume:
    """A heal that ended healed, and the verdict that later rejected its winner (its
    patch failed tests that failed, or passed, after the heal began)."""

    result: HealResult
    verdict: Verdict


def shown_definitions(context: BugContext) -> tuple[str, ...]:
    """What the model was shown of each editable file: ``path`` whole, else
    ``path:definition`` per definition shown in full."""
    shown: list[str] = []
    for source in context.editable:
        if source.focused:
            shown += [f"{source.path}:{name}" for name in source.shown] or [
                f"{source.path}:(outline)"]
        else:
            shown.append(source.path)
    return tuple(shown)


def _with_need(context: BugContext, answer: NeedAnswer) -> BugContext:
    """``context`` with what a request added: new editable files, more definitions shown
    in files already editable, read-only views."""
    focus = {**context.focus, **answer.focus}
    updated = replace(context, focus=focus)
    editable = [
        updated.view(source.path, source.text) if source.focused
        and focus.get(source.path) != source.shown else source
        for source in context.editable
    ]
    known = {source.path for source in editable}
    editable += [updated.view(path, redact(text)) for path, text in answer.files.items()
                 if path not in known]
    shown = {source.path for source in context.tests}
    tests = context.tests + tuple(view for view in answer.context if view.path not in shown)
    return replace(updated, editable=tuple(editable), tests=tests)


@dataclass(frozen=True)
class _RoundOutcome:
    ok: bool
    summary: str
    edits: tuple[EditOutcome, ...] = ()
    diff: str = ""
    kind: VerdictKind | None = None
    notes: tuple[str, ...] = ()
    phases: tuple[Phase, ...] = ()
    candidate: Mapping[str, str] | None = None


def _declined(proposal: Proposal) -> str:
    analysis = " ".join(proposal.analysis.split())[:_ANALYSIS_KEEP]
    return analysis or "(no analysis; it proposed no modifications and asked for no code)"


def _play_round(
    proposal: Proposal,
    current: Mapping[str, str],
    originals: Mapping[str, str],
    tried: dict[str, str],
    verify: Callable[[Mapping[str, str]], Verdict],
    guard: Guard | None,
    tidy: Callable[[str], str],
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
        if proposal.need:
            return (
                _RoundOutcome(False, f"asked for more code: {', '.join(proposal.need)[:300]}"),
                "",
                None,
            )
        return (
            _RoundOutcome(False, f"the model proposed no edit: {_declined(proposal)}"),
            "Your previous answer proposed no edit. The tests still fail: propose edits, or "
            'ask for the code you need to see with "need".',
            None,
        )
    base: Mapping[str, str] = current
    applied = apply_proposal(proposal.modifications, current)
    restarted = ""
    if applied.errors and dict(current) != dict(originals):
        fresh = apply_proposal(proposal.modifications, originals)
        if not fresh.errors:  # every quote is the original's: start over from it
            applied, base = fresh, originals
            restarted = ("Your edits quoted the original text, not the current files: they "
                         "were applied to the original files, and the changes of earlier "
                         "rounds were dropped.")
    unmatched = ""
    if applied.errors:
        unmatched = "These edits did not apply:\n" + "\n".join(
            f"- {error}" for error in applied.errors
        )
    candidate = applied.files
    diff = cumulative_diff(base, candidate)
    # Screened before "changed nothing": an edit aimed at a test file is refused as such.
    screening = Screening() if guard is None else guard(
        Candidate(candidate, base, originals, proposal.modifications))
    if screening.reason:
        rejection = screening.reason
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
    summary = tidy(verdict.summary)
    tried[key] = summary
    if restarted:
        summary = f"applied to the original text: {summary}"
    notes = verdict.notes + screening.notes
    listed = "\n".join(f"- {note}" for note in notes)
    feedback = _join(restarted, tidy(verdict.feedback or verdict.summary), unmatched,
                     f"Notes on the candidate's shape:\n{listed}" if listed else "")
    return (_RoundOutcome(verdict.ok, summary, applied.edits, diff, verdict.kind, notes,
                          verdict.phases, candidate),
            feedback, candidate)


def _join(*parts: str) -> str:
    return "\n\n".join(part for part in parts if part)
