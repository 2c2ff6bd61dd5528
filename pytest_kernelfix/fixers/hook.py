"""Let a conftest or plugin answer first, through ``pytest_kernelfix_propose``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from pytest_kernelfix.engine.parse import Modification, ParsedResponse
from pytest_kernelfix.fixers.answer import read_answer
from pytest_kernelfix.fixers.base import (
    Fixer,
    FixerError,
    Proposal,
    ProposalRequest,
    Usage,
    is_free,
)

#: Where a hook's answer came from, unless the hook says.
HOOK_ORIGIN = "a pytest_kernelfix_propose hook"


def as_proposal(answer: Any, source: str) -> Proposal:
    """Accept what a hook may return: a Proposal, edits, a parsed or a raw answer."""
    if isinstance(answer, Proposal):
        return answer
    if isinstance(answer, ParsedResponse):
        return Proposal(answer.modifications, answer.raw, answer.analysis, source=source,
                        need=answer.need, not_a_kernel_bug=answer.not_a_kernel_bug)
    if isinstance(answer, str):
        return read_answer(answer, usage=Usage(), source=source)
    if isinstance(answer, Sequence) and all(isinstance(m, Modification) for m in answer):
        return Proposal(tuple(answer), source=source)
    raise FixerError(
        f"pytest_kernelfix_propose returned {type(answer).__name__}; expected a Proposal, "
        "a list of Modification, or an answer string"
    )


class HookFixer:
    """Ask the hook first; when it returns None, ask the configured fixer.

    A round is labelled with whoever answered, or failed to: the configured fixer's
    failures carry its name, so a round the recipes could not answer says ``recipes``.
    Its own ``name``, which progress lines show while it is asked, is the configured
    fixer's, with the hook first where a hook is implemented.
    """

    def __init__(self, ask: Callable[[ProposalRequest], Any], fallback: Fixer, *,
                 hooked: bool = True) -> None:
        self.ask = ask
        self.fallback = fallback
        self.name = f"the hook, then {fallback.name}" if hooked else fallback.name
        # A hook may call a model of its own: free only when none is implemented.
        self.free = not hooked and is_free(fallback)

    def propose(self, request: ProposalRequest) -> Proposal:
        try:
            answer = self.ask(request)
        except FixerError as error:  # the round is the hook's, whatever this fixer's name
            error.source = error.source or "hook"
            raise
        if answer is None:
            try:
                return self.fallback.propose(request)
            except FixerError as error:
                error.source = error.source or self.fallback.name
                raise
        proposal = as_proposal(answer, "hook")
        return replace(proposal, source=proposal.source or "hook",
                       origin=proposal.origin or HOOK_ORIGIN)


class UnavailableFixer:
    """Stands in when the configured fixer could not be built; says why, every time."""

    name = "unavailable"
    free = True  # it only says why it cannot answer

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def propose(self, request: ProposalRequest) -> Proposal:
        raise FixerError(self.reason)
