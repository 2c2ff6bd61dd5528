"""Write a winning patch into the working tree, and never anything else.

``--kernelfix-apply`` is the only path by which the plugin touches the user's files.
Every write is atomic (temporary file + ``os.replace``, mode kept), serialised by a
``filelock`` per file (xdist workers, concurrent sessions), and refused when the file
changed since the test ran. The original bytes are kept under the report dir for undo.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from pytest_kernelfix.atomic import replace_file


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
