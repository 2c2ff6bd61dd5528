"""The end of a session: in apply mode the healed files are written (the only writer
to your tree: :func:`pytest_kernelfix.report.writeback.write_back`), and the report is
made, for the controller to publish."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_kernelfix.heal.outcomes import HEALED, MASKED, HealResult
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.project import Project
from pytest_kernelfix.report.artifacts import BugReport, SessionReport, patch_name
from pytest_kernelfix.report.writeback import StaleFileError, write_back
from pytest_kernelfix.rerun.launcher import RerunStats
from pytest_kernelfix.session.inputs import SessionInputs


def write_patch(report_dir: Path, project: Project, group: BugGroup, result: HealResult,
           written: Mapping[str, str]) -> tuple[tuple[str, ...], str]:
    """Write the bug's files; ``written`` says which bug wrote each file earlier in this
    session (this bug's text builds on theirs, so no test-time hash applies)."""
    changes = {
        path: (result.original[path], result.final[path]) for path in result.changed_files
    }
    expected: dict[str, str] = {}
    for failure in group.failures:
        for path, digest in failure.hashes:
            if os.path.isfile(path) and project.contains(path):
                expected.setdefault(project.relative(path), digest)
    for path in written:
        expected.pop(path, None)
    try:
        done = write_back(
            project.root, changes, expected=expected,
            backup_dir=report_dir / "backup" / group.id, lock_dir=report_dir / "locks",
        )
    except (StaleFileError, OSError) as error:
        return (), str(error)
    return done.written, ""


def earlier_patches(result: HealResult, finals: Mapping[str, tuple[str, str]]) -> tuple[str, ...]:
    """The earlier bugs whose patched text this bug's patch starts from."""
    return tuple(dict.fromkeys(
        bug for path, (bug, text) in finals.items()
        if path in result.changed_files and result.original.get(path) == text))


def finish(
    inputs: SessionInputs, results: Sequence[tuple[BugGroup, HealResult]], seconds: float,
    *, reruns: Mapping[int, RerunStats], workers: int, interrupted: str = "",
) -> SessionReport:
    """The session's report; in apply mode the healed files are written first (only
    those: a bug an interrupt stopped wrote nothing).

    ``reruns`` holds each bug's rerun statistics by its index in ``results``;
    ``interrupted`` says what stopped the session early (``Ctrl-C``, ``SIGTERM``), if
    anything did.
    """
    settings = inputs.settings
    report_dir = settings.report_dir
    bugs = []
    finals: dict[str, tuple[str, str]] = {}  # path -> (bug, text its patch leaves)
    written: dict[str, str] = {}  # path -> bug that wrote it (apply mode)
    for index, (group, result) in enumerate(results):
        applied: tuple[str, ...] = ()
        error = ""
        builds_on = earlier_patches(result, finals) if result.status == HEALED else ()
        if settings.apply and result.status == HEALED and result.healed_by:
            error = (f"already applied by {result.healed_by}" if any(
                bug in written.values() for bug in result.healed_by.split(", ")) else "")
        elif settings.apply and result.status == HEALED and result.changed_files:
            applied, error = write_patch(report_dir, inputs.project, group, result, written)
            if error and builds_on and not set(builds_on) <= set(written.values()):
                error = (f"not written: it builds on the patch of {', '.join(builds_on)}, "
                         f"which was not written ({error})")
            written.update((path, group.id) for path in applied)
        if result.status == HEALED:
            finals.update((path, (group.id, result.final[path]))
                          for path in result.changed_files)
        keep = result.status in (HEALED, MASKED) and bool(result.patch)
        patch = patch_name(group, result.status) if keep else ""
        bugs.append(BugReport(group, result, patch, applied, error,
                              reruns.get(index, RerunStats()), builds_on))
    return SessionReport(
        bugs=tuple(bugs),
        rootdir=inputs.project.root,
        report_dir=report_dir,
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
