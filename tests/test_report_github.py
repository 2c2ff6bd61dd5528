"""GitHub outputs: workflow-command annotations, the step summary, rdjson suggestions.

Everything a tool reads is checked by parsing it as that tool would: annotation lines
by GitHub's workflow-command grammar (unescaped), the step summary as the file GitHub
renders, ``suggestions.rdjson`` against a JSON Schema of reviewdog's diagnostic format
(``tests/data/rdjson.schema.json``, written from the format's specification) and by
applying its suggestions the way a reviewer's "commit suggestion" does.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import jsonschema
import pytest
from factories import make_bug_report
from hostile.project import BUG, FIX, fix_answer, write_project
from hypothesis import example, given
from hypothesis import strategies as st

from pytest_kernelfix.heal.outcomes import HEALED, UNHEALED
from pytest_kernelfix.report.github import (
    SUMMARY_LIMIT,
    Hunk,
    annotation_lines,
    append_step_summary,
    escape_data,
    escape_property,
    hunks,
    line_based,
    rdjson,
    repository_root,
    workflow_command,
)
from pytest_kernelfix.report.model import SessionReport
from pytest_kernelfix.report.patches import apply_command

SCHEMA = json.loads((Path(__file__).parent / "data" / "rdjson.schema.json").read_text())
COMMAND = re.compile(r"^::(?P<command>[a-z]+) (?P<properties>[^:]*)::(?P<message>.*)$")


def unescape(text: str) -> str:
    for escaped, plain in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","),
                           ("%25", "%")):
        text = text.replace(escaped, plain)
    return text


def parse_command(line: str) -> tuple[str, dict[str, str], str]:
    """A workflow command as the runner reads it: command, properties, message."""
    match = COMMAND.match(line)
    assert match, line
    properties = {}
    for item in match["properties"].split(","):
        name, _, value = item.partition("=")
        properties[name] = unescape(value)
    return match["command"], properties, unescape(match["message"])


def apply_suggestions(text: str, suggestions: list[dict]) -> str:  # type: ignore[type-arg]
    """Replace each line-based range, last first, as GitHub's "commit suggestion" does."""
    lines = text.splitlines()
    for suggestion in sorted(suggestions, key=lambda s: -s["range"]["start"]["line"]):
        span = suggestion["range"]
        assert "column" not in span["start"] and "column" not in span.get("end", {})
        start, end = span["start"]["line"], span.get("end", span["start"])["line"]
        new = suggestion["text"].split("\n") if suggestion["text"] else []
        lines[start - 1:end] = new
    return "\n".join(lines)


# --- workflow commands ---------------------------------------------------------------


def test_escaping_follows_the_workflow_command_rules() -> None:
    assert escape_data("50% done\r\nnext: a, b") == "50%25 done%0D%0Anext: a, b"
    assert escape_property("k1.py:3, 50%\n") == "k1.py%3A3%2C 50%25%0A"
    line = workflow_command("warning", {"file": "a,b:c.py", "line": 7, "title": "t: x"},
                            "one\ntwo %")
    assert line == "::warning file=a%2Cb%3Ac.py,line=7,title=t%3A x::one%0Atwo %25"
    assert parse_command(line) == (
        "warning", {"file": "a,b:c.py", "line": "7", "title": "t: x"}, "one\ntwo %")


# --- changed lines -----------------------------------------------------------------------


def test_hunks_name_the_original_lines_and_merge_near_changes() -> None:
    original = "\n".join(f"line {n}" for n in range(1, 21)) + "\n"
    final = (original.replace("line 3\n", "LINE 3\n").replace("line 5\n", "LINE 5\n")
             .replace("line 18\n", ""))
    assert hunks(original, final) == [
        Hunk(3, 5, ("LINE 3", "line 4", "LINE 5")),  # 1 unchanged line apart: one hunk
        Hunk(18, 18, ()),  # a deletion
    ]
    inserted = original.replace("line 10\n", "line 10\nnew\n")
    (insertion,) = hunks(original, inserted)
    assert insertion == Hunk(11, 10, ("new",))  # before line 11, replacing nothing
    assert line_based(insertion, original) == Hunk(10, 10, ("line 10", "new"))
    (top,) = hunks(original, "first\n" + original)
    assert line_based(top, original) == Hunk(1, 1, ("first", "line 1"))


@given(
    st.lists(st.sampled_from(["a", "b", "c", "", "    x = 1"]), max_size=12),
    st.lists(st.tuples(st.integers(0, 12), st.integers(0, 3),
                       st.lists(st.sampled_from(["n", "b", "  y"]), max_size=3)), max_size=4),
)
@example(lines=["a", "a", "a", "a", "b", "", ""], edits=[(3, 3, [])])  # leaves one empty line
def test_line_based_suggestions_rebuild_the_final_text(
    lines: list[str], edits: list[tuple[int, int, list[str]]]
) -> None:
    """Whatever changed, applying every suggestion to the original gives the final text."""
    new = list(lines)
    for at, drop, insert in edits:
        at = min(at, len(new))
        new[at:at + drop] = insert
    original, final = "\n".join(lines) + "\n", "\n".join(new) + "\n"
    suggestions = [
        {"range": {"start": {"line": h.start}, "end": {"line": h.end}}, "text": "\n".join(h.lines)}
        for h in (line_based(h, original) for h in hunks(original, final))
    ]
    if not lines:  # nothing to anchor a suggestion to: GitHub cannot suggest in an empty file
        return
    assert apply_suggestions(original, suggestions) == "\n".join(new)


def test_apply_lines_run_from_the_repository_root_when_the_rootdir_is_below_it(
    tmp_path: Path,
) -> None:
    repo, rootdir = tmp_path / "repo", tmp_path / "repo" / "sub"
    patch = rootdir / ".kernelfix" / "k1.patch"
    assert apply_command(patch, rootdir, repo, repo) == (
        "git apply --directory=sub sub/.kernelfix/k1.patch")
    assert apply_command(patch, rootdir, rootdir, repo) == (
        "git -C .. apply --directory=sub sub/.kernelfix/k1.patch")
    assert apply_command(patch, rootdir, rootdir, rootdir) == "git apply .kernelfix/k1.patch"
    assert apply_command(patch, rootdir, repo, rootdir) == "git -C sub apply .kernelfix/k1.patch"


def test_repository_root_is_the_git_top_level(tmp_path: Path) -> None:
    deep = tmp_path / "repo" / "sub" / "project"
    deep.mkdir(parents=True)
    assert repository_root(deep, {}) == deep  # no repository anywhere: the rootdir
    assert repository_root(deep, {"GITHUB_WORKSPACE": str(tmp_path / "repo")}) == (
        tmp_path / "repo")
    (tmp_path / "repo" / ".git").write_text("gitdir: elsewhere\n")  # a worktree's .git file
    assert repository_root(deep, {}) == tmp_path / "repo"


# --- step summary --------------------------------------------------------------------------


def test_the_summary_is_appended_and_cut_to_githubs_limit(tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    assert append_step_summary("# kernelfix report\n", summary) == ""
    assert summary.read_text() == "earlier step\n\n# kernelfix report\n"

    summary.write_text("x" * (SUMMARY_LIMIT - 5000) + "\n")
    big = "# kernelfix report\n\n```diff\n" + "+ added line\n" * 2000 + "```\n"
    note = append_step_summary(big, summary)
    text = summary.read_text()
    assert "cut to fit" in note and note in text
    assert len(text.encode()) <= SUMMARY_LIMIT
    assert text.count("```") % 2 == 0  # the cut diff block is closed again


# --- rdjson, from a report built in memory ------------------------------------------------


def test_rdjson_holds_one_suggestion_per_change_and_validates(tmp_path: Path) -> None:
    root = tmp_path / "repo" / "project"
    (root / "kernels").mkdir(parents=True)
    (root / "tests").mkdir()
    (tmp_path / "repo" / ".git").mkdir()
    original = "".join(f"    line {n}\n" for n in range(1, 30))
    final = original.replace("    line 4\n", "    LINE 4\n").replace(
        "    line 25\n", "    line 25\n    added\n")
    for name, text in (("k1", original), ("k2", original)):
        (root / "kernels" / f"{name}.py").write_text(text)
    (root / "tests" / "test_k2.py").write_text("\n" * 20)
    report = SessionReport(
        (make_bug_report(root, "k1", original, final, HEALED),
         make_bug_report(root, "k2", original, original, UNHEALED)),
        root, root / ".kernelfix", "report", "interpret", "recipes", 1.0)

    document = rdjson(report, repository_root(root, {}))
    jsonschema.validate(document, SCHEMA)
    assert len(document["diagnostics"]) == 2  # two far-apart changes; nothing for k2
    assert {d["location"]["path"] for d in document["diagnostics"]} == {"project/kernels/k1.py"}
    suggestions = [s for d in document["diagnostics"] for s in d["suggestions"]]
    assert apply_suggestions(original, suggestions) + "\n" == final

    healed, unhealed = (parse_command(line) for line in
                        annotation_lines(report, repository_root(root, {})))
    assert healed[0] == "notice" and healed[1]["file"] == "project/kernels/k1.py"
    assert healed[1]["line"] == "4" and healed[1]["title"] == "kernelfix healed " + (
        "k1_kernel-assertionerror-abc123")
    # not healed, no frame in an editable file: the launched kernel's line
    assert unhealed[0] == "warning"
    assert (unhealed[1]["file"], unhealed[1]["line"]) == ("project/kernels/k2.py", "4")
    assert unhealed[2].endswith("unhealed: not healed")


# --- a whole session in GitHub Actions, pytest run from the repository root ------------------


def git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True)


def test_a_session_in_github_actions_annotates_summarises_and_suggests(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = pytester.path
    root = write_project(repo / "sub", "k1", "k2")
    tape = root / "tape.jsonl"
    tape.write_text(json.dumps({"group": "k1_kernel-*", "response": fix_answer("k1")}) + "\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "red")
    summary = repo / "step-summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))

    result = pytester.runpytest_subprocess(
        "sub", "-p", "no:cacheprovider", "-p", "no:randomly", "--kernelfix",
        "--kernelfix-model=replay:sub/tape.jsonl", timeout=600)

    result.assert_outcomes(failed=2, passed=1)
    commands = [parse_command(line) for line in result.stdout.lines if line.startswith("::")]
    assert [(c[0], c[1]["title"].split("-")[0]) for c in commands] == [
        ("notice", "kernelfix healed k1_kernel"), ("warning", "kernelfix could not heal k2_kernel")]
    (_, healed, message), (_, unhealed, why) = commands
    kernel = (root / "kernels" / "k1.py").read_text().splitlines()
    assert healed["file"] == "sub/kernels/k1.py"  # from the repository root, not the rootdir
    assert kernel[int(healed["line"]) - 1] == BUG
    patch_name = f"{healed['title'].removeprefix('kernelfix healed ')}.patch"
    assert f"Patch: sub/.kernelfix/{patch_name}" in message
    assert unhealed["file"] == "sub/kernels/k2.py"
    assert "k2_kernel" in (root / "kernels" / "k2.py").read_text().splitlines()[
        int(unhealed["line"]) - 1]
    assert "unhealed: round 1: replay cassette" in why and "no answer left" in why

    text = summary.read_text()
    assert text.startswith("earlier step\n\n# kernelfix report\n")
    assert "2 bug(s): 1 healed, 1 unhealed, 0 skipped" in text
    assert text.endswith((root / ".kernelfix" / "report.md").read_text())

    document = json.loads((root / ".kernelfix" / "suggestions.rdjson").read_text())
    jsonschema.validate(document, SCHEMA)
    (diagnostic,) = document["diagnostics"]
    assert diagnostic["location"]["path"] == "sub/kernels/k1.py"
    assert diagnostic["suggestions"][0]["text"] == FIX
    original = (root / "kernels" / "k1.py").read_text()
    suggested = apply_suggestions(original, diagnostic["suggestions"]) + "\n"
    # the printed line, run where pytest ran: git reads paths from the repository root
    (command,) = [line.strip() for line in result.stdout.lines if "git apply" in line]
    assert command == f"git apply --directory=sub sub/.kernelfix/{patch_name}"
    git(repo, *shlex.split(command)[1:])
    assert suggested == (root / "kernels" / "k1.py").read_text()  # the patch, line for line
