"""A phased rerun child: one child collects once and runs a candidate's phases, each in
a process forked from its collected state, so no phase sees what another left behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rerun_helpers import make_sandbox, spec_for

from pytest_kernelfix.rerun.launcher import RerunSpec
from pytest_kernelfix.rerun.plan import ProbePlan
from pytest_kernelfix.rerun.runner import Reruns
from pytest_kernelfix.rerun.sandbox import Sandbox

CONFTEST = """
    import os

    import pytest


    @pytest.fixture(scope="session")
    def marks():
        with open(os.environ["KFX_MARKS"], "a") as out:
            out.write("setup\\n")
        yield
        with open(os.environ["KFX_MARKS"], "a") as out:
            out.write("teardown\\n")
"""

STATE = """
    import os

    from kernels import state


    def test_counts(marks):
        state.COUNT += 1
        os.environ["KFX_LEAKED"] = "1"
        assert state.COUNT == 1


    def test_sees_no_leak():
        assert "KFX_LEAKED" not in os.environ


    def test_fails():
        total = 1 + 1
        assert total == 3
        assert total == 2


    def test_passes():
        pass


    def test_slow():
        import time
        time.sleep(30)
"""


def phase(reruns_spec: RerunSpec, *nodeids: str, **changes: object) -> RerunSpec:
    return RerunSpec(reruns_spec.setup, reruns_spec.sandbox_root, tuple(nodeids),
                     **changes)  # type: ignore[arg-type]


def outcomes(result: object) -> list[tuple[str, str]]:
    return [(o.nodeid.rpartition("::")[2], o.outcome) for o in result.outcomes]  # type: ignore[attr-defined]


def test_each_phase_starts_from_the_collected_state_and_ends_its_fixtures(
    sandboxed: tuple[Path, list[Sandbox]], tmp_path: Path, reruns: Reruns,
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {
        "kernels/__init__.py": "", "kernels/state.py": "COUNT = 0\n",
        "tests/conftest.py": CONFTEST, "tests/test_state.py": STATE})
    marks = tmp_path / "marks"
    ids = [f"tests/test_state.py::{name}" for name in
           ("test_counts", "test_sees_no_leak", "test_fails", "test_passes", "test_slow")]
    base = spec_for(sandbox, *ids, mode="fork", jobs=2, env={"KFX_MARKS": str(marks)})
    child = reruns.open(base.setup, sandbox.root, ids)
    assert child is not None
    try:
        runs = [
            child.run(phase(base, ids[0]), "one"),
            child.run(phase(base, ids[0], ids[1]), "both"),  # within a phase: a plain run
            child.run(phase(base, ids[1]), "fresh"),  # nothing of the last phase is left
            child.run(phase(base, ids[0]), "again"),
            child.run(phase(base, ids[2], ids[3], stop_early=True), "stops"),
            child.run(phase(base, ids[2], probe=ProbePlan(reach=True)), "guarded"),
            child.run(phase(base, ids[2]), "plain again"),
            # split in two slices at once: the first fails, the slow one is stopped
            child.run(phase(base, ids[2], ids[3], ids[4], ids[4], stop_early=True), "split"),
        ]
        not_collected = child.run(phase(base, "tests/test_state.py::test_nowhere"))
    finally:
        child.close()
    one, both, fresh, again, stops, guarded, plain, split = runs  # type: ignore[misc]
    assert outcomes(one) == outcomes(again) == [("test_counts", "passed")]
    assert outcomes(both) == [("test_counts", "passed"), ("test_sees_no_leak", "failed")]
    assert outcomes(fresh) == [("test_sees_no_leak", "passed")]
    assert outcomes(stops) == [("test_fails", "failed")]  # test_passes never ran
    assert stops.missing([ids[3]]) == (ids[3],)
    # the guards are in the code of every phase, inert unless the phase probes reach
    assert outcomes(guarded) == [("test_fails", "passed")]
    probe = guarded.outcomes[0].probe
    assert probe is not None and probe.reach and probe.check_failed
    assert [(s.runs, s.failures) for s in probe.sites] == [(1, 1), (1, 0)]
    assert outcomes(plain) == [("test_fails", "failed")]
    one_shot = reruns(phase(base, ids[2]))
    assert plain.outcomes[0].error == one_shot.outcomes[0].error  # same frames and lines
    assert "assert 2 == 3" in plain.outcomes[0].longrepr
    assert outcomes(split) == [("test_fails", "failed")]
    assert not split.timed_out and not split.signal and split.seconds < 20
    assert marks.read_text().split() == ["setup", "teardown"] * 3  # each phase its own
    assert not_collected is None  # the caller runs it as a rerun of its own
    assert [r.started for r in runs] == [1, 0, 0, 0, 0, 0, 0, 0]
    assert {r.mode for r in runs} == {"fork"}


HANGS_AND_CRASHES = """
    import ctypes
    import time


    def test_hangs():
        time.sleep(300)


    def test_crashes():
        ctypes.string_at(0)


    def test_passes():
        pass
"""


def test_a_phase_that_hangs_or_crashes_ends_alone(
    sandboxed: tuple[Path, list[Sandbox]], reruns: Reruns,
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {"tests/test_bad.py": HANGS_AND_CRASHES})
    ids = [f"tests/test_bad.py::test_{name}" for name in ("hangs", "crashes", "passes")]
    # 30 s, not less: the limit covers the child's collection too (the warm phase below
    # waits for it), and on a loaded machine (load 7 on 2 cores) collection alone took 12 s
    base = spec_for(sandbox, *ids, mode="fork", timeout=30.0)
    child = reruns.open(base.setup, sandbox.root, ids)
    assert child is not None
    try:
        # a first phase that passes, so the child has collected before the hung phase's
        # limit starts
        warm = child.run(phase(base, ids[2]))
        assert warm is not None and warm.passed([ids[2]])
        hung = child.run(phase(base, ids[0]))
        crashed = child.run(phase(base, ids[1], ids[2]))
        passed = child.run(phase(base, ids[2]))
    finally:
        child.close()
    assert hung is not None and hung.timed_out and hung.running == ids[0]
    assert crashed is not None and crashed.signal == "SIGSEGV"
    assert "while running tests/test_bad.py::test_crashes" in crashed.crash_reason
    assert crashed.missing(ids[1:]) == (ids[1], ids[2])
    assert passed is not None and passed.passed([ids[2]])  # the child lived on


def test_where_phases_cannot_fork_each_is_a_rerun_of_its_own(
    sandboxed: tuple[Path, list[Sandbox]], reruns: Reruns,
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {
        "tests/test_ok.py": "def test_ok():\n    pass\n",
        "tests/test_broken.py": "import no_such_module_kfx\n\ndef test_a():\n    pass\n"})
    fresh = spec_for(sandbox, "tests/test_ok.py::test_ok", mode="subprocess")
    assert reruns.open(fresh.setup, sandbox.root, fresh.nodeids) is None
    ids = ("tests/test_ok.py::test_ok", "tests/test_broken.py::test_a")
    broken = spec_for(sandbox, *ids, mode="fork")
    child = reruns.open(broken.setup, sandbox.root, ids)
    assert child is not None
    try:  # a collection that reported errors: its phases are left to one-shot reruns
        assert child.run(phase(broken, ids[0])) is None
    finally:
        child.close()
    (sandbox.root / "tests" / "conftest.py").write_text(THREADED)
    child = reruns.open(broken.setup, sandbox.root, ids[:1])
    assert child is not None
    try:  # a thread at collection: the child runs one phase itself, then ends
        first = child.run(phase(broken, ids[0]))
        assert first is not None and first.passed([ids[0]]) and first.started == 1
        assert child.run(phase(broken, ids[0])) is None
    finally:
        child.close()


THREADED = """
import threading
import time

threading.Thread(target=time.sleep, args=(300,), daemon=True).start()
"""


@pytest.mark.parametrize("jobs", [1, 3])
def test_slices_of_a_phase_run_every_test_once_in_order(
    sandboxed: tuple[Path, list[Sandbox]], reruns: Reruns, jobs: int,
) -> None:
    root, sandboxes = sandboxed
    body = "".join(f"def test_{i}():\n    assert {i} != 4\n\n\n" for i in range(7))
    sandbox = make_sandbox(root, sandboxes, {"tests/test_many.py": body})
    ids = [f"tests/test_many.py::test_{i}" for i in range(7)]
    base = spec_for(sandbox, *ids, mode="fork", jobs=jobs)
    child = reruns.open(base.setup, sandbox.root, ids)
    assert child is not None
    try:
        result = child.run(phase(base, *ids))
    finally:
        child.close()
    assert result is not None
    assert [o.nodeid for o in result.outcomes] == ids
    assert [o.outcome for o in result.outcomes] == ["passed"] * 4 + ["failed"] + ["passed"] * 2
