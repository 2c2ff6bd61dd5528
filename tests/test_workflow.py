"""A whole healing session as plain stages: grouping, triage, rounds, reports.

The rerun runner is a fake that judges the sandbox's files as a rerun would (the bug is
fixed when the kernel file holds the fix), so these run in milliseconds; the real
subprocess reruns are proven in test_rerun.py and the session tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import make_settings

from pytest_kernelfix.capture import Failure, PassedTest
from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.failure import ErrorInfo, Frame
from pytest_kernelfix.fixers.base import Proposal, ProposalRequest, Usage
from pytest_kernelfix.guards import build_guard
from pytest_kernelfix.launches import KernelLaunch
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun import RerunResult, RerunSetup, RerunSpec, TestOutcome
from pytest_kernelfix.rerun_plan import DevicePlan
from pytest_kernelfix.workflow import SessionInputs, Stages, run_healing

BUG, FIX = "    y = x + factor\n", "    y = x * factor\n"
KERNEL = f"def scale_kernel(x, factor):\n{BUG}    return y\n"
NODEIDS = ("tests/test_scale.py::test_scale[2]", "tests/test_scale.py::test_scale[3]")
REGRESSION = "tests/test_scale.py::test_scale_zero"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "ops.py").write_text(KERNEL)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_scale.py").write_text("def test_scale():\n    pass\n")
    return tmp_path


def failures(root: Path) -> tuple[Failure, ...]:
    kernel = str(root / "kernels" / "ops.py")
    test = str(root / "tests" / "test_scale.py")
    launch = KernelLaunch("scale_kernel", kernel, 1)
    frames = (Frame(test, 2, "test_scale", "assert_close(...)"),)
    return tuple(
        Failure(nodeid, test, ErrorInfo("AssertionError", f"Mismatched elements: {n} / 8",
                                        frames), "longrepr", (launch,))
        for n, nodeid in enumerate(NODEIDS, start=3)
    )


def inputs(root: Path, notes: tuple[str, ...] = (), **changes: object) -> SessionInputs:
    passed = (PassedTest(REGRESSION, (KernelLaunch("scale_kernel",
                                                   str(root / "kernels" / "ops.py"), 1),)),)
    return SessionInputs(
        failures=failures(root), passed=passed, settings=make_settings(root, **changes),
        setup=RerunSetup(root, 10.0, DevicePlan(interpret=True)), project=Project(root),
        notes=notes,
    )


class FakeRunner:
    """Reruns judged from the sandbox's kernel file: fixed means every test passes."""

    def __init__(self, *, reproduces: bool = True) -> None:
        self.reproduces = reproduces
        self.specs: list[RerunSpec] = []

    def __call__(self, spec: RerunSpec) -> RerunResult:
        self.specs.append(spec)
        fixed = FIX in (spec.sandbox_root / "kernels" / "ops.py").read_text()
        passing = fixed or not self.reproduces
        outcomes = tuple(
            TestOutcome(nodeid, "passed" if passing or nodeid == REGRESSION else "failed",
                        "call", launch_count=1)
            for nodeid in spec.nodeids
        )
        return RerunResult(outcomes, returncode=0 if passing else 1)


class Answers:
    name = "scripted"

    def __init__(self, *proposals: Proposal) -> None:
        self.proposals = list(proposals)
        self.requests: list[ProposalRequest] = []

    def propose(self, request: ProposalRequest) -> Proposal:
        self.requests.append(request)
        return self.proposals.pop(0)


def fix(old: str = BUG, new: str = FIX) -> Proposal:
    return Proposal((Modification(old, new, file="kernels/ops.py"),), source="scripted")


def test_a_session_heals_with_a_fake_runner_and_writes_its_artifacts(root: Path) -> None:
    runner = FakeRunner()
    fixer = Answers(fix("    y = x + factor\n", "    y = x - factor\n"), fix())
    report = run_healing(inputs(root), Stages(fixer=fixer, guard=build_guard(Project(root)),
                                              runner=runner))
    (bug,) = report.bugs
    assert bug.result.status == "healed", bug.result.reason
    assert len(bug.result.rounds) == 2  # round 1's change did not fix it; round 2 did
    assert bug.group.nodeids == NODEIDS  # one bug, two parametrized failures
    assert (root / ".kernelfix" / bug.patch_file).read_text().endswith(
        f"-{BUG}+{FIX}     return y\n")
    assert (root / "kernels" / "ops.py").read_text() == KERNEL  # report mode writes no tree
    # baseline first (failing tests + the regression set), then one run per candidate
    assert [spec.nodeids for spec in runner.specs] == [(*NODEIDS, REGRESSION)] * 3
    assert f"{NODEIDS[0]}: failed" in fixer.requests[1].feedback  # round 2 saw round 1 fail


def test_session_notes_reach_report_json_and_report_md(root: Path) -> None:
    note = "kernel launches are not recorded: No module named 'triton'"
    run_healing(inputs(root, notes=(note,)), Stages(fixer=Answers(fix()), runner=FakeRunner()))
    data = json.loads((root / ".kernelfix" / "report.json").read_text())
    assert data["notes"] == [note]
    assert f"> {note}" in (root / ".kernelfix" / "report.md").read_text()


def test_a_failure_that_does_not_reproduce_is_skipped_before_any_proposal(root: Path) -> None:
    fixer = Answers()
    report = run_healing(inputs(root), Stages(fixer=fixer, runner=FakeRunner(reproduces=False)))
    (bug,) = report.bugs
    assert bug.result.status == "skipped"
    assert "does not reproduce" in bug.result.reason
    assert fixer.requests == []


def test_with_the_cuda_shim_off_a_failure_the_shim_cures_is_not_healed(root: Path) -> None:
    def runner(spec: RerunSpec) -> RerunResult:
        passing = spec.setup.device.cuda_shim
        return RerunResult(tuple(TestOutcome(n, "passed" if passing else "failed", "call")
                                 for n in spec.nodeids), returncode=0)

    session = inputs(root)
    off = SessionInputs(session.failures, session.passed, session.settings,
                        RerunSetup(root, 10.0, DevicePlan(interpret=True, cuda_shim=False)),
                        session.project)
    fixer = Answers()
    (bug,) = run_healing(off, Stages(fixer=fixer, runner=runner)).bugs
    assert bug.result.status == "skipped"
    assert "kernelfix_cuda_shim is off" in bug.result.reason
    assert fixer.requests == []


def test_apply_mode_writes_the_winner_into_the_tree(root: Path) -> None:
    report = run_healing(inputs(root, apply=True), Stages(fixer=Answers(fix()),
                                                          runner=FakeRunner()))
    assert report.bugs[0].applied == ("kernels/ops.py",)
    assert (root / "kernels" / "ops.py").read_text() == KERNEL.replace(BUG, FIX)


def test_the_token_cap_stops_the_session_between_rounds(root: Path) -> None:
    """``max_tokens`` from the settings reaches the session's fixer: the answer that
    crossed the cap was verified, the next round was not bought."""
    wrong = Proposal((Modification(BUG, "    y = x - factor\n", file="kernels/ops.py"),),
                     usage=Usage(1, 900, 300), source="scripted")
    fixer = Answers(wrong, fix())
    report = run_healing(inputs(root, rounds=3, max_tokens=1000),
                         Stages(fixer=fixer, runner=FakeRunner()))
    (bug,) = report.bugs
    assert len(fixer.requests) == 1  # round 2's answer was never asked for
    assert (bug.result.status, bug.result.reason) == (
        "unhealed",
        "round 2: the session's budget is spent: 1200 of 1000 tokens (--kernelfix-max-tokens)")
    data = json.loads((root / ".kernelfix" / "report.json").read_text())
    assert data["budget"] == {"max_cost": None, "max_tokens": 1000}
    assert data["totals"]["prompt_tokens"] + data["totals"]["completion_tokens"] == 1200
