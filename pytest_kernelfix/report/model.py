"""The session's report as data: each bug, how its heal ended and what was done with
it, and what the report files, the CI outputs and the terminal compute from them.

Every output of a session is written from one :class:`SessionReport`
(:mod:`pytest_kernelfix.report.publish`); the session builds it once its bugs are
healed, and apply mode adds what it wrote (:mod:`pytest_kernelfix.report.writeback`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from pytest_kernelfix.capture.records import Unselected
from pytest_kernelfix.fixers.base import Usage
from pytest_kernelfix.heal.outcomes import (
    HEALED,
    SKIPPED,
    STATUSES,
    UNHEALED,
    HealResult,
    RoundRecord,
)
from pytest_kernelfix.locate.context import CHARS_PER_TOKEN
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.report.prompts import prompt_file
from pytest_kernelfix.rerun.launcher import RerunStats

#: How much of an error line patches, reports and CI annotations show.
HEADLINE_CHARS = 300


@dataclass(frozen=True)
class BugReport:
    """One bug as reported: the group, how the heal ended, and what was done with it."""

    group: BugGroup
    result: HealResult
    patch_file: str = ""
    applied: tuple[str, ...] = ()
    apply_error: str = ""
    reruns: RerunStats = field(default_factory=RerunStats)
    #: Bugs whose patches this bug's patch applies after (they share a file).
    builds_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class SessionReport:
    """The session's bugs and how it ran; ``save_prompts`` says whether the prompt files
    are written (``--kernelfix-save-prompts``)."""

    bugs: tuple[BugReport, ...]
    rootdir: Path
    report_dir: Path
    mode: str
    device: str
    model: str
    seconds: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    workers: int = 1
    max_cost: float = 0.0
    max_tokens: int = 0
    save_prompts: bool = True
    #: Failing tests ``select`` (``kernelfix_select``) left out, with the reason.
    unselected: tuple[Unselected, ...] = ()
    select: tuple[str, ...] = ("kernel",)
    #: How much healing overlapped the test run (None: it began after the run).
    overlap: Overlapped | None = None
    #: A Ctrl-C or SIGTERM stopped the session early (a note says which, and what it left).
    interrupted: bool = False

    @property
    def reruns(self) -> RerunStats:
        """Every bug's reruns together."""
        total = RerunStats()
        for bug in self.bugs:
            total = total + bug.reruns
        return total

    @property
    def usage(self) -> Usage:
        total = Usage()
        for bug in self.bugs:
            total = total + bug.result.usage
        return total

    def count(self, status: str) -> int:
        return sum(1 for bug in self.bugs if bug.result.status == status)


@dataclass(frozen=True)
class Overlapped:
    """How much healing overlapped the test run: ``bugs`` whose heal began while it
    ran, and the seconds healing went on after its last test."""

    bugs: int
    after_tests: float


def healers(bug: BugReport, report: SessionReport) -> tuple[BugReport, ...]:
    """The bugs whose patches heal ``bug`` (``healed_by``), in the order they apply."""
    names = [name.strip() for name in bug.result.healed_by.split(",") if name.strip()]
    by_id = {other.group.id: other for other in report.bugs}
    return tuple(by_id[name] for name in names if name in by_id)


def healing_patches(bug: BugReport, report: SessionReport) -> tuple[str, ...]:
    """The patch files that heal ``bug``: its own, or those of the bugs it is healed by."""
    if bug.patch_file:
        return (bug.patch_file,)
    return tuple(other.patch_file for other in healers(bug, report) if other.patch_file)


def counts(report: SessionReport) -> str:
    """``2 healed, 1 unhealed, 0 skipped``: the three main statuses always, the others
    (masked, declined) where they occur, in report order."""
    return ", ".join(f"{report.count(status)} {status}" for status in STATUSES
                     if report.count(status) or status in (HEALED, UNHEALED, SKIPPED))


def error_headline(group: BugGroup) -> str:
    """The bug's error line as patches, reports and CI annotations show it."""
    return group.first.error.headline[:HEADLINE_CHARS]


def edit_levels(result: HealResult) -> list[list[str]]:
    """How each round's edits matched (``exact``, ``whitespace``...), round by round."""
    return [[edit.level for edit in record.edits] for record in result.rounds]


def round_prompt_file(bug: BugReport, record: RoundRecord, save_prompts: bool) -> str:
    """The round's prompt file relative to the report dir; "" when none is written."""
    return prompt_file(bug.group.id, record) if save_prompts else ""


def prompt_tokens(chars: int) -> int:
    """An estimate of a prompt's tokens from its characters (see context.CHARS_PER_TOKEN)."""
    return math.ceil(chars / CHARS_PER_TOKEN)
