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
from collections.abc import Callable, Iterator
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


class Shows(Answers):
    """Answers that, in round 1, first let ``join`` add failures to the bug (so that
    round 1's candidate is verified on them too), and keep what each round showed."""

    def __init__(self, join: Callable[[], None], *edits: tuple[str, str]) -> None:
        super().__init__(*edits)
        self.join = join
        self.shown: list[tuple[str, ...]] = []

    def propose(self, request: ProposalRequest) -> Proposal:
        if request.round == 1:
            self.join()
        self.shown.append(request.context.nodeids)
        return super().propose(request)


def test_failures_that_join_a_bug_while_it_heals_are_shown_from_the_next_round(
    root: Path, overlaps: list[Overlap],
) -> None:
    runner = Runner()

    def join() -> None:  # while round 1 is answered, the late failures join the bug
        for nodeid in LATE:
            overlap.failed(failure(root, nodeid))
        (unit,) = overlap.units.values()
        deadline = time.monotonic() + 30
        while (unit.posted is None or len(unit.posted[0].nodeids) < 4) and (
                time.monotonic() < deadline):
            time.sleep(0.01)

    fixer = Shows(join, PARTIAL, WHOLE)
    overlap, inputs = overlap_of(root, runner, fixer, overlaps)
    for nodeid in EARLY:
        overlap.failed(failure(root, nodeid))
    wait(runner.poisoned)  # round 2's winner was verified
    everything = tuple(failure(root, n) for n in EARLY + LATE)
    report = run_healing(replace(inputs, failures=everything), Stages(fixer=fixer),
                         head=overlap)

    (bug,) = report.bugs
    assert bug.result.status == "healed" and bug.result.reason == "healed in round 2"
    first, second = fixer.shown
    assert not set(LATE) & set(first) and second == EARLY + LATE  # shown from round 2
    assert bug.result.rounds[0].outcome.startswith("2 of 4 failing tests still fail")


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


# -- a failure that joins a bug while it heals shows the rest of the fault ------------------

#: Two paths of one kernel, each with its own fault; a launch runs one, so a test of the
#: first path is shown ``_low`` alone (the module is long enough to be shown focused).
TWO_PATHS = '''"""Scale a vector by two, on one of two paths."""

import torch
import triton
import triton.language as tl


@triton.jit
def _low(x):
    return x + 1.0  # low path


@triton.jit
def _high(x):
    return x - 1.0  # high path


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, MODE: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    if MODE == 0:
        y = _low(x)
    else:
        y = _high(x)
    tl.store(out_ptr + offsets, y, mask=mask)


def scale(x: torch.Tensor, mode: int) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    scale_kernel[(triton.cdiv(n, 256),)](x, out, n, MODE=mode, BLOCK=256)
    return out
''' + "".join(f'''

def unrelated_{i:02d}(values):
    """A helper no test reaches."""
    total = 0
    for value in values:
        total += value * {i}
    return total
''' for i in range(30))

#: The low path's test fails first; the high path's, only once the heal asked round 1.
TWO_PATH_TESTS = '''import os
import time
from pathlib import Path

import pytest
import torch

from kernels.ops import scale

ROOT = Path(__file__).parent.parent


@pytest.mark.kernel
def test_low() -> None:
    x = torch.arange(300, dtype=torch.float32)
    torch.testing.assert_close(scale(x, 0), x * 2.0)


def test_waits_for_round_1() -> None:
    deadline = time.monotonic() + float(os.environ.get("KFX_WAIT", "0"))
    while not (ROOT / "asked").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.kernel
def test_high() -> None:
    (ROOT / "ran-high").write_text("")
    x = torch.arange(300, dtype=torch.float32)
    torch.testing.assert_close(scale(x, 1), x * 2.0)
'''

#: Answers each fault whose line the prompt shows (as the historic benchmark's oracle
#: does); round 1 is answered once the high path's test failed, so that round 1's
#: candidate is verified on it.
SHOWN_ONLY = '''import json
import time
from pathlib import Path

from pytest_kernelfix.fixers.prompting import render_messages

ROOT = Path(__file__).parent
FAULTS = [("    return x + 1.0  # low path\\n", "    return x * 2.0  # low path\\n"),
          ("    return x - 1.0  # high path\\n", "    return x * 2.0  # high path\\n")]


def pytest_kernelfix_propose(request, config):
    if request.round == 1:
        (ROOT / "asked").write_text("")
        deadline = time.monotonic() + 120
        while not (ROOT / "ran-high").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2)  # the helper groups it with the bug under way
    shown = "\\n".join(message["content"] for message in render_messages(request))
    text = {source.path: source.text for source in request.files}.get("kernels/ops.py", "")
    edits = [{"file": "kernels/ops.py", "old_string": old, "new_string": new,
              "reason": "the fault shown"}
             for old, new in FAULTS if old in text and old.strip() in shown]
    with (ROOT / "asked.jsonl").open("a") as log:
        log.write(json.dumps({"round": request.round, "edits": len(edits)}) + "\\n")
    return json.dumps({"analysis": "what the prompt shows", "modifications": edits})
'''


def test_a_failure_that_joins_a_bug_while_it_heals_is_shown_and_heals_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first failing test does not show the faulty definition of the second path; the
    test that joins the bug during round 1 does, and round 2 shows it (the defaults:
    overlap on)."""
    write_project(pytester.path, passing=False)
    (pytester.path / "kernels" / "ops.py").write_text(TWO_PATHS)
    (pytester.path / "tests" / "test_scale.py").write_text(TWO_PATH_TESTS)
    pytester.makeconftest(SHOWN_ONLY)
    monkeypatch.setenv("KFX_WAIT", "120")
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--kernelfix", "--kernelfix-rounds=3",
        timeout=600)
    result.assert_outcomes(failed=2, passed=1)
    report = json.loads((pytester.path / ".kernelfix" / "report.json").read_text())
    (bug,) = report["bugs"]
    assert (bug["status"], bug["rounds"]) == ("healed", 2), bug["reason"]
    calls = (pytester.path / "asked.jsonl").read_text().splitlines()
    asked = [json.loads(line) for line in calls]
    assert [(call["round"], call["edits"]) for call in asked] == [(1, 1), (2, 1)]
    assert report["overlap"]["bugs"] == 1
