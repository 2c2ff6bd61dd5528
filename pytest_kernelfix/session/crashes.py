"""Tests that crashed an xdist worker: rerun each alone to learn what it launched.

A kernel that segfaults its process (an unmasked store under the interpreter) leaves
xdist nothing but "worker crashed while running X": no error, no frames, no launches.
Healing reruns X alone in the sandbox first; the rerun agent writes each launch as it
happens and faulthandler writes the crashing stack, so even a rerun that crashes again
tells which kernel it launched, from where, and the kernel line that was running.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from pytest_kernelfix.capture.errors import ErrorInfo, crash_dump
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.capture.records import Failure, Selection, involved_hashes
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun.launcher import RerunResult, RerunSetup, RerunSpec

Runner = Callable[[RerunSpec], RerunResult]


def reproduce(failure: Failure, setup: RerunSetup, sandbox_root: Path, runner: Runner,
              project: Project) -> tuple[Failure, str]:
    """The crashed ``failure`` as a rerun of it alone saw it, and a note ("" if none)."""
    result = runner(RerunSpec(setup, sandbox_root, (failure.nodeid,)))
    outcome = result.outcome(failure.nodeid)
    if result.crash_reason:
        dump, frames = crash_dump(result.output)
        launches = result.running_launches if result.running == failure.nodeid else ()
        why = replace(result, running="").crash_reason  # no nodeid: one bug, many params
        error = ErrorInfo(result.signal, why, frames)
        longrepr = "\n\n".join(part for part in (
            failure.longrepr, "Rerun alone in a sandbox copy, the test crashed again:",
            why, dump) if part)
        return _with(failure, error, longrepr, launches, project), ""
    if outcome is not None and outcome.outcome in ("failed", "error") and outcome.error:
        note = (f"{failure.nodeid} crashed its xdist worker, and failed without crashing "
                "when rerun alone; healing that failure")
        return _with(failure, outcome.error, outcome.longrepr, outcome.launches, project), note
    seen = "timed out" if result.timed_out else (outcome.outcome if outcome else "did not run")
    return failure, (f"{failure.nodeid} crashed its xdist worker but {seen} when rerun alone "
                     "in the sandbox")


def _with(failure: Failure, error: ErrorInfo, longrepr: str,
          launches: Sequence[KernelLaunch], project: Project) -> Failure:
    kept = tuple(launches)
    return replace(failure, error=error, longrepr=longrepr, launches=kept,
                   hashes=involved_hashes(error, kept, project.root))


def reproduce_crashes(
    failures: Sequence[Failure], setup: RerunSetup, sandbox_root: Path, runner: Runner,
    project: Project, selection: Selection,
) -> tuple[tuple[Failure, ...], tuple[str, ...]]:
    """Every failure, crashed ones rerun alone; those the selection no longer wants
    (``launched``: the rerun shows no project kernel) are left out with a note."""
    kept: list[Failure] = []
    notes: list[str] = []
    for failure in failures:
        if not failure.crashed:
            kept.append(failure)
            continue
        seen, note = reproduce(failure, setup, sandbox_root, runner, project)
        if note:
            notes.append(note)
        if selection.selects(seen.nodeid, seen.marked, seen.launches, project):
            kept.append(seen)
            continue
        launched = sum(1 for launch in seen.launches if project.contains(launch.file))
        notes.append(f"{seen.nodeid} crashed its xdist worker but kernelfix_select leaves it "
                     f"out ({'marked' if seen.marked else 'not marked'} kernel; it launched "
                     f"{launched} project kernel(s) when rerun alone)")
    return tuple(kept), tuple(notes)
