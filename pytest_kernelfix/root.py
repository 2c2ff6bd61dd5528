"""Which folder is the project: what a fix may edit, what the sandbox copies, where reports go.

pytest's rootdir is the folder of its config file, and a repository may keep a config
file of its own in its test folder (a formatter's ``tests/pyproject.toml``): pytest then
takes ``tests/`` as its rootdir, while the code under test lies beside it. The project
root is, in this order:

1. ``kernelfix_root`` when it is given;
2. pytest's rootdir, unless the rootdir lies in a test folder (a folder named ``tests``,
   ``test`` or ``testing``, whose files :class:`~pytest_kernelfix.project.Project` treats
   as tests anyway) of a larger project: then that project's folder, which is the git
   work tree's top level when the rootdir is in one, else the nearest folder above the
   rootdir holding a ``pyproject.toml``, ``setup.py`` or ``setup.cfg``.

The root is chosen before any test runs (the launch recorder, the healing helper and its
sandboxes need it from the start), so the failing frames cannot choose it; the marker
files stand in for them: a package's sources lie under the folder that builds it. A
failure whose code lies outside the root anyway is reported with the root named
(:func:`outside_note`). Light to import: this runs in every pytest process.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pytest_kernelfix.project import TEST_DIRS, is_within

#: Files that mark a Python project's folder, looked for above a test-folder rootdir.
PROJECT_FILES = ("pyproject.toml", "setup.py", "setup.cfg")


@dataclass(frozen=True)
class ProjectRoot:
    """The project's folder, and the terminal line that says how it was found ("" when
    it is pytest's rootdir and nothing needs saying)."""

    path: Path
    note: str = ""


def git_top(start: Path) -> Path | None:
    """The top level of the git work tree ``start`` lies in (a ``.git`` folder, or a
    worktree's or submodule's ``.git`` file), else None."""
    start = Path(os.path.abspath(start))
    return next((folder for folder in (start, *start.parents)
                 if (folder / ".git").exists()), None)


def in_test_folder(rootdir: Path, top: Path) -> bool:
    """``rootdir`` lies in a test folder of the project at ``top``."""
    parts = Path(os.path.abspath(rootdir)).relative_to(os.path.abspath(top)).parts
    return any(part.lower() in TEST_DIRS for part in parts)


def find_root(rootdir: Path, given: Path | None = None, given_by: str = "") -> ProjectRoot:
    """The project root for pytest's ``rootdir``: ``given`` (named ``given_by`` in the
    line, ``--kernelfix-root`` or ``ini kernelfix_root``) when it is set, else as the
    module says. Raises :class:`ValueError` for a given root that is not a folder holding
    the rootdir: reruns run pytest in a copy of the root, so the tests must lie in it."""
    rootdir = Path(os.path.abspath(rootdir))
    if given is not None:
        given = Path(os.path.abspath(given))
        if not given.is_dir():
            raise ValueError(f"{given} is not a directory")
        if given != rootdir and given not in rootdir.parents:
            raise ValueError(
                f"{given} does not hold pytest's rootdir {rootdir}: reruns run pytest in a "
                "copy of the project root, so the tests must lie in it (kernelfix_paths "
                "limits which files edits may touch)")
        return ProjectRoot(given, "" if given == rootdir else
                           f"kernelfix: project root {given} (set by {given_by})")
    found = _enclosing_project(rootdir)
    if found is None:
        if not any(part.lower() in TEST_DIRS for part in rootdir.parts[-1:]):
            return ProjectRoot(rootdir)
        return ProjectRoot(rootdir, (
            f"kernelfix: project root is pytest's rootdir {rootdir}, a test folder: no git "
            f"work tree and no {'/'.join(PROJECT_FILES)} above it; set kernelfix_root if "
            "the code under test lies outside it"))
    top, how = found
    if top == rootdir or not in_test_folder(rootdir, top):
        return ProjectRoot(rootdir)
    inside = Path(os.path.relpath(rootdir, top)).as_posix()
    return ProjectRoot(top, f"kernelfix: project root {top} (pytest's rootdir {inside}/ is "
                            f"a test folder in it; {how})")


def _enclosing_project(rootdir: Path) -> tuple[Path, str] | None:
    """The git top level of ``rootdir``, else the nearest folder above it with a project
    file, and how it was found; None when there is neither."""
    top = git_top(rootdir)
    if top is not None:
        return top, "the git work tree's top level"
    for folder in rootdir.parents:
        marker = next((name for name in PROJECT_FILES if (folder / name).is_file()), None)
        if marker is not None:
            return folder, f"the nearest folder above the rootdir with a {marker}"
    return None


def outside_note(root: Path, paths: Iterable[str]) -> str:
    """What to say when a failure's own code (its frames and launched kernels that are
    neither installed nor the standard library) lies outside the project root: a few of
    those files and how to widen the root; "" when none does."""
    outside = [path for path in dict.fromkeys(paths)
               if path.endswith(".py") and os.path.isfile(path) and not _installed(path)
               and not is_within(path, root)]
    if not outside:
        return ""
    shown = ", ".join(outside[:3]) + (f" and {len(outside) - 3} more" if len(outside) > 3 else "")
    return (f"its code lies outside the project root {root} ({shown}): set kernelfix_root "
            "to a folder that holds it and the tests")


def _installed(path: str) -> bool:
    """The standard library, an installed package, or this plugin."""
    if any(part in ("site-packages", "dist-packages") for part in Path(path).parts):
        return True
    places = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values(),
              str(Path(__file__).parent)}
    return any(is_within(path, place) for place in places)
