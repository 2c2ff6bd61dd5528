"""``--junitxml``: every failing kernel test's testcase carries its bug, status and patch.

Checked on the file pytest writes, parsed as XML, in a plain session and under xdist
(where the controller writes the file from the workers' reports).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from factories import make_bug_report
from kernel_project import BUGS, GOOD_LINE, answer, make_project, report_of, write_cassette

from pytest_kernelfix.heal.outcomes import UNHEALED
from pytest_kernelfix.report.junit import JUnitProperties, add_properties, junit_names
from pytest_kernelfix.report.model import SessionReport

FIX = answer(BUGS["offset"], GOOD_LINE, reason="scale, not offset")
RECORDED = """

import pytest


@pytest.mark.kernel
def test_scale_recorded(record_property):
    record_property("owner", "kernels-team")
    import torch
    from kernels.ops import scale
    torch.testing.assert_close(scale(torch.ones(8), 2.0), torch.full((8,), 2.0))
"""


def cases_of(path: Path) -> dict[str, ET.Element]:
    return {f"{case.get('classname')}::{case.get('name')}": case
            for case in ET.parse(path).getroot().iter("testcase")}


def properties(case: ET.Element) -> dict[str, str]:
    holders = case.findall("properties")
    assert len(holders) <= 1  # one element, whoever wrote into it
    return {p.get("name", ""): p.get("value", "") for h in holders for p in h}


@pytest.mark.parametrize("extra", [
    pytest.param((), id="plain"),
    pytest.param(("-n", "2"), id="xdist", marks=pytest.mark.slow),
])
def test_failing_kernel_tests_carry_the_heal(pytester: pytest.Pytester,
                                             extra: tuple[str, ...]) -> None:
    make_project(pytester, extra=RECORDED)
    tape = write_cassette(pytester.path / "tape.jsonl", [FIX])
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kernelfix", f"--kernelfix-model=replay:{tape}",
        "--junitxml=out/junit.xml", "--junit-prefix=ci", *extra, timeout=600)
    result.assert_outcomes(failed=5, passed=1)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed"

    cases = cases_of(pytester.path / "out" / "junit.xml")
    healed = {key: case for key, case in cases.items() if "kernelfix_bug" in properties(case)}
    assert len(healed) == 5 and all(case.find("failure") is not None
                                    for case in healed.values())  # still failures
    for case in healed.values():
        assert {key: value for key, value in properties(case).items()
                if key.startswith("kernelfix")} == {
            "kernelfix_bug": bug["id"],
            "kernelfix_status": "healed",
            "kernelfix_reason": "healed in round 1",
            "kernelfix_patch": f".kernelfix/{bug['patch']}",
        }
        assert case[0].tag == "properties"  # first child, as JUnit schemas want
    recorded = cases["ci.tests.test_ops::test_scale_recorded"]
    assert properties(recorded)["owner"] == "kernels-team"  # the test's own, kept
    passing = cases["ci.tests.test_ops::test_scale_zeros_by_zero"]
    assert properties(passing) == {}


def test_names_match_what_junitxml_writes_and_other_cases_are_untouched(tmp_path: Path) -> None:
    assert junit_names("tests/test_ops.py::TestOps::test_scale[100-2.0]", "ci") == (
        "ci.tests.test_ops.TestOps", "test_scale[100-2.0]")
    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_ops" name="test_a"><failure message="x"/></testcase>'
        '<testcase classname="tests.test_ops" name="test_b"/></testsuite></testsuites>')
    count = add_properties(junit, {("tests.test_ops", "test_a"): [("kernelfix_bug", "b\x01")]})
    assert count == 1
    cases = cases_of(junit)
    assert properties(cases["tests.test_ops::test_a"]) == {"kernelfix_bug": "b?"}
    assert cases["tests.test_ops::test_b"].find("properties") is None
    assert junit.read_text().startswith('<?xml version="1.0" encoding="utf-8"?><testsuites>')


def test_a_junit_file_that_cannot_be_read_is_left_alone_with_a_note(tmp_path: Path) -> None:
    junit = tmp_path / "junit.xml"
    junit.write_text("<testsuites><testsuite>")  # cut short
    bug = make_bug_report(tmp_path, "k1", "x = 1\n", "x = 1\n", UNHEALED)
    report = SessionReport((bug,), tmp_path, tmp_path / ".kernelfix", "report", "interpret",
                           "recipes", 1.0)
    notes: list[str] = []
    sink = JUnitProperties(str(junit), "", notes.append)
    sink.publish(report)
    hook = sink.pytest_sessionfinish()
    next(hook)  # junitxml writes the file here
    with pytest.raises(StopIteration):
        hook.send(None)
    assert junit.read_text() == "<testsuites><testsuite>"
    (note,) = notes
    assert note.startswith(f"the JUnit report {junit} was left without kernelfix properties")
