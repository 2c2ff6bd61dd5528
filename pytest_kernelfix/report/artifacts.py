"""Artifacts of a healing session: one patch per healed bug, report.json, report.md, and
the prompt files of every round (:mod:`pytest_kernelfix.report.prompts`).

Patches are written the way Hypothesis writes its patches: a short header git ignores,
``a/`` ``b/`` paths relative to the rootdir, a stable name derived from the bug, and a
``git apply`` line in the summary. A bug healed on top of an earlier bug's patch (they
share a file) has a patch that applies after that one: the summary prints them in that
order. A bug that another bug's patch already heals has no patch of its own. A masked
bug's candidate is kept for review as ``<bug>.masked.patch``, never applied.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelfix import __version__
from pytest_kernelfix.atomic import replace_file
from pytest_kernelfix.capture.records import Unselected
from pytest_kernelfix.fixers.base import Usage
from pytest_kernelfix.heal.outcomes import (
    HEALED,
    MASKED,
    SKIPPED,
    STATUSES,
    UNHEALED,
    HealResult,
    Phase,
    RoundRecord,
    phase_text,
)
from pytest_kernelfix.locate.change import REGRESSION, TEST_CHANGED, Regression, Trial
from pytest_kernelfix.locate.context import CHARS_PER_TOKEN
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.redact import redact
from pytest_kernelfix.report.prompts import prompt_file, remove_stale_prompts, write_prompt_files
from pytest_kernelfix.report.unselected import (
    unselected_json,
    unselected_lines,
    unselected_markdown,
)
from pytest_kernelfix.rerun.launcher import RerunStats
from pytest_kernelfix.root import git_top

SCHEMA_VERSION = 3
PATCH_MARKER = "Generated-by: pytest-kernelfix"
#: How much of an error line patches, reports and CI annotations show.
HEADLINE_CHARS = 300


@dataclass(frozen=True)
class BugReport:
    """One bug as reported: the group, how the heal ended, and what was done with it."""

    group: BugGroup
    result: HealResult
    patch_file: str = ""
    applied: tuple[str, ...] = ()
    apply_error: str = ""
    reruns: RerunStats = field(default_factory=RerunStats)
    #: Bugs whose patches this bug's patch applies after (they share a file).
    builds_on: tuple[str, ...] = ()


@dataclass(frozen=True)
class SessionReport:
    """The session's bugs and how it ran; ``save_prompts`` says whether the prompt files
    are written (``--kernelfix-save-prompts``)."""

    bugs: tuple[BugReport, ...]
    rootdir: Path
    report_dir: Path
    mode: str
    device: str
    model: str
    seconds: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    workers: int = 1

    @property
    def reruns(self) -> RerunStats:
        """Every bug's reruns together."""
        total = RerunStats()
        for bug in self.bugs:
            total = total + bug.reruns
        return total
    max_cost: float = 0.0
    max_tokens: int = 0
    save_prompts: bool = True
    #: Failing tests ``select`` (``kernelfix_select``) left out, with the reason.
    unselected: tuple[Unselected, ...] = ()
    select: tuple[str, ...] = ("kernel",)
    #: How much healing overlapped the test run (None: it began after the run).
    overlap: Overlapped | None = None
    #: A Ctrl-C or SIGTERM stopped the session early (a note says which, and what it left).
    interrupted: bool = False

    @property
    def usage(self) -> Usage:
        total = Usage()
        for bug in self.bugs:
            total = total + bug.result.usage
        return total

    def count(self, status: str) -> int:
        return sum(1 for bug in self.bugs if bug.result.status == status)


@dataclass(frozen=True)
class Overlapped:
    """How much healing overlapped the test run: ``bugs`` whose heal began while it
    ran, and the seconds healing went on after its last test."""

    bugs: int
    after_tests: float
def healers(bug: BugReport, report: SessionReport) -> tuple[BugReport, ...]:
    """The bugs whose patches heal ``bug`` (``healed_by``), in the order they apply."""
    names = [name.strip() for name in bug.result.healed_by.split(",") if name.strip()]
    by_id = {other.group.id: other for other in report.bugs}
    return tuple(by_id[name] for name in names if name in by_id)


def healing_patches(bug: BugReport, report: SessionReport) -> tuple[str, ...]:
    """The patch files that heal ``bug``: its own, or those of the bugs it is healed by."""
    if bug.patch_file:
        return (bug.patch_file,)
    return tuple(other.patch_file for other in healers(bug, report) if other.patch_file)


def patch_name(group: BugGroup, status: str = HEALED) -> str:
    return f"{group.id}.masked.patch" if status == MASKED else f"{group.id}.patch"


def counts(report: SessionReport) -> str:
    """``2 healed, 1 unhealed, 0 skipped``: the three main statuses always, the others
    (masked, declined) where they occur, in report order."""
    return ", ".join(f"{report.count(status)} {status}" for status in STATUSES
                     if report.count(status) or status in (HEALED, UNHEALED, SKIPPED))


def phases_json(phases: Sequence[Phase]) -> list[dict[str, Any]]:
    """Which tests each step ran, how long it took, how its tests ended (``results``)
    and how the step ended (``outcome``)."""
    return [{"name": phase.name, "tests": list(phase.nodeids), "seconds": phase.seconds,
             "results": phase.results, "outcome": phase.outcome} for phase in phases]


def error_headline(group: BugGroup) -> str:
    """The bug's error line as patches, reports and CI annotations show it."""
    return group.first.error.headline[:HEADLINE_CHARS]


def patch_text(group: BugGroup, result: HealResult) -> str:
    """The patch file: a header that ``git apply`` skips (redacted), then the diff."""
    header = [
        f"{PATCH_MARKER} {__version__}",
        f"Bug: {group.id}",
        f"Error: {error_headline(group)}",
        f"Tests: {len(group.nodeids)} ({group.nodeids[0]}"
        + (", ..." if len(group.nodeids) > 1 else "") + ")",
        f"Rounds: {len(result.rounds)}",
    ]
    if result.status == MASKED:
        header.append("Status: masked, kept for review: the kernel's output is unchanged and "
                      "this patch masks it; it is not a fix")
    if result.regression is not None and result.regression.verdict == REGRESSION:
        header.append(f"Regression: {result.regression.summary}")
    if result.revert:
        header.append("Revert: this patch only puts back lines of the change since "
                      f"{result.regression.base if result.regression else 'the base'}")
    header.append("")
    return redact("\n".join(header)) + "\n" + result.patch


def redacted(data: Any) -> Any:
    """``data`` (JSON-like) with every string redacted, before it is serialised."""
    if isinstance(data, str):
        return redact(data)
    if isinstance(data, list):
        return [redacted(item) for item in data]
    if isinstance(data, dict):
        return {key: redacted(value) for key, value in data.items()}
    return data


def write_atomic(path: Path, text: str) -> None:
    replace_file(path, text.encode("utf-8"))


def _levels(result: HealResult) -> list[list[str]]:
    return [[edit.level for edit in record.edits] for record in result.rounds]


def round_prompt_file(bug: BugReport, record: RoundRecord, save_prompts: bool) -> str:
    """The round's prompt file relative to the report dir; "" when none is written."""
    return prompt_file(bug.group.id, record) if save_prompts else ""


def bug_json(bug: BugReport, *, save_prompts: bool = True) -> dict[str, Any]:
    result, group = bug.result, bug.group
    return {
        "id": group.id,
        "status": result.status,
        "reason": result.reason,
        "kernel": group.kernel,
        "error": group.first.error.headline,
        "nodeids": list(group.nodeids),
        "files": list(result.editable or group.editable),
        "rounds": len(result.rounds),
        "levels": _levels(result),
        "round_details": [
            {
                "round": record.round,
                "source": record.source,
                "outcome": record.outcome,
                "edits": [
                    {"file": e.file, "level": e.level, "error": e.error} for e in record.edits
                ],
                "calls": record.usage.calls,
                "prompt_tokens": record.usage.prompt_tokens,
                "completion_tokens": record.usage.completion_tokens,
                "cost": record.usage.cost,
                "notes": list(record.notes),
                "cached": record.usage.cache_hits > 0,
                "phases": phases_json(record.phases),
                "shown": list(record.shown),
                "prompt_file": round_prompt_file(bug, record, save_prompts) or None,
            }
            for record in result.rounds
        ],
        "triage": phases_json(result.triage),
        "healed_by": result.healed_by or None,
        "builds_on": list(bug.builds_on),
        "calls": result.usage.calls,
        "cache_hits": result.usage.cache_hits,
        "prompt_tokens": result.usage.prompt_tokens,
        "completion_tokens": result.usage.completion_tokens,
        "cost": result.usage.cost,
        "seconds": round(result.seconds, 3),
        "patch": bug.patch_file or None,
        "changed_files": list(result.changed_files),
        "applied": list(bug.applied),
        "apply_error": bug.apply_error or None,
        "first_prompt_chars": result.prompt_chars or None,
        "first_prompt_tokens": prompt_tokens(result.prompt_chars) or None,
        "shown": list(result.shown),
        "reruns": reruns_json(bug.reruns),
        "regression": regression_json(result.regression),
        "revert": result.revert,
    }


def regression_json(regression: Regression | None) -> dict[str, Any] | None:
    """What the experiment on the change since the base found, with its reruns."""
    if regression is None:
        return None
    return {
        "base": regression.base,
        "verdict": regression.verdict,
        "test": regression.test,
        "summary": regression.summary,
        "culprits": [{"path": hunk.path, "lines": hunk.span, "start": hunk.start,
                      "end": hunk.end, "base_start": hunk.base_start,
                      "base_end": hunk.base_end,
                      "base_lines": (f"{hunk.base_start}-{hunk.base_end}"
                                     if hunk.base_end >= hunk.base_start
                                     else f"before {hunk.base_start}"),
                      "current": list(hunk.lines), "base": list(hunk.base_lines)}
                     for hunk in regression.culprits],
        "hunks": regression.hunks,
        "reruns": regression.reruns,
        "minimal": regression.minimal,
        "tests": list(regression.tests),
        "trials": [{"reverted": list(trial.reverted), "passed": trial.passed,
                    "seconds": trial.seconds, "outcome": trial.outcome,
                    "tests": list(trial.tests)}
                   for trial in regression.trials],
    }


def trial_text(trial: Trial) -> str:
    """``kernels/ops.py:12 reverted: passed``; a long set by its size."""
    what = (", ".join(trial.reverted) if len(trial.reverted) <= 3
            else f"{len(trial.reverted)} hunks")
    return f"{what} reverted: {'passed' if trial.passed else 'failed'}"


def regression_lines(regression: Regression | None, revert: bool = False) -> list[str]:
    """How a reviewer reads the experiment: which lines of the change introduced the
    failure, the reruns that show it, and whether the patch only reverts them."""
    if regression is None:
        return []
    lines = [regression.summary]
    if regression.verdict == REGRESSION:
        for hunk in regression.culprits:
            now = " / ".join(line.strip() for line in hunk.lines) or "(lines removed)"
            was = " / ".join(line.strip() for line in hunk.base_lines) or "(nothing)"
            lines.append(f"  {hunk.path}:{hunk.span}: `{now[:160]}` (was `{was[:160]}`)")
    if revert:
        lines.append("the winning patch only reverts lines of the change (a revert, not a fix "
                     "of the change): review whether the change's intent can be kept")
    return lines


def reruns_json(stats: RerunStats) -> dict[str, Any]:
    """How the reruns ran (``fork``, ``subprocess``, ``mixed`` or ``none``), what they
    cost (``seconds``: wall time, reruns that ran at the same time counted once;
    ``seconds_summed``: each rerun's own time added up), why any was not forked, and how
    many compile-cache lookups hit."""
    return {
        "count": stats.count,
        "mode": stats.mode,
        "seconds": round(stats.wall, 3),
        "seconds_summed": round(stats.seconds, 3),
        "fallbacks": list(stats.fallbacks),
        "cache_hits": stats.cache_hits,
        "cache_lookups": stats.cache_lookups,
        "children": stats.children,
    }


def prompt_tokens(chars: int) -> int:
    """An estimate of a prompt's tokens from its characters (see context.CHARS_PER_TOKEN)."""
    return math.ceil(chars / CHARS_PER_TOKEN)


def session_json(report: SessionReport) -> dict[str, Any]:
    usage = report.usage
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": f"pytest-kernelfix {__version__}",
        "rootdir": str(report.rootdir),
        "mode": report.mode,
        "device": report.device,
        "model": report.model,
        "seconds": round(report.seconds, 3),
        "interrupted": report.interrupted,
        "totals": {
            "bugs": len(report.bugs),
            **{status: report.count(status) for status in STATUSES},
            "calls": usage.calls,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cost": usage.cost,
            "cache_hits": usage.cache_hits,
        },
        "budget": {
            "max_cost": report.max_cost or None,
            "max_tokens": report.max_tokens or None,
        },
        "notes": list(report.notes),
        "unselected": unselected_json(report.unselected, report.select),
        "reruns": {**reruns_json(report.reruns), "workers": report.workers},
        "bugs": [bug_json(bug, save_prompts=report.save_prompts) for bug in report.bugs],
        **({"overlap": {"bugs": report.overlap.bugs,
                        "after_tests": round(report.overlap.after_tests, 3)}}
           if report.overlap is not None else {}),
    }


def _display(path: Path, rootdir: Path) -> str:
    try:
        return path.relative_to(rootdir).as_posix()
    except ValueError:
        return str(path)


def repository_root(start: Path, environ: Mapping[str, str] | None = None) -> Path:
    """The git top level above ``start`` (a ``.git`` folder or file: worktrees,
    submodules); else ``$GITHUB_WORKSPACE`` when it holds ``start``; else ``start``."""
    start = Path(os.path.abspath(start))
    top = git_top(start)
    if top is not None:
        return top
    workspace = (environ if environ is not None else os.environ).get("GITHUB_WORKSPACE", "")
    if workspace and start.is_relative_to(os.path.abspath(workspace)):
        return Path(os.path.abspath(workspace))
    return start


def apply_command(patch: Path, rootdir: Path, cwd: Path, repo: Path | None = None) -> str:
    """The ``git apply`` line, run from ``cwd``, for a patch whose paths are relative to
    ``rootdir``.

    When the rootdir is a subdirectory of a git repository, git reads patch paths from
    the top level (and silently skips those outside the current directory), so the line
    runs at the top level with ``--directory=<rootdir>``.
    """
    repo = Path(os.path.abspath(repository_root(rootdir) if repo is None else repo))
    if repo == Path(os.path.abspath(rootdir)):
        inside = _display(patch, rootdir)
        if os.path.abspath(rootdir) == os.path.abspath(cwd):
            return f"git apply {inside}"
        return f"git -C {os.path.relpath(rootdir, cwd)} apply {inside}"
    where = "" if repo == Path(os.path.abspath(cwd)) else f"-C {os.path.relpath(repo, cwd)} "
    prefix = Path(os.path.relpath(rootdir, repo)).as_posix()
    return f"git {where}apply --directory={prefix} {_display(patch, repo)}"


def session_markdown(report: SessionReport) -> str:
    usage = report.usage
    lines = [
        "# kernelfix report",
        "",
        *(["**Interrupted**: the session was stopped before it finished; what was healed "
           "before is below.", ""] if report.interrupted else []),
        f"{len(report.bugs)} bug(s): {counts(report)}. "
        f"{usage.calls} model call(s), {usage.tokens} tokens, ${usage.cost:.4f}"
        + (f", {usage.cache_hits} answer(s) from the cache (free)" if usage.cache_hits else "")
        + f", {report.seconds:.1f} s. Device: {report.device}; fixer: `{report.model}`.",
        "",
        "Failing tests stay failed in the test run; healing is reported beside them.",
        *unselected_markdown(report.unselected, report.select, only=not report.bugs),
        "",
        reruns_line(report),
        "",
        "| bug | status | tests | rounds | edits | first prompt | calls | tokens | cost | "
        "seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for bug in report.bugs:
        result = bug.result
        levels = ", ".join(level for round_levels in _levels(result) for level in round_levels)
        prompt = (f"~{prompt_tokens(result.prompt_chars)} tokens" if result.prompt_chars
                  else "-")
        lines.append(
            f"| `{bug.group.id}` | {result.status} | {len(bug.group.nodeids)} | "
            f"{len(result.rounds)} | {levels or '-'} | {prompt} | {result.usage.calls} | "
            f"{result.usage.tokens} | "
            f"${result.usage.cost:.4f} | {result.seconds:.1f} |"
        )
    for note in report.notes:
        lines += ["", f"> {note}"]
    repo = repository_root(report.rootdir)
    for bug in report.bugs:
        result = bug.result
        lines += ["", f"## `{bug.group.id}`: {result.status}", ""]
        lines.append(f"- Error: `{error_headline(bug.group)}`")
        lines.append(f"- Tests: {len(bug.group.nodeids)} (first: `{bug.group.nodeids[0]}`)")
        files = result.editable or bug.group.editable
        lines.append(f"- Files: {', '.join(f'`{p}`' for p in files) or 'none'}")
        regression = result.regression
        if regression is not None:
            lines.append(f"- Change: {regression.summary}")
            if regression.verdict == REGRESSION:
                for hunk in regression.culprits:
                    lines += ["", f"  `{hunk.path}` lines {hunk.span}, now and at "
                                  f"{regression.base}:", "", "  ```diff"]
                    lines += [f"  -{line}" for line in hunk.base_lines]
                    lines += [f"  +{line}" for line in hunk.lines]
                    lines += ["  ```", ""]
            lines.append(f"- Evidence ({regression.reruns} rerun(s) of "
                         f"`{regression.test}`): "
                         + "; ".join(trial_text(trial) for trial in regression.trials))
        if result.revert:
            lines.append("- **Revert**: the winning patch only puts back lines of the change "
                         "(it undoes what the change wanted): review whether its intent can "
                         "be kept")
        if result.shown:
            first = "round 1" if result.rounds and result.rounds[0].shown else "the first prompt"
            lines.append(f"- Shown to the model in {first}: "
                         f"{', '.join(f'`{s}`' for s in result.shown)}"
                         + (f" (first prompt {result.prompt_chars} characters)"
                            if result.prompt_chars else ""))
        lines.append(f"- Outcome: {result.reason}")
        if result.triage:
            lines.append("- Before round 1: " + "; ".join(
                f"{phase_text(p)} ({p.seconds:.1f} s)" for p in result.triage))
        seen = set(result.shown)
        for record in result.rounds:
            edits = ", ".join(e.level for e in record.edits) or "no edits"
            cached = ", cached" if record.usage.cache_hits else ""
            name = round_prompt_file(bug, record, report.save_prompts)
            link = f"; [prompt and answer]({name})" if name else ""
            lines.append(f"  - round {record.round} ({record.source or 'fixer'}{cached}; "
                         f"{edits}{link}): {record.outcome}")
            more = [item for item in record.shown if item not in seen]
            if more:
                lines.append(f"    - also shown in this round: "
                             f"{', '.join(f'`{item}`' for item in more)}")
                seen.update(more)
            lines += [f"    - note: {note}" for note in record.notes]
            if record.phases:
                lines.append("    - verified: " + "; ".join(
                    phase_text(p) for p in record.phases))
        if bug.builds_on:
            lines += ["", f"This patch applies after the patch of {', '.join(bug.builds_on)} "
                          "(they change the same file): apply them in the order shown."]
        if bug.patch_file and result.status == MASKED:
            lines += ["", "Kept for review, not a fix (the kernel's output is unchanged; this "
                          f"candidate masks it): `{bug.patch_file}`", ""]
            lines += ["```diff", result.patch.rstrip("\n"), "```"]
        elif bug.patch_file:
            command = apply_command(report.report_dir / bug.patch_file, report.rootdir, repo,
                                    repo)
            where = "rootdir" if repo == report.rootdir else "repository root"
            lines += ["", applied_sentence(bug, report) if bug.applied
                      else f"Apply from the {where} with `{command}`", ""]
            lines += ["```diff", result.patch.rstrip("\n"), "```"]
        if bug.applied and not bug.patch_file:
            lines += ["", f"Written to the working tree: {', '.join(bug.applied)}"]
        if bug.apply_error:
            lines += ["", f"Not written to the working tree: {bug.apply_error}"]
    return "\n".join(lines) + "\n"


def applied_sentence(bug: BugReport, report: SessionReport) -> str:
    """What apply mode did with a bug's patch: no ``git apply`` line for a patch already
    in the working tree, where its originals are kept instead."""
    backup = _display(report.report_dir / "backup" / bug.group.id, report.rootdir)
    return (f"Written to the working tree: {', '.join(bug.applied)} (the originals are in "
            f"`{backup}`)")


def reruns_line(report: SessionReport) -> str:
    """One sentence on how the sandbox reruns ran: their wall time, and the sum of their
    own times beside it when some ran at the same time."""
    stats = report.reruns
    summed = (f" ({stats.seconds:.1f} s of reruns added up, as some ran at the same time)"
              if stats.seconds - stats.wall >= 0.05 else "")
    text = (f"Sandbox reruns: {stats.count} ({stats.mode}) in {stats.children} child "
            f"process(es), {stats.wall:.1f} s{summed}, {report.workers} worker(s)")
    if stats.cache_lookups:
        text += (f"; compile cache: {stats.cache_hits} of {stats.cache_lookups} "
                 "kernel compile(s) reused")
    text += "."
    if stats.fallbacks:
        text += " Not forked: " + "; ".join(stats.fallbacks)
    if report.overlap is not None and report.overlap.bugs:
        text += (f" Healing began while the tests ran for {report.overlap.bugs} bug(s) and "
                 f"went on {report.overlap.after_tests:.1f} s after the last test.")
    return text


def remove_stale_patches(report_dir: Path, keep: Sequence[str]) -> None:
    """Delete patches an earlier session wrote that this session did not write again."""
    if not report_dir.is_dir():
        return
    for path in report_dir.glob("*.patch"):  # masked patches too (*.masked.patch)
        if path.name in keep:
            continue
        try:
            head = path.read_text(encoding="utf-8", errors="replace")[:200]
        except OSError:
            continue
        if head.startswith(PATCH_MARKER):
            path.unlink(missing_ok=True)


def write_patches(report: SessionReport) -> None:
    """Write the patch of every bug that has one (see :attr:`BugReport.patch_file`)."""
    for bug in report.bugs:
        if bug.patch_file:
            write_atomic(report.report_dir / bug.patch_file, patch_text(bug.group, bug.result))


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
    write_atomic(json_path, json.dumps(redacted(session_json(report)), indent=2) + "\n")
    write_atomic(md_path, redact(session_markdown(report)))
    remove_stale_patches(report.report_dir, [b.patch_file for b in report.bugs if b.patch_file])
    remove_stale_prompts(report.report_dir, [
        name for bug in report.bugs for record in bug.result.rounds
        if (name := round_prompt_file(bug, record, report.save_prompts))])
    return {"json": json_path, "markdown": md_path}


def summary_lines(report: SessionReport, json_path: Path | None) -> list[str]:
    """The terminal summary: one line per bug, then the patches and the report."""
    lines = []
    for bug in report.bugs:
        result = bug.result
        detail = result.reason
        if result.status == HEALED and result.healed_by:
            detail = (f"healed by the patch of {result.healed_by} ({len(bug.group.nodeids)} "
                      "test(s)); no patch of its own")
        elif result.status == HEALED:
            levels = ", ".join(e.level for e in result.rounds[-1].edits if e.level != "none")
            detail = (f"{len(result.rounds)} round(s), {len(bug.group.nodeids)} test(s), "
                      f"{', '.join(result.changed_files)} ({levels})")
        if result.revert:
            detail += " (a revert of the change)"
        lines.append(f"{result.status:<9} {bug.group.id}: {detail}")
        if result.regression is not None and result.regression.verdict != TEST_CHANGED:
            lines += [f"          {line}" for line in regression_lines(result.regression)]
    lines += unselected_lines(report.unselected, report.select)
    patches = [b for b in report.bugs if b.patch_file and b.result.status == HEALED
               and not b.applied]  # a patch already written needs no git apply line
    repo, cwd = repository_root(report.rootdir), Path.cwd()
    if patches:
        lines.append("")
        ordered = any(bug.builds_on for bug in patches)
        lines.append("patches (each verified on a sandbox copy"
                     + ("; apply them in this order" if ordered else "") + "):")
        for bug in patches:
            patch = report.report_dir / bug.patch_file
            lines.append(f"  {apply_command(patch, report.rootdir, cwd, repo)}")
    review = [b for b in report.bugs if b.patch_file and b.result.status == MASKED]
    if review:
        lines.append("")
        lines.append("kept for review, not fixes (they mask the kernel's unchanged output):")
        lines += [f"  {_display(report.report_dir / b.patch_file, cwd)}" for b in review]
    applied = [path for bug in report.bugs for path in bug.applied]
    if applied:
        lines.append("")
        lines.append(f"written to the working tree: {', '.join(applied)}")
    for bug in report.bugs:
        if bug.apply_error:
            lines.append(f"not written ({bug.group.id}): {bug.apply_error}")
    hits = report.usage.cache_hits
    if hits:
        lines.append(f"answers from the cache: {hits} (no call, no cost)")
    for note in report.notes:
        lines.append(f"note: {note}")
    if json_path is not None:
        lines.append(f"report: {_display(json_path, Path.cwd())}")
    return lines
