"""One strict reader behind every from_json: exact types, nested types, the bad field named."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from pytest_kernelfix.capture.errors import ErrorInfo, Frame
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.capture.records import Failure, PassedTest, read_record
from pytest_kernelfix.fields import FieldError, read
from pytest_kernelfix.fixers.cache import CachedAnswer
from pytest_kernelfix.locate.green import GreenState, GreenStore
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun.plan import PhaseCommand, PhaseEnd, PlanError, Ready, SliceEnd
from pytest_kernelfix.rerun.report import (
    ChildReport,
    GateResult,
    ReportError,
    TestOutcome,
    fold_events,
)
from pytest_kernelfix.rerun.server.wire import ForkRequest, ForkResult, Started
from pytest_kernelfix.vocabulary import BugStatus


@dataclass(frozen=True)
class Site:
    line: int
    taint: str = ""


@dataclass(frozen=True)
class Record:
    count: int
    ok: bool
    name: str = ""
    seconds: float = 0.0
    status: BugStatus = BugStatus.HEALED
    outcome: Literal["passed", "failed"] = "passed"
    sites: tuple[Site, ...] = ()
    first: Site | None = None
    pair: tuple[str, int] = ("", 0)
    scalar: int | float | bool | str | None = None
    phases: dict[str, float] = field(default_factory=dict)


def test_a_record_is_read_by_its_annotations_all_the_way_down() -> None:
    data = {"count": 3, "ok": False, "name": "n", "seconds": 2, "status": "masked",
            "outcome": "failed", "sites": [{"line": 1, "taint": "full"}, [2]],
            "first": None, "pair": ["k", 4], "scalar": True, "phases": {"main": 1}}
    assert read(Record, json.loads(json.dumps(data))) == Record(
        3, False, "n", 2.0, BugStatus.MASKED, "failed", (Site(1, "full"), Site(2)), None,
        ("k", 4), True, {"main": 1.0})
    assert read(Record, {"count": 0, "ok": True}) == Record(0, True)  # the defaults


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"count": "3"}, "count: expected an integer, got '3'"),
        ({"count": True}, "count: expected an integer, got True"),
        ({"count": 3.5}, "count: expected an integer, got 3.5"),
        ({"ok": "false"}, "ok: expected true or false, got 'false'"),
        ({"ok": 0}, "ok: expected true or false, got 0"),
        ({"name": 7}, "name: expected a string, got 7"),
        ({"seconds": False}, "seconds: expected a number, got False"),
        ({"status": "bogus"}, "status: expected one of 'healed', 'masked', 'unhealed', "
                              "'declined', 'skipped', got 'bogus'"),
        ({"outcome": "bogus"}, "outcome: expected one of 'passed', 'failed', got 'bogus'"),
        ({"sites": [{"line": 1}, {"line": "2"}]}, "sites[1].line: expected an integer"),
        ({"sites": [{"line": 1, "colour": "red"}]}, "sites[0]: unknown keys: colour"),
        ({"sites": [[1, "full", "extra"]]}, "sites[0]: expected at most 2 items, got 3"),
        ({"sites": {"line": 1}}, "sites: expected a list"),
        ({"first": {"taint": "full"}}, "first.line: missing"),
        ({"first": "here"}, "first: expected a JSON object, got 'here'"),
        ({"pair": ["k"]}, "pair: expected 2 items, got 1"),
        ({"pair": ["k", "4"]}, "pair[1]: expected an integer"),
        ({"scalar": [1]}, "scalar: expected an integer, a number, true or false, a string or "
                          "null, got [1]"),
        ({"phases": {"main": "1"}}, "phases['main']: expected a number"),
        ({"extra": 1, "more": 2}, "unknown keys: extra, more"),
    ],
)
def test_a_value_of_another_type_is_refused_with_its_path(change: dict[str, Any],
                                                           problem: str) -> None:
    with pytest.raises(FieldError) as refused:
        read(Record, {"count": 1, "ok": True, **change})
    assert str(refused.value).startswith(problem)


def test_what_is_missing_or_not_an_object_is_refused() -> None:
    with pytest.raises(FieldError, match=r"^ok: missing$"):
        read(Record, {"count": 1})
    with pytest.raises(FieldError, match=r"^expected a JSON object, got None$"):
        read(Record, None)
    with pytest.raises(FieldError, match=r"^name: missing$"):  # complete: defaults too
        read(Record, {"count": 1, "ok": True}, complete=True)
    assert read(Record, {"event": "x", "count": 1, "ok": True}, ignore=("event",)) == Record(
        1, True)


@dataclass(frozen=True)
class Checked:
    size: int

    def __post_init__(self) -> None:
        if self.size < 0:
            raise ValueError("a size is never negative")


@dataclass(frozen=True)
class Outer:
    inner: Checked


def test_a_dataclasss_own_check_is_a_field_error_at_its_path() -> None:
    with pytest.raises(FieldError, match=r"^inner: a size is never negative$"):
        read(Outer, {"inner": {"size": -1}})


# -- the package's records ----------------------------------------------------------------

def outcome_event(**change: Any) -> dict[str, Any]:
    return {"event": "test", **TestOutcome("t.py::a", "passed", "call").to_json(), **change}


def test_a_nested_outcome_that_names_no_outcome_is_the_reruns_error() -> None:
    folded = fold_events([outcome_event(outcome="bogus"),
                          {"event": "test", **TestOutcome("t.py::b", "passed", "call").to_json()}])
    assert [o.nodeid for o in folded.tests] == ["t.py::b"]  # the other test stands
    assert folded.report_error == ("the test event of t.py::a is malformed: outcome: expected "
                                   "one of 'passed', 'failed', 'error', 'skipped', 'xfailed', "
                                   "'xpassed', got 'bogus'")


def test_a_malformed_event_is_the_reruns_error_never_a_key_error() -> None:
    event = outcome_event()
    del event["outcome"]
    assert fold_events([event]).report_error == (
        "the test event of t.py::a is malformed: outcome: missing")
    launch = KernelLaunch("k", "/p/k.py", 3).to_json()
    folded = fold_events([{"event": "start", "nodeid": "t.py::a"},
                          {"event": "launch", "nodeid": "t.py::a", "launch": {**launch,
                                                                               "line": "3"}}])
    assert folded.running == "t.py::a" and folded.running_launches == ()
    assert folded.report_error == "a launch event of t.py::a is malformed: line: expected an " \
                                  "integer, got '3'"
    nested = outcome_event(error={"type": "E", "message": "m",
                                  "frames": [{"path": "/p", "lineno": "9", "name": "f"}]})
    assert "error.frames[0].lineno: expected an integer" in fold_events([nested]).report_error


def test_a_gate_verdict_of_false_written_as_a_string_is_refused() -> None:
    gate = GateResult("k", "/x/k.py", 3, False, "boom", 1024, 0.25, True)
    assert GateResult.from_json(json.loads(json.dumps(gate.to_json()))) == gate
    with pytest.raises(FieldError, match=r"^ok: expected true or false, got 'false'$"):
        GateResult.from_json({**gate.to_json(), "ok": "false"})
    report = ChildReport(gate=(gate,)).to_json()
    report["gate"] = [{**gate.to_json(), "ok": "false"}]
    with pytest.raises(ReportError, match=r"malformed: gate\[0\]\.ok: expected true or false"):
        ChildReport.from_json(report)


def test_a_capture_record_carried_over_xdist_is_read_strictly() -> None:
    error = ErrorInfo("AssertionError", "boom", (Frame("/p/t.py", 3, "test_a", "assert x"),))
    launch = KernelLaunch("k", "/p/k.py", 4, (("x", "*fp32"),), (("BLOCK", 64),),
                          sites=(("/p/ops.py", 9, "run"),))
    record = {"kernel": True, "test_path": "/p/t.py", "launches": [launch.to_json()],
              "error": error.to_json(), "hashes": [["/p/k.py", "ab"]]}
    assert read_record("t.py::a", record, "long") == Failure(
        "t.py::a", "/p/t.py", error, "long", (launch,), (("/p/k.py", "ab"),), marked=True)
    assert read_record("t.py::a", {**record, "error": None}, "") == PassedTest("t.py::a",
                                                                              (launch,))
    with pytest.raises(FieldError, match=r"^kernel: expected true or false, got 'yes'$"):
        read_record("t.py::a", {**record, "kernel": "yes"}, "")
    with pytest.raises(FieldError, match=r"^launches\[0\]\.sites\[0\]\[1\]: expected an int"):
        read_record("t.py::a", {**record, "launches": [
            {**launch.to_json(), "sites": [["/p/ops.py", "9", "run"]]}]}, "")


def test_a_phased_childs_events_are_typed() -> None:
    assert Ready.from_json({"event": "ready", "nodeids": ["a", "b"], "fork": False,
                            "why": "threads"}) == Ready(("a", "b"), False, "threads")
    assert PhaseEnd.from_json({"event": "phase_end", "index": 2, "slices": [
        {"returncode": 0, "timed_out": False, "stopped": False},
        {"returncode": -9, "timed_out": True, "stopped": False}]}) == PhaseEnd(
        2, (SliceEnd(0), SliceEnd(-9, timed_out=True)))
    with pytest.raises(FieldError, match=r"^fork: expected true or false, got 'no'$"):
        Ready.from_json({"event": "ready", "nodeids": [], "fork": "no"})
    with pytest.raises(FieldError, match=r"^slices\[0\]\.returncode: missing$"):
        PhaseEnd.from_json({"event": "phase_end", "index": 2, "slices": [{"stopped": True}]})
    command = PhaseCommand(1, "failing tests", (("a",),)).to_json()
    with pytest.raises(PlanError, match=r"malformed: slices\[0\]\[0\]: expected a string"):
        PhaseCommand.from_json({**command, "slices": [[1]]})
    with pytest.raises(PlanError, match=r"malformed: probe\.poison: expected a string"):
        PhaseCommand.from_json({**command, "probe": {**command["probe"], "poison": None}})


def test_a_cached_answer_of_another_shape_is_a_miss() -> None:
    answer = CachedAnswer("raw", "openai/m", 1, 2, 0.5)
    assert CachedAnswer.from_json(json.loads(json.dumps(answer.to_json()))) == answer
    for change in ({"usage": {"prompt_tokens": "1"}}, {"cost": "free"}, {"response": 3},
                   {"usage": None}, {"extra": 1}):
        assert CachedAnswer.from_json({**answer.to_json(), **change}) is None


def test_a_fork_request_and_the_servers_answers_are_typed() -> None:
    request = ForkRequest(("-c", "pass"), "/p", "/p/log", 10.0, {"A": "1"}, nice=5)
    assert read(ForkRequest, json.loads(json.dumps(asdict(request)))) == request
    with pytest.raises(FieldError, match=r"^env\['A'\]: expected a string, got 1$"):
        read(ForkRequest, {**asdict(request), "env": {"A": 1}})
    assert read(Started, {"event": "started", "pid": 7}, ignore=("event",)) == Started(7)
    with pytest.raises(FieldError, match=r"^timed_out: expected true or false"):
        read(ForkResult, {"event": "exited", "returncode": 0, "timed_out": "no"},
             ignore=("event",))


def test_a_last_green_record_of_another_shape_is_no_record(tmp_path: Path) -> None:
    (tmp_path / "k.py").write_text("v = 0\n")
    project = Project(tmp_path)
    store = GreenStore(tmp_path / "green")
    store.record(project, ["t.py::test_k"], now=1.0)
    assert store.state("t.py::test_k") is not None
    index = store.folder / "index.json"
    data = json.loads(index.read_text())
    for broken in ({**data, "states": {"x": {"time": "yesterday", "files": {}}}},
                   {**data, "tests": ["t.py::test_k"]}, [data]):
        index.write_text(json.dumps(broken))
        assert store.state("t.py::test_k") is None and not store.differs(project)
    store.record(project, ["t.py::test_k"], now=2.0)  # written anew
    assert store.state("t.py::test_k") == GreenState(
        data["tests"]["t.py::test_k"], 2.0, data["states"][data["tests"]["t.py::test_k"]][
            "files"])
