"""The end of a session: its report, for the controller to publish; in apply mode the
session then writes the tree from it (:func:`pytest_kernelfix.report.writeback.write_healed`,
the only writer to your tree)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pytest_kernelfix.heal.outcomes import HEALED, MASKED, HealResult
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.report.model import BugReport, SessionReport
from pytest_kernelfix.report.patches import patch_name
from pytest_kernelfix.rerun.launcher import RerunStats
from pytest_kernelfix.session.inputs import SessionInputs


def earlier_patches(result: HealResult, finals: Mapping[str, tuple[str, str]]) -> tuple[str, ...]:
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
        builds_on = earlier_patches(result, finals) if result.status == HEALED else ()
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
