"""Healing while the tests run (``--kernelfix-overlap``).

The heal of a bug begins at its first failure, in a helper process, and the failures that
arrive later join it; the session's end takes the bugs under way over. First the logic
with a fake runner (milliseconds), then whole sessions with overlap on, off, and under
xdist: the tests' outcomes and the exit status never change, the report says how much
overlapped, and a test that waits for the model's call proves it came while tests ran.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from factories import make_settings
from hostile.project import BUG, FIX, write_project

from pytest_kernelfix.capture.errors import ErrorInfo, Frame
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.capture.records import Failure
from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.fixers.base import Proposal, ProposalRequest
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun.launcher import RerunSetup, RerunSpec
from pytest_kernelfix.rerun.plan import DevicePlan
from pytest_kernelfix.rerun.report import Probe, RerunResult, TestOutcome
from pytest_kernelfix.session.overlap import Overlap, spare_cores
from pytest_kernelfix.session.pipeline import SessionInputs, Stages, run_healing

KERNEL = "def scale(x):\n    y = x + 1\n    return y[:n // BLOCK]\n"
PARTIAL = ("    y = x + 1\n", "    y = x * 2\n")  # fixes the value, not the length
WHOLE = ("    return y[:n // BLOCK]\n", "    return y[:cdiv(n, BLOCK)]\n")
EARLY = tuple(f"tests/test_a.py::test_a[{n}]" for n in (256, 512))  # multiples of BLOCK
LATE = tuple(f"tests/test_b.py::test_b[{n}]" for n in (300, 700))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "ops.py").write_text(KERNEL)
    (tmp_path / "tests").mkdir()
    for name in ("a", "b"):
        (tmp_path / "tests" / f"test_{name}.py").write_text(f"def test_{name}():\n    pass\n")
    return tmp_path


def failure(root: Path, nodeid: str) -> Failure:
    test = str(root / nodeid.split("::")[0])
    return Failure(nodeid, test, ErrorInfo("AssertionError", "Tensor-likes are not close!",
                                           (Frame(test, 2, "test", "assert_close(y, ref)"),)),
                   "longrepr", (KernelLaunch("scale_kernel", str(root / "kernels" / "ops.py"),
                                             1),))


class Runner:
    """Reruns judged from the sandbox's kernel: the value fix heals the early tests, the
    length fix too the late ones; poisoned runs fail (the fix reads the kernel)."""

    def __init__(self) -> None:
        self.specs: list[RerunSpec] = []
        self.poisoned = threading.Event()

    def __call__(self, spec: RerunSpec) -> RerunResult:
        self.specs.append(spec)
        text = (spec.sandbox_root / "kernels" / "ops.py").read_text()
        outcomes = []
        for nodeid in spec.nodeids:
            healed = PARTIAL[1] in text and (nodeid in EARLY or WHOLE[1] in text)
            failed = spec.probe.poison or not healed
            probe = Probe(1, 1, 1, "full") if spec.probe.poison else None
            outcomes.append(TestOutcome(nodeid, "failed" if failed else "passed", "call",
                                        launch_count=1, probe=probe))
        if spec.probe.poison == "scramble":  # the last phase of a verification
            self.poisoned.set()
        return RerunResult(tuple(outcomes), returncode=0)

    def ran(self, nodeid: str) -> int:
        return sum(nodeid in spec.nodeids for spec in self.specs)


class Answers:
    name = "scripted"
    free = True

    def __init__(self, *edits: tuple[str, str]) -> None:
        self.edits = list(edits)
        self.rounds: list[int] = []

    def propose(self, request: ProposalRequest) -> Proposal:
        self.rounds.append(request.round)
        old, new = self.edits.pop(0)
        return Proposal((Modification(old, new, file="kernels/ops.py"),), source="scripted")


@pytest.fixture
def overlaps() -> Iterator[list[Overlap]]:
    """Overlaps a test made: stopped afterwards, their sandboxes removed."""
    made: list[Overlap] = []
    yield made
    for overlap in made:
        overlap.stop()
        overlap.join()


def overlap_of(root: Path, runner: Runner, fixer: Answers, made: list[Overlap]
               ) -> tuple[Overlap, SessionInputs]:
    settings = make_settings(root, rounds=3, workers=1)
    setup = RerunSetup(root, 10.0, DevicePlan(interpret=True))
    project = Project(root)
    overlap = Overlap(settings=settings, project=project, setup=setup,
                      stages=lambda: Stages(fixer=fixer, runner=runner))
    made.append(overlap)
    inputs = SessionInputs(failures=(), passed=(), settings=settings, setup=setup,
                           project=project)
    return overlap, inputs


def wait(event: threading.Event) -> None:
    assert event.wait(30), "the heal never got there"


def test_a_winner_that_fails_a_later_failure_goes_on_to_its_next_round(
    root: Path, overlaps: list[Overlap],
) -> None:
    runner = Runner()
    fixer = Answers(PARTIAL, WHOLE)
    overlap, inputs = overlap_of(root, runner, fixer, overlaps)
    for nodeid in EARLY:
        overlap.failed(failure(root, nodeid))
    wait(runner.poisoned)  # round 1's winner was verified on the early failures alone
    for nodeid in LATE:
        overlap.failed(failure(root, nodeid))
    everything = tuple(failure(root, n) for n in EARLY + LATE)
    report = run_healing(replace(inputs, failures=everything), Stages(fixer=fixer),
                         head=overlap)

    (bug,) = report.bugs
    assert bug.group.nodeids == EARLY + LATE  # one bug: the late failures joined it
    assert bug.result.status == "healed" and bug.result.reason == "healed in round 2"
    first, second = bug.result.rounds
    assert first.outcome.startswith("2 of 4 failing tests still fail")  # checked later
    assert second.outcome.startswith("4 failing test(s) pass")
    assert fixer.rounds == [1, 2]
    assert WHOLE[1] in bug.result.final["kernels/ops.py"]
    assert report.overlap is None  # the controller adds it
    # round 1's check on the early tests was kept: only the late ones ran for it again
    early_runs = [spec for spec in runner.specs if EARLY[0] in spec.nodeids
                  and not spec.probe.poison]
    assert len(early_runs) >= 3  # the baseline, round 1's first check, round 2


def test_failures_that_arrive_later_are_checked_without_rerunning_the_others(
    root: Path, overlaps: list[Overlap],
) -> None:
    runner = Runner()
    fixer = Answers(PARTIAL)
    overlap, inputs = overlap_of(root, runner, fixer, overlaps)
    overlap.failed(failure(root, EARLY[0]))
    wait(runner.poisoned)
    before = len(runner.specs)
    overlap.failed(failure(root, EARLY[1]))
    everything = tuple(failure(root, n) for n in EARLY)
    report = run_healing(replace(inputs, failures=everything), Stages(fixer=fixer),
                         head=overlap)

    (bug,) = report.bugs
    assert bug.result.status == "healed" and len(bug.result.rounds) == 1
    assert bug.result.rounds[0].outcome.startswith("2 failing test(s) pass")
    later = runner.specs[before:]
    assert later and all(spec.nodeids == (EARLY[1],) for spec in later)  # only the new one
    assert fixer.rounds == [1]  # no second call for the same bug


def test_a_bug_under_way_that_merges_into_another_is_dropped(
    root: Path, overlaps: list[Overlap],
) -> None:
    runner = Runner()
    overlap, _ = overlap_of(root, runner, Answers(PARTIAL, PARTIAL), overlaps)
    overlap.failed(failure(root, EARLY[0]))
    deadline = time.monotonic() + 30
    while not overlap.units and time.monotonic() < deadline:
        time.sleep(0.01)
    (unit,) = overlap.units.values()
    other = replace(unit.group, failures=(*unit.group.failures, failure(root, LATE[0])))
    assert overlap.assign([other], ()) == {0: unit}  # the final group holds its seed
    result, stats = unit.outcome()
    assert result.group_id == other.id and stats.count > 0
    assert spare_cores(1, cores=2) == 1 and spare_cores(2, cores=2) == 0


def test_on_a_gpu_the_tests_keep_to_themselves_the_model_is_asked_first(
    root: Path, overlaps: list[Overlap], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One GPU, one test process: no GPU is free while the tests run, so the bug's reruns
    wait for their end, and the model (whose latency is what there is to hide) is asked
    before the baseline."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    runner = Runner()
    fixer = Answers(PARTIAL)
    fixer.free = False  # a paid model: asked after the baseline, unless reruns must wait
    settings = make_settings(root, rounds=3, workers=1, device="cuda")
    setup = RerunSetup(root, 10.0, DevicePlan(interpret=False))
    overlap = Overlap(settings=settings, project=Project(root), setup=setup,
                      stages=lambda: Stages(fixer=fixer, runner=runner))
    overlaps.append(overlap)
    overlap.failed(failure(root, EARLY[0]))
    deadline = time.monotonic() + 30
    while not fixer.rounds and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fixer.rounds == [1] and runner.specs == []  # asked, nothing rerun yet
    assert overlap.wait_for_gpu
    inputs = SessionInputs(failures=(failure(root, EARLY[0]),), passed=(), settings=settings,
                           setup=setup, project=Project(root))
    report = run_healing(inputs, Stages(fixer=fixer), head=overlap)  # the tests ran
    (bug,) = report.bugs
    assert bug.result.status == "healed", bug.result.reason
    assert runner.specs  # rerun once the run ended


# -- whole sessions -------------------------------------------------------------------------

HOOK = f"""
import os
import time
from pathlib import Path

from pytest_kernelfix import Modification

ASKED = Path(__file__).parent / "asked"


def pytest_kernelfix_propose(request, config):
    name = request.context.group_id.split("_kernel")[0]
    ASKED.write_text(str(time.monotonic()))
    return [Modification({BUG!r}, {FIX!r}, file=f"kernels/{{name}}.py")]
"""

#: Passes once the model was asked, which with overlap on happens while tests still run.
WAITS = """
import os
import time
from pathlib import Path


def test_waits_for_the_model() -> None:
    asked = Path(__file__).parent.parent / "asked"
    deadline = time.monotonic() + float(os.environ.get("KFX_WAIT", "0"))
    while not asked.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert asked.exists() or not os.environ.get("KFX_WAIT")


def test_after_the_wait() -> None:
    pass
"""


def session(pytester: pytest.Pytester, *args: str) -> tuple[dict, str]:  # type: ignore[type-arg]
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--kernelfix", "-v", *args,
        timeout=600)
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the failing tests stay failed
    result.assert_outcomes(failed=2, passed=3)  # the waiting test passed too
    report = json.loads((pytester.path / ".kernelfix" / "report.json").read_text())
    assert [bug["status"] for bug in report["bugs"]] == ["healed"] * 2
    (pytester.path / "asked").unlink()
    return report, result.stdout.str()


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    write_project(pytester.path, "k1", "k2")
    (pytester.path / "tests" / "test_zz_waits.py").write_text(WAITS)  # runs last
    pytester.makeconftest(HOOK)
    return pytester


def test_with_overlap_the_model_is_asked_while_the_tests_run(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KFX_WAIT", "120")
    report, out = session(project)
    assert report["overlap"]["bugs"] >= 1
    lines = out.splitlines()
    heal = next(i for i, line in enumerate(lines) if "healing while the tests run" in line)
    last = next(i for i, line in enumerate(lines) if "test_after_the_wait PASSED" in line)
    assert heal < last  # the heal's lines came between test results
    window = [line for line in lines[heal:last + 1] if line]  # no line mixes a test's
    shapes = ("kernelfix: ", "tests/", "---")  # result with a heal's line
    assert [line for line in window if not line.startswith(shapes)] == []
    assert [line for line in window if not line.startswith("---") and (
        "kernelfix:" in line[1:] or (line.startswith("tests/") and "kernel" in line))] == []
    assert "Sandbox reruns:" in (project.path / ".kernelfix" / "report.md").read_text()
    assert report["reruns"]["children"] < report["reruns"]["count"]  # phases share children


def test_without_overlap_healing_begins_after_the_last_test(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KERNELFIX_OVERLAP", "off")  # the environment twin of the option
    report, out = session(project)
    assert "overlap" not in report
    lines = out.splitlines()
    heal = next(i for i, line in enumerate(lines) if "kernelfix: healing" in line)
    last = next(i for i, line in enumerate(lines) if "test_after_the_wait PASSED" in line)
    assert last < heal and "while the tests run" not in out


def test_with_overlap_under_xdist_the_outcomes_stay_and_the_bugs_heal(
    project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KFX_WAIT", "120")
    report, _ = session(project, "-p", "xdist", "-n", "2")
    assert report["overlap"]["bugs"] >= 1
