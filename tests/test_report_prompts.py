"""Prompt files: each round's messages and raw answer in the report dir, redacted.

What a proposal carries is checked against the fake OpenAI-compatible server (the
messages that really went over the wire) and against the fixers no model answers for
(replay, the answer cache, recipes, a hook); then the loop's records, the files the
report writes, and whole sessions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import make_group
from fake_llm import GELU_ANSWER, FakeLLM, Status, answer, sample_request
from kernel_project import BUGS, GOOD_LINE, make_project, report_of
from kernel_project import answer as edit_answer

from pytest_kernelfix.capture.errors import ErrorInfo
from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.fixers.base import FixerError, Proposal, ProposalRequest, Usage
from pytest_kernelfix.fixers.cache import caching
from pytest_kernelfix.fixers.hook import HookFixer
from pytest_kernelfix.fixers.llm import LLMFixer
from pytest_kernelfix.fixers.recipes import RecipeFixer
from pytest_kernelfix.fixers.replay import ReplayFixer
from pytest_kernelfix.heal.loop import heal
from pytest_kernelfix.heal.outcomes import (
    HEALED,
    KEEP_CHARS,
    UNHEALED,
    Exchange,
    HealResult,
    RoundRecord,
    Verdict,
    bounded,
)
from pytest_kernelfix.locate.context import BugContext, SourceFile
from pytest_kernelfix.redact import MARKER
from pytest_kernelfix.report.model import BugReport, SessionReport
from pytest_kernelfix.report.prompts import PROMPT_MARKER, prompt_markdown
from pytest_kernelfix.report.publish import write_prompts, write_reports

MODEL = "openai/fake-model"
SECRET = "sk-proj-PlantedInTheKernel0123456789"
ECHOED = "ghp_0123456789abcdefghijEchoedByModel99"


def live_fixer(fake: FakeLLM) -> LLMFixer:
    return LLMFixer(MODEL, api_base=fake.url, num_retries=0)


# -- what a proposal carries ------------------------------------------------------------


def test_a_live_answer_carries_the_messages_sent_and_the_whole_answer(
    fake_llm: FakeLLM,
) -> None:
    long_answer = GELU_ANSWER + " " * 10_000 + "\n"
    fake_llm.script(answer(long_answer))
    proposal = live_fixer(fake_llm).propose(sample_request())
    [body] = fake_llm.requests
    assert proposal.messages == tuple((m["role"], m["content"]) for m in body["messages"])
    assert [role for role, _ in proposal.messages] == ["system", "user"]
    assert proposal.sent and proposal.origin == ""
    assert proposal.raw == long_answer  # whole, not the loop's glance
    assert proposal.usage.prompt_chars == sum(len(text) for _, text in proposal.messages)


def test_a_call_that_got_no_answer_carries_the_prompt_it_sent(fake_llm: FakeLLM) -> None:
    fake_llm.script(Status(400, "context length exceeded"))
    with pytest.raises(FixerError) as caught:
        live_fixer(fake_llm).propose(sample_request())
    [body] = fake_llm.requests
    assert caught.value.messages == tuple((m["role"], m["content"]) for m in body["messages"])
    exchange = Exchange.failed(caught.value)
    assert exchange.sent and exchange.messages and exchange.answer == ""


def test_answers_no_model_gave_now_say_where_they_came_from(tmp_path: Path) -> None:
    tape = tmp_path / "tape.jsonl"
    tape.write_text(json.dumps({"response": GELU_ANSWER, "model": "openai/gpt-4o"}) + "\n")
    replayed = ReplayFixer(tape).propose(sample_request())
    # rendered for the recorded model, never sent: labelled so
    assert not replayed.sent and [role for role, _ in replayed.messages] == ["system", "user"]
    assert replayed.origin == f"replayed from {tape} line 1 (recorded from openai/gpt-4o)"
    assert replayed.raw == GELU_ANSWER

    recipe = RecipeFixer().propose(sample_request())
    assert recipe.messages == () and not recipe.sent
    assert recipe.origin.startswith("the offline recipe ") and recipe.raw

    hooked = HookFixer(lambda request: GELU_ANSWER, RecipeFixer()).propose(sample_request())
    assert hooked.messages == () and hooked.origin == "a pytest_kernelfix_propose hook"
    assert hooked.raw == GELU_ANSWER


def test_a_cache_hit_sends_nothing_and_names_its_entry(fake_llm: FakeLLM,
                                                       tmp_path: Path) -> None:
    fake_llm.script(answer(GELU_ANSWER))
    fixer = caching(live_fixer(fake_llm), tmp_path, model=MODEL, api_base=fake_llm.url,
                    prompts_dir=None)
    first = fixer.propose(sample_request())
    hit = fixer.propose(sample_request())
    assert first.sent and first.messages and first.origin == ""
    assert len(fake_llm.requests) == 1 and hit.usage.cache_hits == 1
    assert hit.messages == () and not hit.sent and hit.raw == GELU_ANSWER
    [entry] = (tmp_path / "answers").glob("*/*.json")
    assert hit.origin == f"the answer cache ({entry}); no model was asked"


# -- what the loop keeps ----------------------------------------------------------------


class Answers:
    """A fixer that answers from a list."""

    name = "scripted"

    def __init__(self, *answers: Proposal | Exception) -> None:
        self.answers = list(answers)

    def propose(self, request: ProposalRequest) -> Proposal:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def loop_context() -> BugContext:
    return BugContext(
        group_id="scale-assertionerror-abc123",
        nodeids=("tests/test_scale.py::test_scale",),
        error=ErrorInfo("AssertionError", "assert 3 == 2"),
        error_log="assert 3 == 2",
        editable=(SourceFile("k.py", ""),),
    )


def test_the_loop_keeps_each_rounds_prompt_and_answer_redacted_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok9d8c7b6a5f4e3d2c1b0a")
    edit = (Modification("y = x + 1", "y = x * 2", file="k.py"),)
    huge = "a" * KEEP_CHARS + SECRET + "z" * KEEP_CHARS
    first = Proposal(edit, raw=f"echo {ECHOED} " + huge, messages=(
        ("system", "rules"), ("user", "token tok9d8c7b6a5f4e3d2c1b0a, log " + huge)),
        sent=True, source="scripted")
    second = Proposal(edit, raw="", source="scripted", origin="the offline recipe r")
    failed = FixerError("rate limited", messages=(("user", f"again {SECRET}"),))
    verdicts = iter([Verdict(False, "still fails")])
    result = heal(loop_context(), {"k.py": "y = x + 1\n"}, fixer=Answers(first, second, failed),
                  verify=lambda files: next(verdicts), rounds=3)

    assert result.status == UNHEALED
    one, two, three = (record.exchange for record in result.rounds)
    assert one.sent and [role for role, _ in one.messages] == ["system", "user"]
    kept = one.messages[1][1] + one.answer
    assert "tok9d8c7b6a5f4e3d2c1b0a" not in kept and ECHOED not in kept
    assert one.answer.startswith(f"echo {MARKER} ")
    assert len(one.answer) < KEEP_CHARS + 100 and "characters left out ..." in one.answer
    assert two == Exchange((), False, "the offline recipe r", "")  # nothing sent, no answer
    assert three.sent and three.messages == (("user", f"again {MARKER}"),)
    assert three.answer == ""


def test_bounded_keeps_both_ends_and_counts_what_it_left_out() -> None:
    text = "".join(f"{number:05d}\n" for number in range(40_000))  # 240,000 characters
    head, rest = bounded(text).split("\n[... ", 1)
    gap, tail = rest.split(" characters left out ...]\n", 1)
    assert text.startswith(head) and text.endswith(tail)
    assert len(head) + len(tail) == KEEP_CHARS and int(gap) == len(text) - KEEP_CHARS
    assert bounded("short") == "short"


# -- the files the report writes -------------------------------------------------------


def sample_result(group_id: str) -> HealResult:
    """Round 1 sent a prompt and got an answer with a code fence; round 2 was replayed
    (rendered, not sent); round 3's call failed without a prompt (no file)."""
    answer_text = f"Here:\n```json\n{{\"analysis\": \"{ECHOED}\"}}\n```\n"
    live = RoundRecord(1, "litellm:openai/x", (), "1 of 4 failing tests still fail",
                       Usage(1, 812, 144, 0.0123, prompt_chars=21),
                       exchange=Exchange((("system", "rules"), ("user", f"fix {SECRET}")),
                                         True, "", answer_text))
    replayed = RoundRecord(2, "replay:t.jsonl", (), "healed",
                           Usage(1, prompt_chars=9),
                           exchange=Exchange((("user", "the bug"),), False,
                                             "replayed from t.jsonl line 2", "{}"))
    nothing = RoundRecord(3, "scripted", (), "no answer: cassette used up")
    return HealResult(group_id, HEALED, "healed in round 2", (live, replayed, nothing))


def sample_report(root: Path, *, save_prompts: bool = True) -> SessionReport:
    group = make_group(root, "tests/test_gelu.py::test_gelu")
    bug = BugReport(group, sample_result(group.id))
    return SessionReport((bug,), root, root / ".kernelfix", "report", "interpret", "m", 1.0,
                         save_prompts=save_prompts)


def test_prompt_files_are_written_linked_and_pointed_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = sample_report(tmp_path)
    written = write_prompts(report)
    write_reports(report)
    folder = f"prompts/{report.bugs[0].group.id}"
    assert written == (f"{folder}/round-1.md", f"{folder}/round-2.md")
    live = (report.report_dir / written[0]).read_text()
    assert live.startswith(PROMPT_MARKER)
    assert "- Prompt: sent to the model: 2 message(s), 21 characters" in live
    assert "- Cost: 1 call(s), 812 prompt + 144 completion tokens, $0.0123" in live
    assert "## Message 1: system\n\n```\nrules\n```" in live
    assert "## Message 2: user\n\n```\nfix [REDACTED]\n```" in live
    # the answer holds a fence: its own fence is longer, so it reads as one block
    assert "## Answer\n\n````\nHere:\n```json\n" in live and live.endswith("```\n````\n")
    assert SECRET not in live and ECHOED not in live
    replayed = (report.report_dir / written[1]).read_text()
    assert "- Answer from: replayed from t.jsonl line 2" in replayed
    assert "- Prompt: not sent: 1 message(s), 9 characters" in replayed

    data = json.loads((report.report_dir / "report.json").read_text())
    details = data["bugs"][0]["round_details"]
    assert [detail["prompt_file"] for detail in details] == [*written, None]
    markdown = (report.report_dir / "report.md").read_text()
    assert f"[prompt and answer]({written[0]})" in markdown
    assert f"[prompt and answer]({written[1]})" in markdown
    assert markdown.count("[prompt and answer]") == 2


def test_a_prompt_file_says_when_the_plugin_sent_no_prompt() -> None:
    record = RoundRecord(1, "hook", (), "healed",
                         exchange=Exchange((), False, "a pytest_kernelfix_propose hook", "{}"))
    text = prompt_markdown("k-abc123", record)
    assert "- Answer from: a pytest_kernelfix_propose hook" in text
    assert "- Prompt: none: the plugin sent no prompt for this answer" in text
    assert "## Message" not in text


def test_stale_prompt_files_go_and_a_users_files_stay(tmp_path: Path) -> None:
    report = sample_report(tmp_path)
    prompts = report.report_dir / "prompts"
    old = prompts / "old_kernel-typeerror-fedcba" / "round-1.md"
    old.parent.mkdir(parents=True)
    old.write_text(f"{PROMPT_MARKER} 0.0.1 -->\n# old\n")
    mine = prompts / "notes" / "round-1.md"
    mine.parent.mkdir()
    mine.write_text("my own notes\n")
    dropped = prompts / report.bugs[0].group.id / "round-3.md"  # this bug, a round not kept
    dropped.parent.mkdir()
    dropped.write_text(f"{PROMPT_MARKER} 0.0.1 -->\n")
    write_prompts(report)
    write_reports(report)
    assert not old.exists() and not old.parent.exists() and not dropped.exists()
    assert mine.read_text() == "my own notes\n"
    assert (prompts / report.bugs[0].group.id / "round-1.md").exists()


def test_off_writes_no_prompt_file_and_points_at_none(tmp_path: Path) -> None:
    write_prompts(sample_report(tmp_path))
    write_reports(sample_report(tmp_path))
    report = sample_report(tmp_path, save_prompts=False)
    assert write_prompts(report) == ()
    write_reports(report)
    assert not (report.report_dir / "prompts").exists()  # the earlier ones are stale
    data = json.loads((report.report_dir / "report.json").read_text())
    assert {detail["prompt_file"] for detail in data["bugs"][0]["round_details"]} == {None}
    assert "[prompt and answer]" not in (report.report_dir / "report.md").read_text()


# -- whole sessions ---------------------------------------------------------------------

HOOK = """
def pytest_kernelfix_propose(request, config):
    return {answer!r}
"""


def test_sessions_keep_prompts_and_answers_in_the_report_dir(
    pytester: pytest.Pytester, fake_llm: FakeLLM
) -> None:
    kernel = make_project(pytester)
    kernel.write_text(f"# deploy key: {SECRET}\n" + kernel.read_text())
    fix = edit_answer(BUGS["offset"], GOOD_LINE, reason=f"scale, not offset ({ECHOED})")
    fake_llm.script(answer(fix))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kernelfix", f"--kernelfix-model={MODEL}",
        f"--kernelfix-api-base={fake_llm.url}", "--kernelfix-no-cache")
    result.assert_outcomes(failed=4, passed=1)

    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed", bug["reason"]
    name = bug["round_details"][0]["prompt_file"]
    assert name == f"prompts/{bug['id']}/round-1.md"
    report_dir = pytester.path / ".kernelfix"
    text = (report_dir / name).read_text()
    [sent] = fake_llm.requests
    system, user = (message["content"] for message in sent["messages"])
    assert "- Prompt: sent to the model: 2 message(s)" in text
    assert system.strip() in text and user.strip() in text  # what went over the wire
    assert "def scale_kernel" in text and "Tensor-likes are not close" in text
    assert "scale, not offset" in text  # the raw answer
    assert f"# deploy key: {MARKER}" in text  # the source was shown, its secret not
    assert SECRET not in text and ECHOED not in text
    assert f"[prompt and answer]({name})" in (report_dir / "report.md").read_text()


@pytest.mark.slow
def test_with_prompt_files_off_a_session_writes_none_and_the_earlier_ones_go(
    pytester: pytest.Pytester,
) -> None:
    make_project(pytester)
    earlier = pytester.path / ".kernelfix" / "prompts" / "scale_kernel-old" / "round-1.md"
    earlier.parent.mkdir(parents=True)
    earlier.write_text(f"{PROMPT_MARKER} 0.1.0 -->\n# a prompt file of an earlier session\n")
    report_dir = pytester.path / ".kernelfix"
    pytester.makeconftest(HOOK.format(answer=edit_answer(BUGS["offset"], GOOD_LINE)))
    again = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kernelfix",
                                          "--kernelfix-save-prompts=off")
    again.assert_outcomes(failed=4, passed=1)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed" and bug["round_details"][0]["source"] == "hook"
    assert bug["round_details"][0]["prompt_file"] is None
    assert not (report_dir / "prompts").exists()
