"""report.md: the session's report for people, each bug with its evidence and patch."""

from __future__ import annotations

from pytest_kernelfix.heal.outcomes import MASKED, phase_text
from pytest_kernelfix.locate.change import REGRESSION, Trial
from pytest_kernelfix.redact import redact
from pytest_kernelfix.report.model import (
    BugReport,
    SessionReport,
    counts,
    edit_levels,
    error_headline,
    prompt_tokens,
    round_prompt_file,
)
from pytest_kernelfix.report.patches import apply_command, display_path, repository_root
from pytest_kernelfix.report.unselected import unselected_markdown


def report_markdown(report: SessionReport) -> str:
    """report.md's text, redacted."""
    return redact(session_markdown(report))


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
        levels = ", ".join(level for round_levels in edit_levels(result) for level in round_levels)
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
    backup = display_path(report.report_dir / "backup" / bug.group.id, report.rootdir)
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


def trial_text(trial: Trial) -> str:
    """``kernels/ops.py:12 reverted: passed``; a long set by its size."""
    what = (", ".join(trial.reverted) if len(trial.reverted) <= 3
            else f"{len(trial.reverted)} hunks")
    return f"{what} reverted: {'passed' if trial.passed else 'failed'}"
