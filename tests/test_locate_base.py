"""Which base a session compares with: an explicit revision, a pull request's merge base,
a merge request's base, the uncommitted edits, the last green run; and the one line a
base that is missing gets."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_kernelfix.locate import green as green_module
from pytest_kernelfix.locate.base import (
    find_git_base,
    git_change,
    resolve_changes,
)
from pytest_kernelfix.locate.green import GreenStore
from pytest_kernelfix.project import Project


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t",
                           "-c", "protocol.file.allow=always", *args], cwd=root, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """``main`` with two commits, ``feature`` one commit ahead of it."""
    root = tmp_path / "repo"
    (root / "kernels").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "kernels" / "k.py").write_text("a = 1\nb = 2\n")
    (root / "tests" / "test_k.py").write_text("def test(): pass\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "one")
    (root / "kernels" / "gone.py").write_text("x = 1\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "two")
    git(root, "checkout", "-qb", "feature")
    (root / "kernels" / "k.py").write_text("a = 1\nb = 3\n")
    (root / "kernels" / "new.py").write_text("c = 4\n")
    (root / "kernels" / "gone.py").unlink()
    (root / "tests" / "test_k.py").write_text("def test(): assert 1\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "feature")
    return root


def test_an_explicit_revision_diffs_the_working_tree_against_it(repo: Path) -> None:
    (repo / "kernels" / "k.py").write_text("a = 0\nb = 3\n")  # uncommitted, on top
    base, why = find_git_base("main", repo, {})
    assert why == "" and base is not None and base.label.startswith("main (") and base.ci
    change = git_change(base, Project(repo))
    assert change is not None
    files = {c.path: c for c in change.files}
    assert set(files) == {"kernels/k.py", "kernels/new.py", "kernels/gone.py",
                          "tests/test_k.py"}
    assert (files["kernels/k.py"].base, files["kernels/k.py"].current) == (
        "a = 1\nb = 2\n", "a = 0\nb = 3\n")
    assert files["kernels/new.py"].base is None and files["kernels/gone.py"].current is None
    assert files["tests/test_k.py"].test and not files["kernels/k.py"].test


def test_auto_outside_ci_is_the_uncommitted_edits(repo: Path) -> None:
    base, why = find_git_base("auto", repo, {})
    assert why == "" and base is not None and not base.ci
    assert base.label == "HEAD (uncommitted changes)"
    assert git_change(base, Project(repo)) is None  # a clean tree: nothing changed
    # nothing to bisect: heals while the tests run
    assert resolve_changes("auto", Project(repo), {}).waits(Project(repo)) == ""
    (repo / "kernels" / "k.py").write_text("a = 1\nb = 5\n")
    change = git_change(base, Project(repo))
    assert change is not None and [c.path for c in change.files] == ["kernels/k.py"]
    assert change.files[0].base == "a = 1\nb = 3\n"
    # a change to bisect: healing waits for the end of the run, unless no base is wanted
    assert resolve_changes("auto", Project(repo), {}).waits(Project(repo)) == (
        "HEAD (uncommitted changes)")
    assert resolve_changes("none", Project(repo), {}).waits(Project(repo)) == ""


def test_a_pull_request_compares_with_its_merge_base(repo: Path, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--branch", "feature", str(repo), str(clone))
    base, why = find_git_base("auto", clone, {"GITHUB_BASE_REF": "main"})
    assert why == "" and base is not None
    assert base.rev == git(repo, "rev-parse", "main") and base.label.startswith("origin/main")


def test_a_shallow_checkout_says_what_to_fetch_and_goes_on(repo: Path, tmp_path: Path) -> None:
    clone = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", "--single-branch", "--branch", "feature",
        f"file://{repo}", str(clone))
    base, why = find_git_base("auto", clone, {"GITHUB_BASE_REF": "main"})
    assert base is None
    assert "base branch main is not in this clone" in why and "fetch-depth: 0" in why
    assert why.endswith("healing goes on without a base")
    git(clone, "fetch", "-q", "--depth", "1", "origin", "main:refs/remotes/origin/main")
    base, why = find_git_base("auto", clone, {"GITHUB_BASE_REF": "main"})
    assert base is None and "no merge base" in why and "git fetch --unshallow" in why
    base, why = find_git_base("0123456789abcdef0123456789abcdef01234567", clone, {})
    assert base is None and "is not in this clone" in why
    base, why = find_git_base("auto", clone, {"CI_MERGE_REQUEST_DIFF_BASE_SHA": "f" * 40})
    assert base is None and "merge request's base ffffffffffff is not in this clone" in why


def test_without_git_a_base_asked_for_gets_one_line(tmp_path: Path) -> None:
    project = Project(tmp_path)
    changes = resolve_changes("main", project, {})
    notes = changes.said(["tests/test_k.py::test_k"])
    assert changes.git is None and len(notes) == 1 and "not in a git repository" in notes[0]
    changes = resolve_changes("auto", project, {}, green=tmp_path / "green")
    notes = changes.said(["tests/test_k.py::test_k"])
    assert len(notes) == 1 and notes[0].startswith("no base to compare the failing tests")
    assert resolve_changes("none", project, {}) == type(changes)()
    assert type(changes)().said(["tests/test_k.py::test_k"]) == ()


def test_the_last_green_state_is_a_base_without_git(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "kernels" / "k.py").write_text("a = 1\n")
    (tmp_path / "kernels" / "util.py").write_text("u = 1\n")
    (tmp_path / "tests" / "test_k.py").write_text("def test_k(): pass\n")
    project = Project(tmp_path)
    store = GreenStore(tmp_path / ".cache" / "green")
    store.record(project, ["tests/test_k.py::test_k"])
    assert store.change("tests/test_k.py::test_k", project) is None  # nothing changed
    assert store.change("tests/test_k.py::test_other", project) is None  # no record
    assert resolve_changes("auto", project, {}, green=store.folder).waits(project) == ""
    (tmp_path / "kernels" / "k.py").write_text("a = 2\n")
    assert resolve_changes("auto", project, {}, green=store.folder).waits(project) == (
        "the last green run")
    (tmp_path / "kernels" / "new.py").write_text("n = 1\n")
    change = store.change("tests/test_k.py::test_k", project)
    assert change is not None and change.base.startswith("the last green run of tests/")
    assert [(c.path, c.base, c.current) for c in change.files] == [
        ("kernels/k.py", "a = 1\n", "a = 2\n"), ("kernels/new.py", None, "n = 1\n")]
    changes = resolve_changes("auto", project, {}, green=store.folder)
    notes = changes.said(["tests/test_k.py::test_k"])
    assert notes == () and changes.for_test("tests/test_k.py::test_k", project) == change
    # a later green session of another test keeps this test's state, and only the files
    # that changed are stored again
    blobs = set((store.folder / "blobs").iterdir())
    store.record(project, ["tests/test_k.py::test_other"])
    assert len(set((store.folder / "blobs").iterdir()) - blobs) == 2
    assert store.change("tests/test_k.py::test_k", project) == change
    assert not store.differs(project)  # the newest state is the files as they are


def test_the_record_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(green_module, "MAX_STATES", 2)
    (tmp_path / "k.py").write_text("v = 0\n")
    project = Project(tmp_path)
    store = GreenStore(tmp_path / "green")
    for n in range(4):
        (tmp_path / "k.py").write_text(f"v = {n}\n")
        store.record(project, [f"t.py::test_{n}"], now=float(n))
    assert store.state("t.py::test_0") is None and store.state("t.py::test_1") is None
    assert store.state("t.py::test_3") is not None
    assert len(list((store.folder / "blobs").iterdir())) == 2
    monkeypatch.setattr(green_module, "MAX_BYTES", 10)
    (tmp_path / "big.py").write_text("x = 1\n" * 10)
    store.record(project, ["t.py::test_4"], now=5.0)
    assert store.state("t.py::test_3") is None  # the older state gave way
    (tmp_path / "big.py").write_text("x = 2\n")
    change = store.change("t.py::test_4", project)
    assert change is None or all(c.path != "big.py" for c in change.files)
