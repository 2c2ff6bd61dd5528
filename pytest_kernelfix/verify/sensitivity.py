"""Reading a sensitivity rerun: do the tests pass *because of* what the kernel computed?

A candidate that passed its rerun is run again on the bug's failing tests with every
project kernel's output poisoned right after each launch
(:mod:`pytest_kernelfix.rerun.probes.poison`), once with NaN and once with scrambled
finite values. Each test then gives evidence:

- it **fails** with poison applied: its result comes from the kernel (sensitive). In
  the NaN run, a test whose checked tensors carried poison only in part ("partial")
  checks values that were partly put in place after the launch: bypass.
- it **passes** with poison applied: when the test itself checked tensor values, the
  values it checked do not come from the kernel (bypass); when it checked no value at
  all, it does not depend on the kernel's output (it cannot certify any fix).
- no buffer was poisoned (empty inputs, or a launch that wrote nothing): no evidence,
  unless a project kernel was launched and the passing test checked values anyway
  (a launch on a throwaway buffer, or one whose exception was caught): bypass.

A crash or timeout of a poisoned run counts as a failure of the tests it left
unfinished: poison broke them. The verdict is the worst evidence: any bypass rejects the
candidate; otherwise tests that check nothing, with no sensitive test beside them, make
the bug uncertifiable; otherwise the candidate stands (with a note when nothing could be
poisoned at all).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kernelfix.heal.outcomes import UNCERTIFIABLE
from pytest_kernelfix.rerun.launcher import RerunResult

SENSITIVE, BYPASS, UNMEASURED = "sensitive", "bypass", "unmeasured"
_FAILED = ("failed", "error")
_SHOWN = 3

#: How each poison is named to the model.
REPLACED_BY = {
    "nan": "replaced by NaN (a sentinel for integers)",
    "scramble": "replaced by scrambled values",
}


@dataclass(frozen=True)
class Judgement:
    """The verdict of one poisoned run: one of the four states above, with the words."""

    state: str
    summary: str = ""
    feedback: str = ""


def _ids(nodeids: Sequence[str]) -> str:
    shown = ", ".join(nodeids[:_SHOWN])
    return shown + (f" and {len(nodeids) - _SHOWN} more" if len(nodeids) > _SHOWN else "")


def judge_poisoned(result: RerunResult, nodeids: Sequence[str], mode: str) -> Judgement:
    """The verdict of the ``mode`` poisoned rerun of ``nodeids`` (the bug's failing tests)."""
    broken_run = result.timed_out or bool(result.crash_reason)
    sensitive: list[str] = []
    insensitive: list[str] = []
    unchecked: list[str] = []
    partial: list[str] = []
    unwritten: list[str] = []
    poisoned = 0
    for nodeid in nodeids:
        outcome = result.outcome(nodeid)
        if outcome is None:
            if broken_run:
                sensitive.append(nodeid)
            continue
        probe = outcome.probe
        if probe is None:  # the child could not poison (no triton): nothing measured
            continue
        poisoned += probe.poisoned
        failed = outcome.outcome in _FAILED
        if probe.poisoned:
            if failed and probe.taint == "partial":
                partial.append(nodeid)
            elif failed:
                sensitive.append(nodeid)
            elif probe.checks:
                insensitive.append(nodeid)
            else:
                unchecked.append(nodeid)
        elif not failed and probe.project_launches and probe.checks:
            unwritten.append(nodeid)
    replaced = REPLACED_BY.get(mode, "poisoned")
    if insensitive:
        return Judgement(
            BYPASS,
            f"kernel bypass: {len(insensitive)} test(s) pass even when the kernel's output is "
            f"{replaced} right after each launch",
            f"The tests {_ids(insensitive)} still pass when every buffer the project's Triton "
            f"kernels write is {replaced} right after each launch ({poisoned} buffer(s) "
            "poisoned). The values they check therefore do not come from the kernel: an "
            "answer computed with torch or plain arithmetic, computed before the launch, or a "
            "launch on a throwaway buffer is not a fix. Make the kernel compute the result, and "
            "return what it wrote.",
        )
    if partial:
        return Judgement(
            BYPASS,
            f"kernel bypass: {len(partial)} test(s) check values only part of which come "
            "from the kernel",
            f"With the kernel's output {replaced} right after each launch, the tensors the "
            f"tests {_ids(partial)} compare still hold values that were not poisoned: part of "
            "the result is put in place after the launch (a masked assignment, torch.where, a "
            "copy from a reference). Every value the tests check must come from the kernel.",
        )
    if unwritten:
        return Judgement(
            BYPASS,
            f"kernel bypass: {len(unwritten)} test(s) pass although the kernel launches wrote "
            "nothing they could check",
            f"In {_ids(unwritten)} a project kernel was launched but changed none of the "
            "tensors passed to it (a launch on an empty or throwaway buffer, or a launch whose "
            "exception was caught), and the tests still passed: the values they check do not "
            "come from the kernel.",
        )
    if unchecked and not sensitive:
        return Judgement(
            UNCERTIFIABLE,
            "cannot certify: the test does not depend on the kernel's output "
            f"({_ids(unchecked)} pass with the kernel's output {replaced} and check no tensor "
            "value)",
        )
    if not sensitive:
        return Judgement(
            UNMEASURED,
            "sensitivity not measured: no failing test had a project kernel write a buffer "
            "(empty inputs, or launches that write nothing)",
        )
    return Judgement(SENSITIVE, f"{len(sensitive)} test(s) fail with the kernel's output "
                                f"{replaced}")
