"""Delta debugging over the hunks of a change, with a runner that reads the sandbox: the
test passes when the culprit lines are back as they were at the base."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from pytest_kernelfix.locate.change import (
    NOT_REGRESSION,
    REGRESSION,
    TEST_CHANGED,
    Change,
    FileChange,
)
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun.launcher import RerunSetup, RerunSpec
from pytest_kernelfix.rerun.report import RerunResult, TestOutcome
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.verify.culprit import find_culprits, single_bound, trial_cap

TEST = "tests/test_m.py::test_m"
BASE = "".join(f"value_{i} = {i}\n" for i in range(1, 200))


def changed(count: int) -> str:
    """``count`` hunks, three unchanged lines apart."""
    rows = BASE.splitlines(keepends=True)
    for n in range(count):
        rows[4 * n] = rows[4 * n].replace(" = ", " = 1000 + ")
    return "".join(rows)


class FakeRunner:
    """A test passes when every line in its ``needed`` (``TEST``'s by default) of the
    sandbox's ``m.py`` is as at the base (and the test file as at the base, when
    ``test_line`` is given); a rerun stops at the first test that fails."""

    def __init__(self, needed: Sequence[int], test_line: str = "",
                 more: dict[str, Sequence[int]] | None = None,
                 broken: frozenset[str] | set[str] = frozenset()) -> None:
        self.needed = {TEST: needed, **(more or {})}
        self.broken = broken  # tests that fail whatever is reverted
        self.test_line = test_line
        self.calls: list[Path] = []

    def __call__(self, spec: RerunSpec) -> RerunResult:
        self.calls.append(spec.sandbox_root)
        rows = (spec.sandbox_root / "m.py").read_text().splitlines(keepends=True)
        base = BASE.splitlines(keepends=True)
        assert spec.stop_early
        outcomes = []
        for nodeid in spec.nodeids:
            ok = nodeid not in self.broken and all(rows[n] == base[n]
                                                   for n in self.needed[nodeid])
            if self.test_line:
                test = spec.sandbox_root / "tests" / "test_m.py"
                ok = ok and test.exists() and self.test_line in test.read_text()
            outcomes.append(TestOutcome(nodeid, "passed" if ok else "failed", "call"))
            if not ok:
                break
        return RerunResult(tuple(outcomes), 0)


@pytest.fixture
def project(tmp_path: Path) -> Callable[[int], tuple[Project, Change, Sandbox]]:
    made: list[Sandbox] = []

    def make(count: int, test: tuple[str, str] | None = None) -> tuple[Project, Change, Sandbox]:
        (tmp_path / "m.py").write_text(changed(count))
        (tmp_path / "tests").mkdir(exist_ok=True)
        files = [FileChange("m.py", BASE, changed(count))]
        if test is not None:
            (tmp_path / "tests" / "test_m.py").write_text(test[1])
            files.append(FileChange("tests/test_m.py", test[0], test[1], test=True))
        sandbox = Sandbox.create(tmp_path)
        made.append(sandbox)
        return Project(tmp_path), Change("main", tuple(files)), sandbox

    yield make  # type: ignore[misc]
    for sandbox in made:
        sandbox.close()


def run(project: Project, change: Change, sandbox: Sandbox, runner: FakeRunner,
        jobs: int = 1):  # type: ignore[no-untyped-def]
    spec = RerunSpec(RerunSetup(project.root, 10.0), sandbox.root, ())
    return find_culprits(change, TEST, sandbox, spec, runner=runner, project=project,
                         jobs=jobs, others=[n for n in runner.needed if n != TEST])


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8, 13, 17])
def test_a_single_culprit_is_found_within_the_bound(project, count: int) -> None:
    for culprit in {0, count // 2, count - 1}:
        root, change, sandbox = project(count)
        runner = FakeRunner([4 * culprit])
        regression = run(root, change, sandbox, runner)
        assert regression.verdict == REGRESSION and regression.minimal
        assert [h.start for h in regression.culprits] == [4 * culprit + 1]
        assert regression.reruns == len(runner.calls) <= single_bound(count)
        assert regression.trials[0].passed and len(regression.trials[0].reverted) == count
        assert (sandbox.root / "m.py").read_text() == changed(count)  # current bytes back


def test_two_hunks_that_only_revert_together_are_both_found(project) -> None:
    root, change, sandbox = project(16)
    runner = FakeRunner([4 * 2, 4 * 11])
    regression = run(root, change, sandbox, runner)
    assert [h.start for h in regression.culprits] == [9, 45] and regression.minimal
    assert regression.reruns <= trial_cap(16)


def test_the_cap_stops_a_search_with_a_culprit_set_that_still_passes(project) -> None:
    root, change, sandbox = project(16)
    runner = FakeRunner([4 * n for n in (0, 3, 6, 9, 12, 15)])
    regression = run(root, change, sandbox, runner)
    assert regression.reruns == trial_cap(16)
    assert regression.verdict == REGRESSION
    starts = {h.start for h in regression.culprits}
    assert {4 * n + 1 for n in (0, 3, 6, 9, 12, 15)} <= starts
    assert not regression.minimal or len(starts) == 6


def test_in_parallel_the_halves_run_in_two_sandboxes_and_the_extra_one_goes(project) -> None:
    root, change, sandbox = project(8)
    runner = FakeRunner([4 * 5])
    regression = run(root, change, sandbox, runner, jobs=2)
    assert [h.start for h in regression.culprits] == [21]
    assert regression.reruns <= single_bound(8)
    roots = set(runner.calls)
    assert len(roots) == 2 and sandbox.root in roots
    assert not any(path.exists() for path in roots - {sandbox.root})


def test_a_failure_the_base_has_too_is_not_a_regression(project) -> None:
    root, change, sandbox = project(4)
    runner = FakeRunner([], test_line="never there")
    regression = run(root, change, sandbox, runner)
    assert regression.verdict == NOT_REGRESSION and regression.reruns == 1
    assert "fails with every change" in regression.summary


def test_a_test_that_changed_is_named_and_never_reverted_to_find_a_culprit(project) -> None:
    root, change, sandbox = project(2, test=("assert f() == 1\n", "assert f() == 2\n"))
    runner = FakeRunner([], test_line="== 1")
    regression = run(root, change, sandbox, runner)
    assert regression.verdict == TEST_CHANGED and regression.reruns == 2
    assert [h.path for h in regression.culprits] == ["tests/test_m.py"]
    assert (sandbox.root / "tests" / "test_m.py").read_text() == "assert f() == 2\n"
    assert "the test changed since main" in regression.summary


def test_another_failing_test_gets_its_own_share_of_the_culprit(project) -> None:
    """The representative needs one hunk; another failing test needs a second one
    besides (a bug in two kernels); a third passes with the first; one that fails on the
    base too adds nothing."""
    root, change, sandbox = project(8)
    other, third = "tests/test_m.py::test_other", "tests/test_m.py::test_third"
    runner = FakeRunner([4 * 2], more={other: [4 * 2, 4 * 6], third: [4 * 2]})
    regression = run(root, change, sandbox, runner)
    assert [h.start for h in regression.culprits] == [9, 25] and regression.minimal
    assert set(regression.tests) == {other, third}
    assert "and 2 more failing tests pass" in regression.summary
    assert regression.reruns <= trial_cap(8)
    assert any(len(trial.tests) == 2 for trial in regression.trials)  # both rerun at once
    root, change, sandbox = project(8)
    never = "tests/test_m.py::test_never"
    runner = FakeRunner([4 * 2], more={never: [4 * 2]}, broken={never})
    regression = run(root, change, sandbox, runner)
    assert [h.start for h in regression.culprits] == [9] and regression.tests == ()
