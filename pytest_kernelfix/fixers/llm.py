"""The live fixer: render the prompt, ask a model through litellm, parse the answer.

litellm is imported on the first call only (it takes seconds and, unless told
otherwise, downloads its price list at import). Retries are done here rather than by
litellm's ``num_retries``: its retry path needs ``tenacity``, which litellm does not
install, and without it the real error is replaced by "tenacity import failed". Doing it
here also makes every provider retry alike and honour ``Retry-After``.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any

from pytest_kernelfix.fixers.answer import read_answer
from pytest_kernelfix.fixers.base import (
    FixerError,
    Proposal,
    ProposalRequest,
    Usage,
    as_messages,
)
from pytest_kernelfix.fixers.prompting import PromptError, render_messages
from pytest_kernelfix.redact import MARKER, redact

_NO_EXTRA: Mapping[str, object] = MappingProxyType({})
#: Arguments the fixer owns; ``extra`` may not override them.
_RESERVED = frozenset({"model", "messages", "stream", "num_retries", "max_retries"})
_MAX_RETRY_AFTER = 60.0
_MAX_BACKOFF = 30.0
_MAX_DETAIL = 200
#: litellm's own loggers: each has a stderr handler of its own and also propagates.
LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")
#: The variables litellm reads, in this order, for the base URL of an ``openai/`` model.
OPENAI_BASE_VARIABLES = ("OPENAI_BASE_URL", "OPENAI_API_BASE")


def import_litellm() -> Any:
    """litellm, imported offline-safe (the bundled price list instead of a download) and
    quiet (:func:`quiet_logging`)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm: Any = importlib.import_module("litellm")
    litellm.suppress_debug_info = True  # no "Give Feedback / Get Help" banners in pytest output
    quiet_logging()
    return litellm


def quiet_logging(environ: Mapping[str, str] | None = None) -> None:
    """litellm's INFO lines kept out of the session's output unless asked for.

    Its loggers write to stderr through a handler of their own *and* propagate to the
    root logger, so a project that shows INFO logs (``log_cli_level = INFO``) saw every
    line twice, two per call. A logger left at ``NOTSET`` is set to WARNING; a level set
    by the user (in a conftest) or ``LITELLM_LOG`` (litellm's own switch) is kept.
    """
    if (environ if environ is not None else os.environ).get("LITELLM_LOG", "").strip():
        return
    for name in LITELLM_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


@dataclass(frozen=True)
class Endpoint:
    """Where a litellm model's requests go: ``url`` ("" for the provider's own public
    service) and where that URL was set (``source``: an option, a variable, a default)."""

    url: str = ""
    source: str = ""

    def __str__(self) -> str:
        return f"{self.url} (from {self.source})" if self.source else self.url


def resolve_endpoint(model: str, api_base: str = "", source: str = "--kernelfix-api-base",
                     environ: Mapping[str, str] | None = None) -> Endpoint:
    """The endpoint ``model`` is called at, as litellm resolves it.

    ``api_base`` (the option, from ``source``) wins. Otherwise the provider's own
    settings count: for ``openai/`` models ``OPENAI_BASE_URL`` then ``OPENAI_API_BASE``
    (litellm's order); for others the base litellm derives from the model and the
    environment (``HOSTED_VLLM_API_BASE``, ``OLLAMA_API_BASE``, ollama's local default).
    An unknown provider, or one served from its public endpoint, gives no URL.
    """
    if api_base:
        return Endpoint(api_base, source)
    env = environ if environ is not None else os.environ
    litellm = import_litellm()
    try:
        _, provider, _, derived = litellm.get_llm_provider(model=model)
    except Exception:
        return Endpoint()
    if provider == "openai":
        for name in OPENAI_BASE_VARIABLES:
            if env.get(name, "").strip():
                return Endpoint(env[name].strip(), name)
        return Endpoint()
    if not derived:
        return Endpoint()
    named = next((name for name, value in env.items() if value.strip() == derived
                  and name.endswith(("_API_BASE", "_BASE_URL"))), "")
    return Endpoint(derived, named or f"{provider}'s default")


class LLMFixer:
    """Ask ``model`` (any litellm model string) for search/replace edits."""

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        timeout: float = 120,
        num_retries: int = 2,
        prompts_dir: Path | None = None,
        extra: Mapping[str, object] = _NO_EXTRA,
    ) -> None:
        if not model.strip():
            raise ValueError("LLMFixer needs a model string such as 'openai/gpt-4o'")
        clash = sorted(_RESERVED & set(extra))
        if clash:
            raise ValueError(f"extra litellm arguments may not set {', '.join(clash)}")
        if prompts_dir is not None and not Path(prompts_dir).is_dir():
            raise ValueError(f"prompts directory {prompts_dir} does not exist")
        if num_retries < 0:
            raise ValueError(f"num_retries must be >= 0, got {num_retries}")
        self.model = model.strip()
        self.api_base = api_base or None
        self.timeout = float(timeout)
        self.num_retries = num_retries
        self.prompts_dir = prompts_dir
        self.extra = dict(extra)
        self.name = f"litellm:{self.model}"

    def propose(self, request: ProposalRequest) -> Proposal:
        try:
            messages = render_messages(request, prompts_dir=self.prompts_dir)
        except PromptError as exc:
            raise FixerError(f"{self.name}: {exc}") from None
        litellm = import_litellm()
        started = time.monotonic()
        response = self._complete(litellm, messages)
        seconds = time.monotonic() - started
        prompt_tokens, completion_tokens = _tokens(response)
        sent = sum(len(message["content"]) for message in messages)
        usage = Usage(1, prompt_tokens, completion_tokens, _cost(litellm, response), seconds,
                      prompt_chars=sent)
        proposal = read_answer(_content(response), usage=usage, source=self.name)
        return replace(proposal, messages=as_messages(messages), sent=True)

    def call_arguments(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        """The keyword arguments of ``litellm.completion`` for one attempt."""
        arguments: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "timeout": self.timeout,
            "num_retries": 0,  # one HTTP request per attempt: the retries are ours
            "drop_params": True,
            "temperature": 0,
        }
        if self.api_base:
            arguments["api_base"] = self.api_base
            if self.model.startswith("openai/") and not _openai_key_configured(self.extra):
                # A local OpenAI-compatible server (vLLM, llama.cpp) usually wants no key,
                # but the openai client refuses to send a request without one.
                arguments["api_key"] = "EMPTY"
        arguments.update(self.extra)
        return arguments

    def _complete(self, litellm: ModuleType, messages: list[dict[str, str]]) -> Any:
        arguments = self.call_arguments(messages)
        attempts = self.num_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return litellm.completion(**arguments)
            except Exception as exc:
                failure = classify(litellm, exc)
                if not failure.retryable or attempt == attempts:
                    raise FixerError(self._reason(failure, attempt, exc),
                                     messages=as_messages(messages),
                                     ends_session=failure.ends_session) from None
                if failure.backoff:
                    time.sleep(retry_delay(exc, attempt))
        raise AssertionError("unreachable")  # pragma: no cover

    def _reason(self, failure: Failure, attempts: int, exc: BaseException) -> str:
        tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
        detail = _detail(exc)
        key = self.extra.get("api_key")
        if isinstance(key, str) and key:
            detail = detail.replace(key, MARKER)
        reason = f"{self.name}: {failure.kind} after {tries}"
        if self.api_base and failure.kind == "connection failed":  # say which server
            reason += f" to {self.api_base}"
        return f"{reason}: {detail}" if detail else reason


@dataclass(frozen=True)
class Failure:
    """What kind of API failure happened, in words, and whether trying again may help."""

    kind: str
    retryable: bool
    backoff: bool = True  # False after a timeout: the waiting is already done
    #: Every later call would fail the same way (no connection, a refused key, no such
    #: model): the session stops asking once retries are spent.
    ends_session: bool = False


def classify(litellm: ModuleType, exc: BaseException) -> Failure:
    """Name a litellm exception for a one-line report; decide whether to retry it."""
    errors = litellm.exceptions
    status = getattr(exc, "status_code", None)
    http = f" (HTTP {status})" if isinstance(status, int) else ""
    message = str(exc)
    # Providers differ in which exception class a status becomes: check both.
    if isinstance(exc, errors.Timeout) or status == 408:
        return Failure("timeout", True, backoff=False)
    if isinstance(exc, errors.RateLimitError) or status == 429:
        return Failure(f"rate limited{http}", True)
    if isinstance(exc, (errors.AuthenticationError, errors.PermissionDeniedError)) or (
        status in (401, 403)
    ):
        return Failure(f"authentication failed{http}", False, ends_session=True)
    if isinstance(exc, errors.ContextWindowExceededError):
        return Failure("prompt too long for the model's context window", False)
    if isinstance(exc, errors.NotFoundError) or status == 404:
        return Failure(f"model or endpoint not found{http}", False, ends_session=True)
    if isinstance(exc, (errors.BadRequestError, errors.UnprocessableEntityError)):
        return Failure(f"request rejected{http}", False)
    if isinstance(exc, errors.APIConnectionError) or re.search(
        r"Connection (refused|error)|connect error|Name or service not known", message, re.I
    ):
        return Failure("connection failed", True, ends_session=True)
    if re.search(r"Missing credentials|api_key client option must be set", message):
        return Failure("no API key configured", False, ends_session=True)
    if isinstance(status, int) and status >= 500:
        return Failure(f"server error{http}", True)
    if isinstance(exc, errors.APIError):
        return Failure(f"API error{http}", False)
    return Failure(f"unexpected {type(exc).__name__}", False)


def retry_delay(exc: BaseException, attempt: int) -> float:
    """Seconds to wait before the next attempt: the server's ``Retry-After`` or backoff."""
    headers = getattr(exc, "litellm_response_headers", None) or getattr(
        getattr(exc, "response", None), "headers", None
    )
    if headers is not None:
        for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
            try:
                value = float(headers.get(name)) * scale
            except (TypeError, ValueError, AttributeError):
                continue
            if 0 <= value <= _MAX_RETRY_AFTER:
                return value
    return float(min(2 ** (attempt - 1), _MAX_BACKOFF))


def _detail(exc: BaseException) -> str:
    """The provider's own words, one line, without litellm's repeated class prefixes."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    previous = None
    while previous != text:
        previous = text
        text = re.sub(r"^(litellm\.)?\w*(Error|Exception|Timeout):\s*", "", text)
    text = redact(text)
    return text if len(text) <= _MAX_DETAIL else text[: _MAX_DETAIL - 3] + "..."


def _openai_key_configured(extra: Mapping[str, object]) -> bool:
    if extra.get("api_key") or os.environ.get("OPENAI_API_KEY"):
        return True
    litellm = import_litellm()
    return bool(litellm.api_key or litellm.openai_key)


def _content(response: Any) -> str:
    try:
        content = response.choices[0].message.content
    except (AttributeError, IndexError, KeyError, TypeError):
        return ""
    return content if isinstance(content, str) else ""


def _tokens(response: Any) -> tuple[int, int]:
    usage = getattr(response, "usage", None)
    prompt = getattr(usage, "prompt_tokens", 0) or 0
    completion = getattr(usage, "completion_tokens", 0) or 0
    return int(prompt), int(completion)


def _cost(litellm: ModuleType, response: Any) -> float:
    """Dollars for this answer from litellm's price list; 0.0 for unpriced (local) models."""
    try:
        cost = litellm.completion_cost(completion_response=response)
    except Exception:
        return 0.0
    return float(cost) if isinstance(cost, (int, float)) else 0.0
