"""Turn a model's raw answer text into a :class:`Proposal`.

The live fixer and the cassette replayer both go through :func:`read_answer`, so a
recorded heal replays to exactly the proposal the live run saw. An answer that cannot
be read is not an exception: it becomes ``parse_error``, which the healing loop feeds
back to the model next round.
"""

from __future__ import annotations

from pytest_kernelfix.engine.parse import FORMAT_HINT, ParseError, parse_modifications
from pytest_kernelfix.fixers.base import Proposal, Usage

#: Answers longer than this are refused unread: a runaway generation, not a fix.
MAX_ANSWER_CHARS = 1_000_000


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
    return Proposal(parsed.modifications, raw, analysis, usage=usage, source=source,
                    need=parsed.need, not_a_kernel_bug=parsed.not_a_kernel_bug)
