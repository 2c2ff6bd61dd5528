"""LLMFixer through litellm over real HTTP to the fake OpenAI-compatible server."""

from __future__ import annotations

import http.client
import json
from pathlib import Path

import pytest
from fake_llm import (
    GELU_ANSWER,
    Delay,
    FakeLLM,
    Hangup,
    Reply,
    Status,
    answer,
    closed_port_url,
    empty,
    huge,
    malformed,
    sample_request,
)

from pytest_kernelfix.fixers.answer import MAX_ANSWER_CHARS
from pytest_kernelfix.fixers.base import FixerError
from pytest_kernelfix.fixers.factory import build_fixer
from pytest_kernelfix.fixers.llm import (
    LITELLM_LOGGERS,
    Endpoint,
    LLMFixer,
    import_litellm,
    quiet_logging,
    resolve_endpoint,
)
from pytest_kernelfix.fixers.prompting import render_messages
from pytest_kernelfix.fixers.recipes import RecipeFixer
from pytest_kernelfix.fixers.replay import RecordingFixer, ReplayFixer

MODEL = "openai/fake-model"
KEY = "sk-kernelfix-test-0123456789abcdef"


def fixer_for(
    fake: FakeLLM, model: str = MODEL, *, timeout: float = 120, num_retries: int = 0
) -> LLMFixer:
    return LLMFixer(model, api_base=fake.url, timeout=timeout, num_retries=num_retries,
                    extra={"api_key": KEY})


def test_an_answer_becomes_modifications_with_tokens(fake_llm: FakeLLM) -> None:
    fake_llm.script(answer(GELU_ANSWER, prompt_tokens=812, completion_tokens=144))
    request = sample_request()
    proposal = fixer_for(fake_llm).propose(request)

    assert proposal.parse_error == ""
    assert proposal.raw == GELU_ANSWER
    assert proposal.analysis == "Triton 3.x has no tl.tanh."
    [edit] = proposal.modifications
    assert edit.file == "kernels/gelu.py"
    assert edit.old_string == "    y = 0.5 * x * (1.0 + tl.tanh(u))"
    assert "tl.sigmoid" in edit.new_string
    assert (proposal.usage.calls, proposal.usage.prompt_tokens) == (1, 812)
    assert proposal.usage.completion_tokens == 144
    assert proposal.usage.cost == 0.0  # fake-model has no price
    assert proposal.usage.seconds > 0
    assert proposal.source == "litellm:openai/fake-model"
    # What went over the wire: the rendered prompt, the provider's model name, the key.
    [body] = fake_llm.requests
    assert body["messages"] == render_messages(request)
    assert body["model"] == "fake-model"
    assert body["temperature"] == 0
    assert fake_llm.headers[0]["Authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("spelling", ["authorization", "Authorization", "AUTHORIZATION"])
def test_the_fake_server_reads_header_names_in_any_case(fake_llm: FakeLLM, spelling: str) -> None:
    # HTTP header names have no case, and clients differ in the spelling they send.
    fake_llm.script(answer("{}"))
    connection = http.client.HTTPConnection("127.0.0.1", fake_llm.port, timeout=30)
    try:  # http.client sends a header name as spelled (urllib would capitalise it)
        connection.request("POST", "/v1/chat/completions", body=b"{}",
                           headers={spelling: "Bearer abc", "Content-Type": "application/json"})
        assert connection.getresponse().status == 200
    finally:
        connection.close()
    [headers] = fake_llm.headers
    assert headers["Authorization"] == headers["authorization"] == "Bearer abc"


def test_a_server_error_is_retried(fake_llm: FakeLLM) -> None:
    fake_llm.script(Status(500, "overloaded"), answer(GELU_ANSWER))
    proposal = fixer_for(fake_llm, num_retries=2).propose(sample_request())
    assert len(proposal.modifications) == 1
    assert len(fake_llm.requests) == 2
    assert fake_llm.requests[0] == fake_llm.requests[1]


def test_persistent_server_errors_end_in_a_fixer_error(fake_llm: FakeLLM) -> None:
    fake_llm.script(*[Status(500, "overloaded")] * 5)
    with pytest.raises(FixerError) as info:
        fixer_for(fake_llm, num_retries=2).propose(sample_request())
    message = str(info.value)
    assert message.startswith("litellm:openai/fake-model: server error (HTTP 500) after 3 attempts")
    assert "overloaded" in message
    assert "\n" not in message and "Traceback" not in message
    assert len(fake_llm.requests) == 3


def test_rate_limit_is_retried_then_reported(fake_llm: FakeLLM) -> None:
    fake_llm.script(Status(429, "Rate limit reached for requests"),
                    Status(429, "Rate limit reached for requests"))
    with pytest.raises(FixerError, match=r"fake-model: rate limited \(HTTP 429\) after 2 attempts"):
        fixer_for(fake_llm, num_retries=1).propose(sample_request())
    assert len(fake_llm.requests) == 2


def test_a_slow_server_times_out(fake_llm: FakeLLM) -> None:
    fake_llm.script(Delay(30))
    with pytest.raises(FixerError, match=r"fake-model: timeout after 1 attempt"):
        fixer_for(fake_llm, timeout=0.3).propose(sample_request())


def test_a_timeout_is_retried(fake_llm: FakeLLM) -> None:
    fake_llm.script(Delay(30), answer(GELU_ANSWER))
    proposal = fixer_for(fake_llm, timeout=1.5, num_retries=1).propose(sample_request())
    assert len(proposal.modifications) == 1
    assert len(fake_llm.requests) == 2


def test_connection_refused() -> None:
    url = closed_port_url()
    fixer = LLMFixer(MODEL, api_base=url, num_retries=0, extra={"api_key": KEY})
    with pytest.raises(FixerError, match=r"fake-model: connection failed after 1 attempt") as info:
        fixer.propose(sample_request())
    assert f"after 1 attempt to {url}: " in str(info.value)  # which server, by its URL
    assert info.value.ends_session  # no later request can do better


def test_a_server_that_goes_away_ends_the_session_after_its_retries(fake_llm: FakeLLM) -> None:
    fake_llm.script(Hangup())
    with pytest.raises(FixerError) as info:
        fixer_for(fake_llm, num_retries=1).propose(sample_request())
    assert str(info.value).startswith(
        f"litellm:openai/fake-model: connection failed after 2 attempts to {fake_llm.url}: ")
    assert info.value.ends_session and len(fake_llm.requests) == 1  # the retry was refused


@pytest.mark.parametrize(("status", "ends"), [(401, True), (404, True), (429, False),
                                              (500, False)])
def test_only_failures_every_later_call_would_repeat_end_the_session(
    fake_llm: FakeLLM, status: int, ends: bool
) -> None:
    fake_llm.script(Status(status))
    with pytest.raises(FixerError) as info:
        fixer_for(fake_llm).propose(sample_request())
    assert info.value.ends_session is ends


def test_an_endpoint_set_only_by_the_providers_variable_is_the_one_called(
    fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """OPENAI_API_BASE alone, as litellm reads it: called without a key (a local server),
    and the answer cache is keyed on it."""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNELFIX_API_BASE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_API_BASE", fake_llm.url)
    assert resolve_endpoint(MODEL) == Endpoint(fake_llm.url, "OPENAI_API_BASE")
    assert resolve_endpoint(MODEL, "http://h/v1", "KERNELFIX_API_BASE") == Endpoint(
        "http://h/v1", "KERNELFIX_API_BASE")  # the plugin's own setting wins
    assert resolve_endpoint("anthropic/claude-sonnet-4-5") == Endpoint()  # its public API
    fake_llm.script(answer(GELU_ANSWER))
    fixer = build_fixer(MODEL, cache_dir=tmp_path, num_retries=0)
    assert fixer.identity["api_base"] == fake_llm.url  # type: ignore[attr-defined]
    assert len(fixer.propose(sample_request()).modifications) == 1
    assert fake_llm.headers[0]["Authorization"] == "Bearer EMPTY"
    monkeypatch.setenv("OPENAI_API_BASE", "http://another-server:8000/v1")
    other = build_fixer(MODEL, cache_dir=tmp_path, num_retries=0)
    assert other.identity["api_base"] == "http://another-server:8000/v1"  # type: ignore[attr-defined]


def test_litellms_own_logging_is_quiet_unless_asked_for() -> None:
    import logging

    import_litellm()
    loggers = [logging.getLogger(name) for name in LITELLM_LOGGERS]
    assert all(logger.level == logging.WARNING for logger in loggers)
    saved = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.NOTSET)
        quiet_logging({"LITELLM_LOG": "INFO"})  # litellm's own switch: left as set
        assert all(logger.level == logging.NOTSET for logger in loggers)
        loggers[0].setLevel(logging.DEBUG)  # a level a conftest chose is kept
        quiet_logging({})
        assert [logger.level for logger in loggers] == [logging.DEBUG, logging.WARNING,
                                                        logging.WARNING]
    finally:
        for logger, level in zip(loggers, saved, strict=True):
            logger.setLevel(level)


def test_authentication_errors_are_not_retried_and_never_show_the_key(
    fake_llm: FakeLLM,
) -> None:
    fake_llm.script(Status(401, f"Incorrect API key provided: {KEY}"), answer(GELU_ANSWER))
    with pytest.raises(FixerError) as info:
        fixer_for(fake_llm, num_retries=2).propose(sample_request())
    assert "authentication failed (HTTP 401) after 1 attempt" in str(info.value)
    assert KEY not in str(info.value) and "Incorrect API key provided" in str(info.value)
    assert len(fake_llm.requests) == 1


@pytest.mark.parametrize(
    ("status", "message", "kind"),
    [
        (400, "Unrecognized request argument supplied: foo", "request rejected (HTTP 400)"),
        (400, "This model's maximum context length is 8192 tokens. However, your messages "
              "resulted in 9100 tokens.", "prompt too long for the model's context window"),
        (403, "Project does not have access to model", "authentication failed (HTTP 403)"),
        (404, "The model `fake-model` does not exist", "model or endpoint not found (HTTP 404)"),
    ],
    ids=["bad-request", "context-window", "forbidden", "not-found"],
)
def test_client_errors_are_reported_without_retrying(
    fake_llm: FakeLLM, status: int, message: str, kind: str
) -> None:
    fake_llm.script(Status(status, message), answer(GELU_ANSWER))
    with pytest.raises(FixerError) as info:
        fixer_for(fake_llm, num_retries=2).propose(sample_request())
    assert str(info.value).startswith(f"litellm:openai/fake-model: {kind} after 1 attempt: ")
    assert len(fake_llm.requests) == 1


def test_a_malformed_response_body_is_an_api_failure(fake_llm: FakeLLM) -> None:
    fake_llm.script(malformed())
    with pytest.raises(FixerError, match="fake-model: server error"):
        fixer_for(fake_llm).propose(sample_request())


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (empty(), "The answer was empty"),
        (Reply(None), "The answer was empty"),
        (answer("I think the kernel is fine."), "No edits were found"),
        (huge(MAX_ANSWER_CHARS + 1), "answer too large"),
    ],
    ids=["empty", "null-content", "prose", "huge"],
)
def test_unreadable_answers_become_parse_errors(
    fake_llm: FakeLLM, reply: Reply, expected: str
) -> None:
    fake_llm.script(reply)
    proposal = fixer_for(fake_llm).propose(sample_request())
    assert expected in proposal.parse_error
    assert proposal.modifications == ()
    assert proposal.raw == (reply.content or "")
    assert proposal.usage.calls == 1


def test_a_decline_written_only_in_the_analysis_is_read_as_one(fake_llm: FakeLLM) -> None:
    text = json.dumps({"analysis": "This is not a kernel bug: the test compares against a "
                                   "float64 reference with an fp16 tolerance.",
                       "modifications": []})
    fake_llm.script(answer(text))
    proposal = fixer_for(fake_llm).propose(sample_request())
    assert proposal.not_a_kernel_bug.startswith("This is not a kernel bug: the test compares")
    assert proposal.declined and not proposal.parse_error


def test_an_answer_without_edits_or_request_is_read_as_declining(fake_llm: FakeLLM) -> None:
    """A well-formed answer with no edits is the model's word, not an unreadable answer."""
    text = '{"analysis": "nothing to do", "modifications": []}'
    fake_llm.script(answer(text))
    proposal = fixer_for(fake_llm).propose(sample_request())
    assert proposal.declined and proposal.parse_error == ""
    assert proposal.analysis == "nothing to do" and proposal.raw == text
    fake_llm.script(answer('{"modifications": [], "need": ["search: BLOCK_SIZE_N"]}'))
    asking = fixer_for(fake_llm).propose(sample_request())
    assert asking.need == ("search: BLOCK_SIZE_N",) and not asking.declined


def test_cost_comes_from_litellm_prices_for_known_models(fake_llm: FakeLLM) -> None:
    fake_llm.script(Reply(GELU_ANSWER, prompt_tokens=1000, completion_tokens=200,
                          model="gpt-4o-mini"))
    proposal = fixer_for(fake_llm, model="openai/gpt-4o-mini").propose(sample_request())
    price = import_litellm().model_cost["gpt-4o-mini"]
    expected = 1000 * price["input_cost_per_token"] + 200 * price["output_cost_per_token"]
    assert expected > 0
    assert proposal.usage.cost == pytest.approx(expected)


def test_a_keyless_local_server_gets_a_placeholder_key(
    fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    fake_llm.script(answer(GELU_ANSWER))
    LLMFixer(MODEL, api_base=fake_llm.url, num_retries=0).propose(sample_request())
    assert fake_llm.headers[0]["Authorization"] == "Bearer EMPTY"


def test_extra_arguments_reach_the_request(fake_llm: FakeLLM) -> None:
    fake_llm.script(answer(GELU_ANSWER))
    fixer = LLMFixer(MODEL, api_base=fake_llm.url, num_retries=0,
                     extra={"api_key": KEY, "temperature": 0.2, "max_tokens": 4096})
    fixer.propose(sample_request())
    assert (fake_llm.requests[0]["temperature"], fake_llm.requests[0]["max_tokens"]) == (0.2, 4096)


def test_a_broken_prompt_override_is_a_fixer_error(tmp_path: Path) -> None:
    (tmp_path / "fix.j2").write_text("{{ no_such_variable }}\n")
    fixer = LLMFixer(MODEL, api_base="http://127.0.0.1:9/v1", prompts_dir=tmp_path)
    with pytest.raises(FixerError, match=r"fix\.j2, line 1: 'no_such_variable' is undefined"):
        fixer.propose(sample_request())


def test_invalid_configuration_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="may not set messages, model"):
        LLMFixer(MODEL, extra={"model": "x", "messages": []})
    with pytest.raises(ValueError, match="does not exist"):
        LLMFixer(MODEL, prompts_dir=tmp_path / "missing")


def test_build_fixer_picks_the_fixer_from_the_model_string(tmp_path: Path) -> None:
    cassette = tmp_path / "c.jsonl"
    cassette.write_text(json.dumps({"response": GELU_ANSWER}) + "\n")
    assert isinstance(build_fixer("recipes"), RecipeFixer)
    replay = build_fixer(f"replay:{cassette}")
    assert isinstance(replay, ReplayFixer) and replay.path == cassette
    live = build_fixer("anthropic/claude-sonnet-4-5", api_base="", timeout=30, num_retries=1)
    assert isinstance(live, LLMFixer)
    assert (live.model, live.api_base, live.timeout, live.num_retries) == (
        "anthropic/claude-sonnet-4-5", None, 30.0, 1)
    recording = build_fixer("ollama/qwen2.5-coder", record=tmp_path / "out.jsonl")
    assert isinstance(recording, RecordingFixer) and isinstance(recording.inner, LLMFixer)


@pytest.mark.parametrize("model", ["", "   "])
def test_build_fixer_without_a_model_says_how_to_set_one(model: str) -> None:
    with pytest.raises(ValueError, match=r"--kernelfix-model \(or set KERNELFIX_MODEL\)"):
        build_fixer(model)


def test_build_fixer_refuses_to_record_a_replay(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a live model"):
        build_fixer("recipes", record=tmp_path / "out.jsonl")
