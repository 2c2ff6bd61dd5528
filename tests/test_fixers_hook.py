"""Rounds are labelled with whoever answered them: the conftest hook or the configured fixer.

The plugin always asks through :class:`HookFixer` (the hook first, then the configured
fixer), so the label of a round must come from the one that answered or failed, never
from the wrapper.
"""

from __future__ import annotations

from typing import Any

import pytest
from fake_llm import sample_request

from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.fixers.base import FixerError, Proposal
from pytest_kernelfix.fixers.hook import HookFixer
from pytest_kernelfix.fixers.recipes import RecipeFixer
from pytest_kernelfix.heal.loop import heal
from pytest_kernelfix.heal.outcomes import HEALED, UNHEALED, Verdict

GELU = "kernels/gelu.py"
HOOK_EDIT = Modification("    y = 0.5 * x * (1.0 + tl.tanh(u))",
                         "    y = 0.5 * x * (1.0 + (2 * tl.sigmoid(2 * u) - 1))", file=GELU)


def no_hook(request: Any) -> None:
    return None


def rounds_of(fixer: HookFixer) -> tuple[str, list[str]]:
    """Heal the gelu bug of ``sample_request`` with ``fixer``; (status, round labels)."""
    context = sample_request().context
    originals = {GELU: context.editable[0].text}

    def verify(files: Any) -> Verdict:
        ok = "tl.tanh" not in files[GELU]
        return Verdict(ok, "1 failing test(s) pass" if ok else "1 of 1 failing tests still fail")

    result = heal(context, originals, fixer=fixer, verify=verify, rounds=2)
    return result.status, [record.source for record in result.rounds]


def test_a_round_the_recipes_answer_says_recipes() -> None:
    assert rounds_of(HookFixer(no_hook, RecipeFixer())) == (HEALED, ["recipes"])


def test_a_round_the_recipes_cannot_answer_says_recipes_not_hook() -> None:
    recipes = RecipeFixer()
    recipes.propose(sample_request())  # its one proposal for this bug is spent
    assert rounds_of(HookFixer(no_hook, recipes)) == (UNHEALED, ["recipes"])


def test_a_round_the_hook_answers_says_hook() -> None:
    def hook(request: Any) -> Proposal:
        return Proposal((HOOK_EDIT,), analysis="tanh from sigmoid")

    assert rounds_of(HookFixer(hook, RecipeFixer())) == (HEALED, ["hook"])


def test_a_round_the_hook_fails_says_hook() -> None:
    def hook(request: Any) -> None:
        raise FixerError("the conftest's model is down")

    assert rounds_of(HookFixer(hook, RecipeFixer())) == (UNHEALED, ["hook"])


def test_the_configured_fixers_error_keeps_its_message() -> None:
    recipes = RecipeFixer()
    recipes.propose(sample_request())
    with pytest.raises(FixerError, match=r"no recipe for .*already proposed once") as caught:
        HookFixer(no_hook, recipes).propose(sample_request())
    assert caught.value.source == "recipes"
