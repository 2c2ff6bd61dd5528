"""The report dir gets a .gitignore, as pytest's cache dir does, and keeps a user's own."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kernel_project import git_status

from pytest_kernelfix.report.folder import GITIGNORE, make_report_dir


def test_a_new_report_dir_ignores_everything_in_it_for_git(tmp_path: Path) -> None:
    report_dir = make_report_dir(tmp_path / "out" / ".kernelfix", tmp_path)
    assert (report_dir / ".gitignore").read_text() == (
        "# Created by pytest-kernelfix automatically.\n*\n") == GITIGNORE
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    (report_dir / "k1.patch").write_text("diff\n")
    (tmp_path / "kernel.py").write_text("")
    # the report dir, its .gitignore included, is not listed
    assert git_status(tmp_path) == "?? kernel.py\n"


def test_an_existing_report_dir_without_one_gets_it(tmp_path: Path) -> None:
    (tmp_path / ".kernelfix").mkdir()
    (tmp_path / ".kernelfix" / "report.json").write_text("{}")
    make_report_dir(tmp_path / ".kernelfix", tmp_path)
    assert (tmp_path / ".kernelfix" / ".gitignore").read_text() == GITIGNORE


def test_a_users_own_gitignore_is_kept(tmp_path: Path) -> None:
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / ".gitignore").write_text("*.json\n")
    make_report_dir(tmp_path / "reports", tmp_path)
    assert (tmp_path / "reports" / ".gitignore").read_text() == "*.json\n"


def test_a_report_dir_that_holds_the_project_gets_none(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for report_dir in (project, tmp_path, project / "sub" / ".."):
        make_report_dir(report_dir, project)
        assert not (report_dir / ".gitignore").exists()  # "*" there would hide the project
