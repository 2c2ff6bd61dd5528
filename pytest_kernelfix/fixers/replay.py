"""Cassettes: record live model answers to JSON Lines and replay them offline.

One line per answer::

    {"group": "gelu_kernel-*", "round": 1, "response": "<raw answer>", "model": "...",
     "usage": {"prompt_tokens": 812, "completion_tokens": 144}, "cost": 0.0012}

``group`` is an ``fnmatch`` pattern on the bug's group id and ``round`` the healing
round; both are optional (absent: any). A replayed answer goes through the same parser
as a live one, so a recorded heal replays identically without network or keys: the
demo and CI use this.
"""

from __future__ import annotations

import fnmatch
import json
import re
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_kernelfix.fixers.answer import read_answer
from pytest_kernelfix.fixers.base import (
    Fixer,
    FixerError,
    Proposal,
    ProposalRequest,
    Usage,
    as_messages,
    is_free,
)
from pytest_kernelfix.fixers.prompting import PromptError, render_messages
from pytest_kernelfix.redact import redact


class CassetteError(FixerError, ValueError):
    """The cassette file is missing or a line is not a valid entry (names the line)."""


@dataclass(frozen=True)
class CassetteEntry:
    response: str
    group: str = ""
    round: int | None = None
    model: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    line: int = 0

    def matches(self, group_id: str, round: int) -> bool:
        if self.round is not None and self.round != round:
            return False
        return not self.group or self.group == group_id or fnmatch.fnmatchcase(
            group_id, self.group
        )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.group:
            data["group"] = self.group
        if self.round is not None:
            data["round"] = self.round
        data["response"] = self.response
        data["model"] = self.model
        data["usage"] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }
        data["cost"] = self.cost
        return data


def group_pattern(group_id: str) -> str:
    """An fnmatch pattern matching exactly ``group_id`` (ids may hold ``[``, ``*``, ``?``)."""
    return re.sub(r"([*?\[])", r"[\1]", group_id)


def load_cassette(path: Path) -> tuple[CassetteEntry, ...]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CassetteError(f"replay cassette {path} cannot be read: {exc.strerror}") from None
    entries = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            entries.append(parse_entry(line, number, path))
    return tuple(entries)


def parse_entry(line: str, number: int, path: Path) -> CassetteEntry:
    def bad(why: str) -> CassetteError:
        return CassetteError(f"replay cassette {path} line {number}: {why}")

    try:
        data = json.loads(line)
    except ValueError as exc:
        raise bad(f"not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise bad("expected a JSON object")
    response = data.get("response")
    if not isinstance(response, str):
        raise bad('"response" (the raw answer text) must be a string')
    group = data.get("group", "")
    if not isinstance(group, str):
        raise bad('"group" must be a string (an fnmatch pattern on the group id)')
    round_ = data.get("round")
    if round_ is not None and (not isinstance(round_, int) or isinstance(round_, bool)):
        raise bad('"round" must be an integer')
    usage = data.get("usage", {})
    if not isinstance(usage, dict):
        raise bad('"usage" must be an object')
    tokens = [usage.get(key, 0) for key in ("prompt_tokens", "completion_tokens")]
    if not all(isinstance(count, int) and not isinstance(count, bool) for count in tokens):
        raise bad('"usage" token counts must be integers')
    cost = data.get("cost", 0.0)
    if not isinstance(cost, (int, float)) or isinstance(cost, bool):
        raise bad('"cost" must be a number')
    return CassetteEntry(response, group, round_, str(data.get("model", "")),
                         tokens[0], tokens[1], float(cost), number)


class ReplayFixer:
    """Answer from a cassette: the first unused entry that matches the bug and round.

    It stands in for the model that recorded the cassette, so it renders the prompt that
    model would have been sent: its size is reported like a live prompt's, and the
    proposal carries it marked as not sent, with the cassette line it answers from."""

    def __init__(self, path: Path | str, *, prompts_dir: Path | None = None) -> None:
        self.path = Path(path)
        self.prompts_dir = prompts_dir
        self.entries = load_cassette(self.path)
        self.name = f"replay:{path}"
        self.free = True  # answers come from a file
        self._used: set[int] = set()
        self._lock = threading.Lock()

    def propose(self, request: ProposalRequest) -> Proposal:
        group_id = request.context.group_id
        with self._lock:
            index = next(
                (i for i, entry in enumerate(self.entries)
                 if i not in self._used and entry.matches(group_id, request.round)),
                None,
            )
            if index is None:
                raise FixerError(
                    f"replay cassette {self.path} has no answer left for {group_id} "
                    f"(round {request.round}); it holds {len(self.entries)} entries"
                )
            self._used.add(index)
        entry = self.entries[index]
        try:
            messages = render_messages(request, prompts_dir=self.prompts_dir)
        except PromptError as error:
            raise FixerError(f"{self.name}: {error}") from None
        usage = Usage(1, entry.prompt_tokens, entry.completion_tokens, entry.cost, 0.0,
                      prompt_chars=sum(len(message["content"]) for message in messages))
        proposal = read_answer(entry.response, usage=usage, source=self.name)
        recorded = f" (recorded from {entry.model})" if entry.model else ""
        return replace(proposal, messages=as_messages(messages),
                       origin=f"replayed from {self.path} line {entry.line}{recorded}")


class RecordingFixer:
    """Wrap a live fixer and append each of its answers to a cassette.

    The append happens under a file lock, so xdist workers and parallel sessions can
    record to one cassette without interleaving lines. Answers are redacted first: a
    model that echoes a secret does not put it into a file meant to be committed.
    """

    def __init__(self, inner: Fixer, path: Path | str) -> None:
        self.inner = inner
        self.free = is_free(inner)
        self.path = Path(path)
        self.name = inner.name

    def propose(self, request: ProposalRequest) -> Proposal:
        proposal = self.inner.propose(request)
        model = getattr(self.inner, "model", "") or self.inner.name
        entry = CassetteEntry(
            redact(proposal.raw),
            group_pattern(request.context.group_id),
            request.round,
            str(model),
            proposal.usage.prompt_tokens,
            proposal.usage.completion_tokens,
            proposal.usage.cost,
        )
        append_entry(self.path, entry)
        return proposal


def append_entry(path: Path, entry: CassetteEntry) -> None:
    """Add one line to a cassette; a lock file beside it keeps writers from interleaving."""
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    # ASCII escapes keep any text (even lone surrogates) exact through a round trip.
    line = json.dumps(entry.to_json(), ensure_ascii=True) + "\n"
    with FileLock(f"{path}.lock"), path.open("a", encoding="utf-8") as handle:
        handle.write(line)
