"""What the reviewer is told about a regression: report.json (against its schema),
report.md, the terminal summary, the patch header and the GitHub annotation on the
culprit line of the change; a patch that only reverts the change says so."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources
from pathlib import Path

import jsonschema
from factories import make_bug_report

from pytest_kernelfix.heal.outcomes import DECLINED, HEALED, UNHEALED, RoundRecord
from pytest_kernelfix.locate.change import (
    NOT_REGRESSION,
    REGRESSION,
    TEST_CHANGED,
    Hunk,
    Regression,
    Trial,
)
from pytest_kernelfix.report.github import annotation
from pytest_kernelfix.report.json_report import session_json
from pytest_kernelfix.report.markdown_report import session_markdown
from pytest_kernelfix.report.model import SessionReport
from pytest_kernelfix.report.patches import patch_text
from pytest_kernelfix.report.terminal import summary_lines

SCHEMA = json.loads(resources.files("pytest_kernelfix").joinpath("report.schema.json")
                    .read_text())
ORIGINAL = "import triton\n\n\ndef k(x):\n    y = x + 1\n    return y\n"
FINAL = ORIGINAL.replace("x + 1", "x * 2")
CULPRIT = Hunk("kernels/k.py", 5, 5, 5, 5, ("    y = x + 1",), ("    y = x * 2",))
TRIALS = (Trial(("kernels/k.py:5", "kernels/util.py:3"), True, 1.5, "passed"),
          Trial(("kernels/k.py:5",), True, 1.2, "passed"))


def regression(verdict: str = REGRESSION, culprits: tuple[Hunk, ...] = (CULPRIT,)
               ) -> Regression:
    return Regression("origin/main (merge base 1a2b3c4d5e)", verdict, "tests/test_k.py::test_k",
                      culprits, TRIALS, 2)


def session(root: Path, status: str, found: Regression | None, revert: bool = False
            ) -> SessionReport:
    bug = make_bug_report(root, "k", ORIGINAL, FINAL, status)
    bug = replace(bug, result=replace(bug.result, regression=found, revert=revert,
                                      rounds=(RoundRecord(1, "model", (), "healed"),)))
    return SessionReport((bug,), root, root / ".kernelfix", "report", "interpret", "m", 1.0)


def test_a_healed_regression_reads_as_one_in_every_output(tmp_path: Path) -> None:
    report = session(tmp_path, HEALED, regression(), revert=True)
    data = session_json(report)
    jsonschema.validate(data, SCHEMA)
    (bug,) = data["bugs"]
    assert bug["revert"] is True
    assert bug["regression"]["verdict"] == "regression" and bug["regression"]["reruns"] == 2
    assert bug["regression"]["culprits"] == [{
        "path": "kernels/k.py", "lines": "5", "start": 5, "end": 5, "base_start": 5,
        "base_end": 5, "base_lines": "5-5", "current": ["    y = x + 1"],
        "base": ["    y = x * 2"]}]
    sentence = ("regression since origin/main (merge base 1a2b3c4d5e): line 5 of kernels/k.py "
                "introduced it: reverting it alone makes tests/test_k.py::test_k pass "
                "(2 reruns over 2 changed hunks)")
    assert bug["regression"]["summary"] == sentence
    lines = summary_lines(report, None)
    assert lines[0].endswith("(a revert of the change)")
    assert lines[1].strip() == sentence
    assert lines[2].strip() == "kernels/k.py:5: `y = x + 1` (was `y = x * 2`)"
    markdown = session_markdown(report)
    assert f"- Change: {sentence}" in markdown and "**Revert**" in markdown
    assert "  -    y = x * 2\n  +    y = x + 1" in markdown
    assert "kernels/k.py:5, kernels/util.py:3 reverted: passed" in markdown
    header = patch_text(report.bugs[0].group, report.bugs[0].result)
    assert f"Regression: {sentence}" in header and "Revert: this patch only" in header
    line = annotation(report.bugs[0], report, tmp_path)
    assert line.startswith("::notice file=kernels/k.py,line=5,")
    assert "regression since origin/main" in line and "a revert, not a fix" in line


def test_an_unhealed_regression_is_annotated_on_the_culprit_line(tmp_path: Path) -> None:
    removed = Hunk("kernels/k.py", 6, 5, 6, 7, (), ("    y = y * 2", "    y = y + 1"))
    report = session(tmp_path, UNHEALED, regression(culprits=(removed,)))
    jsonschema.validate(session_json(report), SCHEMA)
    line = annotation(report.bugs[0], report, tmp_path)
    assert line.startswith("::warning file=kernels/k.py,line=5,")  # before the removed lines
    assert "lines before 6 of kernels/k.py introduced it" in line


def test_not_a_regression_and_a_changed_test_say_so(tmp_path: Path) -> None:
    report = session(tmp_path, HEALED, regression(NOT_REGRESSION, ()))
    jsonschema.validate(session_json(report), SCHEMA)
    assert any("not a regression of the change since origin/main" in line
               for line in summary_lines(report, None))
    assert annotation(report.bugs[0], report, tmp_path).startswith(
        "::notice file=kernels/k.py,line=5,")  # the patch's line, as without a base
    test_hunk = Hunk("tests/test_k.py", 9, 9, 9, 9, ("    assert k(1) == 3",),
                     ("    assert k(1) == 2",), test=True)
    changed = regression(TEST_CHANGED, (test_hunk,))
    report = session(tmp_path, DECLINED, changed)
    report = replace(report, bugs=(replace(report.bugs[0], result=replace(
        report.bugs[0].result, reason=changed.summary)),))
    jsonschema.validate(session_json(report), SCHEMA)
    line = annotation(report.bugs[0], report, tmp_path)
    assert line.startswith("::warning file=tests/test_k.py,line=9,")
    assert line.count("the test changed since origin/main") == 1
