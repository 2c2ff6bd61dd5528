"""Which failures are healed (kernelfix_select), and tests that crashed their worker.

Unit level: the selection rules, the option's parsing, faulthandler dumps, the rerun's
launch events, and a crashed test rerun alone with a fake runner. The whole sessions
(xdist crash, an unmarked suite) are in test_locate_reach_sessions.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kernelfix.capture.errors import Frame, crash_dump
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.capture.records import (
    Failure,
    Selection,
    crash_failure,
    launched_project_kernel,
    reached_project_kernel,
)
from pytest_kernelfix.config import parse_select
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun.launcher import RerunSetup, RerunSpec
from pytest_kernelfix.rerun.plan import DevicePlan
from pytest_kernelfix.rerun.report import RerunResult, TestOutcome, read_child_output
from pytest_kernelfix.session.crashes import reproduce_crashes


def test_the_option_reads_words_and_globs_and_refuses_typos() -> None:
    assert parse_select("kernel") == ("kernel",)
    assert parse_select("") == ("kernel",)
    assert parse_select("launched, tests/ops/*  kernel") == ("launched", "tests/ops/*", "kernel")
    with pytest.raises(pytest.UsageError, match=r"'lauched'.*kernel, launched or a nodeid glob"):
        parse_select("lauched")


def test_each_rule_selects_its_failures(tmp_path: Path) -> None:
    project = Project(tmp_path)
    ours = KernelLaunch("k", str(tmp_path / "kernels" / "k.py"), 1)
    installed = KernelLaunch("k", str(tmp_path / ".venv/lib/site-packages/lib/k.py"), 1)
    elsewhere = KernelLaunch("k", "/usr/lib/python3/site-packages/lib/k.py", 1)
    marker = Selection.of(parse_select("kernel"))
    assert marker.selects("t.py::a", True, (), project)
    assert not marker.selects("t.py::a", False, (ours,), project)
    launched = Selection.of(parse_select("launched"))
    assert launched.selects("t.py::a", False, (ours,), project)
    assert not launched.selects("t.py::a", False, (installed, elsewhere), project)
    assert not launched.selects("t.py::a", True, (), project)
    globs = Selection.of(parse_select("tests/ops/*::test_swiglu*"))
    assert globs.selects("tests/ops/test_a.py::test_swiglu[1]", False, (), project)
    assert not globs.selects("tests/ops/test_a.py::test_geglu", False, (), project)
    # a crashed test has recorded nothing: "launched" keeps it until its rerun says more
    assert launched.may_select_crash("t.py::a", marked=False)
    assert not marker.may_select_crash("t.py::a", marked=False)
    assert marker.may_select_crash("t.py::a", marked=True)


def test_an_unselected_failure_says_which_chosen_rules_it_fails(tmp_path: Path) -> None:
    project = Project(tmp_path)
    ours = KernelLaunch("k", str(tmp_path / "kernels" / "k.py"), 1)

    def why(select: str, marked: bool = False, launches: tuple[KernelLaunch, ...] = ()) -> str:
        return Selection.of(parse_select(select)).why_not("t.py::a", marked, launches, project)

    assert why("kernel") == "not marked kernel"
    assert why("kernel", launches=(ours,)) == "not marked kernel"
    assert why("launched") == "launched no project kernel"
    assert why("tests/ops/*") == "matched no glob"
    assert why("kernel,launched,tests/ops/*") == (
        "not marked kernel and launched no project kernel and matched no glob")
    assert why("kernel", marked=True) == why("launched", launches=(ours,)) == why("t.py::*") == ""
    assert launched_project_kernel((ours,), project)
    assert not launched_project_kernel(
        (KernelLaunch("k", "/usr/lib/python3/site-packages/lib/k.py", 1),), project)



def test_launched_selects_a_failure_raised_on_the_way_to_a_project_kernel(
        tmp_path: Path) -> None:
    """A launch-sizing helper that raises before any launch (liger's calculate_settings
    with its block cap broken) fails every kernel test that calls it, and no launch is
    recorded: ``launched`` takes such a test when the error was raised in a project module
    that defines a Triton kernel, not when it was raised in the test or a plain helper."""
    (tmp_path / "ops").mkdir()
    utils = tmp_path / "ops" / "utils.py"
    utils.write_text("import triton\n\ndef settings(n):\n    raise RuntimeError(n)\n\n\n"
                     "@triton.jit\ndef element_mul_kernel(x):\n    pass\n")
    plain = tmp_path / "ops" / "plain.py"
    plain.write_text("def helper(n):\n    raise RuntimeError(n)\n")
    test = tmp_path / "tests" / "test_ops.py"
    test.parent.mkdir()
    test.write_text("import triton\n\n@triton.jit\ndef inline_kernel(x):\n    pass\n")
    project = Project(tmp_path)
    in_test = Frame(str(test), 3, "test_softmax")
    launched = Selection.of(parse_select("launched"))
    raised = (in_test, Frame(str(utils), 4, "settings"))
    assert launched.selects("t.py::a", False, (), project, raised)
    assert reached_project_kernel((), raised, project)
    for frames in ((in_test,), (in_test, Frame(str(plain), 2, "helper"))):
        assert not launched.selects("t.py::a", False, (), project, frames)
        assert launched.why_not("t.py::a", False, (), project, frames) == (
            "launched no project kernel")
    marker = Selection.of(parse_select("kernel"))
    assert not marker.selects("t.py::a", False, (), project, (Frame(str(utils), 4, "s"),))


DUMP = """\
collected 1 item

tests/test_ops.py Fatal Python error: Segmentation fault

Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 320 in wait

Current thread 0x00007f0000000000 (most recent call first):
  File "/venv/site-packages/triton/runtime/interpreter.py", line 700 in store
  File "/proj/kernels/ops.py", line 13 in scale_kernel
  File "/proj/kernels/ops.py", line 19 in scale
  File "/proj/tests/test_ops.py", line 8 in test_scale

Extension modules: numpy.core._multiarray_umath, torch._C (total: 2)
"""


def test_a_faulthandler_dump_gives_the_crashing_thread_outermost_first() -> None:
    text, frames = crash_dump(DUMP)
    assert [(f.path, f.lineno, f.name) for f in frames] == [
        ("/proj/tests/test_ops.py", 8, "test_scale"), ("/proj/kernels/ops.py", 19, "scale"),
        ("/proj/kernels/ops.py", 13, "scale_kernel"),
        ("/venv/site-packages/triton/runtime/interpreter.py", 700, "store")]
    assert text.startswith("Fatal Python error: Segmentation fault")
    assert "threading.py" not in text and "Extension modules" not in text
    assert crash_dump("no crash here") == ("", ())


def test_launches_written_before_a_crash_are_read_back(tmp_path: Path) -> None:
    launch = KernelLaunch("k", "/proj/k.py", 3, sites=(("/proj/w.py", 9, "wrap"),))
    lines = [{"event": "start", "nodeid": "t::a"},
             {"event": "launch", "nodeid": "t::a", "launch": launch.to_json()}]
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + '\n{"event": "te')
    data = read_child_output(path)
    assert data.running == "t::a"
    (read,) = data.running_launches
    assert read == launch and read.sites == launch.sites


def test_a_crashed_test_is_rerun_alone_and_healed_from_what_the_rerun_saw(
    tmp_path: Path,
) -> None:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "ops.py").write_text("def scale_kernel():\n    pass\n")
    kernel = KernelLaunch("scale_kernel", str(tmp_path / "kernels" / "ops.py"), 1)
    specs: list[RerunSpec] = []

    def runner(spec: RerunSpec) -> RerunResult:
        specs.append(spec)
        return RerunResult((), returncode=-11, signal="SIGSEGV", running=spec.nodeids[0],
                           output=DUMP.replace("/proj", str(tmp_path)),
                           running_launches=(kernel,))

    crashed = crash_failure("tests/test_ops.py::test_scale", tmp_path,
                            "worker 'gw0' crashed while running 'tests/test_ops.py::test_scale'",
                            marked=True)
    unmarked = crash_failure("tests/test_ops.py::test_other", tmp_path, "crashed",
                             marked=False)
    plain = Failure("t::plain", "t.py", crashed.error, "log")
    setup = RerunSetup(tmp_path, 10.0, DevicePlan(interpret=True))
    failures, notes = reproduce_crashes((plain, crashed, unmarked), setup, tmp_path, runner,
                                        Project(tmp_path), Selection.of(("kernel",)))
    assert [spec.nodeids for spec in specs] == [(crashed.nodeid,), (unmarked.nodeid,)]
    assert [f.nodeid for f in failures] == ["t::plain", crashed.nodeid]
    seen = failures[1]
    assert seen.error.type == "SIGSEGV" and "mask every load and store" in seen.error.message
    assert "while running" not in seen.error.message  # one bug for every parametrization
    assert seen.launches == (kernel,)
    assert (str(tmp_path / "kernels" / "ops.py"), 13, "scale_kernel") in [
        (f.path, f.lineno, f.name) for f in seen.error.frames]
    assert "crashed again" in seen.longrepr and "Fatal Python error" in seen.longrepr
    assert dict(seen.hashes)[str(tmp_path / "kernels" / "ops.py")]
    assert notes == ("tests/test_ops.py::test_other crashed its xdist worker but "
                     "kernelfix_select leaves it out (not marked kernel; it launched 1 project "
                     "kernel(s) when rerun alone)",)


def test_a_crash_that_does_not_come_back_is_kept_with_a_note(tmp_path: Path) -> None:
    def runner(spec: RerunSpec) -> RerunResult:
        return RerunResult((TestOutcome(spec.nodeids[0], "passed", "call"),), returncode=0)

    crashed = crash_failure("t.py::a", tmp_path, "crashed", marked=True)
    failures, notes = reproduce_crashes((crashed,), RerunSetup(tmp_path, 1.0), tmp_path,
                                        runner, Project(tmp_path), Selection.of(("kernel",)))
    assert failures == (crashed,)
    assert notes == ("t.py::a crashed its xdist worker but passed when rerun alone in the "
                     "sandbox",)
