"""Every output of a session, written once, from one report.

The controller calls :func:`publish` once with the session's report and the sinks the
session asked for: the files in the report dir (:class:`ReportFiles`: patches,
prompt files, report.json, report.md, suggestions.rdjson), GitHub's step summary and annotations
(:class:`GitHubActions`), and JUnit XML properties
(:class:`~pytest_kernelfix.report.junit.JUnitProperties`, which writes once pytest's
junitxml has). A sink that fails costs its own output and a note, never the session;
only the report files are ``required``: a session that cannot write them says so as an
error.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from filelock import FileLock

from pytest_kernelfix.report.folder import make_report_dir, write_atomic
from pytest_kernelfix.report.github import github_outputs, write_suggestions
from pytest_kernelfix.report.json_report import report_json
from pytest_kernelfix.report.markdown_report import report_markdown
from pytest_kernelfix.report.model import SessionReport, round_prompt_file
from pytest_kernelfix.report.patches import remove_stale_patches, write_patches
from pytest_kernelfix.report.prompts import remove_stale_prompts, write_prompt_files


@dataclass(frozen=True)
class Published:
    """What publishing leaves for the terminal: ``lines`` printed with the summary
    (GitHub reads workflow commands from the log) and ``notes`` on what went wrong."""

    lines: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def __add__(self, other: Published) -> Published:
        return Published(self.lines + other.lines, self.notes + other.notes)


class Sink(Protocol):
    """One kind of output of a session; a ``required`` one raises when it fails."""

    name: str
    required: bool

    def publish(self, report: SessionReport) -> Published: ...


class ReportFiles:
    """Patches, prompt files, report.json, report.md and suggestions.rdjson in the report
    dir (with its .gitignore), written under a lock on the report dir (xdist sessions and
    concurrent runs share it)."""

    name = "the report files"
    required = True

    def publish(self, report: SessionReport) -> Published:
        make_report_dir(report.report_dir, report.rootdir)
        with FileLock(str(report.report_dir / ".report.lock"), timeout=120):
            write_patches(report)
            write_prompts(report)
            write_reports(report)
            write_suggestions(report)
        return Published()


def write_prompts(report: SessionReport) -> tuple[str, ...]:
    """Write every round's prompt file (none with ``save_prompts`` off); their names."""
    if not report.save_prompts:
        return ()
    rounds = ((bug.group.id, record) for bug in report.bugs for record in bug.result.rounds)
    return write_prompt_files(report.report_dir, rounds)


def write_reports(report: SessionReport) -> Mapping[str, Path]:
    """Write report.json and report.md next to the patches and prompt files, and remove
    those an earlier session left; returns the reports' paths."""
    json_path = report.report_dir / "report.json"
    md_path = report.report_dir / "report.md"
    write_atomic(json_path, report_json(report))
    write_atomic(md_path, report_markdown(report))
    remove_stale_patches(report.report_dir, [b.patch_file for b in report.bugs if b.patch_file])
    remove_stale_prompts(report.report_dir, [
        name for bug in report.bugs for record in bug.result.rounds
        if (name := round_prompt_file(bug, record, report.save_prompts))])
    return {"json": json_path, "markdown": md_path}


class GitHubActions:
    """In GitHub Actions: report.md appended to the step summary, one annotation per bug.
    Reads the report files, so it comes after :class:`ReportFiles`."""

    name = "the GitHub outputs"
    required = False

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ

    def publish(self, report: SessionReport) -> Published:
        lines, notes = github_outputs(report, self.environ)
        return Published(tuple(lines), tuple(notes))


def publish(report: SessionReport, sinks: Iterable[Sink]) -> Published:
    """Hand ``report`` to every sink in order."""
    published = Published()
    for sink in sinks:
        try:
            published += sink.publish(report)
        except Exception as error:  # one output lost, never the session
            if sink.required:
                raise
            published += Published(notes=(
                f"{sink.name} were not written: {type(error).__name__}: {error}",))
    return published
