"""The sandbox is a full copy that never writes through to the original tree."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from pytest_kernelfix.rerun.sandbox import Sandbox, SandboxError, is_excluded


def _snapshot(root: Path) -> dict[str, tuple[str, int]]:
    """Every regular file under ``root``: content hash and inode."""
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            files[path.relative_to(root).as_posix()] = (digest, path.stat().st_ino)
    return files


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    files = {
        "kernels/add.py": "def add(x, y):\n    return x + y\n",
        "tests/test_add.py": "from kernels.add import add\n",
        "data/keep.txt": "kept\n",
        "data/big.bin": "x" * 1000,
        "reports/out.txt": "report\n",
        ".git/HEAD": "ref: refs/heads/main\n",
        ".venv/pyvenv.cfg": "home = /usr\n",
        "myenv/pyvenv.cfg": "home = /usr\n",
        "myenv/lib/site.py": "",
        "kernels/__pycache__/add.cpython-311.pyc": "junk",
        "node_modules/x.js": "",
        ".kernelfix/report.json": "{}",
        ".pytest_cache/v/x": "",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_copy_leaves_out_vcs_venvs_caches_and_caller_globs(project: Path) -> None:
    with Sandbox.create(project, exclude=["reports", "data/*.bin"]) as sandbox:
        copied = {p.relative_to(sandbox.root).as_posix() for p in sandbox.root.rglob("*")
                  if p.is_file()}
        assert sandbox.root.name == "proj"
        assert sandbox.root.parent.name.startswith("kernelfix-")
    assert copied == {"kernels/add.py", "tests/test_add.py", "data/keep.txt"}


@pytest.mark.parametrize(
    ("relpath", "excluded"),
    [("a/b/.git", True), ("data/x.bin", True), ("data/sub/x.txt", False), ("x.bin", False)],
)
def test_is_excluded_matches_paths_and_names(relpath: str, excluded: bool) -> None:
    assert is_excluded(relpath, (".git", "data/*.bin")) is excluded


def test_writes_to_hardlinked_files_never_reach_the_original(project: Path) -> None:
    add = project / "kernels/add.py"
    add.chmod(0o755)
    before = _snapshot(project)
    with Sandbox.create(project, link_min_size=0) as sandbox:
        twin = sandbox.twin(add)
        assert twin.stat().st_ino == add.stat().st_ino  # really hardlinked
        sandbox.write("kernels/add.py", "def add(x, y):\n    return x - y\n")
        assert sandbox.read("kernels/add.py").endswith("x - y\n")
        assert twin.stat().st_ino != add.stat().st_ino
        assert stat.S_IMODE(twin.stat().st_mode) == 0o755
        assert _snapshot(project) == before  # bytes and inodes of the original
        sandbox.write("kernels/new.py", "X = 1\n")
        assert not (project / "kernels/new.py").exists()
    assert _snapshot(project) == before


def test_large_files_are_hardlinked_and_small_ones_copied(project: Path) -> None:
    with Sandbox.create(project, link_min_size=500) as sandbox:
        big, small = project / "data/big.bin", project / "kernels/add.py"
        assert sandbox.twin(big).stat().st_ino == big.stat().st_ino
        assert sandbox.twin(small).stat().st_ino != small.stat().st_ino


def test_writes_through_a_hardlink_by_a_test_are_detected(project: Path) -> None:
    with Sandbox.create(project, link_min_size=500) as sandbox:
        assert sandbox.hardlinked == {"data/big.bin"}
        assert sandbox.touched_links() == ()
        os.utime(sandbox.root / "data/big.bin", ns=(1, 1))  # what an in-place write does
        assert sandbox.touched_links() == ("data/big.bin",)
        sandbox.write("data/big.bin", "y")  # a new inode: shared no more
        assert sandbox.hardlinked == frozenset() and sandbox.touched_links() == ()


def test_reset_restores_the_original_content(project: Path) -> None:
    with Sandbox.create(project, link_min_size=0) as sandbox:
        sandbox.write("kernels/add.py", "broken")
        sandbox.write("kernels/extra.py", "X = 1\n")
        assert sandbox.written == {"kernels/add.py", "kernels/extra.py"}
        sandbox.reset("kernels/add.py")
        sandbox.reset("kernels/extra.py")
        assert sandbox.read("kernels/add.py") == (project / "kernels/add.py").read_text()
        assert not (sandbox.root / "kernels/extra.py").exists()
        assert sandbox.written == frozenset()


def test_paths_that_leave_the_sandbox_are_refused(project: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.py").write_text("SECRET = 1\n")
    (project / "ext").symlink_to(outside)
    (project / "secret_link.py").symlink_to(outside / "secret.py")
    with Sandbox.create(project) as sandbox:
        for bad in ("/etc/passwd", "../outside/secret.py", "kernels/../../x.py",
                    "ext/secret.py", "ext/new.py", "secret_link.py", "."):
            with pytest.raises(SandboxError):
                sandbox.write(bad, "pwned")
        assert sandbox.read("secret_link.py") == "SECRET = 1\n"  # read-only use is fine
        with pytest.raises(SandboxError):
            sandbox.twin(outside / "secret.py")
    assert (outside / "secret.py").read_text() == "SECRET = 1\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.py"]


def test_symlinks_inside_the_root_point_at_the_sandbox(project: Path) -> None:
    (project / "rel_link.py").symlink_to("kernels/add.py")
    (project / "abs_link.py").symlink_to(project / "kernels/add.py")
    (project / "git_link").symlink_to(project / ".git/HEAD")
    with Sandbox.create(project) as sandbox:
        assert os.readlink(sandbox.root / "rel_link.py") == "kernels/add.py"
        assert os.readlink(sandbox.root / "abs_link.py") == str(sandbox.root / "kernels/add.py")
        assert os.readlink(sandbox.root / "git_link") == str(project / ".git/HEAD")
        sandbox.write("abs_link.py", "changed = True\n")  # writes the sandbox's target
        assert (sandbox.root / "abs_link.py").is_symlink()
        assert sandbox.read("kernels/add.py") == "changed = True\n"
    assert (project / "kernels/add.py").read_text().startswith("def add")


def test_twin_and_original_map_paths_both_ways(project: Path) -> None:
    with Sandbox.create(project) as sandbox:
        twin = sandbox.twin(project / "kernels/add.py")
        assert twin == sandbox.root / "kernels/add.py"
        assert sandbox.original(twin) == project / "kernels/add.py"
        assert sandbox.source == project.resolve()
        with pytest.raises(SandboxError):
            sandbox.original(project / "kernels/add.py")


def test_close_removes_the_copy_and_leaves_the_original(project: Path) -> None:
    before = _snapshot(project)
    sandbox = Sandbox.create(project, link_min_size=0)
    readonly = sandbox.root / "kernels"
    readonly.chmod(0o555)  # a test left a read-only directory behind
    sandbox.close()
    sandbox.close()
    assert sandbox.closed
    assert not sandbox.root.parent.exists()
    assert _snapshot(project) == before


def test_a_parent_inside_the_root_is_not_copied_into_itself(project: Path) -> None:
    parent = project / "tmp"
    parent.mkdir()
    with Sandbox.create(project, parent=parent) as sandbox:
        assert sandbox.root.is_relative_to(parent)
        assert not (sandbox.root / "tmp").exists() or not any((sandbox.root / "tmp").iterdir())
