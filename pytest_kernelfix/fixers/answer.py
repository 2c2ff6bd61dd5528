"""Turn a model's raw answer text into a :class:`Proposal`.

The live fixer and the cassette replayer both go through :func:`read_answer`, so a
recorded heal replays to exactly the proposal the live run saw. An answer that cannot
be read is not an exception: it becomes ``parse_error``, which the healing loop feeds
back to the model next round.

A model that sees no kernel bug does not always use the ``not_a_kernel_bug`` field: it
may write so in its analysis and send an empty edit list. Such an answer is read as the
decline it is (:func:`declined_in_words`), so the bug ends as declined at once instead
of asking again for the same answer.
"""

from __future__ import annotations

import re

from pytest_kernelfix.engine.parse import FORMAT_HINT, ParseError, parse_modifications
from pytest_kernelfix.fixers.base import Proposal, Usage

#: Answers longer than this are refused unread: a runaway generation, not a fix.
MAX_ANSWER_CHARS = 1_000_000

_KERNEL = r"(?:triton\s+)?kernel"
#: How an analysis says, in words, that the failure is not a kernel bug. Only that: "the
#: kernel looks right" with no edit is a model that sees no fix, asked once more.
NOT_A_KERNEL_BUG = re.compile(
    rf"\bnot[\s_-]+a[\s_-]+{_KERNEL}[\s_-]+bug"
    rf"|\bno[\s_-]+{_KERNEL}[\s_-]+bug"
    rf"|\bnot\s+(?:a|an)\s+(?:bug|problem|issue|error|fault)\s+(?:in|of|with)\s+the\s+{_KERNEL}",
    re.IGNORECASE)


def declined_in_words(text: str) -> str:
    """``text`` when it says the failure is not a kernel bug, else ""."""
    return " ".join(text.split()) if NOT_A_KERNEL_BUG.search(text) else ""


def read_answer(raw: str, *, usage: Usage, source: str) -> Proposal:
    """Parse ``raw``; ``raw`` is kept byte for byte whatever happens."""
    if len(raw) > MAX_ANSWER_CHARS:
        error = f"answer too large ({len(raw)} characters, limit {MAX_ANSWER_CHARS})."
        return Proposal((), raw, parse_error=f"{error} {FORMAT_HINT}", usage=usage,
                        source=source)
    try:
        parsed = parse_modifications(raw)
    except ParseError as exc:
        return Proposal((), raw, parse_error=str(exc) or "The answer could not be read.",
                        usage=usage, source=source)
    analysis = parsed.analysis or parsed.summary
    # No edits and no request is the model declining: reported as such, not as unreadable.
    not_a_kernel_bug = parsed.not_a_kernel_bug
    if not (parsed.modifications or parsed.need or not_a_kernel_bug):
        not_a_kernel_bug = declined_in_words(
            " ".join(part for part in (parsed.analysis, parsed.summary) if part))
    return Proposal(parsed.modifications, raw, analysis, usage=usage, source=source,
                    need=parsed.need, not_a_kernel_bug=not_a_kernel_bug)
