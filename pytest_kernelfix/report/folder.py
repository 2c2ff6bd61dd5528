"""The report dir and the cache dir, made with a ``.gitignore`` inside, as pytest makes
its cache dir (``config.cache.mkdir``), and the files written into them in one step.

Patches, reports, backups, locks and the answer cache are outputs, not source: the
``.gitignore`` (``*``) keeps them, and itself, out of the user's ``git status``, also
when ``--kernelfix-cache-dir`` puts the cache outside the report dir. A
``.gitignore`` already there is the user's and is kept. A report dir that is the
rootdir or holds it gets none: ``*`` there would hide the project itself.
"""

from __future__ import annotations

import os
from pathlib import Path

from pytest_kernelfix.atomic import replace_file

GITIGNORE = "# Created by pytest-kernelfix automatically.\n*\n"


def make_report_dir(report_dir: Path, rootdir: Path) -> Path:
    """Make ``report_dir`` (and its parents) and give it a ``.gitignore`` if it has none."""
    report_dir.mkdir(parents=True, exist_ok=True)
    if _holds(report_dir, rootdir):
        return report_dir
    try:  # "x": never over a user's file, nor over another session's at the same moment
        with open(report_dir / ".gitignore", "x", encoding="utf-8") as handle:
            handle.write(GITIGNORE)
    except FileExistsError:
        pass
    return report_dir


def _holds(folder: Path, rootdir: Path) -> bool:
    folder, rootdir = Path(os.path.realpath(folder)), Path(os.path.realpath(rootdir))
    return rootdir == folder or folder in rootdir.parents


def write_atomic(path: Path, text: str) -> None:
    """Write an output file in one step: a reader never sees half of it."""
    replace_file(path, text.encode("utf-8"))
