"""The project root: kernelfix_root, else the project a test-folder rootdir belongs to."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from pytest_kernelfix.config import load_settings
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.root import find_root, git_top, outside_note
from pytest_kernelfix.session.inputs import sandbox_exclude
from pytest_kernelfix.session.start import session_project

#: A test folder's config that puts the cache dir elsewhere under the project root.
CACHE_IN_CI = "[tool.pytest.ini_options]\nkernelfix_cache_dir = 'ci/cache'\n"


def folders(base: Path, *names: str) -> None:
    for name in names:
        (base / name).mkdir(parents=True, exist_ok=True)


def test_a_rootdir_that_is_the_project_stays_it_with_nothing_to_say(tmp_path: Path) -> None:
    folders(tmp_path, "repo/.git", "repo/sub")
    assert find_root(tmp_path / "repo").path == tmp_path / "repo"
    # a project in a folder of a larger repository: its own rootdir, not the repository
    assert find_root(tmp_path / "repo" / "sub").path == tmp_path / "repo" / "sub"
    assert find_root(tmp_path / "repo" / "sub").note == ""


def test_a_test_folder_in_a_git_work_tree_belongs_to_its_top_level(tmp_path: Path) -> None:
    folders(tmp_path, "repo/tests/unit", "repo/python/test")
    (tmp_path / "repo" / ".git").write_text("gitdir: elsewhere\n")  # a worktree's .git file
    assert git_top(tmp_path / "repo" / "tests") == tmp_path / "repo"
    for rootdir in ("tests", "tests/unit", "python/test"):
        found = find_root(tmp_path / "repo" / rootdir)
        assert found.path == tmp_path / "repo"
        assert found.note == (
            f"kernelfix: project root {tmp_path / 'repo'} (pytest's rootdir {rootdir}/ is a "
            "test folder in it; the git work tree's top level)")


@pytest.mark.parametrize("marker", ["pyproject.toml", "setup.py", "setup.cfg"])
def test_without_git_the_nearest_folder_above_with_a_project_file(tmp_path: Path,
                                                                  marker: str) -> None:
    folders(tmp_path, "top/tests")
    (tmp_path / marker).write_text("")  # farther away: not taken
    (tmp_path / "top" / marker).write_text("")
    (tmp_path / "top" / "tests" / "pyproject.toml").write_text("[tool.black]\n")  # its own
    found = find_root(tmp_path / "top" / "tests")
    assert found.path == tmp_path / "top"
    assert found.note.endswith(f"the nearest folder above the rootdir with a {marker})")


def test_a_test_folder_with_no_project_around_it_stays_and_says_so(tmp_path: Path) -> None:
    folders(tmp_path, "tests", "bench")
    found = find_root(tmp_path / "tests")
    assert found.path == tmp_path / "tests"
    assert found.note.startswith(f"kernelfix: project root is pytest's rootdir {tmp_path}/tests"
                                 ", a test folder: no git work tree")
    assert "set kernelfix_root" in found.note
    assert find_root(tmp_path / "bench").note == ""  # no test folder: nothing to say


def test_a_given_root_wins_and_must_hold_the_rootdir(tmp_path: Path) -> None:
    folders(tmp_path, "repo/.git", "repo/proj/tests", "repo/other")
    rootdir = tmp_path / "repo" / "proj" / "tests"
    found = find_root(rootdir, tmp_path / "repo" / "proj", "ini kernelfix_root")
    assert found.path == tmp_path / "repo" / "proj"  # not the git top level
    assert found.note == (
        f"kernelfix: project root {tmp_path / 'repo' / 'proj'} (set by ini kernelfix_root)")
    same = find_root(rootdir, rootdir, "--kernelfix-root")
    assert same.path == rootdir and same.note == ""  # the rootdir itself: nothing to say
    with pytest.raises(ValueError, match="does not hold pytest's rootdir"):
        find_root(rootdir, tmp_path / "repo" / "other")
    with pytest.raises(ValueError, match="is not a directory"):
        find_root(rootdir, tmp_path / "missing")


def test_settings_follow_the_root_and_a_given_root_is_read_where_it_was_written(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ini value is relative to the ini file's folder; a command-line or environment
    value to where pytest runs. Paths of other options are relative to the project root."""
    monkeypatch.delenv("KERNELFIX_ROOT", raising=False)
    top = pytester.path
    folders(top, "proj/tests", "proj/kernels")
    tests = top / "proj" / "tests"
    (tests / "pytest.ini").write_text("[pytest]\nkernelfix_root = ..\n"
                                      "kernelfix_report_dir = out/reports\n")
    settings = load_settings(pytester.parseconfig(str(tests)))
    assert settings.rootdir == tests and settings.root == top / "proj"
    assert settings.report_dir == top / "proj" / "out" / "reports"
    assert settings.root_note.endswith("(set by ini kernelfix_root)")

    cli = load_settings(pytester.parseconfig(str(tests), "--kernelfix-root=proj"))
    assert cli.root == top / "proj" and cli.root_note.endswith("(set by --kernelfix-root)")
    monkeypatch.setenv("KERNELFIX_ROOT", "proj/tests")
    assert load_settings(pytester.parseconfig(str(tests))).root == tests
    monkeypatch.setenv("KERNELFIX_ROOT", "proj/kernels")
    with pytest.raises(pytest.UsageError, match=r"for KERNELFIX_ROOT: .* does not hold pytest's"):
        load_settings(pytester.parseconfig(str(tests)))


def test_code_outside_the_root_is_named_installed_code_is_not(tmp_path: Path) -> None:
    folders(tmp_path, "proj/tests", "lib")
    for path in ("proj/tests/test_a.py", "lib/ops.py", "lib/other.py"):
        (tmp_path / path).write_text("")
    installed = str(Path(sysconfig.get_paths()["purelib"]) / "torch" / "__init__.py")
    paths = [str(tmp_path / "proj/tests/test_a.py"), installed, str(tmp_path / "lib/ops.py"),
             str(tmp_path / "lib/ops.py"), "<string>"]
    note = outside_note(tmp_path / "proj", paths)
    assert note == (f"its code lies outside the project root {tmp_path / 'proj'} "
                    f"({tmp_path / 'lib/ops.py'}): set kernelfix_root to a folder that holds "
                    "it and the tests")
    assert outside_note(tmp_path, paths) == ""


def test_the_sandbox_copies_the_root_without_reports_caches_or_git(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root above the test folder: the copy holds the kernels and the tests, not the
    report and cache dirs (wherever the options put them under the root), nor git data
    or what an earlier run left in the test folder."""
    monkeypatch.delenv("KERNELFIX_CACHE_DIR", raising=False)
    top = pytester.path
    folders(top, ".git", "kernels", "tests/.kernelfix", "tests/.pytest_cache", "ci/cache",
            ".kernelfix")
    files = {"kernels/ops.py": "", "tests/test_ops.py": "", "tests/.kernelfix/report.json": "",
             "tests/.pytest_cache/x": "", "ci/cache/answers.json": "", "ci/keep.txt": "",
             ".git/HEAD": "", ".kernelfix/report.json": "",
             "tests/pyproject.toml": CACHE_IN_CI}
    for path, text in files.items():
        (top / path).write_text(text)
    config = pytester.parseconfig("tests")
    settings = load_settings(config)
    assert settings.root == top and settings.cache_root == top / "ci" / "cache"
    with Sandbox.create(top, exclude=sandbox_exclude(settings, session_project(config, settings))
                        ) as sandbox:
        copied = {path.relative_to(sandbox.root).as_posix()
                  for path in sandbox.root.rglob("*") if path.is_file()}
    assert copied == {"kernels/ops.py", "tests/test_ops.py", "tests/pyproject.toml",
                      "ci/keep.txt"}
