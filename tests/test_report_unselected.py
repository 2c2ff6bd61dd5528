"""Failing tests kernelfix_select left out: counted with the reason, and how to select them."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import jsonschema
from factories import make_bug_report

from pytest_kernelfix.capture.records import Unselected
from pytest_kernelfix.heal.outcomes import UNHEALED
from pytest_kernelfix.report.json_report import session_json
from pytest_kernelfix.report.markdown_report import session_markdown
from pytest_kernelfix.report.model import SessionReport
from pytest_kernelfix.report.terminal import summary_lines
from pytest_kernelfix.report.unselected import select_hint, unselected_lines

SCHEMA = json.loads(resources.files("pytest_kernelfix").joinpath("report.schema.json")
                    .read_text())
LEFT_OUT = (
    Unselected("tests/test_ops.py::test_gelu[1]", "not marked kernel", launched=True),
    Unselected("tests/test_ops.py::test_gelu[2]", "not marked kernel", launched=True),
    Unselected("tests/test_io.py::test_load", "not marked kernel"),
)


def test_the_summary_counts_them_with_the_reason_and_a_way_to_select_them() -> None:
    assert unselected_lines(LEFT_OUT, ("kernel",)) == [
        "3 failing test(s) not selected for healing (not marked kernel; kernelfix_select = "
        "kernel), first tests/test_ops.py::test_gelu[1]",
        "  to heal them: --kernelfix-select kernel,launched (or kernelfix_select = "
        "kernel,launched in the ini file; 2 of them reached a Triton kernel of the project), "
        "a nodeid glob, as in --kernelfix-select "
        "'kernel,tests/test_ops.py::*' or @pytest.mark.kernel on the tests",
    ]
    assert unselected_lines((), ("kernel",)) == []


def test_the_hint_offers_only_what_would_select_them() -> None:
    mixed = (Unselected("a.py::t", "launched no project kernel and matched no glob"),
             Unselected("b.py::t", "not marked kernel"))
    # nothing launched a project kernel: "launched" would not help; no marker rule chosen
    assert select_hint(mixed[:1], ("launched", "ops/*")) == (
        "a nodeid glob, as in --kernelfix-select 'launched,ops/*,a.py::*'")
    assert unselected_lines(mixed, ("kernel",))[0].startswith(
        "2 failing test(s) not selected for healing (1 launched no project kernel and "
        "matched no glob; 1 not marked kernel; kernelfix_select = kernel)")


def test_report_json_and_markdown_carry_them(tmp_path: Path) -> None:
    bug = make_bug_report(tmp_path, "k1", "a\n", "a\n", UNHEALED)
    report = SessionReport((bug,), tmp_path, tmp_path / ".kernelfix", "report", "interpret",
                           "recipes", 1.0, unselected=LEFT_OUT, select=("kernel",))
    data = session_json(report)
    jsonschema.validate(data, SCHEMA)
    assert data["unselected"] == {
        "count": 3,
        "reasons": {"not marked kernel": 3},
        "launched_project_kernel": 2,
        "nodeids": [u.nodeid for u in LEFT_OUT],
        "select": ["kernel"],
        "hint": select_hint(LEFT_OUT, ("kernel",)),
    }
    markdown = session_markdown(report)
    assert ("Not selected for healing: 3 failing test(s) not selected for healing (not marked "
            "kernel; `kernelfix_select = kernel`), first `tests/test_ops.py::test_gelu[1]`. "
            "To heal them: `--kernelfix-select kernel,launched` (or `kernelfix_select = "
            "kernel,launched` in the ini file; 2 of them") in markdown
    assert "Nothing was healed" not in markdown  # a bug was selected
    alone = session_markdown(SessionReport((), tmp_path, tmp_path / ".kernelfix", "report",
                                           "interpret", "recipes", 1.0, unselected=LEFT_OUT))
    assert ("**Nothing was healed: no failing test was selected for healing.** Not selected "
            "for healing: 3 failing test(s)") in alone
    lines = summary_lines(report, None)
    assert lines[1:3] == unselected_lines(LEFT_OUT, ("kernel",))  # after the bug's line
    nothing_left_out = session_json(SessionReport((bug,), tmp_path, tmp_path, "report",
                                                  "interpret", "recipes", 1.0))
    jsonschema.validate(nothing_left_out, SCHEMA)
    assert nothing_left_out["unselected"]["count"] == 0
    assert nothing_left_out["unselected"]["hint"] is None
    assert "Not selected" not in session_markdown(SessionReport(
        (bug,), tmp_path, tmp_path, "report", "interpret", "recipes", 1.0))
