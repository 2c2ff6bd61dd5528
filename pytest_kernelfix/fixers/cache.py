"""The answer cache: a CI re-run of the same red commit does not pay the model again.

A :class:`CachingFixer` wraps a live fixer. Before it asks, it looks the round up by a
key made of what decides the answer, and only that:

- who answers: the model string, the endpoint the calls go to (the API base as litellm
  resolves it: ``--kernelfix-api-base``, else ``OPENAI_API_BASE`` and the like), the
  prompt templates (packaged and ``--kernelfix-prompts-dir``) and the cache format;
- the bug: its normalised error signature (numbers and addresses replaced, so unseeded
  tests that print different values in their messages still hit);
- what the round sees: a hash of every editable file as the round shows it, and of the
  read-only test files;
- where the bug is: the round, and a hash of each answer this bug got in earlier rounds.

The full prompt text is *not* in the key: it holds the error log, whose numbers change
from run to run. A hit is parsed exactly as a live answer and costs nothing: its usage
is one cache hit, no call, no token, no dollar. Every answer that could be read is
stored: edits, a request for more code (``need``), a decline; a garbled answer is asked
again next time. Entries are JSON
files written atomically under a file lock, so parallel jobs may share one directory;
an unreadable entry is a miss, and a failed write costs only the saving.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from pytest_kernelfix.atomic import replace_file
from pytest_kernelfix.fields import FieldError, read
from pytest_kernelfix.fixers.answer import read_answer
from pytest_kernelfix.fixers.base import Fixer, Proposal, ProposalRequest, Usage, is_free
from pytest_kernelfix.locate.context import SourceFile
from pytest_kernelfix.redact import redact

#: Bumped when the key or the entry format changes: older entries then simply miss.
CACHE_FORMAT = 1
#: The folder of the answers inside the cache directory.
ANSWERS_DIR = "answers"
_PROMPTS_PACKAGE = "pytest_kernelfix.prompts"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _file_hashes(files: Iterable[SourceFile]) -> list[list[str]]:
    return sorted([view.path, _sha(view.text)] for view in files)


def prompts_digest(prompts_dir: Path | None) -> str:
    """One hash of every template a prompt can be rendered from: edit one, miss."""
    digest = hashlib.sha256()
    packaged = resources.files(_PROMPTS_PACKAGE)
    for entry in sorted(packaged.iterdir(), key=lambda item: item.name):
        if entry.name.endswith(".j2"):
            digest.update(f"packaged/{entry.name}\0".encode() + entry.read_bytes() + b"\0")
    if prompts_dir is not None and Path(prompts_dir).is_dir():
        for path in sorted(Path(prompts_dir).glob("*.j2")):
            digest.update(f"user/{path.name}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()


def answer_key(
    request: ProposalRequest, *, identity: Mapping[str, str], earlier: Mapping[int, str]
) -> str:
    """The cache key of one round (see the module docstring for what goes in)."""
    context = request.context
    parts: dict[str, Any] = {
        "format": CACHE_FORMAT,
        "identity": dict(sorted(identity.items())),
        "signature": context.error.signature(),
        "round": request.round,
        "files": _file_hashes(request.files),
        "tests": _file_hashes(context.tests),
        "earlier": [[number, earlier[number]] for number in sorted(earlier)
                    if number < request.round],
    }
    return _sha(json.dumps(parts, sort_keys=True))


@dataclass(frozen=True)
class _Tokens:
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class _Entry:
    """An answer as it is stored (:meth:`CachedAnswer.to_json`)."""

    format: int
    response: str
    usage: _Tokens
    model: str = ""
    cost: float = 0.0


@dataclass(frozen=True)
class CachedAnswer:
    """One stored answer: the raw text (redacted) and what it cost when it was bought."""

    raw: str
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "format": CACHE_FORMAT,
            "model": self.model,
            "response": self.raw,
            "usage": {"prompt_tokens": self.prompt_tokens,
                      "completion_tokens": self.completion_tokens},
            "cost": self.cost,
        }

    @classmethod
    def from_json(cls, data: Any) -> CachedAnswer | None:
        """The entry, or None when it is not one this version wrote."""
        if not isinstance(data, dict) or data.get("format") != CACHE_FORMAT:
            return None
        try:
            entry = read(_Entry, data)
        except FieldError:
            return None
        return cls(entry.response, entry.model, entry.usage.prompt_tokens,
                   entry.usage.completion_tokens, entry.cost)


class AnswerCache:
    """Answers on disk, one JSON file per key, under ``<cache dir>/answers``."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    def path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def load(self, key: str) -> CachedAnswer | None:
        try:
            text = self.path(key).read_text(encoding="utf-8")
            return CachedAnswer.from_json(json.loads(text))
        except (OSError, ValueError):
            return None

    def store(self, key: str, answer: CachedAnswer) -> bool:
        """Write one entry; False (nothing lost but the saving) when the disk refuses.

        Each write is a whole new file put in place by one rename, so parallel jobs need
        no lock: a reader sees the old entry or the new one, and the last writer wins.
        """
        data = json.dumps(answer.to_json(), ensure_ascii=True, indent=1) + "\n"
        try:
            replace_file(self.path(key), data.encode("ascii"), mode=0o644)
        except OSError:
            return False
        return True


def _storable(proposal: Proposal) -> bool:
    """Every answer that could be read: edits, a request for more code (``need``: a
    re-run would pay for it again), a decline. A garbled answer is asked again."""
    return bool(proposal.raw.strip()) and not proposal.parse_error


class CachingFixer:
    """Answer from the cache when the round was answered before; else ask and store."""

    def __init__(self, inner: Fixer, cache: AnswerCache, identity: Mapping[str, str]) -> None:
        self.inner = inner
        self.free = is_free(inner)
        self.cache = cache
        self.identity = dict(identity)
        self.name = inner.name
        self.model = str(getattr(inner, "model", "") or inner.name)
        self._earlier: dict[str, dict[int, str]] = {}

    def propose(self, request: ProposalRequest) -> Proposal:
        group = request.context.group_id
        if request.round == 1:
            self._earlier[group] = {}  # a bug starts over at round 1
        earlier = self._earlier.setdefault(group, {})
        key = answer_key(request, identity=self.identity, earlier=earlier)
        cached = self.cache.load(key)
        if cached is not None:
            proposal = replace(
                read_answer(cached.raw, usage=Usage(cache_hits=1), source=self.name),
                origin=f"the answer cache ({self.cache.path(key)}); no model was asked")
        else:
            proposal = self.inner.propose(request)
        raw = redact(proposal.raw)
        if cached is None and _storable(proposal):
            usage = proposal.usage
            self.cache.store(key, CachedAnswer(
                raw, self.model, usage.prompt_tokens, usage.completion_tokens, usage.cost))
        earlier[request.round] = _sha(raw)
        return proposal


def caching(inner: Fixer, directory: Path, *, model: str, api_base: str | None,
            prompts_dir: Path | None) -> CachingFixer:
    """``inner`` behind the answer cache in ``directory`` (the cache dir, not its subfolder)."""
    from pytest_kernelfix import __version__

    identity = {
        "model": model,
        "api_base": api_base or "",
        "prompts": prompts_digest(prompts_dir),
        "plugin": __version__,
    }
    return CachingFixer(inner, AnswerCache(Path(directory) / ANSWERS_DIR), identity)
