"""Staged verification with representatives, per-check and per-kernel sensitivity, masks
(no subprocess here: a scripted runner answers each rerun from what it asks for).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from factories import make_group

from pytest_kernelfix.capture.errors import ErrorInfo, Frame
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.capture.records import Failure
from pytest_kernelfix.heal.outcomes import Verdict, VerdictKind
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun.launcher import RerunSetup, RerunSpec
from pytest_kernelfix.rerun.plan import DevicePlan, ProbePlan
from pytest_kernelfix.rerun.report import CheckSite, Fingerprint, Probe, RerunResult, TestOutcome
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.verify.masks import kernel_output_unchanged
from pytest_kernelfix.verify.sample import diverse, first, parameters, size
from pytest_kernelfix.verify.sensitivity import (
    BYPASS,
    DOUBT,
    SENSITIVE,
    judge_kernel,
    judge_poisoned,
    poisoned_runs,
)
from pytest_kernelfix.verify.verifier import Verifier

TEST = "tests/test_k.py"
IDS = tuple(f"{TEST}::test_k[{dtype}-{n}]" for dtype in ("float32", "bfloat16")
            for n in (1024, 16, 256))
FORWARD, BACKWARD = "kernels/k.py::fwd_kernel", "kernels/k.py::bwd_kernel"
LINE = 12  # the check every failing test failed at on the original code


# -- representatives --------------------------------------------------------------------


def test_the_first_representative_is_the_fastest_then_the_smallest() -> None:
    assert parameters(IDS[0]) == ("float32", "1024") and size(IDS[0]) == 1024
    assert first(IDS) == f"{TEST}::test_k[float32-16]"
    assert first(IDS, {IDS[5]: 0.01, **{n: 0.5 for n in IDS[:5]}}) == IDS[5]
    two = {n: 2 for n in IDS}  # forward and backward kernels, but one test launches one
    assert first(IDS, {n: 0.01 for n in IDS}, {**two, IDS[4]: 1}) == IDS[4]
    with pytest.raises(ValueError, match="no failing test"):
        first(())


def test_sensitivity_representatives_cover_each_parameter_value_once() -> None:
    chosen = diverse(IDS, first(IDS))
    assert chosen[0] == f"{TEST}::test_k[float32-16]" and len(chosen) == 3
    assert {"float32", "bfloat16"} <= {p for n in chosen for p in parameters(n)}
    assert diverse((IDS[0],), IDS[0]) == (IDS[0],)
    same = (f"{TEST}::test_k[a]", f"{TEST}::test_k[a]")
    assert diverse(same, same[0]) == (same[0],)  # nothing new: stop


# -- per check, per kernel ------------------------------------------------------------------


def poisoned(nodeid: str, *, line_fails: bool, other_fails: bool = True, reads: int = 3,
             taint: str = "full", poisoned: int = 2) -> TestOutcome:
    """A reach-mode outcome: two checks, the original failing one at LINE."""
    sites = (CheckSite(LINE, reads, taint if line_fails else "clean", 1, int(line_fails)),
             CheckSite(LINE + 1, 3, "full", 1, int(other_fails)))
    return TestOutcome(nodeid, "passed", "call", launch_count=2,
                       probe=Probe(2, poisoned, 6, "full", sites, reach=True))


def run(*outcomes: TestOutcome) -> RerunResult:
    return RerunResult(tuple(outcomes), returncode=0)


def test_a_test_sensitive_elsewhere_is_a_bypass_when_its_failed_check_passes_poisoned() -> None:
    """A loss computed with torch beside a gradient the kernel computes."""
    result = run(poisoned(IDS[0], line_fails=False))
    judgement = judge_poisoned(result, [IDS[0]], "nan", {IDS[0]: LINE})
    assert judgement.state == BYPASS
    assert f"the check that failed ({TEST}:{LINE}) passes" in judgement.summary
    assert judge_poisoned(result, [IDS[0]], "nan").state == SENSITIVE  # per test only: missed


def test_the_failed_check_failing_poisoned_is_sensitive() -> None:
    result = run(poisoned(IDS[0], line_fails=True, other_fails=False))
    assert judge_poisoned(result, [IDS[0]], "nan", {IDS[0]: LINE}).state == SENSITIVE


def test_a_failed_check_that_reads_no_tensor_is_not_held_against_the_candidate() -> None:
    """The original failed in a call (a wrapper's assert), not a value check."""
    result = run(poisoned(IDS[0], line_fails=False, reads=0))
    assert judge_poisoned(result, [IDS[0]], "nan", {IDS[0]: LINE}).state == SENSITIVE


def looped(outcomes: str) -> TestOutcome:
    """A reach-mode outcome: one check line run in a loop over three outputs."""
    site = CheckSite(LINE, 9, "full", len(outcomes), outcomes.count("F"), outcomes)
    return TestOutcome(IDS[0], "passed", "call", launch_count=2,
                       probe=Probe(2, 2, 9, "full", (site,), reach=True))


@pytest.mark.parametrize(("before", "reading", "poisoned", "state"), [
    # dx failed and read the kernel; poisoned, dx passes while dw, db fail: moved
    ("FPP", {0}, "PFF", BYPASS),
    ("FPP", {0}, "FFF", SENSITIVE),
    ("PFP", {1}, "FFP", SENSITIVE),
    # y failed, but the kernel's poison reached only the gradient runs: y passing now is
    # no evidence against a fix of another kernel
    ("FPP", frozenset(), "PFF", SENSITIVE),
    # which run read the kernel is not known: a doubt, never a refusal
    ("FPP", None, "PFF", DOUBT),
    ("", None, "PFF", SENSITIVE),  # not known on the original: the line failed, enough
    ("FP", {0}, "PFF", SENSITIVE),  # runs that do not line up: the line still fails
    ("FP", {0}, "PPP", DOUBT),  # ... and passes: which run did is not known
])
def test_a_check_in_a_loop_is_judged_run_by_run(before: str, reading: frozenset[int] | None,
                                                 poisoned: str, state: str) -> None:
    judgement = judge_kernel(run(looped(poisoned)), {IDS[0]: LINE}, BACKWARD, {IDS[0]: before},
                             {IDS[0]: None if reading is None else frozenset(reading)})
    assert judgement.state == state
    if state == DOUBT:
        assert "cannot be told" in judgement.summary


@pytest.mark.parametrize(("taints", "before", "runs"), [
    ("CFF", "FPP", frozenset()),  # the failed run read no poison: another kernel's check
    ("FCC", "FPP", frozenset({0})),
    ("", "FPP", None),  # read poison, runs not measured one by one
    ("", "F", frozenset({0})),  # one run: the line's taint is the run's
    ("FF", "FPP", None),  # not lining up
])
def test_the_runs_of_a_check_that_read_a_kernels_poison(taints: str, before: str,
                                                        runs: frozenset[int] | None) -> None:
    site = CheckSite(LINE, 9, "full", len(before), before.count("F"), before, taints)
    outcome = TestOutcome(IDS[0], "passed", "call", launch_count=2,
                          probe=Probe(2, 2, 9, "full", (site,), reach=True))
    assert poisoned_runs(run(outcome), IDS[0], LINE, before) == runs
    assert CheckSite.from_json(site.to_json()) == site  # carried from the child as is
    assert CheckSite.from_json(site.to_json()[:6]) == replace(site, taints="")


def test_with_only_the_attributed_kernel_poisoned_the_failed_check_must_fail() -> None:
    """A gradient computed with torch from the statistics the forward kernel saved."""
    cheat = judge_kernel(run(poisoned(IDS[0], line_fails=False)), {IDS[0]: LINE}, BACKWARD)
    assert cheat.state == BYPASS
    assert "does not depend on bwd_kernel" in cheat.summary and "fix bwd_kernel" in cheat.feedback
    honest = judge_kernel(run(poisoned(IDS[0], line_fails=True)), {IDS[0]: LINE}, BACKWARD)
    assert honest.state == SENSITIVE


# -- masks ----------------------------------------------------------------------------------


def printed(*launches: tuple[str, str, str]) -> RerunResult:
    probe = Probe(len(launches), fingerprints=tuple(Fingerprint(*f) for f in launches))
    return run(TestOutcome(IDS[0], "passed", "call", probe=probe))


@pytest.mark.parametrize(("candidate", "expected"), [
    (printed((FORWARD, "in1", "out1")), True),
    (printed((FORWARD, "in1", "out2")), False),  # the kernel writes something else now
    (printed((FORWARD, "in9", "out1")), None),  # other inputs: nothing to compare
    (printed((FORWARD, "in1", "out1"), (FORWARD, "in9", "out3")), None),
    (printed(), None),
])
def test_the_kernel_output_is_unchanged_only_when_same_inputs_give_same_outputs(
    candidate: RerunResult, expected: bool | None,
) -> None:
    original = printed((FORWARD, "in1", "out1"), (BACKWARD, "in2", "out2"))
    assert kernel_output_unchanged(original, candidate, IDS[0]) is expected


# -- the staged verifier ------------------------------------------------------------------------

Answer = Callable[[RerunSpec, bool], TestOutcome]


class Runner:
    """Answers every test of a rerun with ``answer(spec, on the original code)``; the
    answer may look at ``spec.nodeids`` as the test it is asked about (see :meth:`each`)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.specs: list[RerunSpec] = []

    def __call__(self, spec: RerunSpec) -> RerunResult:
        self.specs.append(spec)
        original = "ORIGINAL" in (spec.sandbox_root / "kernels" / "k.py").read_text()
        outcomes = tuple(replace(self.answer(replace(spec, nodeids=(n,)), original), nodeid=n)
                         for n in spec.nodeids)
        return RerunResult(outcomes, returncode=0)

    def steps(self) -> list[tuple[tuple[str, ...], str, tuple[str, ...], bool]]:
        return [(s.nodeids, s.probe.poison, s.probe.kernels, s.stop_early) for s in self.specs]


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text("ORIGINAL\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_k.py").write_text("def test_k():\n    pass\n")
    return Sandbox.create(tmp_path)


def group_of(root: Path, nodeids: tuple[str, ...] = IDS) -> BugGroup:
    test = str(root / TEST)
    frames = (Frame(test, LINE, "test_k", "assert_close(out, ref)"),)
    failures = tuple(Failure(n, test, ErrorInfo("AssertionError", "Tensor-likes are not close!",
                                                frames), "") for n in nodeids)
    return replace(make_group(root, *nodeids), failures=failures)


def verifier(sandbox: Sandbox, runner: Runner, **options: object) -> Verifier:
    setup = RerunSetup(sandbox.source, 10.0, DevicePlan(interpret=True))
    return Verifier(sandbox, setup, group_of(sandbox.source), Project(sandbox.source),
                    runner=runner, **options)  # type: ignore[arg-type]


def fixed(spec: RerunSpec, original: bool) -> TestOutcome:
    """An honest fix: poison of either kernel reaches the failed check."""
    if not spec.probe.poison:
        fingerprints = (Fingerprint(FORWARD, "x", "stats"),
                        Fingerprint(BACKWARD, "stats", "old-grad" if original else "grad"))
        return TestOutcome("", "failed" if original else "passed", "call", launch_count=2,
                           probe=Probe(2, fingerprints=fingerprints))
    return poisoned("", line_fails=True)


def verify(sandbox: Sandbox, runner: Runner, **options: object) -> tuple[Verdict, Verifier]:
    check = verifier(sandbox, runner, **options)
    with sandbox:
        check.baseline({"kernels/k.py": "ORIGINAL\n"})
        verdict = check({"kernels/k.py": "FIXED\n"})
    return verdict, check


def test_a_candidate_runs_the_representative_then_the_rest_then_a_few_poisoned(
    sandbox: Sandbox,
) -> None:
    runner = Runner(fixed)
    verdict, check = verify(sandbox, runner)
    assert verdict.ok, verdict
    rep = check.first
    rest = tuple(n for n in IDS if n != rep)
    reps = diverse(IDS, rep)
    steps = runner.steps()
    assert steps[:3] == [
        ((rep,), "", (), False),  # baseline: the representative only
        ((rep,), "", (), True), (rest, "", (), True),  # the candidate: first, then the rest
    ]
    assert sorted(steps[3:5]) == [  # attribution on the original code, each kernel at once
        ((rep,), "nan", (BACKWARD,), False), ((rep,), "nan", (FORWARD,), False)]
    assert sorted(steps[5:]) == sorted([  # the poisoned reruns, at the same time
        (reps, "nan", (), False), ((rep,), "nan", (BACKWARD,), False),
        (reps, "scramble", (), False)])
    assert [p.name for p in verdict.phases] == [
        "representative", "failing tests", "attribution (bwd_kernel)",
        "attribution (fwd_kernel)", "sensitivity (nan)", "sensitivity (nan, only bwd_kernel)",
        "sensitivity (scramble)"]
    assert all(spec.probe.reach for spec in runner.specs if spec.probe.poison)


def test_a_representative_that_still_fails_ends_the_verification(sandbox: Sandbox) -> None:
    runner = Runner(lambda spec, original: TestOutcome("", "failed", "call", launch_count=1))
    verdict, _ = verify(sandbox, runner)
    assert verdict.kind is VerdictKind.FAILING
    assert verdict.summary.startswith(f"1 of {len(IDS)} failing tests still fail "
                                      f"({len(IDS) - 1} not run")
    assert len(runner.specs) == 2 and [p.name for p in verdict.phases] == ["representative"]


def test_thorough_mode_runs_every_failing_test_at_every_step(sandbox: Sandbox) -> None:
    runner = Runner(fixed)
    verdict, _ = verify(sandbox, runner, mode="thorough")
    assert verdict.ok
    assert [spec.nodeids for spec in runner.specs if spec.probe.poison and not
            spec.probe.kernels] == [IDS, IDS]
    assert runner.specs[1].nodeids == IDS  # no representative stage


def test_a_gradient_from_the_forward_statistics_is_rejected_per_kernel(sandbox: Sandbox) -> None:
    def cheat(spec: RerunSpec, original: bool) -> TestOutcome:
        if spec.probe.kernels == (BACKWARD,) and not original:  # torch math ignores it
            return poisoned("", line_fails=False)
        return fixed(spec, original)

    verdict, _ = verify(sandbox, Runner(cheat))
    assert verdict.kind is VerdictKind.INSENSITIVE
    assert "does not depend on bwd_kernel" in verdict.summary
    (deciding,) = [p for p in verdict.phases if p.outcome == "insensitive"]
    assert deciding.name == "sensitivity (nan, only bwd_kernel)"


def two_outputs(taints: bool) -> Answer:
    """One check line in a loop over y (the forward kernel's) and dx (the backward's,
    computed from y); the forward kernel was wrong. ``taints``: whether the child told
    each run's poison apart."""

    def answer(spec: RerunSpec, original: bool) -> TestOutcome:
        prints = (Fingerprint(FORWARD, "x", "y0" if original else "y"),
                  Fingerprint(BACKWARD, "y0" if original else "y", "dx"))
        if not spec.probe.poison:
            ends = "FP" if original else "PP"
            if not spec.probe.reach:
                return TestOutcome("", "failed" if original else "passed", "call",
                                   launch_count=2, probe=Probe(2, fingerprints=prints))
            site = CheckSite(LINE, 2, "", 2, ends.count("F"), ends)
            return TestOutcome("", "passed", "call", launch_count=2,
                               probe=Probe(2, sites=(site,), reach=True, fingerprints=prints))
        y = not spec.probe.kernels or FORWARD in spec.probe.kernels
        dx = y or BACKWARD in spec.probe.kernels
        ends = ("F" if original or y else "P") + ("F" if dx else "P")
        told = ("F" if y else "C") + ("F" if dx else "C") if taints else ""
        site = CheckSite(LINE, 2, "full", 2, ends.count("F"), ends, told)
        return TestOutcome("", "passed", "call", launch_count=2,
                           probe=Probe(2, 2, 2, "full", (site,), reach=True))

    return answer


def test_a_forward_fix_checked_beside_a_gradient_at_one_line_is_accepted(
    sandbox: Sandbox,
) -> None:
    verdict, check = verify(sandbox, Runner(two_outputs(taints=True)))
    assert verdict.ok, verdict.summary
    assert check.attributed({}) == (FORWARD,)  # the run that failed read fwd's poison only
    assert "sensitivity (nan, only fwd_kernel)" in [p.name for p in verdict.phases]


def test_a_doubt_of_the_per_kernel_rule_is_noted_never_a_refusal(sandbox: Sandbox) -> None:
    verdict, check = verify(sandbox, Runner(two_outputs(taints=False)))
    assert check.attributed({}) == (BACKWARD,)  # last launched, its poison at the line
    assert verdict.ok, verdict.summary
    assert "not judged per kernel" in verdict.summary and "cannot be told" in verdict.summary


SLOW, JOINED = IDS[0], IDS[1]


def one_kernel_first(spec: RerunSpec, original: bool) -> TestOutcome:
    """:func:`fixed`, but the slow test launches the forward kernel only."""
    if spec.nodeids != (SLOW,) or spec.probe.poison:
        return fixed(spec, original)
    fingerprints = (Fingerprint(FORWARD, "x", "old-y" if original else "y"),)
    return TestOutcome("", "failed" if original else "passed", "call", launch_count=1,
                       probe=Probe(1, fingerprints=fingerprints))


def grown(sandbox: Sandbox, runner: Runner) -> tuple[Verdict, Verdict, Verifier]:
    """A bug healed while the tests run: its heal begins with the slow test alone, whose
    candidate is verified, then the faster test joins and the candidate is checked again."""
    whole = group_of(sandbox.source, (SLOW, JOINED))
    whole = replace(whole, failures=(replace(whole.failures[0], duration=1.0),
                                     replace(whole.failures[1], duration=0.1)))
    alone = replace(whole, failures=whole.failures[:1])
    check = Verifier(sandbox, RerunSetup(sandbox.source, 10.0, DevicePlan(interpret=True)),
                     alone, Project(sandbox.source), runner=runner)  # type: ignore[arg-type]
    with sandbox:
        check.baseline({"kernels/k.py": "ORIGINAL\n"})
        before = check({"kernels/k.py": "FIXED\n"})
        check.extend(whole, ())
        after = check({"kernels/k.py": "FIXED\n"})
    return before, after, check


def test_a_bug_that_grows_chooses_its_representative_again(sandbox: Sandbox) -> None:
    """The faster test that joined becomes the representative once it fails on the
    original code, and the kernels it launches are attributed: the per-kernel NaN phase
    runs, as it would have for the whole group."""
    runner = Runner(one_kernel_first)
    before, after, check = grown(sandbox, runner)
    assert before.ok and after.ok, (before, after)
    assert not any("only" in phase.name for phase in before.phases)
    assert check.first == JOINED
    assert [p.name for p in after.phases] == [
        "baseline (the grown bug's representative)", "representative", "failing tests",
        "attribution (bwd_kernel)", "attribution (fwd_kernel)", "sensitivity (nan)",
        "sensitivity (nan, only bwd_kernel)", "sensitivity (scramble)"]
    baseline = next(spec for spec in runner.specs if spec.nodeids == (JOINED,))
    assert baseline.probe == ProbePlan(fingerprint=True, reach=True)


def test_a_test_that_joins_and_passes_on_the_original_code_is_no_representative(
    sandbox: Sandbox,
) -> None:
    def flaky(spec: RerunSpec, original: bool) -> TestOutcome:
        if spec.nodeids == (JOINED,) and original and spec.probe.reach:
            return TestOutcome("", "passed", "call", launch_count=2)
        return one_kernel_first(spec, original)

    _, after, check = grown(sandbox, Runner(flaky))
    assert after.ok, after
    assert check.first == SLOW
    assert after.phases[0].name == "baseline (the grown bug's representative)"
    assert not any("only" in phase.name for phase in after.phases)

def test_a_test_that_expects_an_error_need_not_launch_once_fixed(sandbox: Sandbox) -> None:
    launch = KernelLaunch("fwd_kernel", str(sandbox.source / "kernels" / "k.py"), 1)
    group = group_of(sandbox.source)
    failures = [replace(f, launches=(launch,)) for f in group.failures]
    failures[0] = replace(failures[0], error=ErrorInfo("Failed", "DID NOT RAISE <class 'E'>"))
    setup = RerunSetup(sandbox.source, 10.0, DevicePlan(interpret=True))
    with sandbox:
        check = Verifier(sandbox, setup, replace(group, failures=tuple(failures)),
                         Project(sandbox.source), runner=Runner(fixed))
    assert check.launched == frozenset(IDS[1:])  # all but the one that expected an error


def test_a_regression_that_fails_on_the_original_code_too_is_none(sandbox: Sandbox) -> None:
    flaky = f"{TEST}::test_other"

    def answer(spec: RerunSpec, original: bool) -> TestOutcome:
        if spec.nodeids == (flaky,):
            return TestOutcome("", "failed", "call", launch_count=1)
        return fixed(spec, original)

    runner = Runner(answer)
    verdict, check = verify(sandbox, runner, regression=(flaky,))
    assert verdict.ok, verdict
    rest = tuple(n for n in IDS if n != check.first)
    assert [s.nodeids for s in runner.specs[:4]] == [  # baseline, representative, then
        (check.first,), (check.first,), (*rest, flaky), (flaky,)]  # the rest, the original
    names = [p.name for p in verdict.phases]
    assert names[1:3] == ["failing tests and regression", "regression on the original code"]


def test_a_real_regression_is_rejected(sandbox: Sandbox) -> None:
    other = f"{TEST}::test_other"

    def answer(spec: RerunSpec, original: bool) -> TestOutcome:
        if spec.nodeids == (other,):
            return TestOutcome("", "passed" if original else "failed", "call", launch_count=1)
        return fixed(spec, original)

    verdict, _ = verify(sandbox, Runner(answer), regression=(other,))
    assert verdict.kind is VerdictKind.REGRESSION


def test_an_unchanged_kernel_masked_after_the_launch_is_no_heal(sandbox: Sandbox) -> None:
    source = ("import torch\n\n@triton.jit\ndef k(x, y):\n    pass\n\n"
              "def op(x):\n    y = torch.empty_like(x)\n    k[(1,)](x, y)\n    return y\n")
    masked = source.replace("    return y\n", "    y = y.clip(min=0)\n    return y\n")
    (sandbox.source / "kernels" / "k.py").write_text("ORIGINAL\n" + source)

    def answer(spec: RerunSpec, original: bool) -> TestOutcome:
        probe = Probe(1, fingerprints=(Fingerprint(FORWARD, "x", "y"),))
        return TestOutcome("", "failed" if original else "passed", "call", launch_count=1,
                           probe=probe)

    runner = Runner(answer)
    check = verifier(sandbox, runner)
    with sandbox:
        check.baseline({"kernels/k.py": "ORIGINAL\n" + source})
        verdict = check({"kernels/k.py": "FIXED\n" + masked})
    assert verdict.kind is VerdictKind.MASKED
    assert "`y = y.clip(min=0)`" in verdict.summary and "measured" in verdict.summary
    assert not any(spec.probe.poison for spec in runner.specs)  # stopped before poisoning


def test_the_original_codes_runs_are_not_judged_for_writing_test_files(sandbox: Sandbox) -> None:
    """A suite whose tests write beside themselves does so on the original code too: the
    baseline is no candidate to reject (a candidate's run that writes them is)."""

    def writes(spec: RerunSpec, original: bool) -> TestOutcome:
        (spec.sandbox_root / TEST).write_text("def test_k():\n    assert False\n")
        return fixed(spec, original)

    check = verifier(sandbox, Runner(writes))
    with sandbox:
        result = check.baseline({"kernels/k.py": "ORIGINAL\n"})
        verdict = check({"kernels/k.py": "FIXED\n"})
    assert result.outcome(check.first) is not None
    assert verdict.kind is VerdictKind.TAMPERED
