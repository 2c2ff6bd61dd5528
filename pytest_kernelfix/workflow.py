"""From captured failures to written artifacts: one healing session, start to end.

A pipeline of plain stages: group the failures into bugs, heal each bug in one shared
sandbox (a baseline rerun first: :meth:`Verifier.triage` skips what is not the kernel's
to heal), then write patches and reports, and with ``--kernelfix-apply`` the healed files.
Knows no pytest hooks: the controller hands it plain data (:class:`SessionInputs`) and
the parts a caller may swap (:class:`Stages`: the fixer, the guard, the rerun runner,
the sandbox factory), so the whole session runs in a unit test with a fake runner.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from filelock import FileLock

from pytest_kernelfix.capture import Failure, PassedTest
from pytest_kernelfix.config import Settings
from pytest_kernelfix.context import build_context
from pytest_kernelfix.fixers.base import Fixer
from pytest_kernelfix.fixers.budget import Budget, BudgetedFixer
from pytest_kernelfix.github import write_suggestions
from pytest_kernelfix.grouping import BugGroup, group_failures, regression_nodeids
from pytest_kernelfix.heal import heal
from pytest_kernelfix.outcomes import HEALED, SKIPPED, Guard, HealResult, RoundRecord
from pytest_kernelfix.project import Project
from pytest_kernelfix.report import BugReport, SessionReport, write_patches, write_reports
from pytest_kernelfix.rerun import RerunSetup, run_tests
from pytest_kernelfix.rerun_plan import DevicePlan
from pytest_kernelfix.sandbox import Sandbox
from pytest_kernelfix.verify import Runner, Verifier
from pytest_kernelfix.writeback import StaleFileError, write_back

Progress = Callable[[str], None]
SandboxFactory = Callable[[Path, Sequence[str]], Sandbox]


@dataclass(frozen=True)
class SessionInputs:
    """What the test run left for healing, and how reruns must be made.

    ``notes`` are the session's own remarks, written into ``report.json`` and
    ``report.md`` as well as shown on the terminal.
    """

    failures: tuple[Failure, ...]
    passed: tuple[PassedTest, ...]
    settings: Settings
    setup: RerunSetup
    project: Project
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def device(self) -> str:
        """The resolved device, ``cuda`` or ``interpret`` (decided once, in the setup)."""
        return self.setup.device.mode


def _create_sandbox(root: Path, exclude: Sequence[str]) -> Sandbox:
    return Sandbox.create(root, exclude=exclude)


@dataclass(frozen=True)
class Stages:
    """The parts of a session a caller chooses: who proposes, what is refused statically,
    how tests are rerun, and where progress lines go."""

    fixer: Fixer
    guard: Guard | None = None
    runner: Runner = run_tests
    sandbox: SandboxFactory = _create_sandbox
    progress: Progress = lambda line: None


def checks_for(device: DevicePlan) -> tuple[str, ...]:
    """How candidates are verified, in words a prompt can pass on to the model."""
    if not device.interpret:
        return ("The failing tests and the tests that passed before are rerun on a CUDA GPU.",)
    checks = [
        "The failing tests and the tests that passed before are rerun on the Triton "
        "interpreter (TRITON_INTERPRET=1) on CPU; it cannot see GPU-only problems such as "
        "races, shared-memory limits, tl.dot shape limits or unsupported constructs."
    ]
    if device.gate:
        checks.append("Each launched kernel is then compiled for a real GPU target; "
                      "compile errors reject the fix.")
    return tuple(checks)


NO_EDITABLE_SOURCE = (
    "no editable source: the failure is not in project code (it is in a test, a conftest "
    "or an installed package), or its files are symlinks, binary, over 256 KiB or outside "
    "kernelfix_paths"
)


def read_originals(root: Path, paths: Sequence[str]) -> dict[str, str]:
    """The exact text of each file (newlines untouched, so CRLF files stay CRLF)."""
    return {path: (root / path).read_bytes().decode("utf-8") for path in paths}


def _skipped(group: BugGroup, reason: str) -> HealResult:
    return HealResult(group_id=group.id, status=SKIPPED, reason=reason)


def run_healing(inputs: SessionInputs, stages: Stages) -> SessionReport:
    """Heal every bug of the session; write patches, reports and (apply mode) files."""
    started = time.monotonic()
    settings = inputs.settings
    project = inputs.project
    groups = group_failures(inputs.failures, project)
    results: list[tuple[BugGroup, HealResult]] = []
    exclude = list(settings.sandbox_exclude)
    for folder in (settings.report_dir, settings.cache_root):
        if folder.is_relative_to(project.root):
            exclude.append(folder.relative_to(project.root).as_posix())
    budget = Budget(settings.max_cost, settings.max_tokens)
    stages = replace(stages, fixer=BudgetedFixer(stages.fixer, budget))
    sandbox: Sandbox | None = None
    progress = stages.progress
    try:
        for index, group in enumerate(groups):
            if index >= settings.max_groups:
                results.append((group, _skipped(
                    group, f"over the limit of {settings.max_groups} bugs per session "
                           "(--kernelfix-max-groups)")))
                continue
            spent = budget.exhausted()
            if spent:
                results.append((group, _skipped(group, spent)))
                continue
            progress(f"healing {group.id} ({len(group.nodeids)} test(s); "
                     f"{', '.join(group.editable) or 'no editable file'})")
            if not group.editable:
                result = _skipped(group, NO_EDITABLE_SOURCE)
            else:
                sandbox = sandbox or stages.sandbox(project.root, exclude)
                result = heal_bug(group, inputs, sandbox, stages)
            progress(f"  {result.status}: {result.reason}")
            results.append((group, result))
    finally:
        if sandbox is not None:
            sandbox.close()
    return finish(inputs, results, time.monotonic() - started)


def heal_bug(group: BugGroup, inputs: SessionInputs, sandbox: Sandbox, stages: Stages) -> (
    HealResult
):
    """One bug: baseline and triage, then the round loop, in the shared sandbox."""
    project = inputs.project
    try:
        originals = read_originals(project.root, group.editable)
    except (OSError, UnicodeDecodeError) as error:
        return _skipped(group, f"cannot read the editable source: {error}")
    context = build_context(group, project, device=inputs.device,
                            checks=checks_for(inputs.setup.device))
    verifier = Verifier(
        sandbox,
        inputs.setup,
        group.nodeids,
        regression_nodeids(group, inputs.passed, project),
        launched=[f.nodeid for f in group.failures if f.launches],
        protected=project.protected_files(f.test_path for f in group.failures),
        runner=stages.runner,
    )
    try:
        why_not = verifier.triage(verifier.baseline(originals), group.first)
        if why_not:
            return _skipped(group, why_not)

        def on_round(record: RoundRecord) -> None:
            edits = ", ".join(e.level for e in record.edits) or "no edits"
            stages.progress(f"  round {record.round} ({edits}): {record.outcome}")

        return heal(
            context, originals, fixer=stages.fixer, verify=verifier,
            rounds=inputs.settings.rounds, guard=stages.guard, on_round=on_round,
        )
    finally:
        verifier.restore()


def _apply(report_dir: Path, project: Project, group: BugGroup, result: HealResult) -> (
    tuple[tuple[str, ...], str]
):
    changes = {
        path: (result.original[path], result.final[path]) for path in result.changed_files
    }
    expected: dict[str, str] = {}
    for failure in group.failures:
        for path, digest in failure.hashes:
            if os.path.isfile(path) and project.contains(path):
                expected.setdefault(project.relative(path), digest)
    try:
        done = write_back(
            project.root, changes, expected=expected,
            backup_dir=report_dir / "backup" / group.id, lock_dir=report_dir / "locks",
        )
    except (StaleFileError, OSError) as error:
        return (), str(error)
    return done.written, ""


def finish(
    inputs: SessionInputs, results: Sequence[tuple[BugGroup, HealResult]], seconds: float
) -> SessionReport:
    """Write patches and reports (and, in apply mode, the healed files); the report."""
    settings = inputs.settings
    report_dir = settings.report_dir
    report_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(report_dir / ".report.lock"), timeout=120):
        patches = write_patches(results, report_dir)
        bugs = []
        for group, result in results:
            applied: tuple[str, ...] = ()
            error = ""
            if settings.apply and result.status == HEALED and result.changed_files:
                applied, error = _apply(report_dir, inputs.project, group, result)
            bugs.append(BugReport(group, result, patches.get(group.id, ""), applied, error))
        report = SessionReport(
            bugs=tuple(bugs),
            rootdir=inputs.project.root,
            report_dir=report_dir,
            mode="apply" if settings.apply else "report",
            device=inputs.device,
            model=settings.model,
            seconds=seconds,
            notes=inputs.notes,
            max_cost=settings.max_cost,
            max_tokens=settings.max_tokens,
        )
        write_reports(report)
        write_suggestions(report)
    return report
