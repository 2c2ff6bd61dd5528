"""The round loop for one bug: propose, apply, guard, verify, feed back, pick the winner.

Knows nothing of pytest: a fixer proposes, ``verify`` runs the tests on a candidate, and
``guard`` rejects candidates that cheat. Each round builds on the last accepted
candidate, and the model sees that cumulative change, so it can refine or revert it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

from pytest_kernelfix.apply import apply_modifications, unified_diff
from pytest_kernelfix.context import BugContext, SourceFile
from pytest_kernelfix.edits import FORMAT_HINT, Modification
from pytest_kernelfix.fixers.base import (
    Attempt,
    Fixer,
    FixerError,
    Proposal,
    ProposalRequest,
    Usage,
)
from pytest_kernelfix.redact import redact

HEALED, UNHEALED, SKIPPED = "healed", "unhealed", "skipped"
_RAW_KEEP = 4000


@dataclass(frozen=True)
class Verdict:
    """How a candidate fared: ``ok`` only when every check passed.

    ``summary`` is one line for the report; ``feedback`` is what the model is shown
    next round (the new failure, the crash, the broken tests).
    """

    ok: bool
    summary: str
    feedback: str = ""
    kind: str = ""


@dataclass(frozen=True)
class EditOutcome:
    """Where one proposed edit went: its file and match level, or why it failed."""

    file: str
    level: str
    error: str = ""


@dataclass(frozen=True)
class RoundRecord:
    round: int
    source: str
    edits: tuple[EditOutcome, ...]
    outcome: str
    usage: Usage = field(default_factory=Usage)
    raw: str = ""


@dataclass(frozen=True)
class HealResult:
    """The end of one bug's heal. ``final`` holds the winning text of changed files."""

    group_id: str
    status: str
    reason: str
    rounds: tuple[RoundRecord, ...] = ()
    original: Mapping[str, str] = field(default_factory=dict)
    final: Mapping[str, str] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    seconds: float = 0.0

    @property
    def changed_files(self) -> tuple[str, ...]:
        return tuple(path for path, text in self.final.items() if self.original.get(path) != text)

    @property
    def patch(self) -> str:
        return cumulative_diff(self.original, self.final)


Guard = Callable[[Mapping[str, str], Mapping[str, str], Sequence[Modification]], str]


def cumulative_diff(original: Mapping[str, str], current: Mapping[str, str]) -> str:
    """One multi-file patch from ``original`` to ``current``, files in sorted order."""
    return "".join(
        unified_diff(original.get(path, ""), current[path], path)
        for path in sorted(current)
        if original.get(path) != current[path]
    )


def _normalise(name: str) -> str:
    text = name.strip().replace("\\", "/")
    while text.startswith("./"):
        text = text[2:]
    return text


def resolve_file(name: str, editable: Sequence[str]) -> tuple[str, str]:
    """Map the ``file`` a model named onto an editable path: ``(path, "")`` or ``("", why)``.

    Models write paths relative to some other directory (``project/kernels/x.py``) or
    just the file name; a unique suffix match is accepted, anything else is refused.
    """
    wanted = _normalise(name)
    if wanted in editable:
        return wanted, ""
    if wanted.startswith("/") or ".." in PurePosixPath(wanted).parts:
        return "", f"file {name!r} is outside the editable set (absolute or '..' path)"
    for prefix in ("a/", "b/"):
        if wanted.startswith(prefix) and wanted[len(prefix):] in editable:
            return wanted[len(prefix):], ""
    suffix = [path for path in editable if path.endswith("/" + wanted) or wanted.endswith(
        "/" + path)]
    if len(suffix) == 1:
        return suffix[0], ""
    return "", (
        f"file {name!r} is not editable; edits may only target: {', '.join(editable)}"
    )


def _locate(modification: Modification, files: Mapping[str, str]) -> tuple[str, str]:
    """Pick the file for an edit that names none: the only file, or the one it matches."""
    if len(files) == 1:
        return next(iter(files)), ""
    matching = [
        path
        for path, text in files.items()
        if apply_modifications(text, [modification], path=path).applied
    ]
    if len(matching) == 1:
        return matching[0], ""
    if matching:
        return "", (
            f"old_string matches in several files ({', '.join(matching)}); "
            'name the target with "file"'
        )
    return "", ""  # let the matcher of the first file explain the miss


@dataclass(frozen=True)
class Application:
    """The result of applying one proposal to the current files."""

    files: Mapping[str, str]
    edits: tuple[EditOutcome, ...]
    errors: tuple[str, ...]
    warnings: tuple[str, ...]


def apply_proposal(
    modifications: Sequence[Modification], files: Mapping[str, str]
) -> Application:
    """Apply every edit to its file, in order; failed edits are reported, not fatal."""
    editable = tuple(files)
    outcomes: dict[int, EditOutcome] = {}
    by_file: dict[str, list[int]] = {}
    for index, modification in enumerate(modifications):
        if modification.file:
            path, why = resolve_file(modification.file, editable)
        else:
            path, why = _locate(modification, files)
            path = path or ("" if why else editable[0])
        if why:
            outcomes[index] = EditOutcome("", "none", f"Edit {index + 1}: {why}")
        else:
            by_file.setdefault(path, []).append(index)
    updated = dict(files)
    warnings: list[str] = []
    for path, indices in by_file.items():
        result = apply_modifications(
            updated[path], [modifications[i] for i in indices], path=path,
            labels=[f"Edit {i + 1} ({path})" for i in indices],
        )
        updated[path] = result.code
        warnings.extend(f"{path}: {warning}" for warning in result.warnings)
        messages = iter(result.errors)  # one per failed modification, in order
        for position, index in enumerate(indices):
            level = result.levels[position] if position < len(result.levels) else "none"
            error = next(messages, "did not apply") if level == "none" else ""
            outcomes[index] = EditOutcome(path, level, error)
    ordered = tuple(outcomes[i] for i in range(len(modifications)))
    errors = tuple(outcome.error for outcome in ordered if outcome.level == "none")
    return Application(updated, ordered, errors, tuple(warnings))


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
            )
        )
        if on_round is not None:
            on_round(records[-1])
        history.append(Attempt(number, redact(outcome.summary), redact(outcome.diff)))
        if accepted is not None:
            current = dict(accepted)
        if outcome.ok:
            return finish(HEALED, f"healed in round {number}", current)
    last = records[-1].outcome if records else "no rounds ran"
    return finish(UNHEALED, f"not healed after {rounds} round(s); last: {last}")


@dataclass(frozen=True)
class _RoundOutcome:
    ok: bool
    summary: str
    edits: tuple[EditOutcome, ...] = ()
    diff: str = ""


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
    feedback = _join(verdict.feedback or verdict.summary, unmatched)
    return _RoundOutcome(verdict.ok, summary, applied.edits, diff), feedback, candidate


def _join(*parts: str) -> str:
    return "\n\n".join(part for part in parts if part)
