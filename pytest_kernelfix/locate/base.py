"""Which base a session compares the code with (``--kernelfix-base REF|auto|none``).

- ``REF``: any git revision; the change is the working tree against it (commits since it
  and uncommitted edits together).
- ``auto`` (the default): on a pull request in GitHub Actions, the merge base of ``HEAD``
  and the target branch (``GITHUB_BASE_REF``); in a GitLab merge-request pipeline,
  ``CI_MERGE_REQUEST_DIFF_BASE_SHA``. Elsewhere, per failing test, the last state in which
  it passed (:mod:`pytest_kernelfix.locate.green`), else the working tree's uncommitted
  changes against ``HEAD``.
- ``none``: no base.

A base the clone does not have (a shallow checkout) or a project outside git gets one
line saying what to fetch, and healing goes on without it. Git runs as a plain
subprocess with a timeout; nothing here writes to the repository.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_kernelfix.locate.change import Change, FileChange
from pytest_kernelfix.locate.green import GreenStore
from pytest_kernelfix.project import MAX_EDITABLE_BYTES, Project

AUTO, NONE = "auto", "none"
#: Changed files read from git at most.
MAX_CHANGED = 400
GIT_TIMEOUT = 30.0
_SUFFIX = "; healing goes on without a base"


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess[bytes] | None:
    """``git -C cwd ARGS`` (None when git cannot be run at all)."""
    try:
        return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True,
                              timeout=GIT_TIMEOUT, check=False,
                              env={**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"})
    except (OSError, subprocess.SubprocessError):
        return None


def _out(result: subprocess.CompletedProcess[bytes] | None) -> str:
    return result.stdout.decode("utf-8", "replace").strip() if result and (
        result.returncode == 0) else ""


def in_git(root: Path) -> bool:
    return bool(_out(git(root, "rev-parse", "--show-toplevel")))


def commit_of(root: Path, ref: str) -> str:
    """The commit ``ref`` names in this clone, or ""."""
    return _out(git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"))


@dataclass(frozen=True)
class GitBase:
    """A commit to diff the working tree against, and how a reader names it; ``ci``: it
    is the CI's base (a pull request's), which comes before the last green state."""

    rev: str
    label: str
    ci: bool = False


def find_git_base(requested: str, root: Path, environ: Mapping[str, str]
                  ) -> tuple[GitBase | None, str]:
    """The git base ``requested`` stands for, or (None, why not: "" when there is simply
    none, a line for the user when one was wanted and is missing)."""
    if requested == NONE:
        return None, ""
    has_git = in_git(root)
    if requested != AUTO:
        if not has_git:
            return None, (f"--kernelfix-base {requested}: {root} is not in a git "
                          f"repository{_SUFFIX}")
        rev = commit_of(root, requested)
        if not rev:
            return None, (f"--kernelfix-base {requested} is not in this clone (a shallow "
                          f"checkout?): fetch it (git fetch origin {requested}, or "
                          f"fetch-depth: 0 with actions/checkout){_SUFFIX}")
        return GitBase(rev, f"{requested} ({rev[:10]})", ci=True), ""
    branch = environ.get("GITHUB_BASE_REF", "").strip()
    gitlab = environ.get("CI_MERGE_REQUEST_DIFF_BASE_SHA", "").strip()
    if (branch or gitlab) and not has_git:
        return None, f"the CI's base cannot be read: {root} is not in a git repository{_SUFFIX}"
    if branch:
        ref = next((ref for ref in (f"refs/remotes/origin/{branch}", f"refs/heads/{branch}")
                    if commit_of(root, ref)), "")
        if not ref:
            return None, (f"the pull request's base branch {branch} is not in this clone "
                          f"(actions/checkout fetches one commit by default): fetch it (git "
                          f"fetch --no-tags origin {branch}, or fetch-depth: 0 with "
                          f"actions/checkout){_SUFFIX}")
        rev = _out(git(root, "merge-base", "HEAD", ref))
        if not rev:
            return None, (f"no merge base of HEAD and origin/{branch} in this clone (its "
                          f"history is shallow): fetch more history (fetch-depth: 0 with "
                          f"actions/checkout, or git fetch --unshallow){_SUFFIX}")
        return GitBase(rev, f"origin/{branch} (merge base {rev[:10]})", ci=True), ""
    if gitlab:
        rev = commit_of(root, gitlab)
        if not rev:
            return None, (f"the merge request's base {gitlab[:12]} is not in this clone: "
                          f"fetch it (GIT_DEPTH: 0, or git fetch origin "
                          f"$CI_MERGE_REQUEST_TARGET_BRANCH_NAME){_SUFFIX}")
        return GitBase(rev, f"the merge request's base ({rev[:10]})", ci=True), ""
    if not has_git:
        return None, ""
    rev = commit_of(root, "HEAD")
    return (GitBase(rev, "HEAD (uncommitted changes)"), "") if rev else (None, "")


def git_change(base: GitBase, project: Project) -> Change | None:
    """The project's files that differ between ``base`` and the working tree (tracked
    files; renames read as a removal and an addition), or None when none do."""
    root = project.root
    listed = git(root, "diff", "--no-renames", "--name-status", "-z", "--relative",
                 base.rev, "--", ".")
    if listed is None or listed.returncode != 0:
        return None
    fields = listed.stdout.decode("utf-8", "replace").split("\0")
    files: list[FileChange] = []
    skipped: list[str] = []
    for status, rel in zip(fields[0::2], fields[1::2], strict=False):
        if not rel or len(files) >= MAX_CHANGED:
            continue
        path = root / rel
        if not project.contains(path) or project.in_environment(str(path)):
            continue
        current = None if status.startswith("D") else _read(path)
        old = None if status.startswith("A") else _show(root, base.rev, rel)
        if (current is None and not status.startswith("D")) or (
                old is None and not status.startswith("A")):
            skipped.append(rel)  # binary, over the size limit or unreadable
            continue
        files.append(FileChange(rel, old, current, project.is_test_file(rel)))
    notes = (f"{len(skipped)} changed file(s) are not compared (binary or over "
             f"{MAX_EDITABLE_BYTES // 1024} KiB): {', '.join(skipped[:5])}",) if skipped else ()
    files = [change for change in files if change.hunks]
    return Change(base.label, tuple(files), notes) if files else None


def _read(path: Path) -> str | None:
    try:
        if path.stat().st_size > MAX_EDITABLE_BYTES:
            return None
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _show(root: Path, rev: str, rel: str) -> str | None:
    result = git(root, "show", f"{rev}:./{rel}")
    if result is None or result.returncode != 0 or len(result.stdout) > MAX_EDITABLE_BYTES:
        return None
    try:
        return result.stdout.decode("utf-8")
    except UnicodeDecodeError:
        return None


@dataclass(frozen=True)
class Changes:
    """Where each failing test's change comes from in this session, read once when it
    starts: the git change (``git``; ``first``: the CI's base or an explicit REF, which
    come before the last green state) and the last-green record (``green``).

    ``notes`` are the lines for the user found while reading (a base that was wanted and
    is missing, what could not be compared); ``unbased`` is the line for failing tests
    that have no base at all (no git, no record of a run in which they passed)."""

    git: Change | None = None
    first: bool = False
    green: GreenStore | None = None
    skip: tuple[Path, ...] = ()
    notes: tuple[str, ...] = ()
    unbased: str = ""

    def for_test(self, nodeid: str, project: Project) -> Change | None:
        """The change a failure of ``nodeid`` is compared with, or None."""
        if self.git is not None and self.first:
            return self.git
        if self.green is not None:
            green = self.green.change(nodeid, project, self.skip)
            if green is not None:
                return green
        return self.git

    def said(self, nodeids: Sequence[str]) -> tuple[str, ...]:
        """The lines to tell the user about the failures ``nodeids``."""
        if self.unbased and not (self.green is not None and any(
                self.green.state(nodeid) for nodeid in nodeids)):
            return (*self.notes, self.unbased)
        return self.notes

    def waits(self, project: Project) -> str:
        """The base a failure of this session will be compared with, when there is a
        change since it to bisect ("" when none): healing while the tests run gives way
        to the experiment, which needs the change."""
        if self.git is not None and self.git.source_hunks:
            return self.git.base
        if self.green is not None and self.green.differs(project, self.skip):
            return "the last green run"
        return ""


def resolve_changes(requested: str, project: Project, environ: Mapping[str, str], *,
                    green: Path | None = None, skip: Iterable[Path] = ()) -> Changes:
    """The session's :class:`Changes`: git is read here, once per session."""
    if requested == NONE:
        return Changes()
    base, why = find_git_base(requested, project.root, environ)
    change = git_change(base, project) if base is not None else None
    store = GreenStore(green) if green is not None and requested == AUTO else None
    notes = [why] if why else []
    notes += list(change.notes) if change is not None else []
    unbased = ""
    if requested == AUTO and base is None and not why and not in_git(project.root):
        unbased = (f"no base to compare the failing tests with: {project.root} is not in a "
                   "git repository and no run recorded in which they passed; healing "
                   "goes on without one")
    return Changes(change, bool(base and base.ci), store, tuple(skip), tuple(notes), unbased)
