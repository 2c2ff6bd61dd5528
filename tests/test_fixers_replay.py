"""Cassettes: record live answers over HTTP, replay them offline to the same proposals."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from fake_llm import GELU_ANSWER, FakeLLM, Status, answer, sample_request

from pytest_kernelfix.fixers.base import FixerError, Proposal, Usage
from pytest_kernelfix.fixers.llm import LLMFixer
from pytest_kernelfix.fixers.replay import (
    CassetteEntry,
    CassetteError,
    RecordingFixer,
    ReplayFixer,
    append_entry,
    group_pattern,
)

KEY = "sk-kernelfix-test-0123456789abcdef"
#: Awkward text a cassette must keep byte for byte: CRLF, tabs, unicode line
#: separators, quotes, backslashes, a lone surrogate, non-ASCII.
TRICKY = 'x\r\n\t"q" \\n \u2028 \u00e9 \U0001f600 \ud800 end'


def comparable(proposal: Proposal) -> Proposal:
    """What a replay reproduces: all but the timing and where the answer came from (a
    replay renders the same prompt but sends it nowhere)."""
    return replace(proposal, usage=replace(proposal.usage, seconds=0.0), source="",
                   sent=False, origin="")


def test_a_recorded_heal_replays_identically(fake_llm: FakeLLM, tmp_path: Path) -> None:
    cassette = tmp_path / "cassettes" / "heal.jsonl"
    # Two bugs, interleaved; ids with fnmatch metacharacters must still match themselves.
    gelu, softmax = "gelu_kernel-1f2e", "softmax_kernel[fp16-*]?"
    requests = [sample_request(1, gelu), sample_request(1, softmax), sample_request(2, gelu)]
    answers = [GELU_ANSWER, "no JSON here " + TRICKY, GELU_ANSWER.replace("2 * u", "2.0 * u")]
    fake_llm.script(*(answer(text, prompt_tokens=900 + i, completion_tokens=100 + i)
                      for i, text in enumerate(answers)))
    live = LLMFixer("openai/fake-model", api_base=fake_llm.url, num_retries=0,
                    extra={"api_key": KEY})
    recorder = RecordingFixer(live, cassette)
    recorded = [recorder.propose(request) for request in requests]

    lines = [json.loads(line) for line in cassette.read_text().splitlines()]
    assert [line["response"] for line in lines] == answers
    assert [(line["group"], line["round"]) for line in lines] == [
        (group_pattern(gelu), 1), (group_pattern(softmax), 1), (group_pattern(gelu), 2)]
    assert lines[0]["model"] == "openai/fake-model"
    assert lines[0]["usage"] == {"prompt_tokens": 900, "completion_tokens": 100}
    assert KEY not in cassette.read_text()

    replay = ReplayFixer(cassette)
    # Replayed in another order (the softmax bug first): the group picks the answer.
    order = [1, 0, 2]
    replayed = {i: replay.propose(requests[i]) for i in order}
    for i in order:
        assert comparable(replayed[i]) == comparable(recorded[i])
        assert replayed[i].source == f"replay:{cassette}"
        assert recorded[i].sent and not replayed[i].sent
        assert replayed[i].origin.startswith(f"replayed from {cassette} line ")
        assert replayed[i].usage.calls == 1
    assert recorded[1].parse_error and recorded[0].modifications


def test_raw_text_survives_a_round_trip_byte_for_byte(tmp_path: Path) -> None:
    cassette = tmp_path / "c.jsonl"
    entry = CassetteEntry(TRICKY, group_pattern("k[1]"), 3, "m", 5, 6, 0.25)
    append_entry(cassette, entry)
    [loaded] = ReplayFixer(cassette).entries
    assert loaded.response == TRICKY
    assert replace(loaded, line=0) == entry
    assert loaded.matches("k[1]", 3) and not loaded.matches("k1", 3)


def write_cassette(path: Path, *entries: dict[str, object]) -> Path:
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    return path


def test_entries_are_consumed_in_order_by_group_and_round(tmp_path: Path) -> None:
    cassette = write_cassette(
        tmp_path / "c.jsonl",
        {"group": "softmax_*", "response": "A", "usage": {"prompt_tokens": 7}, "cost": 0.5},
        {"group": "gelu_*", "round": 2, "response": "B"},
        {"response": "C"},
        {"group": "gelu_*", "response": "D"},
    )
    replay = ReplayFixer(cassette)
    first = replay.propose(sample_request(1, "gelu_kernel-1"))
    assert first.raw == "C"  # A is another group's, B is for round 2
    assert replay.propose(sample_request(2, "gelu_kernel-1")).raw == "B"
    assert replay.propose(sample_request(3, "gelu_kernel-1")).raw == "D"
    softmax = replay.propose(sample_request(1, "softmax_kernel-9"))
    assert softmax.raw == "A"
    assert softmax.usage == Usage(calls=1, prompt_tokens=7, cost=0.5,
                                  prompt_chars=softmax.usage.prompt_chars)
    assert softmax.usage.prompt_chars > 1_000  # it renders what the model was sent
    with pytest.raises(FixerError) as info:
        replay.propose(sample_request(4, "gelu_kernel-1"))
    assert str(info.value) == (
        f"replay cassette {cassette} has no answer left for gelu_kernel-1 (round 4); "
        "it holds 4 entries"
    )


def test_replayed_answers_are_parsed_like_live_ones(tmp_path: Path) -> None:
    cassette = write_cassette(tmp_path / "c.jsonl", {"response": GELU_ANSWER}, {"response": ""})
    replay = ReplayFixer(cassette)
    proposal = replay.propose(sample_request())
    assert proposal.modifications[0].old_string == "    y = 0.5 * x * (1.0 + tl.tanh(u))"
    assert proposal.analysis == "Triton 3.x has no tl.tanh."
    assert "The answer was empty" in replay.propose(sample_request()).parse_error


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"group": "x"}', '"response"'),
        ('{"response": "r", "round": "2"}', '"round" must be an integer'),
        ('{"response": "r", "usage": {"prompt_tokens": 1.5}}', "token counts"),
        ('{"response": "r", "cost": "free"}', '"cost" must be a number'),
    ],
)
def test_a_malformed_line_is_named_at_load_time(tmp_path: Path, line: str, problem: str) -> None:
    cassette = tmp_path / "c.jsonl"
    cassette.write_text('{"response": "fine"}\n\n' + line + "\n")
    with pytest.raises(CassetteError) as info:
        ReplayFixer(cassette)
    assert f"replay cassette {cassette} line 3: " in str(info.value)
    assert problem in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, FixerError)


def test_a_missing_cassette_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CassetteError, match="cannot be read"):
        ReplayFixer(tmp_path / "absent.jsonl")


def test_failed_live_calls_are_not_recorded(fake_llm: FakeLLM, tmp_path: Path) -> None:
    fake_llm.script(Status(400, "bad request"))
    live = LLMFixer("openai/fake-model", api_base=fake_llm.url, num_retries=0,
                    extra={"api_key": KEY})
    with pytest.raises(FixerError):
        RecordingFixer(live, tmp_path / "c.jsonl").propose(sample_request())
    assert not (tmp_path / "c.jsonl").exists()


def test_concurrent_recorders_write_whole_lines(tmp_path: Path) -> None:
    cassette = tmp_path / "c.jsonl"
    body = "y" * 300_000

    def record(worker: int) -> None:
        for index in range(4):
            append_entry(cassette, CassetteEntry(f"{worker}-{index}-{body}", f"g{worker}"))

    threads = [threading.Thread(target=record, args=(worker,)) for worker in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    entries = ReplayFixer(cassette).entries
    assert sorted(entry.response.split("-")[0] + entry.response.split("-")[1]
                  for entry in entries) == sorted(f"{w}{i}" for w in range(4) for i in range(4))
    assert all(entry.response.endswith(body) for entry in entries)
