"""A session's spending cap: ``--kernelfix-max-cost`` and ``--kernelfix-max-tokens``.

One :class:`Budget` per session counts what every answer cost. It is checked before
each answer is asked for, never during one: a round whose answer arrived is verified
(its price is paid), and the answer that crosses the cap is the last one. So a session
may overshoot a cap by one answer's cost. Once spent, the bug in progress ends
``unhealed`` with the reason at its next round, and the workflow reports every bug not
yet started ``skipped`` with the same reason. Cached answers cost nothing and spend
nothing.

The same object stops the session asking when the fixer cannot answer any bug: a
:class:`FixerError` with ``ends_session`` (the endpoint stopped answering, the key was
refused) ends the bug in progress with its reason, and the bugs not yet started are
``skipped`` with one reason that says why, instead of each paying its own retries.
"""

from __future__ import annotations

import threading

from pytest_kernelfix.fixers.base import (
    Fixer,
    FixerError,
    Proposal,
    ProposalRequest,
    Usage,
    is_free,
)


class Budget:
    """What the session may spend (0: no cap) and what it has spent so far."""

    def __init__(self, max_cost: float = 0.0, max_tokens: int = 0) -> None:
        self.max_cost = max_cost
        self.max_tokens = max_tokens
        self.spent = Usage()
        self.stopped = ""  # why the fixer cannot answer any more bug, once it is known
        self._lock = threading.Lock()  # bugs healed in parallel charge the same budget

    def charge(self, usage: Usage) -> None:
        with self._lock:
            self.spent = self.spent + usage

    def stop(self, reason: str) -> None:
        """No more answers: the fixer failed in a way every later request would too."""
        with self._lock:
            self.stopped = self.stopped or reason

    def exhausted(self) -> str:
        """Why no more answers may be bought, or "" while the budget lasts."""
        if self.stopped:
            return f"not asked: {self.stopped}"
        if self.max_cost > 0 and self.spent.cost >= self.max_cost:
            return (f"the session's budget is spent: ${self.spent.cost:.4f} of "
                    f"${self.max_cost:.4f} (--kernelfix-max-cost)")
        if self.max_tokens > 0 and self.spent.tokens >= self.max_tokens:
            return (f"the session's budget is spent: {self.spent.tokens} of "
                    f"{self.max_tokens} tokens (--kernelfix-max-tokens)")
        return ""


class BudgetedFixer:
    """Refuse to ask once the budget is spent; charge every answer to it."""

    def __init__(self, inner: Fixer, budget: Budget) -> None:
        self.inner = inner
        self.free = is_free(inner)
        self.budget = budget
        self.name = inner.name

    def propose(self, request: ProposalRequest) -> Proposal:
        why = self.budget.exhausted()
        if why:
            raise FixerError(why)
        try:
            proposal = self.inner.propose(request)
        except FixerError as error:
            if error.ends_session:
                self.budget.stop(f"the fixer stopped answering in {request.context.group_id}, "
                                 f"round {request.round}: {error}")
            raise
        self.budget.charge(proposal.usage)
        return proposal
