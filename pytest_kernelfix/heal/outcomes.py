"""How candidates and bugs end: the values the loop, the verifier, the guards and the
report share.

They live apart from the loop (:mod:`pytest_kernelfix.heal.loop`) so that the stages which
produce or read them (``verify``, ``guards``, ``report``) depend on data, not on the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_kernelfix.engine.diff import cumulative_diff
from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.fixers.base import Usage

if TYPE_CHECKING:  # the matcher (rapidfuzz, numpy) is not loaded to read a report
    from pytest_kernelfix.engine.files import EditOutcome

HEALED, UNHEALED, SKIPPED = "healed", "unhealed", "skipped"
#: Every status a bug can end with, in report order.
STATUSES = (HEALED, UNHEALED, SKIPPED)
#: The verdict kind that ends a bug as skipped: its tests cannot tell a fix from a cheat.
UNCERTIFIABLE = "uncertifiable"


@dataclass(frozen=True)
class Verdict:
    """How a candidate fared: ``ok`` only when every check passed.

    ``summary`` is one line for the report; ``feedback`` is what the model is shown
    next round (the new failure, the crash, the broken tests). ``notes`` are remarks on
    the candidate's shape (torch math or arithmetic after the launch...) that reject
    nothing but go into the report and to the model. A verdict of kind
    :data:`UNCERTIFIABLE` ends the bug as skipped.
    """

    ok: bool
    summary: str
    feedback: str = ""
    kind: str = ""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RoundRecord:
    round: int
    source: str
    edits: tuple[EditOutcome, ...]
    outcome: str
    usage: Usage = field(default_factory=Usage)
    raw: str = ""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class HealResult:
    """The end of one bug's heal. ``final`` holds the winning text of changed files.

    ``prompt_chars`` is the size of the first round's prompt (0 when not measured);
    ``shown`` says what the model was shown of each editable file (``path`` whole, or
    ``path:definition`` for each definition of a focused view).
    """

    group_id: str
    status: str
    reason: str
    rounds: tuple[RoundRecord, ...] = ()
    original: Mapping[str, str] = field(default_factory=dict)
    final: Mapping[str, str] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    seconds: float = 0.0
    prompt_chars: int = 0
    shown: tuple[str, ...] = ()

    @property
    def changed_files(self) -> tuple[str, ...]:
        return tuple(path for path, text in self.final.items() if self.original.get(path) != text)

    @property
    def patch(self) -> str:
        return cumulative_diff(self.original, self.final)


#: A static check on a candidate: (files before, files after, edits) -> "" or the reason.
Guard = Callable[[Mapping[str, str], Mapping[str, str], Sequence[Modification]], str]
