"""Write the winning patches into the working tree, and never anything else.

``--kernelfix-apply`` is the only path by which the plugin touches the user's files: a
step of its own, which the session runs on the finished report (:func:`write_healed`).
Every write is atomic (temporary file + ``os.replace``, mode kept), serialised by a
``filelock`` per file (xdist workers, concurrent sessions), and refused when the file
changed since the test ran. The original bytes are kept under the report dir for undo.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from filelock import FileLock

from pytest_kernelfix.atomic import replace_file
from pytest_kernelfix.heal.outcomes import HEALED
from pytest_kernelfix.project import Project
from pytest_kernelfix.report.model import BugReport, SessionReport


class StaleFileError(Exception):
    """The file on disk is not the one the heal started from."""


@dataclass(frozen=True)
class WriteBack:
    """What was written: relative paths, and where the originals were saved."""

    written: tuple[str, ...]
    backup_dir: Path


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _lock_for(path: Path, lock_dir: Path) -> FileLock:
    lock_dir.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:16]
    return FileLock(str(lock_dir / f"{name}.lock"), timeout=60)


def write_back(
    rootdir: Path,
    changes: Mapping[str, tuple[str, str]],
    *,
    expected: Mapping[str, str],
    backup_dir: Path,
    lock_dir: Path,
) -> WriteBack:
    """Write ``changes`` (relative path -> (original text, new text)) into ``rootdir``.

    ``expected`` maps relative paths to the sha256 of the file when the test ran. All
    files of one patch are checked before any is written: one stale file stops them all.
    """
    root = rootdir.resolve()
    targets: dict[str, Path] = {}
    for rel in changes:
        path = (root / rel).resolve()
        if root not in path.parents or path.is_symlink() or (root / rel).is_symlink():
            raise StaleFileError(f"{rel} is not a regular file inside the rootdir")
        targets[rel] = path
    locks = [_lock_for(path, lock_dir) for path in targets.values()]
    for lock in locks:
        lock.acquire()
    try:
        for rel, path in targets.items():
            original, _ = changes[rel]
            data = path.read_bytes() if path.exists() else b""
            if not path.exists():
                raise StaleFileError(f"{rel} no longer exists")
            if rel in expected and expected[rel] and _sha256(data) != expected[rel]:
                raise StaleFileError(f"{rel} changed since the test ran (stale); not written")
            if data.decode("utf-8", errors="replace") != original:
                raise StaleFileError(f"{rel} differs from the text the heal started from "
                                     "(stale); not written")
        for rel, path in targets.items():
            saved = backup_dir / rel
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_bytes(path.read_bytes())
        for rel, path in targets.items():
            replace_file(path, changes[rel][1].encode("utf-8"))
    finally:
        for lock in reversed(locks):
            lock.release()
    return WriteBack(tuple(targets), backup_dir)


def write_healed(report: SessionReport, project: Project) -> SessionReport:
    """Write every healed bug's files into the tree, in report order (a patch that builds
    on an earlier one comes after it); the report, with what each bug wrote
    (``applied``) or why it did not (``apply_error``)."""
    written: dict[str, str] = {}  # path -> bug that wrote it
    bugs = []
    for bug in report.bugs:
        result = bug.result
        applied: tuple[str, ...] = ()
        error = ""
        if result.status == HEALED and result.healed_by:
            error = (f"already applied by {result.healed_by}" if any(
                name in written.values() for name in result.healed_by.split(", ")) else "")
        elif result.status == HEALED and result.changed_files:
            applied, error = write_bug(bug, project, report.report_dir, written)
            if error and bug.builds_on and not set(bug.builds_on) <= set(written.values()):
                error = (f"not written: it builds on the patch of {', '.join(bug.builds_on)}, "
                         f"which was not written ({error})")
            written.update((path, bug.group.id) for path in applied)
        bugs.append(replace(bug, applied=applied, apply_error=error))
    return replace(report, bugs=tuple(bugs))


def write_bug(bug: BugReport, project: Project, report_dir: Path,
              written: Mapping[str, str]) -> tuple[tuple[str, ...], str]:
    """Write one bug's files: the paths written, or why none was. ``written`` says which
    bug wrote each file earlier in this session (this bug's text builds on theirs, so no
    test-time hash applies)."""
    group, result = bug.group, bug.result
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
