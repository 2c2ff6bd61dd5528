"""What a fix may touch: one value that owns the project's boundaries.

A heal may edit the project's own Python sources and nothing else: not test modules or
conftest files (they define what a fix must achieve), not installed packages or
virtualenvs inside the rootdir, not symlinks, binary or oversized files, and, when the
user restricts it with ``kernelfix_paths``, nothing outside those globs. Every stage that
asks "may this file be edited?", "what is this path relative to the project?" or "which
file did the model mean?" asks a :class:`Project`, so the rules live in one place.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

DEFAULT_TEST_PATTERNS = ("test_*.py", "*_test.py")
#: Larger files are never edit targets (nor written with a candidate larger than this).
MAX_EDITABLE_BYTES = 256 * 1024
#: Files under a directory of one of these names are tests, whatever their name.
TEST_DIRS = frozenset({"tests", "test", "testing"})
_ENV_MARKERS = ("site-packages", "dist-packages")


#: Folders no walk of the project enters: caches, installed packages, build output.
PRUNED_DIRS = frozenset({"__pycache__", "node_modules", "build", "dist", "site-packages",
                         "dist-packages"})


def walk_files(root: str | os.PathLike[str], skip: Iterable[str | os.PathLike[str]] = ()
               ) -> Iterator[str]:
    """Every file under ``root``, in a stable order (sorted, top-down), without hidden
    folders, :data:`PRUNED_DIRS`, virtualenvs (a ``pyvenv.cfg``) or the folders ``skip``
    names."""
    skipped = {os.path.abspath(path) for path in skip}
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(name for name in dirs
                         if not name.startswith(".") and name not in PRUNED_DIRS
                         and os.path.abspath(os.path.join(folder, name)) not in skipped
                         and not os.path.exists(os.path.join(folder, name, "pyvenv.cfg")))
        for name in sorted(files):
            yield os.path.join(folder, name)


def is_within(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """``path`` lies under ``root`` (or is it), compared as absolute paths."""
    try:
        Path(os.path.abspath(path)).relative_to(os.path.abspath(root))
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Project:
    """The rootdir, with the user's test-file patterns and ``kernelfix_paths`` globs."""

    root: Path
    test_patterns: tuple[str, ...] = DEFAULT_TEST_PATTERNS
    paths: tuple[str, ...] = ()

    # -- where things are ---------------------------------------------------------

    @functools.cached_property
    def roots(self) -> tuple[str, ...]:
        """The rootdir as given and resolved (the same when no link leads to it)."""
        return tuple(dict.fromkeys([os.path.abspath(self.root), os.path.realpath(self.root)]))

    def contains(self, path: str | os.PathLike[str]) -> bool:
        return bool(path) and is_within(path, self.root)

    def relative(self, path: str | os.PathLike[str]) -> str:
        """The rootdir-relative posix path of a path inside the project."""
        absolute = Path(os.path.abspath(path))
        return PurePosixPath(absolute.relative_to(os.path.abspath(self.root))).as_posix()

    def display(self, path: str) -> str:
        """Rootdir-relative inside the project, the bare file name outside it."""
        return self.relative(path) if self.contains(path) else Path(path).name

    # -- what may be edited -------------------------------------------------------

    def is_test_file(self, relpath: str) -> bool:
        """Test modules, conftest files and anything under a tests/ directory."""
        posix = PurePosixPath(relpath)
        if posix.name == "conftest.py":
            return True
        if any(fnmatch.fnmatch(posix.name, pattern) for pattern in self.test_patterns):
            return True
        return any(part in TEST_DIRS for part in posix.parts[:-1])

    def in_environment(self, path: str) -> bool:
        """Installed packages and virtualenvs inside the rootdir are not the project's code."""
        if any(marker in Path(path).parts for marker in _ENV_MARKERS):
            return True
        current = Path(os.path.abspath(path)).parent
        roots = [Path(root) for root in self.roots]
        root = next((r for r in roots if r in current.parents), roots[0])  # a linked root too
        while current != root and root in current.parents:
            if (current / "pyvenv.cfg").exists():
                return True
            current = current.parent
        return False

    def in_paths(self, relpath: str) -> bool:
        """No ``kernelfix_paths``: every file; else ``relpath`` matches one glob
        (``fnmatch``, where ``*`` spans ``/``)."""
        return not self.paths or any(
            fnmatch.fnmatchcase(relpath, pattern.strip().removeprefix("./"))
            for pattern in self.paths
        )

    def is_source(self, path: str) -> bool:
        """A Python file of the project's own code: inside the root, not installed, not a
        test or a conftest."""
        if not path.endswith(".py") or not self.contains(path) or self.in_environment(path):
            return False
        return not self.is_test_file(self.relative(path))

    def editable(self, path: str) -> str:
        """The relative path of ``path`` if a fix may edit it, else ""."""
        if not path or not os.path.isfile(path) or not self.is_source(path):
            return ""
        rel = self.relative(path)
        if not self.in_paths(rel) or not is_plain_source(path, self.root):
            return ""
        return rel

    def undecodable(self, path: str) -> str:
        """Why ``path``, a project source a fix could otherwise edit, is refused for its
        encoding (``"kernels/k.py is encoded as latin-1 ..."``), else ""."""
        if not path or not os.path.isfile(path) or not self.is_source(path):
            return ""
        rel = self.relative(path)
        if not self.in_paths(rel):
            return ""
        problem = encoding_problem(path)
        return f"{rel} {problem}" if problem else ""

    def editable_files(self, candidates: Iterable[str], *, exclude: Iterable[str] = ()) -> (
        tuple[str, ...]
    ):
        """The editable ones among absolute ``candidates``, relative, first seen first."""
        skipped = {os.path.abspath(path) for path in exclude if path}
        found: list[str] = []
        for path in dict.fromkeys(candidates):  # each file is read once
            if path and os.path.abspath(path) in skipped:
                continue
            rel = self.editable(path)
            if rel and rel not in found:
                found.append(rel)
        return tuple(found)

    def protected_files(self, test_paths: Iterable[str]) -> tuple[str, ...]:
        """The given test modules and every conftest.py pytest loads for them, relative."""
        found: list[str] = []
        for path in test_paths:
            if not path or not os.path.isfile(path) or not self.contains(path):
                continue
            rel = self.relative(path)
            found.append(rel)
            parent = PurePosixPath(rel).parent
            for depth in range(len(parent.parts) + 1):
                conftest = PurePosixPath(*parent.parts[:depth], "conftest.py").as_posix()
                if (self.root / conftest).is_file():
                    found.append(conftest)
        return tuple(dict.fromkeys(found))

    def resolve(self, name: str, editable: Sequence[str]) -> tuple[str, str]:
        """The editable path a model meant by ``name``: ``(path, "")`` or ``("", why)``."""
        from pytest_kernelfix.engine.files import resolve_file

        return resolve_file(name, editable)


#: PEP 263: a coding declaration on one of a source's first two lines.
_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


def encoding_problem(path: str | os.PathLike[str]) -> str:
    """Why a file cannot be read as UTF-8, naming its declared encoding when it has one
    (``is encoded as latin-1 (its coding declaration), not UTF-8 ...``); "" when it can,
    or when it cannot be read at all."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return ""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        where = f"byte 0x{data[error.start]:02x} at offset {error.start}"
        declared = next((match.group(1).decode("ascii", "replace")
                         for line in data.splitlines()[:2]
                         if (match := _CODING.match(line))), "")
        what = (f"is encoded as {declared} (its coding declaration), not UTF-8"
                if declared and declared.lower().replace("_", "-") not in ("utf-8", "utf8")
                else "is not valid UTF-8")
        return (f"{what} ({where}): pytest-kernelfix reads and edits UTF-8 sources only; "
                "re-encode it as UTF-8 to heal it")
    return ""


def is_plain_source(path: str, root: Path) -> bool:
    """A regular UTF-8 text file of at most :data:`MAX_EDITABLE_BYTES`, really in ``root``.

    Symlinks are not edit targets (a write would replace the link, or land outside the
    rootdir), and neither are files reached through a directory link that leaves it.
    """
    if os.path.islink(path) or not is_within(os.path.realpath(path), os.path.realpath(root)):
        return False
    try:
        if os.path.getsize(path) > MAX_EDITABLE_BYTES:
            return False
        data = Path(path).read_bytes()
        data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return b"\0" not in data
