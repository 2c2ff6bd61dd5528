"""The shared words: one definition each, written to report.json as they always were."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import pytest_kernelfix
from pytest_kernelfix import vocabulary
from pytest_kernelfix.heal import outcomes
from pytest_kernelfix.verify import sensitivity
from pytest_kernelfix.vocabulary import (
    BugStatus,
    JudgementState,
    Phase,
    StepOutcome,
    Verdict,
    VerdictKind,
    Word,
    phase_text,
)

SCHEMA = json.loads((Path(pytest_kernelfix.__file__).parent / "report.schema.json")
                    .read_text(encoding="utf-8"))
WORDS = (BugStatus, VerdictKind, StepOutcome, JudgementState)


def test_every_status_is_the_schemas_in_report_order() -> None:
    assert [status.value for status in BugStatus] == SCHEMA["$defs"]["bug"]["properties"][
        "status"]["enum"]
    assert {status.value for status in BugStatus} <= set(SCHEMA["properties"]["totals"][
        "required"])


def test_a_steps_outcome_is_one_the_schema_describes() -> None:
    described = SCHEMA["$defs"]["phase"]["description"]
    assert all(f"{word.value} for a run of the original code" in described
               for word in StepOutcome)
    assert f"outcome: {VerdictKind.PASSED.value}," in described
    assert "the verdict kind that stopped there" in described


@pytest.mark.parametrize("word", [word for kind in WORDS for word in kind])
def test_a_word_is_its_string_wherever_it_is_written(word: Word) -> None:
    value = word.value
    assert isinstance(value, str) and word == value and hash(word) == hash(value)
    assert str(word) == f"{word}" == "{}".format(word) == value  # noqa: UP032
    assert json.dumps({word: [word]}) == json.dumps({value: [value]})
    assert type(word)(value) is word


def test_each_word_is_defined_once() -> None:
    assert tuple(BugStatus) == outcomes.STATUSES == (
        outcomes.HEALED, outcomes.MASKED, outcomes.UNHEALED, outcomes.DECLINED, outcomes.SKIPPED)
    assert outcomes.VerdictKind is VerdictKind and outcomes.Verdict is Verdict
    assert outcomes.Phase is Phase and outcomes.phase_text is phase_text
    assert outcomes.UNCERTIFIABLE is VerdictKind.UNCERTIFIABLE
    assert tuple(JudgementState) == (
        sensitivity.SENSITIVE, sensitivity.BYPASS, sensitivity.UNMEASURED, sensitivity.BLIND,
        sensitivity.DOUBT, sensitivity.UNCERTIFIABLE)
    defined = {name for name, value in vars(vocabulary).items()
               if isinstance(value, type) and issubclass(value, Word) and value is not Word}
    assert defined == {kind.__name__ for kind in WORDS}


def test_a_poisoned_run_that_cannot_certify_ends_the_bug_as_a_verdict_would() -> None:
    assert JudgementState.UNCERTIFIABLE == VerdictKind.UNCERTIFIABLE


def test_a_step_says_how_it_ended_beside_how_its_tests_did() -> None:
    ran = Phase("baseline", ("t::a",), 0.5, StepOutcome.RAN, "1 failed")
    assert phase_text(ran) == "baseline: 1 test(s), 1 failed"
    passed = Phase("sensitivity (nan)", ("t::a",), 0.5, VerdictKind.PASSED, "1 failed")
    assert phase_text(passed) == "sensitivity (nan): 1 test(s), 1 failed → step passed"
    rejected = Phase("regression", ("t::a", "t::b"), 1.0, VerdictKind.REGRESSION)
    assert phase_text(rejected) == "regression: 2 test(s) → step rejected (regression)"


def test_a_verdicts_kind_agrees_with_ok() -> None:
    assert Verdict(True, "fine").kind is VerdictKind.PASSED
    assert Verdict(False, "still fails").kind is VerdictKind.FAILING
    with pytest.raises(ValueError, match="ok=True cannot be of kind gate"):
        Verdict(True, "no", kind=VerdictKind.GATE)


def test_judging_a_rerun_loads_neither_the_loop_nor_the_fixers_nor_locate() -> None:
    """verify/judge.py is a pure function of a rerun: importing it in a fresh interpreter
    brings in no module of heal/, fixers/ or locate/."""
    code = ("import sys, pytest_kernelfix.verify.judge\n"
            "print('\\n'.join(m for m in sys.modules if m.startswith('pytest_kernelfix')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.split()
    assert "pytest_kernelfix.verify.judge" in loaded
    stages = {name.split(".")[1] for name in loaded if name.count(".") >= 1}
    assert not stages & {"heal", "fixers", "locate", "engine"}, sorted(loaded)
