"""Group failures into bugs: one heal per bug, verified against all of its tests.

Parametrized kernel tests commonly fail 10-50 times from one bug. Failures that share
their editable files and their normalised error signature are one bug.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from pytest_kernelfix.capture import Failure, PassedTest, is_within

DEFAULT_TEST_PATTERNS = ("test_*.py", "*_test.py")
#: Larger files are never edit targets (nor written with a candidate larger than this).
MAX_EDITABLE_BYTES = 256 * 1024
TEST_DIRS = frozenset({"tests", "test", "testing"})
_ENV_MARKERS = ("site-packages", "dist-packages")


@dataclass(frozen=True)
class BugGroup:
    """One bug: its failing tests, the files a fix may edit, and a stable id."""

    id: str
    kernel: str
    signature: str
    editable: tuple[str, ...]
    failures: tuple[Failure, ...]

    @property
    def nodeids(self) -> tuple[str, ...]:
        return tuple(failure.nodeid for failure in self.failures)

    @property
    def first(self) -> Failure:
        return self.failures[0]


def relative(path: str, root: Path) -> str:
    return PurePosixPath(Path(os.path.abspath(path)).relative_to(os.path.abspath(root))).as_posix()


def is_test_file(relpath: str, test_patterns: Sequence[str] = DEFAULT_TEST_PATTERNS) -> bool:
    """Test modules, conftest files and anything under a tests/ directory are never edited."""
    posix = PurePosixPath(relpath)
    if posix.name == "conftest.py":
        return True
    if any(fnmatch.fnmatch(posix.name, pattern) for pattern in test_patterns):
        return True
    return any(part in TEST_DIRS for part in posix.parts[:-1])


def _in_environment(path: str, root: Path) -> bool:
    """Installed packages and virtualenvs inside the rootdir are not the project's code."""
    if any(marker in Path(path).parts for marker in _ENV_MARKERS):
        return True
    current = Path(path).parent
    root_abs = Path(os.path.abspath(root))
    while current != root_abs and root_abs in current.parents:
        if (current / "pyvenv.cfg").exists():
            return True
        current = current.parent
    return False


def is_plain_source(path: str, root: Path) -> bool:
    """A regular UTF-8 text file of at most :data:`MAX_EDITABLE_BYTES`, really in ``root``.

    Symlinks are not edit targets (a write would replace the link, or land outside the
    rootdir), and neither are files reached through a directory link that leaves it.
    """
    if os.path.islink(path) or not is_within(os.path.realpath(path), Path(os.path.realpath(root))):
        return False
    try:
        if os.path.getsize(path) > MAX_EDITABLE_BYTES:
            return False
        data = Path(path).read_bytes()
        data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return b"\0" not in data


def in_paths(relpath: str, paths: Sequence[str]) -> bool:
    """No patterns: every file; else ``relpath`` matches one (``fnmatch``, ``*`` spans ``/``)."""
    return not paths or any(
        fnmatch.fnmatchcase(relpath, pattern.strip().removeprefix("./")) for pattern in paths
    )


def editable_files(
    failure: Failure,
    root: Path,
    test_patterns: Sequence[str] = DEFAULT_TEST_PATTERNS,
    paths: Sequence[str] = (),
) -> tuple[str, ...]:
    """Project Python files in the traceback or holding a launched kernel, relative paths.

    Order: traceback files innermost first (closest to the fault), then launched
    kernels' files. Test files, conftests, symlinks, binary or oversized files are never
    editable; with ``paths`` (ini ``kernelfix_paths``) only files matching one are.
    """
    candidates = [frame.path for frame in reversed(failure.error.frames)]
    candidates += [launch.file for launch in failure.launches]
    seen: list[str] = []
    for path in candidates:
        if not path or not path.endswith(".py") or not is_within(path, root):
            continue
        if not os.path.isfile(path) or _in_environment(path, root):
            continue
        if os.path.abspath(path) == os.path.abspath(failure.test_path):
            continue
        rel = relative(path, root)
        if is_test_file(rel, test_patterns) or rel in seen or not in_paths(rel, paths):
            continue
        if not is_plain_source(path, root):
            continue
        seen.append(rel)
    return tuple(seen)


def _kernel_name(failure: Failure, editable: tuple[str, ...], root: Path) -> str:
    launched = {
        launch.name for launch in failure.launches if launch.file and is_within(launch.file, root)
    }
    for frame in reversed(failure.error.frames):
        if frame.name in launched:
            return frame.name
    for launch in failure.launches:
        if launch.file and is_within(launch.file, root) and relative(launch.file, root) in editable:
            return launch.name
    for frame in reversed(failure.error.frames):
        if is_within(frame.path, root) and relative(frame.path, root) in editable:
            return frame.name
    return PurePosixPath(editable[0]).stem if editable else "test"


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "-", text.lower()).strip("-") or "bug"


def group_id(kernel: str, error_type: str, signature: str, editable: Iterable[str]) -> str:
    """``<kernel>-<error type>-<6 hex>``: readable, stable across runs, unique per bug."""
    digest = hashlib.sha1("\n".join([signature, *sorted(editable)]).encode()).hexdigest()[:6]
    return f"{_slug(kernel)}-{_slug(error_type)}-{digest}"


def group_failures(
    failures: Sequence[Failure],
    root: Path,
    test_patterns: Sequence[str] = DEFAULT_TEST_PATTERNS,
    paths: Sequence[str] = (),
) -> list[BugGroup]:
    """Groups in order of first failure; failures without editable files form their own."""
    buckets: dict[tuple[tuple[str, ...], str], list[Failure]] = {}
    for failure in failures:
        editable = editable_files(failure, root, test_patterns, paths)
        key = (tuple(sorted(editable)), failure.error.signature())
        buckets.setdefault(key, []).append(failure)
    groups = []
    for (_, signature), members in buckets.items():
        editable = editable_files(members[0], root, test_patterns, paths)
        kernel = _kernel_name(members[0], editable, root)
        gid = group_id(kernel, members[0].error.type, signature, editable)
        groups.append(BugGroup(gid, kernel, signature, editable, tuple(members)))
    return groups


def regression_nodeids(
    group: BugGroup, passed: Iterable[PassedTest], root: Path
) -> tuple[str, ...]:
    """Tests that passed in the session and launched a kernel from a file the bug may edit."""
    editable = set(group.editable)
    chosen = []
    for test in passed:
        files = {
            relative(launch.file, root)
            for launch in test.launches
            if launch.file and is_within(launch.file, root)
        }
        if files & editable:
            chosen.append(test.nodeid)
    return tuple(chosen)
