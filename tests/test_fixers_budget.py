"""Spending caps: ``--kernelfix-max-cost`` and ``--kernelfix-max-tokens``.

The cap is checked before an answer is asked for: the answer that crosses it is still
verified, the bug in progress ends at its next round, the bugs not started are skipped.
"""

from __future__ import annotations

import json

import pytest
from fake_llm import sample_request
from hostile.project import BUG, FIX, fix_answer, report, write_project

from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.fixers.base import Proposal, ProposalRequest, Usage
from pytest_kernelfix.fixers.budget import Budget, BudgetedFixer
from pytest_kernelfix.heal.loop import heal
from pytest_kernelfix.heal.outcomes import UNHEALED, Verdict


class Priced:
    """Answers the same edit every round, at a fixed price."""

    name = "priced"

    def __init__(self, usage: Usage) -> None:
        self.usage = usage
        self.calls = 0

    def propose(self, request: ProposalRequest) -> Proposal:
        self.calls += 1
        edit = Modification("tl.tanh(u)", f"tl.sigmoid(u) * {self.calls}", file="kernels/gelu.py")
        return Proposal((edit,), usage=self.usage, source=self.name)


def test_the_budget_says_which_cap_was_reached() -> None:
    budget = Budget(max_cost=0.05, max_tokens=1000)
    assert budget.exhausted() == ""
    budget.charge(Usage(1, 600, 300, 0.01))
    assert budget.exhausted() == ""
    budget.charge(Usage(1, 80, 20, 0.01))
    assert budget.exhausted() == (
        "the session's budget is spent: 1000 of 1000 tokens (--kernelfix-max-tokens)")
    budget.charge(Usage(cache_hits=5))  # free answers spend nothing
    assert Budget(max_cost=0.02).exhausted() == ""
    cost = Budget(max_cost=0.02)
    cost.charge(Usage(1, 10, 10, 0.025))
    assert cost.exhausted() == (
        "the session's budget is spent: $0.0250 of $0.0200 (--kernelfix-max-cost)")
    unlimited = Budget()
    unlimited.charge(Usage(9, 10**9, 10**9, 10**6))
    assert unlimited.exhausted() == ""


def test_the_bug_in_progress_stops_before_its_next_round() -> None:
    request = sample_request()
    originals = {view.path: view.text for view in request.files}
    live = Priced(Usage(1, 500, 100, 0.6))
    budgeted = BudgetedFixer(live, Budget(max_cost=1.0))

    def never_passes(candidate: object) -> Verdict:
        return Verdict(False, "1 of 1 failing tests still fail")

    result = heal(request.context, originals, fixer=budgeted, verify=never_passes, rounds=5)
    assert live.calls == 2  # $0.60, then $1.20: the answer crossing the cap was the last
    assert result.status == UNHEALED
    assert result.reason == (
        "round 3: the session's budget is spent: $1.2000 of $1.0000 (--kernelfix-max-cost)")
    assert [r.usage.calls for r in result.rounds] == [1, 1, 0]
    assert result.usage.cost == pytest.approx(1.2)


def test_bugs_left_when_the_money_is_spent_are_skipped(pytester: pytest.Pytester) -> None:
    root = write_project(pytester.path, "k1", "k2", "k3")
    shifted = FIX.replace("x * factor", "x - factor")
    wrong, right = json.loads(fix_answer("k1")), json.loads(fix_answer("k1"))
    wrong["modifications"][0]["new_string"] = right["modifications"][0]["old_string"] = shifted
    entries = [
        {"group": "k1_kernel-*", "round": 1, "response": json.dumps(wrong), "cost": 0.006,
         "usage": {"prompt_tokens": 900, "completion_tokens": 100}},
        {"group": "k1_kernel-*", "round": 2, "response": json.dumps(right), "cost": 0.006,
         "usage": {"prompt_tokens": 900, "completion_tokens": 100}},
        {"group": "k2_kernel-*", "response": fix_answer("k2"), "cost": 0.006},
    ]
    (root / "tape.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--kernelfix",
        "--kernelfix-model=replay:tape.jsonl", "--kernelfix-max-cost=0.01",
        "--kernelfix-workers=1", timeout=600)  # one bug after another: k1 spends it all

    result.assert_outcomes(failed=3, passed=1)
    bugs = report(root)
    assert bugs["k1"]["status"] == "healed" and bugs["k1"]["rounds"] == 2
    why = "the session's budget is spent: $0.0120 of $0.0100 (--kernelfix-max-cost)"
    for name in ("k2", "k3"):
        assert (bugs[name]["status"], bugs[name]["reason"]) == ("skipped", why)
        assert bugs[name]["calls"] == 0
    data = json.loads((root / ".kernelfix" / "report.json").read_text())
    assert data["budget"] == {"max_cost": 0.01, "max_tokens": None}
    assert data["totals"]["cost"] == pytest.approx(0.012)
    result.stdout.fnmatch_lines([f"skipped   k2_kernel-*: {why}"])
    assert BUG in (root / "kernels" / "k2.py").read_text()
