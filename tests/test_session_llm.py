"""A live model through a whole session: litellm over HTTP to the fake OpenAI-compatible
server, as a newcomer's first run would meet it.

The project's own settings are the ones that tripped newcomers: the endpoint given only
through ``OPENAI_API_BASE`` (no key: a local server), INFO logs shown live
(``log_cli_level = INFO``), a cost cap on a model litellm has no price for, GitHub
Actions' step summary. The model first asks for more code, then fixes the kernel.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_llm import FakeLLM, Hangup, Reply
from hostile.project import fix_answer, write_project
from hostile.project import report as bugs_of
from kernel_project import BUGS, GOOD_LINE, INI, answer, make_project, report_of

EXTRA = "def unused_helper(x):\n    return x\n"
NEED = json.dumps({"analysis": "First I want to see the helper module.", "modifications": [],
                   "need": ["kernels/extra.py:unused_helper"]})


def test_a_live_model_session_says_what_it_does(
    pytester: pytest.Pytester, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    make_project(pytester)
    (pytester.path / "kernels" / "extra.py").write_text(EXTRA)
    (pytester.path / "pytest.ini").write_text(INI + "log_cli = true\nlog_cli_level = INFO\n")
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "KERNELFIX_API_BASE", "LITELLM_LOG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_API_BASE", fake_llm.url)  # the provider's own variable only
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    fake_llm.script(Reply(NEED), Reply(answer(BUGS["offset"], GOOD_LINE)))
    cache = tmp_path / "ci-cache"

    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:randomly", "--kernelfix",
        "--kernelfix-model=openai/fake-model", "--kernelfix-max-cost=1",
        f"--kernelfix-cache-dir={cache}", "--kernelfix-workers=1", timeout=600)

    result.assert_outcomes(failed=4, passed=1)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed", bug["reason"]
    out = result.stdout.str()
    # the endpoint OPENAI_API_BASE names is the one called, with no key (a local server)
    assert [h["Authorization"] for h in fake_llm.headers] == ["Bearer EMPTY"] * 2
    # the fixer by its name, never "hook"; litellm's own INFO lines kept out
    result.stdout.fnmatch_lines([
        "kernelfix:   round 1: asking litellm:openai/fake-model",
        "kernelfix:   round 1: answered in * s",
        "kernelfix:   round 2: asking litellm:openai/fake-model",
    ])
    assert "asking hook" not in out and "LiteLLM" not in out + result.stderr.str()
    # the cap that cannot cap: said at start-up
    assert ("kernelfix: --kernelfix-max-cost 1 cannot cap openai/fake-model: litellm has no "
            "price for it") in out
    # what was shown, per round: the helper only from round 2, as the model asked
    first, second = bug["round_details"]
    assert first["outcome"].startswith("asked for more code: kernels/extra.py:unused_helper")
    assert bug["shown"] == first["shown"] == ["kernels/ops.py"]
    assert second["shown"] == ["kernels/ops.py", "kernels/extra.py"]  # a small file, whole
    markdown = (pytester.path / ".kernelfix" / "report.md").read_text()
    assert "Shown to the model in round 1: `kernels/ops.py`" in markdown
    assert "also shown in this round: `kernels/extra.py`" in markdown
    assert summary.read_text() == markdown
    # each step reads the same in the terminal and in the report
    steps = [line.removeprefix("kernelfix:").strip() for line in out.splitlines()
             if line.startswith("kernelfix:") and " → step " in line]
    assert steps and all(step in markdown for step in steps)
    assert any(step.startswith("sensitivity (nan): ") and step.endswith(" → step passed")
               for step in steps)
    # the "need" round is cached like the fix; the cache dir keeps out of git status
    assert len(list((cache / "answers").rglob("*.json"))) == 2
    assert (cache / ".gitignore").read_text().endswith("*\n")
    reruns = report_of(pytester.path)["reruns"]
    assert 0 < reruns["seconds"] <= reruns["seconds_summed"]


@pytest.mark.slow
def test_a_server_that_goes_away_mid_session_is_asked_no_more(
    pytester: pytest.Pytester, fake_llm: FakeLLM
) -> None:
    """k1's hook fails (its own reason), k2's call finds the server gone (one bug pays the
    retries, the URL named), k3 is not asked at all."""
    write_project(pytester.path, "k1", "k2", "k3")
    pytester.makeconftest(
        """
        def pytest_kernelfix_propose(request, config):
            if request.context.group_id.startswith("k1"):
                raise RuntimeError("hook exploded")
            return None
        """
    )
    fake_llm.script(Hangup(), Reply(fix_answer("k3")))
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--kernelfix",
        "--kernelfix-model=openai/fake-model", f"--kernelfix-api-base={fake_llm.url}",
        "--kernelfix-llm-retries=2", "--kernelfix-workers=1", timeout=300)

    result.assert_outcomes(failed=3, passed=1)
    bugs = bugs_of(pytester.path)
    assert bugs["k1"]["reason"] == "round 1: the fixer failed: RuntimeError: hook exploded"
    assert bugs["k2"]["status"] == "unhealed"
    lost = (f"litellm:openai/fake-model: connection failed after 3 attempts to "
            f"{fake_llm.url}: ")
    assert bugs["k2"]["reason"].startswith(f"round 1: {lost}")
    assert bugs["k3"]["status"] == "skipped"
    assert bugs["k3"]["reason"].startswith(
        f"not asked: the fixer stopped answering in {bugs['k2']['id']}, round 1: {lost}")
    assert len(fake_llm.requests) == 1 and fake_llm.pending == 1  # k3 cost nothing
