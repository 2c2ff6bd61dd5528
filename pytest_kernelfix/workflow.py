"""From captured failures to written artifacts: one healing session, start to end.

Groups failures into bugs, heals each bug in one shared sandbox (a baseline rerun
first: a failure that does not reproduce there is not healed), writes patches and
reports, and with ``--kernelfix-apply`` writes healed files into the tree. Knows no
pytest hooks: the plugin hands it plain data and a fixer.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath

from filelock import FileLock

from pytest_kernelfix.capture import Failure, PassedTest
from pytest_kernelfix.config import Settings
from pytest_kernelfix.context import build_context
from pytest_kernelfix.fixers.base import Fixer
from pytest_kernelfix.grouping import (
    DEFAULT_TEST_PATTERNS,
    BugGroup,
    group_failures,
    regression_nodeids,
    relative,
)
from pytest_kernelfix.heal import HEALED, SKIPPED, Guard, HealResult, RoundRecord, heal
from pytest_kernelfix.report import (
    BugReport,
    SessionReport,
    write_patches,
    write_reports,
)
from pytest_kernelfix.rerun import RerunResult, RerunSpec
from pytest_kernelfix.sandbox import Sandbox
from pytest_kernelfix.shim import bf16_exact
from pytest_kernelfix.shim.limits import bf16_limitation
from pytest_kernelfix.verify import Verifier, first_line, gate_results, no_outcomes
from pytest_kernelfix.writeback import StaleFileError, write_back

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SessionInputs:
    """What the test run left for healing, and how reruns must be made."""

    failures: tuple[Failure, ...]
    passed: tuple[PassedTest, ...]
    settings: Settings
    device: str
    rerun: RerunSpec
    test_patterns: tuple[str, ...] = DEFAULT_TEST_PATTERNS
    notes: tuple[str, ...] = field(default_factory=tuple)


def _skipped(group: BugGroup, reason: str) -> HealResult:
    return HealResult(group_id=group.id, status=SKIPPED, reason=reason)


def read_originals(root: Path, paths: Sequence[str]) -> dict[str, str]:
    """The exact text of each file (newlines untouched, so CRLF files stay CRLF)."""
    return {path: (root / path).read_bytes().decode("utf-8") for path in paths}


def protected_files(root: Path, group: BugGroup) -> tuple[str, ...]:
    """Test modules of the bug and every conftest.py pytest loads for them."""
    found: list[str] = []
    for failure in group.failures:
        if not failure.test_path or not os.path.isfile(failure.test_path):
            continue
        rel = relative(failure.test_path, root)
        found.append(rel)
        parent = PurePosixPath(rel).parent
        for depth in range(len(parent.parts) + 1):
            conftest = PurePosixPath(*parent.parts[:depth], "conftest.py").as_posix()
            if (root / conftest).is_file():
                found.append(conftest)
    return tuple(dict.fromkeys(found))


def checks_for(device: str, gate: bool) -> tuple[str, ...]:
    """How candidates are verified, in words a prompt can pass on to the model."""
    if device == "cuda":
        return ("The failing tests and the tests that passed before are rerun on a CUDA GPU.",)
    checks = [
        "The failing tests and the tests that passed before are rerun on the Triton "
        "interpreter (TRITON_INTERPRET=1) on CPU; it cannot see GPU-only problems such as "
        "races, shared-memory limits, tl.dot shape limits or unsupported constructs."
    ]
    if gate:
        checks.append("Each launched kernel is then compiled for a real GPU target; "
                      "compile errors reject the fix.")
    return tuple(checks)


NO_EDITABLE_SOURCE = (
    "no editable source: the failure is not in project code (it is in a test, a conftest "
    "or an installed package), or its files are symlinks, binary, over 256 KiB or outside "
    "kernelfix_paths"
)


def _did_not_reproduce(baseline: RerunResult, nodeids: Sequence[str]) -> str:
    if baseline.timed_out or baseline.crash_reason:
        return ""
    if baseline.collection_errors:
        return ("the tests cannot be collected in the sandbox copy: "
                + first_line(baseline.collection_errors[0]))
    if len(baseline.missing(nodeids)) == len(nodeids):
        return "the unpatched tests cannot be rerun in the sandbox: " + no_outcomes(baseline)
    if all(baseline.passed([n]) for n in nodeids):
        return ("the failure does not reproduce in a sandbox rerun (flaky, order-dependent or "
                "environment-dependent); nothing to heal")
    return ""


def raised_in_kernel(failure: Failure) -> str:
    """The launched kernel whose code raised the error under the interpreter, or ""."""
    launched = {(launch.name, os.path.abspath(launch.file)) for launch in failure.launches}
    for frame in reversed(failure.error.frames):
        if (frame.name, os.path.abspath(frame.path)) in launched:
            return frame.name
    return ""


def interpreter_limitation(group: BugGroup, baseline: RerunResult, target: str) -> str:
    """Why the failure is the interpreter's, not the kernel's: "" when it is the kernel's.

    Errors raised while the interpreter runs a kernel are the ones the compiler checks
    too; when the gate compiles the very same launch for a GPU, the interpreter is wrong.
    """
    kernel = raised_in_kernel(group.first)
    if not kernel:
        return ""
    verdicts = [gate for gate in gate_results(baseline) if gate.kernel == kernel]
    if not verdicts or not all(gate.ok and not gate.error for gate in verdicts):
        return ""  # not compiled (skipped, or not launched in the rerun) or really broken
    return (f"interpreter limitation: the Triton interpreter raises "
            f"{group.first.error.headline!r} in {kernel}, but the same launch compiles for "
            f"{target}; nothing to heal (run the test on a GPU to confirm)")


def _passes_with_cuda_shim(verifier: Verifier, group: BugGroup) -> bool:
    """With ``kernelfix_cuda_shim`` off: does the failure vanish once it is on?"""
    plan = {**verifier.template.plan, "cuda_shim": True}
    spec = replace(verifier.template, sandbox_root=verifier.sandbox.root,
                   original_root=verifier.sandbox.source, nodeids=group.nodeids, plan=plan)
    return verifier.runner(spec).passed(group.nodeids)


def _heal_group(
    group: BugGroup,
    inputs: SessionInputs,
    sandbox: Sandbox,
    fixer: Fixer,
    guard: Guard | None,
    progress: Progress,
) -> HealResult:
    settings = inputs.settings
    root = settings.rootdir
    try:
        originals = read_originals(root, group.editable)
    except (OSError, UnicodeDecodeError) as error:
        return _skipped(group, f"cannot read the editable source: {error}")
    context = build_context(
        group, root, device=inputs.device,
        checks=checks_for(inputs.device, settings.gate_enabled and inputs.device != "cuda"),
    )
    verifier = Verifier(
        sandbox,
        inputs.rerun,
        group.nodeids,
        regression_nodeids(group, inputs.passed, root),
        launched=[f.nodeid for f in group.failures if f.launches],
        protected=protected_files(root, group),
    )
    try:
        baseline = verifier.baseline(originals)
        why_not = _did_not_reproduce(baseline, group.nodeids)
        if not why_not and inputs.device == "interpret":
            why_not = interpreter_limitation(group, baseline, settings.target)
            why_not = why_not or bf16_limitation(group.first, bf16_exact=bf16_exact())
            if not why_not and not settings.cuda_shim and _passes_with_cuda_shim(verifier, group):
                why_not = ("interpreter limitation: the tests pass once device='cuda' tensors "
                           "and torch.cuda queries are mapped to the CPU (kernelfix_cuda_shim "
                           "is off); nothing to heal")
        if why_not:
            return _skipped(group, why_not)

        def on_round(record: RoundRecord) -> None:
            edits = ", ".join(e.level for e in record.edits) or "no edits"
            progress(f"  round {record.round} ({edits}): {record.outcome}")

        return heal(
            context, originals, fixer=fixer, verify=verifier, rounds=settings.rounds,
            guard=guard, on_round=on_round,
        )
    finally:
        verifier.restore()


def _apply(
    report_dir: Path, root: Path, group: BugGroup, result: HealResult
) -> tuple[tuple[str, ...], str]:
    changes = {
        path: (result.original[path], result.final[path]) for path in result.changed_files
    }
    expected: dict[str, str] = {}
    for failure in group.failures:
        for path, digest in failure.hashes:
            if os.path.isfile(path):
                expected.setdefault(relative(path, root), digest)
    try:
        done = write_back(
            root, changes, expected=expected,
            backup_dir=report_dir / "backup" / group.id, lock_dir=report_dir / "locks",
        )
    except (StaleFileError, OSError) as error:
        return (), str(error)
    return done.written, ""


def run_healing(
    inputs: SessionInputs,
    fixer: Fixer,
    *,
    guard: Guard | None = None,
    progress: Progress = lambda line: None,
) -> SessionReport:
    """Heal every bug of the session; write patches, reports and (apply mode) files."""
    started = time.monotonic()
    settings = inputs.settings
    root = settings.rootdir
    groups = group_failures(inputs.failures, root, inputs.test_patterns, settings.paths)
    results: list[tuple[BugGroup, HealResult]] = []
    exclude = list(settings.sandbox_exclude)
    if settings.report_dir.is_relative_to(root):
        exclude.append(settings.report_dir.relative_to(root).as_posix())
    sandbox: Sandbox | None = None
    try:
        for index, group in enumerate(groups):
            if index >= settings.max_groups:
                results.append((group, _skipped(
                    group, f"over the limit of {settings.max_groups} bugs per session "
                           "(--kernelfix-max-groups)")))
                continue
            progress(f"healing {group.id} ({len(group.nodeids)} test(s); "
                     f"{', '.join(group.editable) or 'no editable file'})")
            if not group.editable:
                result = _skipped(group, NO_EDITABLE_SOURCE)
            else:
                sandbox = sandbox or Sandbox.create(root, exclude=exclude)
                result = _heal_group(group, inputs, sandbox, fixer, guard, progress)
            progress(f"  {result.status}: {result.reason}")
            results.append((group, result))
    finally:
        if sandbox is not None:
            sandbox.close()
    return _finish(inputs, results, time.monotonic() - started)


def _finish(
    inputs: SessionInputs, results: Sequence[tuple[BugGroup, HealResult]], seconds: float
) -> SessionReport:
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
                applied, error = _apply(report_dir, settings.rootdir, group, result)
            bugs.append(BugReport(group, result, patches.get(group.id, ""), applied, error))
        report = SessionReport(
            bugs=tuple(bugs),
            rootdir=settings.rootdir,
            report_dir=report_dir,
            mode="apply" if settings.apply else "report",
            device=inputs.device,
            model=settings.model,
            seconds=seconds,
            notes=inputs.notes,
        )
        write_reports(report)
    return report
