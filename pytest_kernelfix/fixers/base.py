"""The one small protocol every fixer implements: propose edits for a bug.

A fixer never touches files and never runs tests; it turns a :class:`ProposalRequest`
(what is broken, what was tried) into a :class:`Proposal` (edits plus the cost of
getting them). The healing loop applies and verifies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.locate.context import BugContext, SourceFile


@dataclass(frozen=True)
class Attempt:
    """What one earlier round proposed and how it ended, in a line or two."""

    round: int
    outcome: str
    diff: str = ""


@dataclass(frozen=True)
class ProposalRequest:
    """Everything a fixer may look at for one round of one bug.

    ``files`` hold the current candidate text of every editable file (the original in
    round 1); ``cumulative_diff`` is the change from the original so far; ``feedback``
    says what went wrong in the previous round (new failure, edits that did not match
    with the nearest fragment of the file, rejected candidates).
    """

    context: BugContext
    round: int
    files: tuple[SourceFile, ...]
    cumulative_diff: str = ""
    feedback: str = ""
    history: tuple[Attempt, ...] = ()


@dataclass(frozen=True)
class Usage:
    """Cost of getting an answer: model calls, tokens, dollars, seconds.

    ``cache_hits`` counts answers served from the answer cache: they cost no call, no
    token and no dollar, and are counted so a report can say where an answer came from.
    ``prompt_chars`` is the size of the prompts the fixer sent (0 when it sent none).
    """

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    seconds: float = 0.0
    cache_hits: int = 0
    prompt_chars: int = 0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.calls + other.calls,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cost + other.cost,
            self.seconds + other.seconds,
            self.cache_hits + other.cache_hits,
            self.prompt_chars + other.prompt_chars,
        )


#: One chat message: (role, content).
Message = tuple[str, str]


def as_messages(messages: Iterable[Mapping[str, str]]) -> tuple[Message, ...]:
    """OpenAI-style message dicts as (role, content) pairs."""
    return tuple((message["role"], message["content"]) for message in messages)


@dataclass(frozen=True)
class Proposal:
    """A fixer's answer for one round.

    ``parse_error`` is set (and ``modifications`` empty) when the answer could not be
    read; the loop feeds that message back to the model next round. ``need`` is code the
    model asks to see next round. An answer with neither edits nor a request, that was
    read, is the model declining (:attr:`declined`); ``not_a_kernel_bug`` is its reason
    when it says the failure is not the kernel's (the test's own expectation, the
    environment): the bug then ends after that answer.

    ``raw`` is the whole answer. ``messages`` is the prompt the answer is for and
    ``sent`` says whether a model was sent it just now: a replay renders the prompt
    its recorded model stood for, without sending it. ``origin`` says where an answer
    that no model gave just now came from (a cassette line, the answer cache, a recipe,
    a hook), so the report never passes it off as a model's.
    """

    modifications: tuple[Modification, ...]
    raw: str = ""
    analysis: str = ""
    parse_error: str = ""
    usage: Usage = field(default_factory=Usage)
    source: str = ""
    need: tuple[str, ...] = ()
    not_a_kernel_bug: str = ""
    messages: tuple[Message, ...] = ()
    sent: bool = False
    origin: str = ""

    @property
    def declined(self) -> bool:
        return not (self.modifications or self.need or self.parse_error)


def is_free(fixer: object) -> bool:
    """Whether asking ``fixer`` costs nothing (its ``free`` attribute; False when absent)."""
    return bool(getattr(fixer, "free", False))


class FixerError(Exception):
    """The fixer could not answer at all (API down after retries, cassette used up).

    The message goes into the report as the reason the bug stayed unhealed. ``source``
    names the fixer that failed when the one asked passed the question on (the hook to
    the configured fixer); empty: the one asked. ``messages`` is the prompt of a request
    that was sent and got no answer. ``ends_session`` says that every later request would
    fail the same way (the endpoint stopped answering, the key was refused): the session
    then stops asking for the bugs left.
    """

    def __init__(self, message: str, source: str = "", *,
                 messages: tuple[Message, ...] = (), ends_session: bool = False) -> None:
        super().__init__(message)
        self.source = source
        self.messages = messages
        self.ends_session = ends_session


class Fixer(Protocol):
    """Proposes edits. A fixer whose answers cost nothing (no model call: recipes, a
    cassette) says so with a true ``free`` attribute: it is asked before the baseline
    rerun, so a bug it cannot answer costs no rerun at all (:func:`is_free`)."""

    name: str

    def propose(self, request: ProposalRequest) -> Proposal: ...
