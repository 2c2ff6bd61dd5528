"""One rerun split across several children: the split, the merge in test order, and real
split reruns (a crash, a timeout, a stopped child, progress) in both rerun modes."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rerun_helpers import MODES, alive, make_sandbox, spec_for

from pytest_kernelfix.rerun import runner, split
from pytest_kernelfix.rerun.report import (
    ChildReport,
    FinishedTests,
    GateResult,
    RerunResult,
    TestOutcome,
)
from pytest_kernelfix.rerun.runner import Reruns
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.rerun.split import (
    MIN_TESTS_PER_CHILD,
    Part,
    fair_shares,
    labelled_tails,
    merge_parts,
    min_tests_per_child,
    split_nodeids,
    stops_early,
)

# -- the split ----------------------------------------------------------------------------


def ids(count: int) -> tuple[str, ...]:
    return tuple(f"t.py::t{index}" for index in range(count))


@pytest.mark.parametrize(
    ("count", "jobs", "per_child", "sizes"),
    [
        (1, 4, 4, [1]),
        (2, 2, 1, [1, 1]),
        (2, 2, 4, [2]),  # too few to pay for a second child
        (7, 2, 4, [7]),
        (8, 2, 4, [4, 4]),
        (9, 2, 4, [5, 4]),
        (16, 3, 4, [6, 5, 5]),
        (16, 8, 4, [4, 4, 4, 4]),  # at least per_child each, so fewer children than jobs
        (16, 1, 4, [16]),
        (0, 2, 4, [0]),
    ],
)
def test_the_split_gives_each_child_enough_consecutive_tests(
    count: int, jobs: int, per_child: int, sizes: list[int]
) -> None:
    parts = split_nodeids(ids(count), jobs, per_child)
    assert [len(part) for part in parts] == sizes
    assert sum(parts, ()) == ids(count)


def test_a_fresh_interpreter_needs_many_more_tests_than_a_forked_child() -> None:
    forked, fresh = min_tests_per_child(fresh=False), min_tests_per_child(fresh=True)
    assert forked == MIN_TESTS_PER_CHILD and 3 <= forked < fresh
    assert len(split_nodeids(ids(2), 8, forked)) == 1  # 1-2 tests are never split
    assert len(split_nodeids(ids(2 * forked), 2, forked)) == 2
    assert len(split_nodeids(ids(2 * forked), 2, fresh)) == 1


@given(st.lists(st.sampled_from(ids(30)), max_size=60), st.integers(1, 9),
       st.integers(1, 6))
def test_every_test_runs_once_in_order_in_at_most_jobs_children(
    nodeids: list[str], jobs: int, per_child: int
) -> None:
    parts = split_nodeids(nodeids, jobs, per_child)
    assert sum(parts, ()) == tuple(dict.fromkeys(nodeids))
    assert 1 <= len(parts) <= jobs
    sizes = [len(part) for part in parts]
    assert max(sizes) - min(sizes) <= 1
    assert len(parts) == 1 or min(sizes) >= per_child


# -- the merge ----------------------------------------------------------------------------


def passed(nodeid: str) -> TestOutcome:
    return TestOutcome(nodeid, "passed", "call")


def failed(nodeid: str) -> TestOutcome:
    return TestOutcome(nodeid, "failed", "call", longrepr="AssertionError")


def gate(kernel: str) -> GateResult:
    return GateResult(kernel, f"/p/{kernel}.py", 1, True, "", 0, 0.1, False)


def test_a_crash_in_one_child_and_a_timeout_in_a_later_one_merge_in_test_order() -> None:
    crashed = RerunResult(
        (passed("a.py::t1"),), returncode=-11, signal="SIGSEGV", running="a.py::t2",
        output="Fatal Python error: Segmentation fault\n", seconds=1.0,
        collection_errors=("conftest.py: ImportError",), mode="fork",
        report=ChildReport(gate=(gate("ka"),)))
    hung = RerunResult(
        (passed("b.py::t1"),), returncode=-9, timed_out=True, running="b.py::t2",
        output="b child output\n", seconds=8.0,
        collection_errors=("conftest.py: ImportError", "b.py: SyntaxError"),
        mode="subprocess", fallback="the rerun server could not start",
        report=ChildReport(gate=(gate("kb"),)))
    merged = merge_parts([Part(("a.py::t1", "a.py::t2"), crashed),
                          Part(("b.py::t1", "b.py::t2"), hung)], seconds=8.5,
                         output_budget=4096)
    assert [o.nodeid for o in merged.outcomes] == ["a.py::t1", "b.py::t1"]
    # the crash comes first in test order: one child running all would have died there
    assert (merged.signal, merged.returncode, merged.running) == ("SIGSEGV", -11, "a.py::t2")
    assert not merged.timed_out
    assert "SIGSEGV" in merged.crash_reason and "a.py::t2" in merged.crash_reason
    assert merged.missing(["a.py::t2", "b.py::t1", "b.py::t2"]) == ("a.py::t2", "b.py::t2")
    assert merged.collection_errors == ("conftest.py: ImportError", "b.py: SyntaxError")
    assert [g.kernel for g in merged.report.gate_results] == ["ka", "kb"]
    assert merged.seconds == 8.5  # the wall time, not the sum
    assert (merged.mode, merged.fallback) == ("subprocess", "the rerun server could not start")
    assert "rerun child 1 of 2: 2 test(s) from a.py::t1; died with SIGSEGV" in merged.output
    assert "rerun child 2 of 2: 2 test(s) from b.py::t1; timed out" in merged.output
    assert "Segmentation fault" in merged.output and "b child output" in merged.output

    swapped = merge_parts([Part(("b.py::t1", "b.py::t2"), hung),
                           Part(("a.py::t1", "a.py::t2"), crashed)], seconds=8.5,
                          output_budget=4096)
    assert swapped.timed_out and swapped.running == "b.py::t2"
    assert swapped.crash_reason == ""  # a timeout is judged as a timeout


def test_a_stopped_child_keeps_what_it_finished_and_says_nothing_of_its_end() -> None:
    failing = RerunResult((failed("a.py::t1"),), returncode=1, mode="fork")
    stopped = RerunResult((passed("b.py::t1"),), returncode=-9, running="b.py::t2",
                          mode="fork")
    merged = merge_parts([Part(("a.py::t1", "a.py::t2"), failing),
                          Part(("b.py::t1", "b.py::t2"), stopped, stopped=True)],
                         seconds=2.0, output_budget=4096)
    assert [o.nodeid for o in merged.outcomes] == ["a.py::t1", "b.py::t1"]
    assert merged.returncode == 1 and merged.signal == "" and not merged.timed_out
    assert merged.running == "" and merged.crash_reason == ""
    assert merged.mode == "fork"
    assert "stopped: another child's test failed first" in merged.output


def test_one_child_is_its_own_result() -> None:
    result = RerunResult((passed("a.py::t1"),), returncode=0, output="plain", seconds=1.0)
    merged = merge_parts([Part(("a.py::t1",), result)], seconds=1.2, output_budget=10)
    assert merged == replace(result, seconds=1.2)


def test_each_childs_tail_is_kept_within_the_budget() -> None:
    assert fair_shares([10, 500, 300], 300) == [10, 145, 145]
    assert fair_shares([10, 20], 300) == [10, 20]
    assert sum(fair_shares([7, 900, 900, 900], 1000)) <= 1000
    parts = [Part(("a.py::t1",), RerunResult((), 0, output="x" * 5000 + "END-A")),
             Part(("b.py::t1",), RerunResult((), 0, output="short B"))]
    text = labelled_tails(parts, 1000)
    assert len(text) <= 1000
    assert text.index("END-A") < text.index("rerun child 2 of 2") < text.index("short B")


def test_what_stops_an_early_stopping_rerun() -> None:
    assert stops_early(RerunResult((passed("a"), failed("b")), 1))
    assert stops_early(RerunResult((TestOutcome("a", "error", "setup"),), 1))
    assert stops_early(RerunResult((), -6, signal="SIGABRT"))
    assert stops_early(RerunResult((), -9, timed_out=True))
    assert not stops_early(RerunResult((passed("a"), TestOutcome("b", "skipped", "setup"),
                                        TestOutcome("c", "xfailed", "call")), 0))


def test_finished_tests_are_counted_as_the_results_file_grows(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    counter = FinishedTests(results)
    assert counter.count() == 0  # not written yet
    with open(results, "w") as out:
        out.write('{"event": "start", "nodeid": "a"}\n{"event": "test", "nodeid": "a"}\n'
                  '{"event": "launch", "nodeid": "b"}\n{"event": "test", "nod')
    assert counter.count() == 1  # the line being written is not read yet
    with open(results, "a") as out:
        out.write('eid": "b"}\n{"event": "test", "nodeid": "b"}\n')
    assert counter.count() == 2  # each test once


# -- real split reruns --------------------------------------------------------------------

#: Two modules of six tests: jobs=2 runs each module in its own child. Every test writes
#: its name and process id; ``KFX_WAIT`` (``b1:a2,...``) makes a test wait until another
#: has started, ``KFX_CRASH`` / ``KFX_HANG`` / ``KFX_FAIL`` name a test that aborts /
#: sleeps for 300 s / fails.
SPLIT_TESTS = """
    import os
    import time
    from pathlib import Path

    NAME = __name__[-1]  # test_a: a

    def _ran(name):
        pids = Path(os.environ["KFX_PIDS"])
        with open(pids, "a") as out:
            out.write(f"{name} {os.getpid()}\\n")
        waits = dict(pair.split(":") for pair in os.environ.get("KFX_WAIT", "").split(",")
                     if pair)
        deadline = time.monotonic() + 30
        while name in waits and f"{waits[name]} " not in pids.read_text():
            assert time.monotonic() < deadline, f"{waits[name]} never ran beside {name}"
            time.sleep(0.02)
        if os.environ.get("KFX_CRASH") == name:
            os.abort()
        if os.environ.get("KFX_HANG") == name:
            time.sleep(300)
        if os.environ.get("KFX_FAIL") == name:
            raise AssertionError("still wrong")

    def test_1(): _ran(NAME + "1")
    def test_2(): _ran(NAME + "2")
    def test_3(): _ran(NAME + "3")
    def test_4(): _ran(NAME + "4")
    def test_5(): _ran(NAME + "5")
    def test_6(): _ran(NAME + "6")
"""

NODEIDS = tuple(f"test_{module}.py::test_{index}" for module in "ab" for index in range(1, 7))


def split_rerun(sandboxed: tuple[Path, list[Sandbox]], reruns: Reruns, pids: Path, mode: str,
                *, timeout: float = 60.0, stop_early: bool = False, **tests: str
                ) -> RerunResult:
    """A rerun of :data:`NODEIDS` with ``jobs=2``; ``tests`` sets the ``KFX_*`` variables
    (``crash="b3"``: test_b.py::test_3 aborts)."""
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {"test_a.py": SPLIT_TESTS, "test_b.py": SPLIT_TESTS})
    env = {"KFX_PIDS": str(pids), **{f"KFX_{key.upper()}": value for key, value in tests.items()}}
    spec = spec_for(sandbox, *NODEIDS, mode=mode, jobs=2, timeout=timeout, env=env)
    return reruns(replace(spec, stop_early=stop_early))


@pytest.fixture
def fresh_split_like_forked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh children split as forked ones do (else a subprocess-mode split takes 160
    tests): these tests are about what a split rerun reports, in both modes."""
    monkeypatch.setattr(split, "MIN_TESTS_PER_FRESH_CHILD", MIN_TESTS_PER_CHILD)


def ran(pids_file: Path) -> dict[str, int]:
    """Which process ran each test."""
    return {name: int(pid) for name, pid in
            (line.split() for line in pids_file.read_text().splitlines())}


@pytest.mark.parametrize("mode", MODES)
def test_two_children_run_at_the_same_time_and_a_crash_in_one_keeps_the_others_outcomes(
    sandboxed: tuple[Path, list[Sandbox]], tmp_path: Path, mode: str, reruns: Reruns,
    fresh_split_like_forked: None,
) -> None:
    pids = tmp_path / "pids"
    result = split_rerun(sandboxed, reruns, pids, mode, crash="b3", wait="a1:b1,b1:a1")

    assert result.mode == mode
    by_test = ran(pids)
    assert len({by_test["a1"], by_test["b1"]}) == 2  # two children, which met: concurrent
    assert {by_test[f"a{index}"] for index in range(1, 7)} == {by_test["a1"]}
    assert [o.nodeid for o in result.outcomes] == list(NODEIDS[:6] + NODEIDS[6:8])
    assert result.passed(NODEIDS[:8])
    assert result.signal == "SIGABRT" and not result.timed_out
    assert result.running == "test_b.py::test_3"
    assert "test_b.py::test_3" in result.crash_reason
    assert result.missing(NODEIDS) == NODEIDS[8:]
    assert "rerun child 1 of 2: 6 test(s) from test_a.py::test_1; exit status 0" in result.output
    assert "rerun child 2 of 2: 6 test(s) from test_b.py::test_1; died with SIGABRT" in (
        result.output)
    assert "Fatal Python error: Aborted" in result.output


@pytest.mark.parametrize("mode", MODES)
def test_a_child_that_hangs_times_out_alone(
    sandboxed: tuple[Path, list[Sandbox]], tmp_path: Path, mode: str, reruns: Reruns,
    fresh_split_like_forked: None,
) -> None:
    timeout = 20.0 if mode == "fork" else 45.0  # a fresh interpreter's start is long
    started = time.monotonic()
    result = split_rerun(sandboxed, reruns, tmp_path / "pids", mode, timeout=timeout, hang="a2")
    assert time.monotonic() - started < timeout + 30  # each child's own, at the same time
    assert result.timed_out and result.crash_reason == "" and result.signal == ""
    assert result.running == "test_a.py::test_2"
    assert result.passed((NODEIDS[0], *NODEIDS[6:]))  # the other child finished its tests
    assert result.missing(NODEIDS) == NODEIDS[1:6]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("mode", MODES)
def test_a_failing_test_stops_the_other_child_of_an_early_stopping_rerun(
    sandboxed: tuple[Path, list[Sandbox]], tmp_path: Path, mode: str, reruns: Reruns,
    fresh_split_like_forked: None,
) -> None:
    pids = tmp_path / "pids"
    started = time.monotonic()
    result = split_rerun(sandboxed, reruns, pids, mode, timeout=120.0, stop_early=True,
                         hang="a2", fail="b1", wait="b1:a2")
    assert time.monotonic() - started < 60  # not the hanging child's timeout
    assert result.mode == mode
    assert not result.timed_out and result.signal == "" and result.crash_reason == ""
    assert result.returncode == 1
    assert result.passed(NODEIDS[:1])  # what the stopped child finished is kept
    outcome = result.outcome("test_b.py::test_1")
    assert outcome is not None and outcome.outcome == "failed"
    assert result.missing(NODEIDS) == (*NODEIDS[1:6], *NODEIDS[7:])  # --exitfirst in b
    assert "stopped: another child's test failed first" in result.output
    hung = ran(pids)["a2"]
    deadline = time.monotonic() + 5
    while alive(hung) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(hung)


def test_progress_is_told_while_a_long_rerun_runs_and_never_for_a_short_one(
    sandboxed: tuple[Path, list[Sandbox]], tmp_path: Path, reruns: Reruns,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {"test_slow.py": """
        import time
        import pytest

        @pytest.mark.parametrize("n", range(12))
        def test_slow(n):
            time.sleep(0.25)
    """})
    nodeids = [f"test_slow.py::test_slow[{n}]" for n in range(12)]
    heard: list[tuple[int, int, float]] = []
    spec = replace(spec_for(sandbox, *nodeids, jobs=2),
                   progress=lambda *args: heard.append(args))
    with monkeypatch.context() as patched:
        patched.setattr(runner, "PROGRESS_EVERY", 0.5)
        result = reruns(spec)  # with the server's start when it is the first
    assert result.passed(nodeids) and len(heard) >= 2
    finished = [count for count, _, _ in heard]
    assert finished == sorted(finished) and 0 < finished[-1] <= 12
    assert {total for _, total, _ in heard} == {12}
    seconds = [elapsed for _, _, elapsed in heard]
    assert all(later - earlier >= 0.45 for earlier, later in itertools.pairwise(seconds))
    assert seconds[-1] <= result.seconds

    heard.clear()
    result = reruns(spec)
    assert result.passed(nodeids)
    assert heard == [] or result.seconds > runner.PROGRESS_EVERY  # none for a short one


def test_a_fresh_interpreter_runs_a_dozen_tests_alone(
    sandboxed: tuple[Path, list[Sandbox]], tmp_path: Path, reruns: Reruns,
) -> None:
    result = split_rerun(sandboxed, reruns, tmp_path / "pids", "subprocess")
    assert result.passed(NODEIDS) and result.mode == "subprocess"
    assert len(set(ran(tmp_path / "pids").values())) == 1
    assert "rerun child" not in result.output
