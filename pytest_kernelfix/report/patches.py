"""Patch files, and the ``git apply`` line that applies one.

Patches are written the way Hypothesis writes its patches: a short header git ignores,
``a/`` ``b/`` paths relative to the rootdir, a stable name derived from the bug, and a
``git apply`` line in the summary. A bug healed on top of an earlier bug's patch (they
share a file) has a patch that applies after that one: the summary prints them in that
order. A bug that another bug's patch already heals has no patch of its own. A masked
bug's candidate is kept for review as ``<bug>.masked.patch``, never applied.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from pytest_kernelfix import __version__
from pytest_kernelfix.heal.outcomes import HEALED, MASKED, HealResult
from pytest_kernelfix.locate.change import REGRESSION
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.redact import redact
from pytest_kernelfix.report.folder import write_atomic
from pytest_kernelfix.report.model import SessionReport, error_headline
from pytest_kernelfix.root import git_top

PATCH_MARKER = "Generated-by: pytest-kernelfix"


def patch_name(group: BugGroup, status: str = HEALED) -> str:
    return f"{group.id}.masked.patch" if status == MASKED else f"{group.id}.patch"


def patch_text(group: BugGroup, result: HealResult) -> str:
    """The patch file: a header that ``git apply`` skips (redacted), then the diff."""
    header = [
        f"{PATCH_MARKER} {__version__}",
        f"Bug: {group.id}",
        f"Error: {error_headline(group)}",
        f"Tests: {len(group.nodeids)} ({group.nodeids[0]}"
        + (", ..." if len(group.nodeids) > 1 else "") + ")",
        f"Rounds: {len(result.rounds)}",
    ]
    if result.status == MASKED:
        header.append("Status: masked, kept for review: the kernel's output is unchanged and "
                      "this patch masks it; it is not a fix")
    if result.regression is not None and result.regression.verdict == REGRESSION:
        header.append(f"Regression: {result.regression.summary}")
    if result.revert:
        header.append("Revert: this patch only puts back lines of the change since "
                      f"{result.regression.base if result.regression else 'the base'}")
    header.append("")
    return redact("\n".join(header)) + "\n" + result.patch


def write_patches(report: SessionReport) -> None:
    """Write the patch of every bug that has one (see :attr:`BugReport.patch_file`)."""
    for bug in report.bugs:
        if bug.patch_file:
            write_atomic(report.report_dir / bug.patch_file, patch_text(bug.group, bug.result))


def remove_stale_patches(report_dir: Path, keep: Sequence[str]) -> None:
    """Delete patches an earlier session wrote that this session did not write again."""
    if not report_dir.is_dir():
        return
    for path in report_dir.glob("*.patch"):  # masked patches too (*.masked.patch)
        if path.name in keep:
            continue
        try:
            head = path.read_text(encoding="utf-8", errors="replace")[:200]
        except OSError:
            continue
        if head.startswith(PATCH_MARKER):
            path.unlink(missing_ok=True)


def display_path(path: Path, start: Path) -> str:
    """``path`` relative to ``start`` when inside it, else as it is."""
    try:
        return path.relative_to(start).as_posix()
    except ValueError:
        return str(path)


def repository_root(start: Path, environ: Mapping[str, str] | None = None) -> Path:
    """The git top level above ``start`` (a ``.git`` folder or file: worktrees,
    submodules); else ``$GITHUB_WORKSPACE`` when it holds ``start``; else ``start``."""
    start = Path(os.path.abspath(start))
    top = git_top(start)
    if top is not None:
        return top
    workspace = (environ if environ is not None else os.environ).get("GITHUB_WORKSPACE", "")
    if workspace and start.is_relative_to(os.path.abspath(workspace)):
        return Path(os.path.abspath(workspace))
    return start


def apply_command(patch: Path, rootdir: Path, cwd: Path, repo: Path | None = None) -> str:
    """The ``git apply`` line, run from ``cwd``, for a patch whose paths are relative to
    ``rootdir``.

    When the rootdir is a subdirectory of a git repository, git reads patch paths from
    the top level (and silently skips those outside the current directory), so the line
    runs at the top level with ``--directory=<rootdir>``.
    """
    repo = Path(os.path.abspath(repository_root(rootdir) if repo is None else repo))
    if repo == Path(os.path.abspath(rootdir)):
        inside = display_path(patch, rootdir)
        if os.path.abspath(rootdir) == os.path.abspath(cwd):
            return f"git apply {inside}"
        return f"git -C {os.path.relpath(rootdir, cwd)} apply {inside}"
    where = "" if repo == Path(os.path.abspath(cwd)) else f"-C {os.path.relpath(repo, cwd)} "
    prefix = Path(os.path.relpath(rootdir, repo)).as_posix()
    return f"git {where}apply --directory={prefix} {display_path(patch, repo)}"
