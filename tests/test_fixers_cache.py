"""The answer cache: a re-run of the same red commit is answered from disk, for free.

Unit tests pin down the key (what makes a hit, what makes a miss) and the store; the
session test re-runs a red project whose unseeded test prints different numbers each
run against the fake OpenAI-compatible server, and counts the requests it receives.
"""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
from factories import make_settings
from fake_llm import FakeLLM, Reply, sample_request
from kernel_project import BUGS, GOOD_LINE, answer, make_project, report_of

from pytest_kernelfix.fixers.base import Proposal, ProposalRequest, Usage
from pytest_kernelfix.fixers.cache import (
    ANSWERS_DIR,
    AnswerCache,
    CachedAnswer,
    answer_key,
    caching,
)
from pytest_kernelfix.locate.context import SourceFile
from pytest_kernelfix.session.controller import session_fixer

IDENTITY = {"model": "openai/m", "api_base": "", "prompts": "p", "plugin": "0"}
GOOD = answer("y = 0.5 * x * (1.0 + tl.tanh(u))", "y = x", file="kernels/gelu.py")


def key(request: ProposalRequest, earlier: dict[int, str] | None = None, **identity: str
        ) -> str:
    return answer_key(request, identity={**IDENTITY, **identity}, earlier=earlier or {})


def with_message(request: ProposalRequest, message: str, log: str) -> ProposalRequest:
    context = replace(request.context, error=replace(request.context.error, message=message),
                      error_log=log)
    return replace(request, context=context)


def test_the_key_ignores_numbers_in_messages_and_logs() -> None:
    request = sample_request()
    first = with_message(request, "max error 97.25 at index 17", "x = 0.1324 ... 0x7f3a")
    second = with_message(request, "max error 3.5 at index 2", "x = 0.9 ... 0x55d1")
    assert key(first) == key(second)
    assert key(first) != key(with_message(request, "max error is NaN", ""))


def test_the_key_changes_with_what_decides_the_answer() -> None:
    request = sample_request()
    base = key(request)
    view = request.files[0]
    changed = replace(request, files=(SourceFile(view.path, view.text + "# edited\n"),))
    other_test = replace(request, context=replace(
        request.context, tests=(SourceFile("tests/test_gelu.py", "def test(): pass\n"),)))
    assert len({base, key(changed), key(other_test), key(replace(request, round=2)),
                key(request, model="openai/other"), key(request, api_base="http://h/v1"),
                key(request, prompts="q")}) == 7
    second = replace(request, round=2)
    assert key(second, {1: "a"}) != key(second, {1: "b"})  # the earlier answer counts
    assert key(request, {1: "a"}) == base  # ... only for later rounds


def test_a_prompt_template_edit_is_a_miss(tmp_path: Path) -> None:
    def prompts(prompts_dir: Path | None) -> str:
        fixer = caching(Counting(), tmp_path, model="openai/m", api_base=None,
                        prompts_dir=prompts_dir)
        return fixer.identity["prompts"]

    (tmp_path / "prompts").mkdir()
    assert prompts(None) == prompts(tmp_path / "prompts")  # an empty override dir
    (tmp_path / "prompts" / "fix.j2").write_text("{{ error_log }}\n")
    assert prompts(tmp_path / "prompts") != prompts(None)


class Counting:
    """A live fixer that counts its calls and answers ``answers`` in turn."""

    name = "litellm:openai/m"
    model = "openai/m"

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers) or [GOOD]
        self.calls = 0

    def propose(self, request: ProposalRequest) -> Proposal:
        from pytest_kernelfix.fixers.answer import read_answer

        self.calls += 1
        raw = self.answers[(self.calls - 1) % len(self.answers)]
        return read_answer(raw, usage=Usage(1, 800, 60, 0.01, 2.0), source=self.name)


def test_a_second_session_is_answered_from_the_cache_for_free(tmp_path: Path) -> None:
    second_answer = answer("y = x", "y = x * 1.0", file="kernels/gelu.py")
    live = Counting(GOOD, second_answer)
    first = caching(live, tmp_path, model="openai/m", api_base=None, prompts_dir=None)
    bought = [first.propose(sample_request(1)), first.propose(sample_request(2))]
    assert live.calls == 2 and all(p.usage.cost == 0.01 for p in bought)

    again = Counting("never used")
    rerun = caching(again, tmp_path, model="openai/m", api_base=None, prompts_dir=None)
    replayed = [rerun.propose(sample_request(1)), rerun.propose(sample_request(2))]
    assert again.calls == 0
    assert [p.modifications for p in replayed] == [p.modifications for p in bought]
    assert all(p.usage == Usage(cache_hits=1) for p in replayed)  # no call, token or dollar
    assert replayed[0].source == live.name

    other = caching(Counting(second_answer), tmp_path, model="openai/m", api_base=None,
                    prompts_dir=None)
    other.propose(sample_request(1))  # a round-1 hit ...
    fresh = Counting(GOOD)
    diverged = caching(fresh, tmp_path, model="openai/m", api_base=None, prompts_dir=None)
    diverged._earlier["gelu_kernel-ab12cd"] = {1: "another answer"}
    diverged.propose(sample_request(2))  # ... but round 2 after another answer: a miss
    assert fresh.calls == 1


def test_a_round_that_only_asked_for_code_is_cached_too(tmp_path: Path) -> None:
    """A "need" answer was paid for like any other: a re-run gets it from the cache."""
    need = json.dumps({"analysis": "I need the helper", "modifications": [],
                       "need": ["kernels/act.py:silu"]})
    declined = json.dumps({"analysis": "x", "modifications": [],
                           "not_a_kernel_bug": "the test expects float64"})
    for raw in (need, declined):
        live = Counting(raw)
        first = caching(live, tmp_path / str(len(raw)), model="openai/m", api_base=None,
                        prompts_dir=None).propose(sample_request())
        again = Counting("never used")
        hit = caching(again, tmp_path / str(len(raw)), model="openai/m", api_base=None,
                      prompts_dir=None).propose(sample_request())
        assert live.calls == 1 and again.calls == 0
        assert (hit.need, hit.not_a_kernel_bug) == (first.need, first.not_a_kernel_bug)
        assert hit.usage == Usage(cache_hits=1)


def test_unreadable_answers_are_not_stored_and_bad_entries_are_misses(tmp_path: Path) -> None:
    garbled = Counting("Sorry, I cannot help with that.")
    fixer = caching(garbled, tmp_path, model="openai/m", api_base=None, prompts_dir=None)
    assert fixer.propose(sample_request()).parse_error
    assert not list((tmp_path / ANSWERS_DIR).rglob("*.json"))

    cache = AnswerCache(tmp_path / ANSWERS_DIR)
    entry_key = "ab" + "0" * 62
    cache.path(entry_key).parent.mkdir(parents=True, exist_ok=True)
    for bad in ("{not json", json.dumps({"format": 999, "response": "x", "usage": {}}),
                json.dumps({"format": 1, "response": 3, "usage": {}})):
        cache.path(entry_key).write_text(bad)
        assert cache.load(entry_key) is None
    assert cache.store(entry_key, CachedAnswer("raw", "openai/m", 1, 2, 0.5))
    assert cache.load(entry_key) == CachedAnswer("raw", "openai/m", 1, 2, 0.5)


def _store_many(directory: str, worker: int) -> int:
    cache = AnswerCache(Path(directory))
    for number in range(40):
        cache.store(f"{number:064x}", CachedAnswer(f"answer {number}", f"w{worker}"))
    return worker


def test_concurrent_writers_leave_only_whole_entries(tmp_path: Path) -> None:
    with ProcessPoolExecutor(max_workers=3) as pool:
        list(pool.map(_store_many, [str(tmp_path)] * 3, range(3)))
    cache = AnswerCache(tmp_path)
    loaded = [cache.load(f"{number:064x}") for number in range(40)]
    assert all(entry is not None and entry.raw == f"answer {n}"
               for n, entry in enumerate(loaded))
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".kfx")]  # no temp left


# --- whole sessions ------------------------------------------------------------------


UNSEEDED = '''\
import pytest
import torch

from kernels.ops import scale


@pytest.mark.kernel
def test_scale_random():
    x = torch.rand(100) * 100  # unseeded: each run prints other numbers
    y = scale(x, 2.0)
    error = (y - x * 2.0).abs().max().item()
    assert error < 1e-4, f"max error {error} over a sum of {x.sum().item()}"
'''


@pytest.mark.slow
def test_a_rerun_of_the_same_red_commit_is_answered_from_the_cache(
    pytester: pytest.Pytester, fake_llm: FakeLLM, tmp_path: Path
) -> None:
    make_project(pytester)
    (pytester.path / "tests" / "test_ops.py").write_text(UNSEEDED)
    almost = answer(BUGS["offset"], "    y = x * factor + 1.0", reason="first guess")
    better = answer("    y = x * factor + 1.0", GOOD_LINE, reason="drop the offset")
    ci_cache = tmp_path / "ci-cache"  # outside the project, as a CI cache would be
    args = ("-p", "no:cacheprovider", "--kernelfix", "--kernelfix-model=openai/fake-model",
            f"--kernelfix-api-base={fake_llm.url}", f"--kernelfix-cache-dir={ci_cache}")

    said: list[str] = []

    def session(*more: str) -> dict:  # type: ignore[type-arg]
        result = pytester.runpytest_subprocess(*args, *more, timeout=600)
        result.assert_outcomes(failed=1)
        (bug,) = report_of(pytester.path)["bugs"]
        assert bug["status"] == "healed", bug["reason"]
        said.append(result.stdout.str())
        return report_of(pytester.path)

    fake_llm.script(Reply(almost), Reply(better))
    first = session()
    assert len(fake_llm.requests) == 2 and first["totals"]["cache_hits"] == 0
    shutil.rmtree(pytester.path / ".kernelfix")  # a fresh CI runner: only the cache is kept

    second = session()  # nothing scripted: a request would get HTTP 500
    assert len(fake_llm.requests) == 2
    assert first["bugs"][0]["error"] != second["bugs"][0]["error"]  # other numbers printed
    assert first["bugs"][0]["id"] == second["bugs"][0]["id"]
    (bug,) = second["bugs"]
    assert [r["cached"] for r in bug["round_details"]] == [True, True]
    assert (bug["calls"], bug["prompt_tokens"], bug["cost"], bug["cache_hits"]) == (0, 0, 0, 2)
    assert second["totals"]["cache_hits"] == 2 and second["totals"]["calls"] == 0
    assert "answered from the answer cache" not in said[0]
    assert said[1].count("answered from the answer cache, no call") == 2  # said as it happens
    markdown = (pytester.path / ".kernelfix" / "report.md").read_text()
    assert "2 answer(s) from the cache (free)" in markdown and "cached;" in markdown


def test_the_session_fixer_caches_live_models_only_and_no_cache_bypasses(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    config = pytester.parseconfig()

    def chain(**changes: object) -> list[str]:
        fixer = session_fixer(config, make_settings(tmp_path, api_base="http://h/v1",
                                                    **changes)).fallback  # under the hook
        names = []
        while fixer is not None:
            names.append(type(fixer).__name__)
            fixer = getattr(fixer, "inner", None)
        return names

    assert chain(model="openai/m") == ["CachingFixer", "LLMFixer"]
    assert chain(model="openai/m", no_cache=True) == ["LLMFixer"]
    assert chain(model="openai/m", record=tmp_path / "t.jsonl") == [
        "RecordingFixer", "CachingFixer", "LLMFixer"]  # a cassette also gets cached answers
    assert chain(model="recipes") == ["RecipeFixer"]
    cached = session_fixer(config, make_settings(tmp_path, model="openai/m",
                                                 cache_dir=tmp_path / "ci")).fallback
    assert cached.cache.directory == tmp_path / "ci" / ANSWERS_DIR
