"""What a healing session tells GitHub: the step summary, annotations, review suggestions.

- ``suggestions.rdjson`` (always written beside the patches): every healed change as a
  review suggestion in reviewdog's diagnostic format (rdjson), so
  ``reviewdog -f=rdjson -reporter=github-pr-review`` posts it on the pull request's lines
  (any rdjson consumer, GitLab's included, reads it too).
- With ``GITHUB_ACTIONS=true``: ``report.md`` is appended to ``$GITHUB_STEP_SUMMARY``,
  and one workflow-command annotation per bug is printed: ``::notice`` at the first
  line a healed bug's patch changes, ``::warning`` with the reason for the others.

Paths are relative to the repository root (the git top level), which differs from
pytest's rootdir when pytest runs in a subdirectory: GitHub and reviewdog resolve paths
from the repository root. Line numbers are those of the files as the tests ran, the
commit the pull request shows. Import-light: standard library only.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_kernelfix.heal.outcomes import DECLINED, HEALED, MASKED, SKIPPED
from pytest_kernelfix.locate.change import REGRESSION, TEST_CHANGED
from pytest_kernelfix.redact import redact
from pytest_kernelfix.report.folder import write_atomic
from pytest_kernelfix.report.model import (
    BugReport,
    SessionReport,
    error_headline,
    healers,
    healing_patches,
)
from pytest_kernelfix.report.patches import repository_root
from pytest_kernelfix.report.unselected import select_hint, unselected_sentence

SUGGESTIONS_FILE = "suggestions.rdjson"
SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
#: GitHub refuses a step summary over 1 MiB (the whole file, all writers of the step).
SUMMARY_LIMIT = 1024 * 1024
#: Changes closer than this many unchanged lines become one suggestion.
_MERGE_GAP = 3
_SOURCE = {"name": "pytest-kernelfix"}


def in_github_actions(environ: Mapping[str, str]) -> bool:
    return environ.get("GITHUB_ACTIONS", "").strip().lower() == "true"


def repo_path(path: Path, repo_root: Path) -> str:
    """``path`` relative to the repository root, with ``/`` (absolute when outside it)."""
    relative = os.path.relpath(os.path.abspath(path), repo_root)
    return os.path.abspath(path) if relative.startswith("..") else Path(relative).as_posix()


# --- workflow commands ---------------------------------------------------------------


def escape_data(text: str) -> str:
    """A workflow command's message: ``%``, CR and LF escaped (GitHub's toolkit rules)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value: also ``:`` and ``,`` escaped."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_command(command: str, properties: Mapping[str, object], message: str) -> str:
    shown = ",".join(f"{name}={escape_property(str(value))}"
                     for name, value in properties.items())
    return f"::{command} {shown}::{escape_data(message)}"


# --- where a change lands -------------------------------------------------------------


@dataclass(frozen=True)
class Hunk:
    """Lines ``start``..``end`` (1-based, inclusive) of the original become ``lines``.

    ``end == start - 1`` is a pure insertion before line ``start``.
    """

    start: int
    end: int
    lines: tuple[str, ...]


def hunks(original: str, final: str) -> list[Hunk]:
    """The changed line ranges of one file, nearby changes merged."""
    old, new = original.splitlines(), final.splitlines()
    blocks: list[list[int]] = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if blocks and i1 - blocks[-1][1] <= _MERGE_GAP:
            blocks[-1][1], blocks[-1][3] = i2, j2
        else:
            blocks.append([i1, i2, j1, j2])
    return [Hunk(i1 + 1, i2, tuple(new[j1:j2])) for i1, i2, j1, j2 in blocks]


def line_based(hunk: Hunk, original: str) -> Hunk:
    """A hunk that replaces at least one whole line with text a suggestion can carry.

    A pure insertion takes the line before it along (or the line after, at the top), as
    GitHub suggestions must replace whole lines. So does a hunk whose new text is one
    empty line: its suggestion text would be "", and an empty suggestion deletes.
    """
    old = original.splitlines()
    if not old or (hunk.end >= hunk.start and hunk.lines != ("",)):
        return hunk
    if hunk.start > 1:
        before = hunk.start - 1
        return Hunk(before, hunk.end, (old[before - 1], *hunk.lines))
    if hunk.end < len(old):
        after = hunk.end + 1
        return Hunk(1, after, (*hunk.lines, old[after - 1]))
    return hunk


def first_change(bug: BugReport, within: tuple[str, ...] | None = None
                 ) -> tuple[str, int] | None:
    """The first changed line of a healed bug's patch: (rootdir-relative file, line);
    ``within``: in one of these files only."""
    result = bug.result
    for path in result.changed_files:
        if within is not None and path not in within:
            continue
        found = hunks(result.original[path], result.final[path])
        if found:
            return path, line_based(found[0], result.original[path]).start
    return None


def healed_location(bug: BugReport, report: SessionReport) -> tuple[str, int] | None:
    """Where a healed bug shows: the first line its patch changes; for a bug an earlier
    bug's patch heals, the first line that patch changes in this bug's own files (else
    where its failure shows)."""
    where = first_change(bug)
    for other in healers(bug, report) if where is None else ():
        where = first_change(other, bug.group.editable)
        if where is not None:
            break
    return where or failure_location(bug, report.rootdir)


def failure_location(bug: BugReport, rootdir: Path) -> tuple[str, int] | None:
    """Where a bug that was not healed shows: the innermost traceback line in a file a
    fix may edit; else, for a bug the model declined as not a kernel bug (the test's own
    expectation), the test's line; else the launched kernel's ``def``; else the innermost
    line in the project."""
    failure = bug.group.first

    def inside(pairs: list[tuple[str, int]]) -> list[tuple[str, int]]:
        found = []
        for path, line in pairs:
            relative = os.path.relpath(os.path.abspath(path), rootdir)
            if not relative.startswith("..") and os.path.isfile(path):
                found.append((Path(relative).as_posix(), line))
        return found

    frames = inside([(frame.path, frame.lineno) for frame in reversed(failure.error.frames)])
    kernels = inside([(launch.file, launch.line) for launch in failure.launches])
    editable = [where for where in frames if where[0] in bug.group.editable]
    if editable:
        return editable[0]
    test = next((where for where in frames
                 if os.path.abspath(rootdir / where[0]) == failure.test_path), None)
    if test is not None and bug.result.status == DECLINED:
        return test
    kernel = next((where for where in kernels if where[0] in bug.group.editable), None)
    anywhere = frames + kernels
    return kernel or (anywhere[0] if anywhere else None)


def culprit_location(bug: BugReport) -> tuple[str, int] | None:
    """The first culprit line of the change (rootdir-relative file, line), when the
    experiment found the lines whose revert alone makes the test pass, or the test's own
    changed lines that explain the failure."""
    regression = bug.result.regression
    if regression is None or regression.verdict not in (REGRESSION, TEST_CHANGED) or (
            not regression.culprits):
        return None
    hunk = regression.culprits[0]
    return hunk.path, hunk.line


def _tests(bug: BugReport) -> str:
    nodeids = bug.group.nodeids
    more = f" and {len(nodeids) - 1} more" if len(nodeids) > 1 else ""
    return f"{len(nodeids)} failing test(s) ({nodeids[0]}{more})"


def annotation(bug: BugReport, report: SessionReport, repo_root: Path) -> str:
    """One ``::notice`` (healed) or ``::warning`` (unhealed, skipped) line for ``bug``."""
    result, group = bug.result, bug.group
    headline = error_headline(group)
    if result.status == HEALED:
        command, title = "notice", f"kernelfix healed {group.id}"
        where = healed_location(bug, report)
        message = (f"{_tests(bug)} pass with the change suggested here, verified by a rerun."
                   f"\nThe error was: {headline}")
        if result.healed_by:
            message = (f"{_tests(bug)} pass with the patch of {result.healed_by}, verified "
                       f"by a rerun.\nThe error was: {headline}")
        patches = healing_patches(bug, report)
        if patches:
            message += "\nPatch: " + ", ".join(
                repo_path(report.report_dir / name, repo_root) for name in patches)
    else:
        command = "warning"
        title = {SKIPPED: f"kernelfix skipped {group.id}",
                 DECLINED: f"kernelfix: not a kernel bug ({group.id})",
                 MASKED: f"kernelfix: only a mask for {group.id}"}.get(
                     result.status, f"kernelfix could not heal {group.id}")
        where = failure_location(bug, report.rootdir)
        message = f"{_tests(bug)} fail: {headline}\n{result.status}: {result.reason}"
    culprit = culprit_location(bug)
    if culprit is not None and result.regression is not None:
        where = culprit  # on the change's line, where the pull request shows it
        if result.regression.summary not in message:
            message += f"\n{result.regression.summary}"
        if result.revert:
            message += ("\nThe suggested patch only reverts these lines of the change: a "
                        "revert, not a fix of the change.")
    properties: dict[str, object] = {}
    if where is not None:
        properties = {"file": repo_path(report.rootdir / where[0], repo_root),
                      "line": where[1]}
    properties["title"] = title
    return redact(workflow_command(command, properties, message))


def annotation_lines(report: SessionReport, repo_root: Path) -> list[str]:
    """One line per bug, then one about the failing tests the selection left out."""
    lines = [annotation(bug, report, repo_root) for bug in report.bugs]
    if report.unselected:
        message = (f"{unselected_sentence(report.unselected, report.select)}.\nTo heal them: "
                   f"{select_hint(report.unselected, report.select)}.")
        lines.append(redact(workflow_command(
            "notice", {"title": f"kernelfix left {len(report.unselected)} failing test(s) "
                                "unselected"}, message)))
    return lines


# --- step summary ----------------------------------------------------------------------


def append_step_summary(markdown: str, target: Path) -> str:
    """Append ``markdown`` to the step summary file; a note when it had to be cut or
    could not be written, else ""."""
    try:
        used = target.stat().st_size if target.exists() else 0
    except OSError:
        used = 0
    data = ("\n" if used else "") + markdown
    note = ""
    room = SUMMARY_LIMIT - used
    if len(data.encode("utf-8")) > room:
        data = _cut(data, room - 200)
        note = ("the report was cut to fit GitHub's 1 MiB step summary; the whole report "
                "is report.md in the report dir")
        data += f"\n\n> kernelfix: {note}.\n"
    try:
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(data)
    except OSError as error:
        return f"could not append to ${SUMMARY_ENV} ({target}): {error.strerror or error}"
    return note


def _cut(text: str, limit: int) -> str:
    """Whole lines of ``text`` within ``limit`` bytes, with an open code fence closed."""
    kept: list[str] = []
    size = 0
    for line in text.splitlines(keepends=True):
        size += len(line.encode("utf-8"))
        if size > max(limit, 0):
            break
        kept.append(line)
    fences = sum(1 for line in kept if line.lstrip().startswith("```"))
    body = "".join(kept)
    return body + ("\n```" if fences % 2 else "")


# --- review suggestions (rdjson) ---------------------------------------------------------


def _diagnostics(bug: BugReport, report: SessionReport, repo_root: Path) -> list[dict[str, Any]]:
    result, group = bug.result, bug.group
    message = (f"kernelfix healed {group.id}: {_tests(bug)} pass with this change, verified "
               "by rerunning them and the tests that passed before on a copy of the project."
               f"\n\nThe error was: `{error_headline(group)}`")
    out = []
    for path in result.changed_files:
        original = result.original[path]
        for raw in hunks(original, result.final[path]):
            hunk = line_based(raw, original)
            span = {"start": {"line": hunk.start}, "end": {"line": hunk.end}}
            out.append({
                "message": redact(message),
                "location": {"path": repo_path(report.rootdir / path, repo_root),
                             "range": span},
                "severity": "INFO",
                "source": _SOURCE,
                "code": {"value": group.id},
                "suggestions": [{"range": span, "text": "\n".join(hunk.lines)}],
            })
    return out


def rdjson(report: SessionReport, repo_root: Path) -> dict[str, Any]:
    """The session's healed changes as one rdjson ``DiagnosticResult``."""
    diagnostics: list[dict[str, Any]] = []
    for bug in report.bugs:
        if bug.result.status == HEALED:
            diagnostics.extend(_diagnostics(bug, report, repo_root))
    return {"source": dict(_SOURCE), "severity": "INFO", "diagnostics": diagnostics}


def write_suggestions(report: SessionReport, environ: Mapping[str, str] | None = None) -> Path:
    """Write ``suggestions.rdjson`` beside the patches (empty when nothing was healed)."""
    path = report.report_dir / SUGGESTIONS_FILE
    document = rdjson(report, repository_root(report.rootdir, environ))
    write_atomic(path, json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    return path


def github_outputs(report: SessionReport, environ: Mapping[str, str]
                   ) -> tuple[list[str], list[str]]:
    """In GitHub Actions: append the summary; return (annotation lines, notes)."""
    if not in_github_actions(environ):
        return [], []
    notes: list[str] = []
    summary = environ.get(SUMMARY_ENV, "").strip()
    if summary:
        markdown = (report.report_dir / "report.md").read_text(encoding="utf-8")
        note = append_step_summary(markdown, Path(summary))
        if note:
            notes.append(note)
    return annotation_lines(report, repository_root(report.rootdir, environ)), notes

