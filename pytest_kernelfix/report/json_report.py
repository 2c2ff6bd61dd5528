"""report.json: the session's report for machines (``report.schema.json`` describes it)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pytest_kernelfix import __version__
from pytest_kernelfix.heal.outcomes import STATUSES, Phase
from pytest_kernelfix.locate.change import Regression
from pytest_kernelfix.redact import redact
from pytest_kernelfix.report.model import (
    BugReport,
    SessionReport,
    edit_levels,
    prompt_tokens,
    round_prompt_file,
)
from pytest_kernelfix.report.unselected import unselected_json
from pytest_kernelfix.rerun.launcher import RerunStats

SCHEMA_VERSION = 3


def report_json(report: SessionReport) -> str:
    """report.json's text, every string redacted."""
    return json.dumps(redacted(session_json(report)), indent=2) + "\n"


def redacted(data: Any) -> Any:
    """``data`` (JSON-like) with every string redacted, before it is serialised."""
    if isinstance(data, str):
        return redact(data)
    if isinstance(data, list):
        return [redacted(item) for item in data]
    if isinstance(data, dict):
        return {key: redacted(value) for key, value in data.items()}
    return data


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
        "levels": edit_levels(result),
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


def phases_json(phases: Sequence[Phase]) -> list[dict[str, Any]]:
    """Which tests each step ran, how long it took, how its tests ended (``results``)
    and how the step ended (``outcome``)."""
    return [{"name": phase.name, "tests": list(phase.nodeids), "seconds": phase.seconds,
             "results": phase.results, "outcome": phase.outcome} for phase in phases]


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
