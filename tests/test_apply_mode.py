"""--kernelfix-apply: atomic writes that keep the mode, a filelock per file, stale refusal
against the capture-time hash, and the original bytes kept under the report dir."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading
from pathlib import Path

import pytest
from filelock import FileLock
from hostile.project import BUG, FIX, KERNEL, fix_answer, report, write_project

from pytest_kernelfix.report import writeback
from pytest_kernelfix.report.writeback import StaleFileError, _lock_for, write_back

ORIGINAL = KERNEL.format(name="k1")
HEALED = ORIGINAL.replace(BUG, FIX)


def cassette(root: Path, *names: str) -> Path:
    path = root / "fix.jsonl"
    path.write_text("".join(json.dumps({"group": f"{name}_kernel-*",
                                        "response": fix_answer(name)}) + "\n"
                            for name in names))
    return path


def apply_args(tape: Path) -> tuple[str, ...]:
    return ("-p", "no:randomly", "-p", "no:cacheprovider", "--kernelfix-apply",
            f"--kernelfix-model=replay:{tape}")


def test_apply_writes_atomically_keeps_the_mode_and_the_original(
    pytester: pytest.Pytester,
) -> None:
    root = write_project(pytester.path, "k1")
    kernel = root / "kernels" / "k1.py"
    kernel.chmod(0o640)
    inode = kernel.stat().st_ino

    result = pytester.runpytest_subprocess(*apply_args(cassette(root, "k1")), timeout=300)

    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the failed test stays failed
    result.stdout.fnmatch_lines(["*written to the working tree: kernels/k1.py*"])
    assert "git apply" not in result.stdout.str()  # the patch is in the tree already
    assert "git apply" not in (root / ".kernelfix" / "report.md").read_text()
    assert kernel.read_text() == HEALED
    assert stat.S_IMODE(kernel.stat().st_mode) == 0o640
    assert kernel.stat().st_ino != inode  # a new file replaced the old one in one step
    assert [p.name for p in kernel.parent.iterdir() if p.name.endswith(".kfx")] == []
    bug = report(root)["k1"]
    assert bug["applied"] == ["kernels/k1.py"] and bug["apply_error"] is None
    backup = root / ".kernelfix" / "backup" / bug["id"] / "kernels" / "k1.py"
    assert backup.read_text() == ORIGINAL  # undo: copy it back
    # the healed tree passes without the plugin
    assert pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120).ret == 0


@pytest.mark.slow
def test_a_file_changed_since_the_test_ran_is_not_written(pytester: pytest.Pytester) -> None:
    root = write_project(pytester.path, "k1")
    # After test_k1 failed (and its file hash was taken), the kernel is edited by hand.
    (root / "tests" / "test_zz_edit.py").write_text(
        "from pathlib import Path\n\n\ndef test_edit_by_hand() -> None:\n"
        "    kernel = Path(__file__).parents[1] / 'kernels' / 'k1.py'\n"
        "    kernel.write_text(kernel.read_text() + '# edited by hand\\n')\n"
    )
    result = pytester.runpytest_subprocess(*apply_args(cassette(root, "k1")), timeout=300)

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    bug = report(root)["k1"]
    assert bug["status"] == "healed" and bug["applied"] == []
    assert bug["apply_error"] == "kernels/k1.py changed since the test ran (stale); not written"
    assert (root / "kernels" / "k1.py").read_text() == ORIGINAL + "# edited by hand\n"
    assert not (root / ".kernelfix" / "backup").exists()
    result.stdout.fnmatch_lines(["*not written (k1_kernel-*): kernels/k1.py changed since*"])
    assert list((root / ".kernelfix").glob("*.patch"))  # the verified patch is still there


# -- write_back itself -----------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = write_project(tmp_path / "proj", "k1", "k2")
    (root / "kernels" / "k1.py").chmod(0o750)
    return root


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def changes(*names: str) -> dict[str, tuple[str, str]]:
    return {f"kernels/{name}.py": (KERNEL.format(name=name), KERNEL.format(name=name)
                                   .replace(BUG, FIX)) for name in names}


def test_write_back_keeps_mode_and_saves_the_original(tree: Path) -> None:
    kernel = tree / "kernels" / "k1.py"
    reader = kernel.open()  # an open handle keeps seeing the old file: no partial writes
    done = write_back(tree, changes("k1"), expected={"kernels/k1.py": sha(kernel)},
                      backup_dir=tree / "backup", lock_dir=tree / "locks")
    assert done.written == ("kernels/k1.py",)
    assert kernel.read_text() == HEALED and reader.read() == ORIGINAL
    reader.close()
    assert stat.S_IMODE(kernel.stat().st_mode) == 0o750
    assert (tree / "backup" / "kernels" / "k1.py").read_text() == ORIGINAL


def test_one_stale_file_stops_the_whole_patch(tree: Path) -> None:
    k1, k2 = tree / "kernels" / "k1.py", tree / "kernels" / "k2.py"
    expected = {"kernels/k1.py": sha(k1), "kernels/k2.py": sha(k2)}
    k2.write_text(k2.read_text() + "# edited\n")
    with pytest.raises(StaleFileError, match=r"kernels/k2.py changed since the test ran"):
        write_back(tree, changes("k1", "k2"), expected=expected, backup_dir=tree / "backup",
                   lock_dir=tree / "locks")
    assert k1.read_text() == ORIGINAL  # checked before anything was written
    assert not (tree / "backup").exists()


def test_links_are_never_written_through(tree: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text(ORIGINAL)
    (tree / "kernels" / "k1.py").unlink()
    os.symlink(outside, tree / "kernels" / "k1.py")
    with pytest.raises(StaleFileError, match="not a regular file inside the rootdir"):
        write_back(tree, changes("k1"), expected={}, backup_dir=tree / "backup",
                   lock_dir=tree / "locks")
    assert outside.read_text() == ORIGINAL


def test_writers_of_one_file_wait_for_its_lock_and_the_second_is_stale(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kernel = tree / "kernels" / "k1.py"
    expected = {"kernels/k1.py": sha(kernel)}
    lock = _lock_for(kernel, tree / "locks")
    outcomes: list[str] = []
    waiting = threading.Semaphore(0)

    class Announced:
        """The writer's lock, saying when the writer is about to wait for it."""

        def __init__(self, inner: FileLock) -> None:
            self.inner = inner

        def acquire(self) -> None:
            waiting.release()
            self.inner.acquire()

        def release(self) -> None:
            self.inner.release()

    monkeypatch.setattr(writeback, "_lock_for",
                        lambda path, lock_dir: Announced(_lock_for(path, lock_dir)))

    def writer() -> None:
        try:
            write_back(tree, changes("k1"), expected=expected, backup_dir=tree / "backup",
                       lock_dir=tree / "locks")
            outcomes.append("written")
        except StaleFileError as error:
            outcomes.append(str(error))

    with lock:  # another session (or xdist worker) is writing this file
        threads = [threading.Thread(target=writer) for _ in range(2)]
        for thread in threads:
            thread.start()
        for _ in threads:  # both reached the lock we hold: neither can have written
            assert waiting.acquire(timeout=30)
        assert outcomes == [] and kernel.read_text() == ORIGINAL  # both wait
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["kernels/k1.py changed since the test ran (stale); not written",
                                "written"]
    assert kernel.read_text() == HEALED
