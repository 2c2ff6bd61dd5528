"""Reading the sensitivity reruns, and the verifier steps around them (no subprocess here).

The verdict table: a poisoned test that fails is evidence the result comes from the kernel;
one that still passes, having checked values, is a bypass; one that checked no value does
not depend on the kernel; a test in which nothing was poisoned is no evidence, unless a
project kernel was launched and the test checked values anyway.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import make_group

from pytest_kernelfix.heal.outcomes import UNCERTIFIABLE
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun.launcher import RerunSetup, RerunSpec
from pytest_kernelfix.rerun.plan import DevicePlan
from pytest_kernelfix.rerun.report import (
    CheckSite,
    ChildReport,
    Probe,
    RerunResult,
    TestOutcome,
)
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.verify.sensitivity import (
    BLIND,
    BYPASS,
    SENSITIVE,
    UNMEASURED,
    judge_poisoned,
)
from pytest_kernelfix.verify.verifier import Verifier

A, B = "tests/test_k.py::test_a", "tests/test_k.py::test_b"


def outcome(nodeid: str, result: str, *, launches: int = 1, poisoned: int = 1, checks: int = 3,
            taint: str = "full") -> TestOutcome:
    return TestOutcome(nodeid, result, "call", launch_count=launches,  # type: ignore[arg-type]
                       probe=Probe(launches, poisoned, checks, taint))


def run(*outcomes: TestOutcome, **changes: object) -> RerunResult:
    values: dict[str, object] = {"returncode": 1, **changes}
    return RerunResult(tuple(outcomes), **values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("outcomes", "state", "words"),
    [
        ([outcome(A, "failed"), outcome(B, "failed", taint="clean")], SENSITIVE, "2 test(s) fail"),
        ([outcome(A, "failed"), outcome(B, "passed")], BYPASS, "1 test(s) pass even when"),
        ([outcome(A, "failed", taint="partial")], BYPASS, "only part of which come"),
        ([outcome(A, "passed", poisoned=0)], BYPASS, "wrote nothing they could check"),
        ([outcome(A, "passed", checks=0)], UNCERTIFIABLE, "cannot certify: the test does not "
                                                          "depend on the kernel's output"),
        ([outcome(A, "failed"), outcome(B, "passed", checks=0)], SENSITIVE, "1 test(s) fail"),
        ([outcome(A, "passed", poisoned=0, launches=0)], UNMEASURED, "not measured"),
        ([outcome(A, "passed", poisoned=0, checks=0)], UNMEASURED, "not measured"),
        ([outcome(A, "error")], SENSITIVE, "fail"),
        ([outcome(A, "skipped", checks=2)], BYPASS, "pass even when"),
    ],
    ids=["fails", "one passes", "partly poisoned", "launch wrote nothing", "checks nothing",
         "one checks nothing beside a sensitive one", "no launch", "nothing written or checked",
         "error counts as failing", "a skip is no failure"],
)
def test_the_verdict_of_one_poisoned_run(outcomes: list[TestOutcome], state: str,
                                         words: str) -> None:
    judgement = judge_poisoned(run(*outcomes), [o.nodeid for o in outcomes], "nan")
    assert judgement.state == state
    assert words in judgement.summary


def test_checks_of_nan_and_infinity_alone_cannot_judge_scrambled_values() -> None:
    """A test that only checks the loss is finite: NaN breaks it, scrambled values
    (finite) cannot, so the scramble run says nothing of it."""
    blind = TestOutcome(A, "passed", "call", launch_count=1,
                        probe=Probe(1, 1, 4, "", blind=4))
    judgement = judge_poisoned(run(blind), [A], "scramble")
    assert judgement.state == UNMEASURED and "check only for NaN and infinity" in judgement.summary
    assert judge_poisoned(run(blind), [A], "nan").state == BYPASS  # NaN it would have seen
    seeing = TestOutcome(A, "passed", "call", launch_count=1,
                         probe=Probe(1, 1, 4, "", blind=3))  # one real comparison
    assert judge_poisoned(run(seeing), [A], "scramble").state == BYPASS
    assert Probe.from_json(blind.probe.to_json()) == blind.probe  # type: ignore[union-attr]


def test_a_crash_of_the_poisoned_run_counts_as_failing_for_the_unfinished_tests() -> None:
    crashed = run(outcome(A, "failed"), signal="SIGSEGV", returncode=-11)
    assert judge_poisoned(crashed, [A, B], "nan").state == SENSITIVE
    quiet = run(outcome(A, "passed"))  # B never ran, no crash: no evidence from B
    assert judge_poisoned(quiet, [A, B], "nan").state == BYPASS


def test_the_feedback_names_the_poison_and_the_tests() -> None:
    judgement = judge_poisoned(run(outcome(A, "passed")), [A], "scramble")
    assert "replaced by scrambled values" in judgement.summary
    assert A in judgement.feedback and "not a fix" in judgement.feedback


def compared(nodeid: str, result: str, *taints: str) -> TestOutcome:
    """A reach-mode outcome whose check sites (lines 10, 11, ...) read values with these
    taints."""
    sites = tuple(CheckSite(10 + i, 2, taint, 1, 0, "P") for i, taint in enumerate(taints))
    worst = "partial" if "partial" in taints else "full" if "full" in taints else "clean"
    return TestOutcome(nodeid, result, "call", launch_count=2,  # type: ignore[arg-type]
                       probe=Probe(2, 2, 2 * len(taints), worst, sites, reach=True))


@pytest.mark.parametrize(
    ("outcomes", "mode", "sites", "state"),
    [
        ([compared(A, "passed", "full", "full")], "nan", {}, BLIND),
        ([compared(A, "passed", "full"), outcome(B, "failed")], "nan", {}, SENSITIVE),
        ([compared(A, "passed", "full"), outcome(B, "passed")], "nan", {}, BYPASS),
        ([compared(A, "passed", "full", "clean")], "nan", {}, BYPASS),
        ([compared(A, "passed", "full", "partial")], "nan", {}, BYPASS),
        ([compared(A, "passed", "full")], "scramble", {}, BYPASS),
    ],
    ids=["kernel outputs compared with each other", "beside a sensitive test",
         "beside a bypass", "one check read clean values", "one check read partly poisoned values",
         "blindness is NaN's only"],
)
def test_a_check_nan_cannot_fail_leaves_the_verdict_to_the_scrambled_run(
        outcomes: list[TestOutcome], mode: str, sites: dict[str, int], state: str) -> None:
    """liger's functional tests compare two runs of the kernel with a check that treats
    NaN as equal to NaN: with both outputs poisoned they pass, yet every value they read
    came from the kernel. That is no bypass; a value from torch reads clean."""
    judgement = judge_poisoned(run(*outcomes), [o.nodeid for o in outcomes], mode, sites)
    assert judgement.state == state, judgement


# -- the verifier around the poisoned runs ---------------------------------------------------


class Scripted:
    """A runner answering each spec from a table keyed by its poison mode."""

    def __init__(self, answers: dict[str, RerunResult]) -> None:
        self.answers = answers
        self.specs: list[RerunSpec] = []

    def __call__(self, spec: RerunSpec) -> RerunResult:
        self.specs.append(spec)
        return self.answers[spec.probe.poison]


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text("def k():\n    return 1\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_k.py").write_text("def test_a():\n    pass\n")
    return Sandbox.create(tmp_path)


def verify(sandbox: Sandbox, answers: dict[str, RerunResult]) -> tuple[object, Scripted]:
    runner = Scripted(answers)
    setup = RerunSetup(sandbox.source, 10.0, DevicePlan(interpret=True))
    verifier = Verifier(sandbox, setup, make_group(sandbox.source, A), Project(sandbox.source),
                        runner=runner)
    with sandbox:
        verdict = verifier({"kernels/k.py": "def k():\n    return 2\n"})
    return verdict, runner


def test_a_candidate_passes_only_after_both_poisons_make_the_tests_fail(sandbox: Sandbox) -> None:
    verdict, runner = verify(sandbox, {"": run(outcome(A, "passed")),
                                       "nan": run(outcome(A, "failed")),
                                       "scramble": run(outcome(A, "failed", taint=""))})
    assert verdict.ok, verdict  # type: ignore[attr-defined]
    assert [spec.probe.poison for spec in runner.specs] == ["", "nan", "scramble"]
    assert all(spec.nodeids == (A,) for spec in runner.specs)


def test_what_only_the_scrambled_run_catches_is_rejected(sandbox: Sandbox) -> None:
    """``ref + 0 * out`` carries NaN to the test but ignores finite values."""
    verdict, _ = verify(sandbox, {"": run(outcome(A, "passed")),
                                  "nan": run(outcome(A, "failed")),
                                  "scramble": run(outcome(A, "passed", taint=""))})
    assert not verdict.ok and verdict.kind == "insensitive"  # type: ignore[attr-defined]
    assert "replaced by scrambled values" in verdict.summary  # type: ignore[attr-defined]


@pytest.mark.parametrize("scrambled", ["failed", "passed"])
def test_a_nan_blind_test_is_judged_by_the_scrambled_run(sandbox: Sandbox,
                                                         scrambled: str) -> None:
    verdict, _ = verify(sandbox, {"": run(outcome(A, "passed")),
                                  "nan": run(compared(A, "passed", "full")),
                                  "scramble": run(outcome(A, scrambled, taint=""))})
    if scrambled == "failed":
        assert verdict.ok, verdict  # type: ignore[attr-defined]
    else:
        assert not verdict.ok and verdict.kind == "insensitive"  # type: ignore[attr-defined]
        assert "replaced by scrambled values" in verdict.summary  # type: ignore[attr-defined]


def test_a_test_that_checks_nothing_ends_as_uncertifiable(sandbox: Sandbox) -> None:
    verdict, runner = verify(sandbox, {"": run(outcome(A, "passed")),
                                       "nan": run(outcome(A, "passed", checks=0)),
                                       "scramble": run(outcome(A, "passed", checks=0))})
    assert verdict.kind == UNCERTIFIABLE and not verdict.ok  # type: ignore[attr-defined]
    # the scrambled run went beside the NaN run; the NaN run decided
    assert sorted(spec.probe.poison for spec in runner.specs) == ["", "nan", "scramble"]
    assert verdict.phases[-2].outcome == "uncertifiable"  # type: ignore[attr-defined]


def test_integrity_findings_count_only_when_the_unpatched_code_had_none(sandbox: Sandbox) -> None:
    patched = "torch.testing.assert_close is replaced (now <lambda> from kernels/k.py)"
    mode = "a torch function mode is active: torch.utils._device.DeviceContext"

    def with_findings(*found: str) -> RerunResult:
        return RerunResult((TestOutcome(A, "passed", "call", launch_count=1, integrity=found),),
                           returncode=0)

    runner = Scripted({"": with_findings(mode)})
    setup = RerunSetup(sandbox.source, 10.0, DevicePlan(interpret=True))
    verifier = Verifier(sandbox, setup, make_group(sandbox.source, A), Project(sandbox.source),
                        runner=runner)
    with sandbox:
        verifier.baseline({"kernels/k.py": "def k():\n    return 1\n"})
        runner.answers[""] = with_findings(mode, patched)
        verdict = verifier({"kernels/k.py": "def k():\n    return 2\n"})
    assert verdict.kind == "integrity"
    assert verdict.summary == f"run-time integrity: {patched}"
    assert mode not in verdict.feedback  # the suite's own mode was there before


def test_a_rerun_whose_integrity_check_could_not_start_is_no_pass(sandbox: Sandbox) -> None:
    broken = RerunResult((outcome(A, "passed"),), returncode=0,
                         report=ChildReport(integrity_error="ImportError: numpy.testing"))
    verdict, runner = verify(sandbox, {"": broken})
    assert not verdict.ok and verdict.kind == "rerun"  # type: ignore[attr-defined]
    assert verdict.summary == (  # type: ignore[attr-defined]
        "the run-time integrity check could not start: ImportError: numpy.testing")
    assert [spec.probe.poison for spec in runner.specs] == [""]
