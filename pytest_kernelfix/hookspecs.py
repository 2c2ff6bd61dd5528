"""Hooks that conftest files and other plugins may implement."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_kernelfix.fixers.base import ProposalRequest


@pytest.hookspec(firstresult=True)
def pytest_kernelfix_propose(request: ProposalRequest, config: pytest.Config) -> Any:
    """Propose edits for one round of one bug, before the configured fixer is asked.

    Return ``None`` to let the configured fixer (model, cassette or recipes) answer.
    Otherwise return a :class:`~pytest_kernelfix.fixers.base.Proposal`, a list of
    :class:`~pytest_kernelfix.engine.parse.Modification`, or a model-style answer string (JSON
    edits or SEARCH/REPLACE blocks), which is parsed like a model's answer. The edits go
    through the same matcher, guards and verification as any other.
    """
