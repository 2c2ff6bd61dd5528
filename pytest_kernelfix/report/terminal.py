"""The terminal summary: one line per bug, then the patches to apply and the report."""

from __future__ import annotations

from pathlib import Path

from pytest_kernelfix.heal.outcomes import HEALED, MASKED
from pytest_kernelfix.locate.change import REGRESSION, TEST_CHANGED, Regression
from pytest_kernelfix.report.model import SessionReport
from pytest_kernelfix.report.patches import apply_command, display_path, repository_root
from pytest_kernelfix.report.unselected import unselected_lines


def summary_lines(report: SessionReport, json_path: Path | None) -> list[str]:
    """The terminal summary: one line per bug, then the patches and the report."""
    lines = []
    for bug in report.bugs:
        result = bug.result
        detail = result.reason
        if result.status == HEALED and result.healed_by:
            detail = (f"healed by the patch of {result.healed_by} ({len(bug.group.nodeids)} "
                      "test(s)); no patch of its own")
        elif result.status == HEALED:
            levels = ", ".join(e.level for e in result.rounds[-1].edits if e.level != "none")
            detail = (f"{len(result.rounds)} round(s), {len(bug.group.nodeids)} test(s), "
                      f"{', '.join(result.changed_files)} ({levels})")
        if result.revert:
            detail += " (a revert of the change)"
        lines.append(f"{result.status:<9} {bug.group.id}: {detail}")
        if result.regression is not None and result.regression.verdict != TEST_CHANGED:
            lines += [f"          {line}" for line in regression_lines(result.regression)]
    lines += unselected_lines(report.unselected, report.select)
    patches = [b for b in report.bugs if b.patch_file and b.result.status == HEALED
               and not b.applied]  # a patch already written needs no git apply line
    repo, cwd = repository_root(report.rootdir), Path.cwd()
    if patches:
        lines.append("")
        ordered = any(bug.builds_on for bug in patches)
        lines.append("patches (each verified on a sandbox copy"
                     + ("; apply them in this order" if ordered else "") + "):")
        for bug in patches:
            patch = report.report_dir / bug.patch_file
            lines.append(f"  {apply_command(patch, report.rootdir, cwd, repo)}")
    review = [b for b in report.bugs if b.patch_file and b.result.status == MASKED]
    if review:
        lines.append("")
        lines.append("kept for review, not fixes (they mask the kernel's unchanged output):")
        lines += [f"  {display_path(report.report_dir / b.patch_file, cwd)}" for b in review]
    applied = [path for bug in report.bugs for path in bug.applied]
    if applied:
        lines.append("")
        lines.append(f"written to the working tree: {', '.join(applied)}")
    for bug in report.bugs:
        if bug.apply_error:
            lines.append(f"not written ({bug.group.id}): {bug.apply_error}")
    hits = report.usage.cache_hits
    if hits:
        lines.append(f"answers from the cache: {hits} (no call, no cost)")
    for note in report.notes:
        lines.append(f"note: {note}")
    if json_path is not None:
        lines.append(f"report: {display_path(json_path, Path.cwd())}")
    return lines


def regression_lines(regression: Regression | None, revert: bool = False) -> list[str]:
    """How a reviewer reads the experiment: which lines of the change introduced the
    failure, the reruns that show it, and whether the patch only reverts them."""
    if regression is None:
        return []
    lines = [regression.summary]
    if regression.verdict == REGRESSION:
        for hunk in regression.culprits:
            now = " / ".join(line.strip() for line in hunk.lines) or "(lines removed)"
            was = " / ".join(line.strip() for line in hunk.base_lines) or "(nothing)"
            lines.append(f"  {hunk.path}:{hunk.span}: `{now[:160]}` (was `{was[:160]}`)")
    if revert:
        lines.append("the winning patch only reverts lines of the change (a revert, not a fix "
                     "of the change): review whether the change's intent can be kept")
    return lines
