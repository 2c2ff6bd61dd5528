"""Faults from the model side, through whole pytest sessions.

The fake OpenAI-compatible server runs in this process; each session runs in a
subprocess against a small Triton project with one broken kernel per bug, so one
session checks several faults, one per bug, in the order the bugs are healed. Every
session must end with the exit status a run without the plugin has, each bug must be
reported with a reason naming its fault, and the number of requests must be bounded
by rounds x (retries + 1).
"""

from __future__ import annotations

import json

import pytest
from fake_llm import Delay, FakeLLM, Reply, Status, empty, huge, malformed
from hostile.project import expected_rerun_mode, fix_answer, report, rerun_mode, write_project

BASE = ("-p", "no:randomly", "-p", "no:cacheprovider")


def heal_args(api_base: str, *more: str) -> tuple[str, ...]:
    """One worker: the fake model's scripted replies go to the bugs in their order."""
    return (*BASE, "--kernelfix", "--kernelfix-model=openai/fake-model",
            f"--kernelfix-api-base={api_base}", "--kernelfix-llm-retries=2",
            "--kernelfix-rounds=2", "--kernelfix-llm-timeout=1", "--kernelfix-workers=1", *more)


def without_plugin(pytester: pytest.Pytester) -> int:
    return int(pytester.runpytest_subprocess(*BASE, timeout=120).ret)


def requests_for(fake: FakeLLM, name: str) -> int:
    """Requests whose prompt is about ``kernels/<name>.py``."""
    return sum(f"kernels/{name}.py" in json.dumps(body.get("messages")) for body in fake.requests)


@pytest.mark.slow
def test_http_faults_leave_bugs_unhealed_after_bounded_retries(
    pytester: pytest.Pytester, fake_llm: FakeLLM
) -> None:
    write_project(pytester.path, "k1", "k2", "k3", "k4")
    fake_llm.script(
        *[Status(429, "slow down")] * 3,
        *[Status(500, "overloaded")] * 3,
        *[Delay(3.0, Reply(fix_answer("k3")))] * 3,  # longer than --kernelfix-llm-timeout
        *[malformed()] * 3,
    )
    result = pytester.runpytest_subprocess(*heal_args(fake_llm.url), timeout=300)

    assert result.ret == without_plugin(pytester) == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=4, passed=1)
    bugs = report(pytester.path)
    expected = {
        "k1": "rate limited (HTTP 429) after 3 attempts",
        "k2": "server error (HTTP 500) after 3 attempts: OpenAIException - overloaded",
        "k3": "timeout after 3 attempts",
        "k4": "server error (HTTP 500) after 3 attempts",  # a 200 whose body is cut short
    }
    for name, why in expected.items():
        assert bugs[name]["status"] == "unhealed"
        assert why in bugs[name]["reason"], bugs[name]["reason"]
        assert bugs[name]["reason"].startswith("round 1: litellm:openai/fake-model: ")
        assert requests_for(fake_llm, name) == 3  # 1 + 2 retries, then the bug is given up
    assert len(fake_llm.requests) == 12 and fake_llm.pending == 0
    assert rerun_mode(pytester.path) == expected_rerun_mode()
    result.stdout.fnmatch_lines(["*unhealed  k1_kernel-*: round 1: *rate limited (HTTP 429)*"])


@pytest.mark.slow
def test_unreadable_answers_use_up_rounds_and_a_good_one_still_heals(
    pytester: pytest.Pytester, fake_llm: FakeLLM
) -> None:
    write_project(pytester.path, "k1", "k2", "k3", "k4")
    fake_llm.script(
        empty(), Reply(None),
        huge(), huge(),
        *[Reply(fix_answer("k3")[:cut]) for cut in (60, fix_answer("k3").index('"new_string"'))],
        Reply("Sorry, I cannot help with that."), Reply(fix_answer("k4")),
    )
    result = pytester.runpytest_subprocess(*heal_args(fake_llm.url), timeout=300)

    assert result.ret == without_plugin(pytester) == pytest.ExitCode.TESTS_FAILED
    bugs = report(pytester.path)
    expected = {
        "k1": "last: answer could not be read: The answer was empty.",
        "k2": "last: answer could not be read: answer too large (1200000 characters",
        "k3": "last: answer could not be read: No edits were found in the answer.",
    }
    for name, why in expected.items():
        assert bugs[name]["status"] == "unhealed"
        assert bugs[name]["reason"].startswith("not healed after 2 round(s)")
        assert why in bugs[name]["reason"], bugs[name]["reason"]
        assert requests_for(fake_llm, name) == 2  # one per round: nothing to retry
    first, second = bugs["k4"]["round_details"]
    assert first["outcome"].startswith("answer could not be read: No edits were found")
    assert bugs["k4"]["status"] == "healed" and second["outcome"] == (
        "1 failing test(s) pass; the tests fail once the kernel's output is poisoned")
    assert len(fake_llm.requests) == 8
    assert rerun_mode(pytester.path) == expected_rerun_mode()


def test_a_green_session_is_left_alone(pytester: pytest.Pytester, fake_llm: FakeLLM) -> None:
    write_project(pytester.path)
    result = pytester.runpytest_subprocess(*heal_args(fake_llm.url), "-v", timeout=120)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*kernelfix: no failing kernel tests*"])
    assert fake_llm.requests == []
    assert not (pytester.path / ".kernelfix").exists()


@pytest.mark.slow
def test_an_internal_error_never_changes_the_exit_status(pytester: pytest.Pytester) -> None:
    write_project(pytester.path, "k1")
    (pytester.path / "blocker").write_text("a file where the report dir should go\n")
    # a readable cassette and a cache dir of its own: preflight refuses neither, so the
    # blocked report dir is first met when the report is written, after healing
    (pytester.path / "tape.jsonl").write_text(
        json.dumps({"group": "no-such-bug-*", "response": fix_answer("k1")}) + "\n")
    result = pytester.runpytest_subprocess(
        *BASE, "--kernelfix", "--kernelfix-model=replay:tape.jsonl",
        "--kernelfix-report-dir=blocker", "--kernelfix-cache-dir=cache", timeout=120)
    assert result.ret == without_plugin(pytester) == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*healing stopped by an internal error: *"])
    assert "Traceback" not in result.stdout.str().split("kernelfix")[-1]
