"""A disposable copy of the project that can never write through to the original.

Candidate patches are written here and the failing tests rerun against this copy, so
the user's tree is only touched when a verified patch is applied on purpose. Large
files are hardlinked to keep the copy cheap; every write therefore replaces the file
(a new inode) instead of writing into it, and paths that would leave the copy, through
``..`` or a symlink, are refused.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import sys
import tempfile
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path, PurePath, PurePosixPath
from types import TracebackType
from typing import Any

from pytest_kernelfix.atomic import replace_file

#: Directory and file names never copied: VCS data, virtualenvs, caches, our own reports.
DEFAULT_EXCLUDES = (
    ".git",
    ".hg",
    ".svn",
    ".venv",
    "venv",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
    ".hypothesis",
    "node_modules",
    ".kernelfix",
)

#: Files at least this large are hardlinked instead of copied.
LINK_MIN_SIZE = 256 * 1024


class SandboxError(Exception):
    """A sandbox path that is missing, or would lead outside the sandbox."""


def is_excluded(relpath: str, patterns: Sequence[str]) -> bool:
    """Whether a root-relative posix path matches a pattern, by whole path or by name."""
    name = PurePosixPath(relpath).name
    return any(
        fnmatch.fnmatchcase(relpath, pattern) or fnmatch.fnmatchcase(name, pattern)
        for pattern in patterns
    )


def _patterns(root: Path, exclude: Sequence[str]) -> tuple[str, ...]:
    """Default and caller patterns; an absolute path under the root becomes relative."""
    patterns = list(DEFAULT_EXCLUDES)
    for pattern in exclude:
        text = str(pattern).rstrip("/")
        if os.path.isabs(text):
            try:
                text = Path(text).resolve().relative_to(root).as_posix()
            except ValueError:
                continue  # outside the root: nothing of it is copied anyway
        if text:
            patterns.append(text)
    return tuple(patterns)


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _sandbox_dir_name(root: Path) -> str:
    """The copy keeps the root's name: package names and rootdir-relative ids stay the same."""
    return root.name or "project"


class Sandbox:
    """A copy of ``original_root`` under a fresh temp directory, removed by :meth:`close`."""

    def __init__(self, source: Path, root: Path, container: Path) -> None:
        self.source = source
        self.root = root
        self._container = container
        self._written: set[str] = set()
        self._hardlinked: dict[str, tuple[int, int]] = {}
        self._finalizer = weakref.finalize(self, _remove_tree, container)

    @classmethod
    def create(
        cls,
        root: Path,
        *,
        exclude: Sequence[str] = (),
        link_min_size: int = LINK_MIN_SIZE,
        parent: Path | None = None,
    ) -> Sandbox:
        """Copy ``root`` into ``mkdtemp(prefix="kernelfix-", dir=parent)/<root name>``."""
        original = Path(root).resolve()
        if not original.is_dir():
            raise SandboxError(f"not a directory: {original}")
        container = Path(tempfile.mkdtemp(prefix="kernelfix-", dir=parent)).resolve()
        sandbox = cls(original, container / _sandbox_dir_name(original), container)
        try:
            sandbox._hardlinked = _copy_tree(
                original, sandbox.root, _patterns(original, exclude), link_min_size,
                skip=container,
            )
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    # -- path mapping -------------------------------------------------------------

    def twin(self, original_path: str | PurePath) -> Path:
        """The sandbox path of an absolute path under the original root."""
        return self.root / _relative(Path(original_path), self.source)

    def original(self, sandbox_path: str | PurePath) -> Path:
        """The original path of an absolute path under the sandbox root."""
        return self.source / _relative(Path(sandbox_path), self.root)

    def path(self, relpath: str | PurePath) -> Path:
        """The sandbox path of ``relpath``, refused if it would end up outside the sandbox.

        Absolute paths and ``..`` are refused outright; the rest is resolved so that a
        symlink pointing out of the sandbox is refused too.
        """
        resolved = self._lexical(relpath).resolve()
        if resolved == self.root or not _within(resolved, self.root):
            raise SandboxError(f"{relpath!s} resolves outside the sandbox: {resolved}")
        return resolved

    def _lexical(self, relpath: str | PurePath) -> Path:
        rel = PurePath(relpath)
        if rel.is_absolute() or rel.anchor or ".." in rel.parts or not rel.parts:
            raise SandboxError(f"not a relative path inside the sandbox: {relpath!s}")
        return self.root / rel

    # -- files --------------------------------------------------------------------

    @property
    def written(self) -> frozenset[str]:
        """Relative paths changed through :meth:`write` and not reset since."""
        return frozenset(self._written)

    @property
    def hardlinked(self) -> frozenset[str]:
        """Relative paths that still share their inode with the original file."""
        return frozenset(self._hardlinked)

    def touched_links(self) -> tuple[str, ...]:
        """Hardlinked files whose size or mtime changed since the copy.

        :meth:`write` never writes through a hardlink, but a test that opens a large
        data file for writing in the sandbox does; call this after a rerun to find out.
        """
        changed = []
        for rel, before in sorted(self._hardlinked.items()):
            try:
                info = (self.root / rel).stat()
            except FileNotFoundError:
                continue  # replaced or removed in the sandbox: no longer shared
            if info.st_nlink > 1 and (info.st_size, info.st_mtime_ns) != before:
                changed.append(rel)
        return tuple(changed)

    def read(self, relpath: str | PurePath) -> str:
        """Read a sandbox file; a symlink out of the root may be read, never written."""
        return self._lexical(relpath).read_text(encoding="utf-8")

    def write(self, relpath: str | PurePath, text: str) -> None:
        """Replace a file's content with a new inode; a hardlinked original stays intact."""
        target = self.path(relpath)
        replace_file(target, text.encode("utf-8"))
        rel = target.relative_to(self.root).as_posix()
        self._hardlinked.pop(rel, None)
        self._written.add(PurePath(relpath).as_posix())

    def reset(self, relpath: str | PurePath) -> None:
        """Restore a file to the original's bytes; a file the original lacks is removed."""
        target = self.path(relpath)
        source = self.original(target)
        if source.is_file():
            replace_file(target, source.read_bytes(), mode=stat.S_IMODE(source.stat().st_mode))
            self._hardlinked.pop(target.relative_to(self.root).as_posix(), None)
        elif target.is_file():
            target.unlink()
        self._written.discard(PurePath(relpath).as_posix())

    # -- lifetime -----------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Remove the copy; unlinking hardlinks and symlinks never touches the original."""
        self._finalizer()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Sandbox({self.source} -> {self.root})"


def _relative(path: Path, root: Path) -> Path:
    """``path`` relative to ``root``, trying it as given and resolved."""
    if not path.is_absolute():
        raise SandboxError(f"not an absolute path: {path}")
    for candidate in (Path(os.path.normpath(path)), path.resolve()):
        try:
            return candidate.relative_to(root)
        except ValueError:
            continue
    raise SandboxError(f"{path} is not under {root}")


def _copy_tree(
    source: Path, dest: Path, patterns: tuple[str, ...], link_min_size: int, *, skip: Path
) -> dict[str, tuple[int, int]]:
    """Copy files, hardlink large ones, and recreate symlinks once every file exists.

    Returns the hardlinked files with their (size, mtime) at the time of the copy.
    """
    hardlinked: dict[str, tuple[int, int]] = {}
    links: list[tuple[Path, Path]] = []
    dest.mkdir()
    stack = [(source, dest, "")]
    while stack:
        src_dir, dst_dir, rel_dir = stack.pop()
        with os.scandir(src_dir) as entries:
            for entry in entries:
                rel = f"{rel_dir}{entry.name}"
                if is_excluded(rel, patterns):
                    continue
                src = Path(entry.path)
                dst = dst_dir / entry.name
                if entry.is_symlink():
                    links.append((src, dst))
                elif entry.is_dir():
                    if src == skip or (src / "pyvenv.cfg").exists():
                        continue
                    dst.mkdir()
                    stack.append((src, dst, f"{rel}/"))
                elif entry.is_file():
                    info = entry.stat()
                    if info.st_size >= link_min_size and _hardlink(src, dst):
                        hardlinked[rel] = (info.st_size, info.st_mtime_ns)
                    else:
                        shutil.copy2(src, dst)
    for src, dst in links:
        os.symlink(_link_target(src, source, dest), dst)
    return hardlinked


def _hardlink(src: Path, dst: Path) -> bool:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed: the caller copies
        return False
    return True


def _link_target(link: Path, source: Path, dest: Path) -> str:
    """Where the sandbox's twin of ``link`` should point.

    A link into the root points at the twin (relative links already do); a link whose
    target was not copied, or that leaves the root, keeps pointing at the original
    target, for reading only: writes through it are refused by :meth:`Sandbox.path`.
    """
    target = os.readlink(link)
    resolved = Path(os.path.realpath(link))
    if _within(resolved, source):
        twin = dest / resolved.relative_to(source)
        if os.path.lexists(twin):
            return target if not os.path.isabs(target) else str(twin)
        return str(resolved)
    if not os.path.isabs(target):
        return str(resolved)
    return target


def _remove_tree(path: Path) -> None:
    """Remove a sandbox even where a test left read-only files or directories behind."""

    def retry(function: Callable[..., Any], name: str, *_: Any) -> None:
        parent = os.path.dirname(name)
        os.chmod(parent, stat.S_IRWXU)
        if not os.path.islink(name) and os.path.isdir(name):
            os.chmod(name, stat.S_IRWXU)
        function(name)

    if not os.path.lexists(path):
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)
