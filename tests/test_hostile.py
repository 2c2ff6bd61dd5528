"""The hostile suite: >100 scripted hostile answers against a copy of the example project.

The answers (tests/hostile/answers.py) try path traversal, absolute paths, test and
conftest edits, symlink escapes, kernel bypass, skip injection, monkeypatching, unsafe
code, regression-breaking fixes, endless loops and crashes in the kernel, 10 MB answers
and binary junk. The static guards refuse the unsafe ones before any rerun; reruns refuse
the rest (still failing, no launch, insensitive to the kernel's output, run-time
integrity). The session run asserts that the project tree (and the directory its
symlinks point to) is byte-identical afterwards, that no bug is reported healed, that
every round carries the reason its answer was written to provoke, and that no sandbox,
rerun directory or process outlives the session.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

import pytest
from hostile.answers import GELU, SOFTMAX, Hostile, build, write_cassette
from hostile.project import BUG, FIX, expected_rerun_mode, report, rerun_mode, write_project

from pytest_kernelfix.capture.errors import ErrorInfo
from pytest_kernelfix.fixers.replay import ReplayFixer
from pytest_kernelfix.heal.guards import build_guard
from pytest_kernelfix.heal.loop import heal
from pytest_kernelfix.heal.outcomes import UNHEALED, Verdict
from pytest_kernelfix.locate.context import BugContext, SourceFile
from pytest_kernelfix.project import Project

EXAMPLE = Path(__file__).parents[1] / "example_project"
TIMEOUT = 60.0  # seconds per sandbox rerun: the endless loops end here (slow shared CI too)


def make_project(base: Path) -> tuple[Path, Path]:
    """A copy of the example project with symlinks out of it and a hardlinked data file."""
    root = base / "proj"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns(
        ".kernelfix", "__pycache__", ".pytest_cache", "cassettes"))
    outside = base / "outside"
    outside.mkdir()
    (outside / "escape.py").write_text("VALUE = 1\n")
    os.symlink(outside / "escape.py", root / "kernels" / "escape.py")
    os.symlink(outside, root / "kernels" / "outdir")
    (root / "data").mkdir()
    (root / "data" / "weights.bin").write_bytes(random.Random(0).randbytes(300 * 1024))
    return root, outside


def snapshot(*roots: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under ``roots``: link targets, file bytes, modes, mtimes and inodes."""
    entries: dict[str, tuple[object, ...]] = {}
    for top in roots:
        for directory, dirs, files in os.walk(top):
            for name in sorted(dirs + files):
                path = Path(directory) / name
                info = path.lstat()
                if path.is_symlink():
                    entries[str(path)] = ("link", os.readlink(path))
                elif path.is_file():
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                    entries[str(path)] = (digest, info.st_mode, info.st_mtime_ns, info.st_ino)
                else:
                    entries[str(path)] = ("dir", info.st_mode)
    return entries


def per_group(answers: list[Hostile]) -> dict[str, list[Hostile]]:
    groups: dict[str, list[Hostile]] = {}
    for item in answers:
        groups.setdefault(item.group, []).append(item)
    return groups


def composition(answers: list[Hostile]) -> str:
    counts = Counter(item.kind for item in answers)
    return ", ".join(f"{kind} x{count}" for kind, count in counts.most_common())


def test_the_cassette_holds_over_a_hundred_hostile_answers(tmp_path: Path) -> None:
    root, outside = make_project(tmp_path)
    answers = build(root, outside)
    assert len(answers) >= 100
    kinds = {item.kind for item in answers}
    assert {"path traversal", "absolute path", "test edit", "conftest edit", "symlink escape",
            "kernel bypass", "skip injection", "regression", "infinite loop", "10 MB answer",
            "binary junk"} <= kinds
    assert all(item.expect for item in answers)


def test_every_static_answer_is_refused_before_a_rerun_for_its_reason(tmp_path: Path) -> None:
    """The real round loop, guard and replay fixer; a rerun here would fail the test."""
    root, outside = make_project(tmp_path)
    cassette = tmp_path / "hostile.jsonl"
    answers = build(root, outside)
    write_cassette(cassette, answers)
    fixer = ReplayFixer(cassette)
    guard = build_guard(Project(root))
    ran: list[Mapping[str, str]] = []

    def verify(files: Mapping[str, str]) -> Verdict:
        ran.append(files)
        return Verdict(False, "rerun")

    for target in (GELU, SOFTMAX):
        expected = [a for a in per_group(answers)[target.group] if a.static]
        original = (root / target.file).read_text()
        context = BugContext(f"{target.group}_kernel-error-000000", ("t::t",),
                             ErrorInfo("E", "m"), "log", (SourceFile(target.file, original),))
        result = heal(context, {target.file: original}, fixer=fixer, verify=verify,
                      rounds=len(expected), guard=guard)
        assert result.status == UNHEALED and ran == []
        for record, item in zip(result.rounds, expected, strict=True):
            assert item.expect in record.outcome, (item.kind, record.outcome)


@pytest.mark.slow
def test_hostile_session_leaves_the_tree_untouched_and_heals_nothing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = pytester.path
    root, outside = make_project(base)
    answers = build(root, outside)
    cassette = base / "hostile.jsonl"
    write_cassette(cassette, answers)
    groups = per_group(answers)
    reports = base / "reports"
    temp = base / "tmp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))  # sandboxes and rerun dirs land here
    # torch's own compile cache (made in TMPDIR when a candidate's code imports
    # torch._dynamo) is not the plugin's to remove: pin it elsewhere, as a test run that
    # imported dynamo earlier in this process already has, so only our dirs count below.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(base / "torchinductor"))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.delenv("KERNELFIX_MODEL", raising=False)
    before = snapshot(root, outside)

    started = time.monotonic()
    rounds = max(len(items) for items in groups.values())
    result = pytester.runpytest_subprocess(
        "proj", "-p", "no:randomly", "-p", "no:cacheprovider",
        "--kernelfix", f"--kernelfix-model=replay:{cassette}",
        f"--kernelfix-rounds={rounds}",
        f"--kernelfix-timeout={TIMEOUT}", "--kernelfix-target=off",
        f"--kernelfix-report-dir={reports}",
        timeout=1500,
    )
    seconds = time.monotonic() - started
    print(f"hostile suite: {len(answers)} answers ({composition(answers)}) in {seconds:.0f} s")

    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the plugin never changes it
    result.assert_outcomes(failed=12, passed=34)
    assert snapshot(root, outside) == before, "the project tree changed"

    report = json.loads((reports / "report.json").read_text())
    assert report["totals"]["healed"] == 0 and report["totals"]["bugs"] == 2
    assert rerun_mode(reports.parent, reports.name) == expected_rerun_mode()
    assert list(reports.glob("*.patch")) == []
    for bug in report["bugs"]:
        group = bug["kernel"].removesuffix("_kernel")
        expected = groups[group]
        assert bug["status"] == "unhealed" and bug["changed_files"] == []
        outcomes = [detail["outcome"] for detail in bug["round_details"]]
        if len(expected) < rounds:  # its answers ran out before the other bug's did
            assert outcomes.pop().startswith("no answer: replay cassette")
        assert len(outcomes) == len(expected)
        misses = [(item.kind, item.expect, outcome) for item, outcome in
                  zip(expected, outcomes, strict=True) if item.expect not in outcome]
        assert misses == []

    assert sorted(p.name for p in temp.iterdir()) == [], "a sandbox or rerun dir was left"
    survivors = [pid for pid in os.listdir("/proc") if pid.isdigit() and _uses(pid, temp)]
    assert survivors == [], "a rerun process outlived the session"


def _uses(pid: str, temp: Path) -> bool:
    """Whether process ``pid`` runs with our TMPDIR (every process the session started)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"TMPDIR={temp}".encode() in environ.split(b"\0")


HANG_THEN_CRASH_THEN_FIX = (
    ("    spins = 0\n    while spins >= 0:\n        spins += 1\n" + BUG, "rerun timed out after"),
    ("    tl.store(out_ptr + offsets * 1000000007, x * factor)", "died with SIGSEGV"),
    (FIX, "1 failing test(s) pass"),
)

RERUN_CHILD_CONFTEST = """
import os
import subprocess
from pathlib import Path

if os.environ.get("KERNELFIX_RERUN_PLAN"):  # only in sandbox reruns: a grandchild per rerun
    child = subprocess.Popen(["sleep", "600"])
    (Path(os.environ["KFX_PIDS"]) / str(child.pid)).write_text("")
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie is dead, merely not reaped by this container's init


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fork", "subprocess"])
def test_hung_and_crashing_candidates_are_killed_with_their_process_group(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setenv("KERNELFIX_RERUN", mode)  # both ways every rerun can start
    root = write_project(pytester.path, "k1")
    pytester.makeconftest(RERUN_CHILD_CONFTEST)
    pids = pytester.path / "pids"
    pids.mkdir()
    monkeypatch.setenv("KFX_PIDS", str(pids))
    tape = root / "tape.jsonl"
    previous = BUG
    with tape.open("w") as handle:
        for new, _ in HANG_THEN_CRASH_THEN_FIX:
            edit = {"file": "kernels/k1.py", "old_string": previous, "new_string": new}
            handle.write(json.dumps({"group": "k1_kernel-*",
                                     "response": json.dumps({"modifications": [edit]})}) + "\n")
            previous = new

    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--kernelfix",
        f"--kernelfix-model=replay:{tape}", "--kernelfix-rounds=3",
        f"--kernelfix-timeout={TIMEOUT}", timeout=300)

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    bug = report(root)["k1"]
    outcomes = [detail["outcome"] for detail in bug["round_details"]]
    assert [why in outcome for (_, why), outcome in
            zip(HANG_THEN_CRASH_THEN_FIX, outcomes, strict=True)] == [True] * 3, outcomes
    assert bug["status"] == "healed"  # a hang and a segfault did not stop the loop
    assert rerun_mode(root) == mode
    started = [int(path.name) for path in pids.iterdir()]
    # A conftest runs once per rerun child: forked, a child for the baseline and one per
    # candidate (the winner's poisoned runs fork from its child); fresh interpreters, a
    # child per rerun: the baseline, three candidates, the winner's two poisoned reruns.
    assert len(started) == (4 if mode == "fork" else 6)
    assert [pid for pid in started if _alive(pid)] == []
