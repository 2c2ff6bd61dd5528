"""How candidates and bugs end: the values the loop, the verifier, the guards and the
report share.

They live apart from the loop (:mod:`pytest_kernelfix.heal.loop`) so that the stages which
produce or read them (``verify``, ``guards``, ``report``) depend on data, not on the loop.
The words among them (the statuses, the verdict and its kinds and phases) are defined in
:mod:`pytest_kernelfix.vocabulary`; they are named here too, where the stages import them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_kernelfix.engine.diff import cumulative_diff
from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.fixers.base import FixerError, Message, Proposal, Usage
from pytest_kernelfix.locate.change import Regression
from pytest_kernelfix.redact import redact
from pytest_kernelfix.vocabulary import BugStatus, Phase, VerdictKind
from pytest_kernelfix.vocabulary import Verdict as Verdict
from pytest_kernelfix.vocabulary import phase_text as phase_text
from pytest_kernelfix.vocabulary import step_outcome as step_outcome

if TYPE_CHECKING:  # the matcher (rapidfuzz, numpy) is not loaded to read a report
    from pytest_kernelfix.engine.files import EditOutcome

#: How a bug can end (:class:`~pytest_kernelfix.vocabulary.BugStatus`), by the names the
#: stages import; every status, in report order.
HEALED, MASKED, UNHEALED = BugStatus.HEALED, BugStatus.MASKED, BugStatus.UNHEALED
DECLINED, SKIPPED = BugStatus.DECLINED, BugStatus.SKIPPED
STATUSES = tuple(BugStatus)
#: The verdict kind that ends a bug as skipped: its tests cannot tell a fix from a cheat.
UNCERTIFIABLE = VerdictKind.UNCERTIFIABLE


#: How much of one message, or of one answer, a round keeps (about 25k tokens): far more
#: than a prompt of this plugin holds, a bound on a runaway answer.
KEEP_CHARS = 100_000


def bounded(text: str, limit: int = KEEP_CHARS) -> str:
    """``text``, or its first and last halves of ``limit`` with a line saying how much of
    the middle was left out (the start holds the error, the end the latest feedback)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return (f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n"
            f"{text[-half:]}")


@dataclass(frozen=True)
class Exchange:
    """What one round's answer was given and what it said, redacted and bounded: the
    prompt's ``messages``, whether they were ``sent`` to a model, where the answer came
    from when no model gave it just now (``origin``), and the raw ``answer``."""

    messages: tuple[Message, ...] = ()
    sent: bool = False
    origin: str = ""
    answer: str = ""

    @classmethod
    def of(cls, proposal: Proposal) -> Exchange:
        return cls(_kept(proposal.messages), proposal.sent, redact(proposal.origin),
                   bounded(redact(proposal.raw)))

    @classmethod
    def failed(cls, error: BaseException) -> Exchange:
        """The prompt of a call that got no answer (none when it was never sent)."""
        messages = error.messages if isinstance(error, FixerError) else ()
        return cls(_kept(messages), bool(messages))

    @property
    def empty(self) -> bool:
        return not (self.messages or self.answer)


def _kept(messages: tuple[Message, ...]) -> tuple[Message, ...]:
    # Redacted whole, then cut: a cut first could leave half a key no pattern matches.
    return tuple((role, bounded(redact(content))) for role, content in messages)


@dataclass(frozen=True)
class RoundRecord:
    """One round as reported; ``exchange`` is its prompt and answer for the prompt file
    (``raw`` is the answer's start, for a glance); ``shown`` is what this round's prompt
    showed of each editable file (``path``, or ``path:definition``): a request for more
    code (``need``) shows more in the rounds after it."""

    round: int
    source: str
    edits: tuple[EditOutcome, ...]
    outcome: str
    usage: Usage = field(default_factory=Usage)
    raw: str = ""
    notes: tuple[str, ...] = ()
    phases: tuple[Phase, ...] = ()
    exchange: Exchange = field(default_factory=Exchange)
    shown: tuple[str, ...] = ()


@dataclass(frozen=True)
class HealResult:
    """The end of one bug's heal. ``final`` holds the winning text of changed files.

    ``prompt_chars`` is the size of the first round's prompt (0 when not measured);
    ``shown`` says what the first round's prompt showed of each editable file (``path``
    whole, or ``path:definition`` for each definition of a focused view; each round's
    is its :attr:`RoundRecord.shown`). ``healed_by`` names the
    bug whose patch already heals this one (no patch of its own); ``triage`` the steps
    run before round 1; ``seconds`` covers them too. A :data:`MASKED` bug keeps the
    masking candidate in ``final`` for review. ``verified``: the tests a healed bug's
    candidate was verified passing on (a later bug its patch heals reruns only the
    others). ``regression`` is what reverting parts of the change since the base did to
    the failing test (None: no base, or nothing to revert); ``revert`` says the winning
    patch only puts back lines of that change; ``editable`` are the files a fix could
    edit when the change widened the bug's own.
    """

    group_id: str
    status: BugStatus
    reason: str
    rounds: tuple[RoundRecord, ...] = ()
    original: Mapping[str, str] = field(default_factory=dict)
    final: Mapping[str, str] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    seconds: float = 0.0
    prompt_chars: int = 0
    shown: tuple[str, ...] = ()
    healed_by: str = ""
    triage: tuple[Phase, ...] = ()
    verified: tuple[str, ...] = ()
    regression: Regression | None = None
    revert: bool = False
    editable: tuple[str, ...] = ()

    @property
    def changed_files(self) -> tuple[str, ...]:
        return tuple(path for path, text in self.final.items() if self.original.get(path) != text)

    @property
    def patch(self) -> str:
        return cumulative_diff(self.original, self.final)


class HealInterrupted(KeyboardInterrupt):
    """The round loop was stopped by a Ctrl-C or SIGTERM: ``result`` is what the bug got
    so far (the rounds played, what they cost), so that the report keeps it. A
    ``KeyboardInterrupt``: every ``except Exception`` lets it through."""

    def __init__(self, result: HealResult, why: str = "") -> None:
        super().__init__(*((why,) if why else ()))
        self.result = result


@dataclass(frozen=True)
class Candidate:
    """A candidate as the static screen sees it: the files it would write (``files``),
    the text it was made from (``base``: the current files of the round), the bug's
    original text (``originals``) and the edits that made it."""

    files: Mapping[str, str]
    base: Mapping[str, str]
    originals: Mapping[str, str]
    modifications: Sequence[Modification] = ()


@dataclass(frozen=True)
class Screening:
    """What the static screen says of a candidate, from one reading of its code: why it
    must not run ("" when it may), and remarks on its shape for the report and the model
    (torch math or arithmetic after the launch...), which reject nothing."""

    reason: str = ""
    notes: tuple[str, ...] = ()


#: The static screen every candidate goes through before it runs.
Guard = Callable[[Candidate], Screening]
