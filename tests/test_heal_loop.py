"""The round loop: proposals, feedback, guards, stopping rules.

The verify function here really executes the candidate's code, so a round is judged
by behaviour, exactly as the sandbox rerun judges it in the plugin.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_kernelfix.capture.errors import ErrorInfo
from pytest_kernelfix.engine.files import apply_proposal, resolve_file
from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.fixers.base import FixerError, Proposal, ProposalRequest, Usage
from pytest_kernelfix.heal.loop import heal
from pytest_kernelfix.heal.outcomes import (
    DECLINED,
    HEALED,
    MASKED,
    UNHEALED,
    Candidate,
    Screening,
    Verdict,
    VerdictKind,
)
from pytest_kernelfix.locate.context import BugContext, SourceFile, render_source

BUGGY = '''def scale(values, factor):
    out = []
    for v in values:
        out.append(v + factor)
    return out
'''

HELPER = '''def offset(values):
    return [v - 1 for v in values]
'''


def context(*files: str) -> BugContext:
    return BugContext(
        group_id="scale-assertionerror-abc123",
        nodeids=("tests/test_scale.py::test_scale",),
        error=ErrorInfo("AssertionError", "assert [3, 4] == [2, 4]"),
        error_log="assert [3, 4] == [2, 4]",
        editable=tuple(SourceFile(f, "") for f in files),
    )


class Scripted:
    """A fixer that answers from a list and remembers every request."""

    name = "scripted"

    def __init__(self, *answers: Proposal | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[ProposalRequest] = []

    def propose(self, request: ProposalRequest) -> Proposal:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def edits(*pairs: tuple[str, str], file: str = "") -> Proposal:
    mods = tuple(Modification(old, new, file=file) for old, new in pairs)
    return Proposal(mods, raw="{}", usage=Usage(calls=1, prompt_tokens=10, completion_tokens=5,
                                                 cost=0.001), source="scripted")


def running(check: Callable[[Callable[..., list[int]]], bool]) -> tuple[
        Callable[[Mapping[str, str]], Verdict], list[Mapping[str, str]]]:
    """A verify function that executes the candidate and applies ``check``."""
    seen: list[Mapping[str, str]] = []

    def verify(files: Mapping[str, str]) -> Verdict:
        seen.append(dict(files))
        namespace: dict[str, object] = {}
        try:
            exec(files["ops/scale.py"], namespace)
            ok = check(namespace["scale"])  # type: ignore[arg-type]
        except Exception as error:
            return Verdict(False, f"raised {type(error).__name__}", f"{error!r}")
        if ok:
            return Verdict(True, "1 failing test(s) pass")
        got = namespace["scale"]([1, 2], 2)  # type: ignore[operator]
        return Verdict(False, "1 of 1 failing tests still fail",
                       f"assert {got} == [2, 4]", kind="failing")

    return verify, seen


def multiplies(fn: Callable[..., list[int]]) -> bool:
    return fn([1, 2], 2) == [2, 4] and fn([3], 3) == [9]


ORIGINALS = {"ops/scale.py": BUGGY}


def test_healed_in_one_round() -> None:
    fixer = Scripted(edits(("out.append(v + factor)", "out.append(v * factor)")))
    verify, seen = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3)
    assert result.status == HEALED
    assert len(result.rounds) == 1 and len(seen) == 1
    assert result.rounds[0].edits[0].level == "exact"
    assert result.changed_files == ("ops/scale.py",)
    assert "-        out.append(v + factor)" in result.patch
    assert "+        out.append(v * factor)" in result.patch
    assert result.patch.startswith("diff --git a/ops/scale.py b/ops/scale.py")
    assert result.usage.calls == 1 and result.usage.cost == pytest.approx(0.001)


def test_healed_in_two_rounds_through_feedback() -> None:
    fixer = Scripted(
        edits(("out.append(v + factor)", "out.append(v + factor + 0)")),
        edits(("out.append(v + factor + 0)", "out.append(v * factor)")),
    )
    verify, _ = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3)
    assert result.status == HEALED and len(result.rounds) == 2
    second = fixer.requests[1]
    assert second.round == 2
    assert "assert [3, 4] == [2, 4]" in second.feedback  # the new failure
    assert "+        out.append(v + factor + 0)" in second.cumulative_diff  # builds on round 1
    assert second.files[0].text.count("v + factor + 0") == 1
    assert second.history[0].outcome == "1 of 1 failing tests still fail"
    # the final patch goes from the original to the winner, not from round 1
    assert "-        out.append(v + factor)\n+        out.append(v * factor)" in result.patch


def test_unhealed_after_n_rounds_with_the_reason() -> None:
    wrong = edits(("out.append(v + factor)", "out.append(v - factor)"))
    fixer = Scripted(wrong, edits(("out.append(v - factor)", "out.append(factor)")))
    verify, _ = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=2)
    assert result.status == UNHEALED
    assert result.reason.startswith("not healed after 2 round(s)")
    assert "still fail" in result.reason
    assert result.final == {}


def test_edit_that_does_not_match_is_fed_back_without_a_rerun() -> None:
    fixer = Scripted(
        edits(("results = sorted(results, key=len)", "results = sorted(results)"),
              ("while pending:", "while not pending:")),
        edits(("out.append(v + factor)", "out.append(v * factor)")),
    )
    verify, seen = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3)
    assert result.status == HEALED
    assert len(seen) == 1  # round 1 changed nothing, so nothing was rerun
    first = result.rounds[0]
    assert [e.level for e in first.edits] == ["none", "none"]
    feedback = fixer.requests[1].feedback
    assert "These edits did not apply" in feedback
    assert "levels tried: exact, trimmed, whitespace, fuzzy" in feedback
    assert "for v in values:" in feedback  # the nearest real fragment is shown


def test_fixer_error_stops_with_its_reason() -> None:
    fixer = Scripted(FixerError("replay cassette tape.jsonl has no answer left"))
    verify, seen = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3)
    assert result.status == UNHEALED
    assert "no answer left" in result.reason
    assert seen == [] and len(result.rounds) == 1


def test_unreadable_answer_is_fed_back() -> None:
    fixer = Scripted(Proposal((), raw="I think it is fine", parse_error="no edits found: ..."),
                     edits(("out.append(v + factor)", "out.append(v * factor)")))
    verify, _ = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=2)
    assert result.status == HEALED
    assert "could not be read: no edits found" in fixer.requests[1].feedback


def test_edits_to_files_outside_the_editable_set_are_refused() -> None:
    fixer = Scripted(
        edits(("assert", "pass"), file="tests/test_scale.py"),
        edits(("x", "y"), file="/etc/passwd"),
        edits(("x", "y"), file="../outside.py"),
    )
    verify, seen = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3)
    assert result.status == UNHEALED and seen == []
    reasons = [record.edits[0].error for record in result.rounds]
    assert "not editable" in reasons[0]
    assert "outside the editable set" in reasons[1]
    assert "outside the editable set" in reasons[2]


def test_guard_rejection_is_not_kept_for_the_next_round() -> None:
    def no_plus_zero(candidate: Candidate) -> Screening:
        return Screening("adds a no-op" if "+ 0" in candidate.files["ops/scale.py"] else "")

    fixer = Scripted(
        edits(("out.append(v + factor)", "out.append(v * factor + 0)")),
        edits(("out.append(v + factor)", "out.append(v * factor)")),
    )
    verify, seen = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3,
                  guard=no_plus_zero)
    assert result.status == HEALED and len(seen) == 1
    assert result.rounds[0].outcome == "rejected: adds a no-op"
    assert fixer.requests[1].cumulative_diff == ""  # the rejected change was dropped
    assert "rejected: adds a no-op" in fixer.requests[1].feedback


def test_a_repeated_candidate_is_not_rerun() -> None:
    wrong = edits(("out.append(v + factor)", "out.append(v - factor)"))
    back = edits(("out.append(v - factor)", "out.append(v + factor)"))
    fixer = Scripted(wrong, back, edits(("out.append(v + factor)", "out.append(v - factor)")))
    verify, seen = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3)
    assert result.status == UNHEALED
    assert len(seen) == 2
    assert result.rounds[2].outcome.startswith("repeats an earlier candidate")


def test_edit_without_file_goes_to_the_file_it_matches() -> None:
    files = {"ops/scale.py": BUGGY, "ops/offset.py": HELPER}
    applied = apply_proposal([Modification("return [v - 1 for v in values]",
                                           "return [v - 2 for v in values]")], files)
    assert applied.edits[0].file == "ops/offset.py" and applied.errors == ()
    assert "v - 2" in applied.files["ops/offset.py"]
    assert applied.files["ops/scale.py"] == BUGGY


def test_resolve_file_accepts_prefixed_and_bare_names() -> None:
    editable = ("kernels/gelu.py", "kernels/softmax.py")
    assert resolve_file("kernels/gelu.py", editable) == ("kernels/gelu.py", "")
    assert resolve_file("./kernels/gelu.py", editable) == ("kernels/gelu.py", "")
    assert resolve_file("project/kernels/gelu.py", editable) == ("kernels/gelu.py", "")
    assert resolve_file("gelu.py", editable) == ("kernels/gelu.py", "")
    assert resolve_file("b/kernels/softmax.py", editable) == ("kernels/softmax.py", "")
    assert resolve_file("tests/test_gelu.py", editable)[0] == ""


def test_a_hook_answer_string_is_read_like_a_model_answer() -> None:
    from pytest_kernelfix.fixers.hook import as_proposal

    text = '{"modifications": [{"old_string": "v + factor", "new_string": "v * factor"}]}'
    proposal = as_proposal(text, "hook")
    assert proposal.modifications == (Modification("v + factor", "v * factor"),)
    assert proposal.raw == text and proposal.source == "hook"
    unreadable = as_proposal("I would rather not.", "hook")
    assert unreadable.modifications == () and "No edits were found" in unreadable.parse_error
    assert "answer too large" in as_proposal("x" * 1_000_001, "hook").parse_error


def test_a_stale_quote_of_the_original_starts_over_from_the_original() -> None:
    """Round 2 quotes the line the error showed (the original), not the current one."""
    fixer = Scripted(
        edits(("        out.append(v + factor)\n", "        total = v + factor\n"
               "        out.append(total)\n")),
        edits(("out.append(v + factor)", "out.append(v * factor)")),  # stale: the original
    )
    verify, seen = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3)
    assert result.status == HEALED and len(result.rounds) == 2
    assert result.rounds[1].outcome.startswith("applied to the original text: ")
    assert "total" not in seen[1]["ops/scale.py"]  # the round-1 change was dropped
    assert "-        out.append(v + factor)\n+        out.append(v * factor)" in result.patch


def test_an_answer_matching_neither_text_is_still_refused() -> None:
    fixer = Scripted(
        edits(("        out.append(v + factor)\n", "        total = v + factor\n"
               "        out.append(total)\n")),
        edits(("out.append(v + factor)", "out.append(v * factor)"),
              ("return nothing", "return out")),  # the second edit matches no text at all
    )
    verify, seen = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=2)
    assert result.status == UNHEALED and len(seen) == 1
    assert [e.level for e in result.rounds[1].edits] == ["none", "none"]


def test_a_declining_answer_is_reported_with_its_analysis() -> None:
    declined = Proposal((), raw='{"modifications": []}', analysis="The kernel looks right.")
    fixer = Scripted(declined, edits(("out.append(v + factor)", "out.append(v * factor)")))
    verify, _ = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=2)
    assert result.status == HEALED
    assert result.rounds[0].outcome == "the model proposed no edit: The kernel looks right."
    assert "proposed no edit" in fixer.requests[1].feedback and '"need"' in (
        fixer.requests[1].feedback)


def test_two_identical_answers_in_a_row_end_the_bug() -> None:
    declined = Proposal((), raw='{"modifications": []}', analysis="Nothing to fix.")
    fixer = Scripted(declined, declined, edits(("out.append(v + factor)", "out.append(v)")))
    verify, seen = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3)
    assert result.status == UNHEALED and len(result.rounds) == 2 and seen == []
    assert result.reason.startswith("the model gave the same answer twice in a row (rounds 1 "
                                    "and 2)")
    assert len(fixer.answers) == 1  # round 3 was never asked for


def test_a_request_for_code_is_served_next_round() -> None:
    from pytest_kernelfix.locate.need import NeedAnswer

    asked: list[tuple[str, ...]] = []

    def resolve(items, current, focus):  # type: ignore[no-untyped-def]
        asked.append(tuple(items))
        return NeedAnswer(files={"ops/offset.py": HELPER}, found=("ops/offset.py:offset",),
                          missing=("'search: NOPE': nothing in the project",))

    ask = Proposal((), raw='{"need": ["ops/offset.py:offset"]}', analysis="show me offset",
                   need=("ops/offset.py:offset", "search: NOPE"))
    fixer = Scripted(ask, edits(("return [v - 1 for v in values]", "return [v - 2 for v in "
                                 "values]"), file="ops/offset.py"),
                     edits(("out.append(v + factor)", "out.append(v * factor)")))
    verify, seen = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3,
                  resolve_need=resolve)
    assert asked == [("ops/offset.py:offset", "search: NOPE")]
    assert result.rounds[0].outcome.startswith("asked for more code: ops/offset.py:offset")
    second = fixer.requests[1]
    assert [f.path for f in second.files] == ["ops/scale.py", "ops/offset.py"]
    assert [f.path for f in second.context.editable] == ["ops/scale.py", "ops/offset.py"]
    assert "Added to the files shown above" in second.feedback and "Not added" in (
        second.feedback)
    assert result.status == HEALED and "ops/offset.py" in result.original
    assert "v - 2" in seen[0]["ops/offset.py"]  # the requested file became editable


def test_the_first_prompt_is_what_the_fixer_sent_and_feedback_is_tidied() -> None:
    sent = [replace(edits(("out.append(v + factor)", "out.append(v - factor)")),
                    usage=Usage(calls=1, prompt_chars=1001)),
            replace(edits(("out.append(v - factor)", "out.append(v * factor)")),
                    usage=Usage(calls=1, prompt_chars=1002))]
    fixer = Scripted(*sent)
    verify, _ = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=2,
                  tidy=lambda text: text.replace("assert", "ASSERT"))
    assert result.prompt_chars == 1001
    assert "ASSERT [-1, 0] == [2, 4]" in fixer.requests[1].feedback
    assert result.shown == ("ops/scale.py",)


def test_the_model_is_told_when_its_quotes_were_the_original_text() -> None:
    fixer = Scripted(
        edits(("        out.append(v + factor)\n", "        total = v + factor\n"
               "        out.append(total)\n")),
        edits(("out.append(v + factor)", "out.append(v - factor)")),  # stale, still wrong
        edits(("out.append(v - factor)", "out.append(v * factor)")),
    )
    verify, _ = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3)
    assert result.status == HEALED
    third = fixer.requests[2]
    assert "quoted the original text, not the current files" in third.feedback
    assert "total" not in third.files[0].text and "v - factor" in third.files[0].text


def test_an_answer_that_says_not_a_kernel_bug_ends_the_bug_as_declined() -> None:
    answer = '{"analysis": "the op returns (4, 5) by design", "modifications": [], ' \
             '"not_a_kernel_bug": "the test expects the wrong shape"}'
    from pytest_kernelfix.fixers.answer import read_answer

    fixer = Scripted(read_answer(answer, usage=Usage(calls=1), source="scripted"))
    verify, seen = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3)
    assert result.status == DECLINED and seen == [] and result.usage.calls == 1
    assert result.reason == ("the model says this is not a kernel bug: the test expects the "
                             "wrong shape")
    assert result.rounds[0].outcome == "not a kernel bug: the test expects the wrong shape"
    assert fixer.answers == [] and len(fixer.requests) == 1  # no second, identical call


@pytest.mark.parametrize("analysis", [
    "This is not a kernel bug: the test compares with a float64 reference.",
    "Not a Triton kernel bug; the reference is computed in the wrong dtype.",
    "The failure is not a bug in the kernel but in the test's tolerance.",
    "not_a_kernel_bug: the expected shape is wrong",
])
def test_a_decline_written_only_in_the_analysis_costs_one_call(analysis: str) -> None:
    """No ``not_a_kernel_bug`` field, an empty edit list, the decline in words: the bug
    ends as declined after that answer, not after a second identical one."""
    from pytest_kernelfix.fixers.answer import read_answer

    raw = json.dumps({"analysis": analysis, "modifications": []})
    fixer = Scripted(*[read_answer(raw, usage=Usage(calls=1), source="scripted")] * 2)
    verify, seen = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3)
    assert result.status == DECLINED and len(fixer.requests) == 1 and seen == []
    assert result.reason == ("the model says this is not a kernel bug: "
                             + " ".join(analysis.split()))


def test_no_edit_with_the_kernel_said_right_is_asked_again() -> None:
    from pytest_kernelfix.fixers.answer import read_answer

    raw = '{"analysis": "The kernel looks right to me.", "modifications": []}'
    assert read_answer(raw, usage=Usage(), source="m").not_a_kernel_bug == ""


def test_a_mask_is_fed_back_and_kept_for_review_when_nothing_better_comes() -> None:
    masks: list[Mapping[str, str]] = []

    def verify(files: Mapping[str, str]) -> Verdict:
        masks.append(files)
        return Verdict(False, "masks the kernel's output (`out = [max(v, 0) for v in out]`)",
                       "The kernel's output is unchanged; the candidate masks it: fix the "
                       "kernel.", kind=VerdictKind.MASKED)

    fixer = Scripted(edits(("    return out", "    return [max(v, 0) for v in out]")),
                     Proposal((), raw='{"modifications": []}', analysis="no idea"))
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=2)
    assert result.status == MASKED
    assert "masks the kernel's output" in result.reason and "kept for review" in result.reason
    assert "max(v, 0)" in result.patch  # the masking candidate, for a reviewer
    assert "fix the kernel" in fixer.requests[1].feedback


@pytest.mark.parametrize("then", ["fixer error", "same answer"])
def test_a_mask_is_kept_when_a_later_round_ends_the_bug_early(then: str) -> None:
    def verify(files: Mapping[str, str]) -> Verdict:
        return Verdict(False, "masks the kernel's output", "fix the kernel.",
                       kind=VerdictKind.MASKED)

    mask = edits(("    return out", "    return [max(v, 0) for v in out]"))
    ending = FixerError("the replay cassette has no answer") if then == "fixer error" else mask
    fixer = Scripted(mask, ending)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3)
    assert result.status == MASKED, result.reason
    assert "kept for review" in result.reason and "max(v, 0)" in result.patch
    assert ("no answer" if then == "fixer error" else "same answer") in (
        result.rounds[-1].outcome)


def test_a_first_answer_asked_for_already_is_not_asked_again() -> None:
    first = edits(("out.append(v + factor)", "out.append(v * factor)"))
    fixer = Scripted()
    verify, _ = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=3,
                  first=first)
    assert result.status == HEALED and fixer.requests == []


def test_an_answer_nested_too_deep_is_fed_back_as_unreadable() -> None:
    from pytest_kernelfix.fixers.answer import read_answer

    deep = read_answer('{"modifications": ' + "[" * 1000 + "]" * 1000 + "}",
                       usage=Usage(calls=1), source="scripted")
    fixer = Scripted(deep, edits(("out.append(v + factor)", "out.append(v * factor)")))
    verify, _ = running(multiplies)
    result = heal(context("ops/scale.py"), ORIGINALS, fixer=fixer, verify=verify, rounds=2)
    assert result.status == HEALED and result.usage.calls == 2  # both answers were paid for
    assert result.rounds[0].outcome.startswith("answer could not be read")
    assert "could not be read" in fixer.requests[1].feedback


#: A module whose ``scale`` is long enough to be cut for length in a focused view.
LONG = BUGGY.replace("    out = []\n", "    out = []\n" + "".join(
    f"    note_{i} = {i}  # a line that only makes the function long\n" for i in range(60))
).replace("    return out\n", "".join(
    f"    more_{i} = {i}  # a line that only makes the function long\n" for i in range(60))
    + "    return out\n")


def _cut_context() -> BugContext:
    view = render_source("ops/scale.py", LONG, ["scale"], limit=1_500, keep=1)
    assert view.cut == ("scale",) and "out.append(v + factor)" not in view.content
    return replace(context("ops/scale.py"), editable=(view,), focus={"ops/scale.py": ("scale",)})


def test_after_an_answer_with_no_edit_what_was_cut_is_shown_whole() -> None:
    """The model says the fault is not in what it was shown: the next round shows the
    definitions the prompt had cut for length, whole, and says so."""
    declined = Proposal((), raw='{"modifications": []}', analysis="The fault is not shown.")
    fixer = Scripted(declined, edits(("out.append(v + factor)", "out.append(v * factor)")))
    verify, _ = running(multiplies)
    result = heal(_cut_context(), {"ops/scale.py": LONG}, fixer=fixer, verify=verify, rounds=2)
    assert result.status == HEALED
    first, second = (request.files[0] for request in fixer.requests)
    assert "out.append(v + factor)" not in first.content
    assert "out.append(v + factor)" in second.content and second.cut == ()
    assert "in full where the last prompt had cut them for length: ops/scale.py:scale" in (
        fixer.requests[1].feedback)


def test_a_request_for_a_definition_cut_for_length_shows_it_whole(tmp_path: Path) -> None:
    from pytest_kernelfix.locate.need import NeedResolver
    from pytest_kernelfix.project import Project

    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "scale.py").write_text(LONG)
    ask = Proposal((), raw='{"need": ["ops/scale.py:scale"]}', analysis="show me all of it",
                   need=("ops/scale.py:scale",))
    fixer = Scripted(ask, edits(("out.append(v + factor)", "out.append(v * factor)")))
    verify, _ = running(multiplies)
    result = heal(_cut_context(), {"ops/scale.py": LONG}, fixer=fixer, verify=verify, rounds=2,
                  resolve_need=NeedResolver(Project(tmp_path)))
    assert result.status == HEALED
    shown = fixer.requests[1].files[0]
    assert "out.append(v + factor)" in shown.content and shown.cut == ()
