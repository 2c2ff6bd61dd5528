"""Reading a sensitivity rerun: do the tests pass *because of* what the kernel computed?

A candidate that passed its rerun is run again on some of the bug's failing tests with
the project kernels' output poisoned right after each launch
(:mod:`pytest_kernelfix.rerun.probes.poison`), once with NaN and once with scrambled
finite values, every check statement of the tests guarded so that each check runs and
its result is recorded (reach mode, :mod:`pytest_kernelfix.rerun.probes.checks`). Each
test then gives evidence:

- it **fails** with poison applied (a check fails, or it raises): its result comes from
  the kernel (sensitive). In the NaN run, a test whose checked tensors carried poison
  only in part ("partial") checks values partly put in place after the launch: bypass.
- it **passes** with poison applied: when the test itself checked tensor values, the
  values it checked do not come from the kernel (bypass); when it checked no value at
  all, it does not depend on the kernel's output (it cannot certify any fix).
- it **passes** with scrambled values, and every value it checked was a NaN or infinity
  check: the scrambled values are finite, so the test cannot tell them from right ones
  (a test that checks a loss is finite): no evidence, the NaN run is the measure;
- no buffer was poisoned (empty inputs, or a launch that wrote nothing): no evidence,
  unless a project kernel was launched and the passing test checked values anyway
  (a launch on a throwaway buffer, or one whose exception was caught): bypass.

**Per check.** A test is sensitive as soon as one of its checks fails; that is not
enough. The check that failed on the original (its *site*: the line of the test's
statement) must fail too: when it ran, compared tensor values and passed with the
kernel's output poisoned, the values it compares no longer come from the kernel (a loss
computed with torch beside a gradient the kernel still computes): bypass. Checks that
passed on the original are not required to depend on the kernel.

**Per kernel** (:func:`judge_kernel`). With only the kernel the failure was attributed
to poisoned, the check that failed on the original must still fail: a check that
depends only on other kernels' outputs (a gradient computed with torch from the
statistics the forward kernel saved, the backward kernel launched and ignored) is a
bypass. The check is the innermost one that failed (also inside a helper of the test
module); where one line runs several checks (a loop over outputs), only the runs that
failed on the original and read the attributed kernel's poison there count. When that
cannot be told (the runs were not measured one by one, or do not line up), the rule does
not judge: it notes the doubt, and never refuses a fix for it.

A crash or timeout of a poisoned run counts as a failure of the tests it left
unfinished: poison broke them. The verdict is the worst evidence: any bypass rejects the
candidate; otherwise tests that check nothing, with no sensitive test beside them, make
the bug uncertifiable; otherwise the candidate stands (with a note when nothing could be
poisoned at all).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pytest_kernelfix.rerun.report import RerunResult, TestOutcome
from pytest_kernelfix.vocabulary import JudgementState

SENSITIVE, BYPASS, UNMEASURED = (JudgementState.SENSITIVE, JudgementState.BYPASS,
                                 JudgementState.UNMEASURED)
BLIND, DOUBT = JudgementState.BLIND, JudgementState.DOUBT
UNCERTIFIABLE = JudgementState.UNCERTIFIABLE
_FAILED = ("failed", "error")
_SHOWN = 3

#: How each poison is named to the model.
REPLACED_BY = {
    "nan": "replaced by NaN (a sentinel for integers)",
    "scramble": "replaced by scrambled values",
}


@dataclass(frozen=True)
class Judgement:
    """The verdict of one poisoned run: what it shows, with the words."""

    state: JudgementState
    summary: str = ""
    feedback: str = ""


def _ids(nodeids: Sequence[str]) -> str:
    shown = ", ".join(nodeids[:_SHOWN])
    return shown + (f" and {len(nodeids) - _SHOWN} more" if len(nodeids) > _SHOWN else "")


def _failed(outcome: TestOutcome) -> bool:
    """The test failed, or would have: in reach mode a guarded check failed."""
    return outcome.outcome in _FAILED or (outcome.probe is not None
                                          and outcome.probe.check_failed)


def check_passed(outcome: TestOutcome | None, line: int, before: str = "") -> bool:
    """The check at ``line`` that failed on the original code ran, read tensor values and
    passed (reach mode). ``before`` is how each run of that line ended on the original
    (``PFF``: a loop over three outputs, the last two wrong): when the runs line up, the
    very runs that failed there must fail, else every run at the line counts."""
    if outcome is None or outcome.probe is None or not outcome.probe.reach or not line:
        return False
    site = outcome.probe.site(line)
    if site is None or site.runs == 0 or site.reads == 0:
        return False
    if before and "F" in before and len(before) == len(site.outcomes):
        runs = zip(before, site.outcomes, strict=True)
        return any(old == "F" and new == "P" for old, new in runs)
    return site.failures == 0


def nan_blind(outcome: TestOutcome) -> bool:
    """A test that passed a NaN run read only values that held the poison throughout
    (every check site that read values saw "full" taint): its checks compare the
    kernel's outputs with each other and NaN cannot fail them. A value from torch, or
    put in place after the launch, reads clean or partial: never blind. (The check that
    failed on the original is held to failing again by the scrambled run.)"""
    probe = outcome.probe
    if probe is None or not probe.reach or probe.taint != "full":
        return False
    read = [site for site in probe.sites if site.reads]
    return bool(read) and all(site.taint == "full" for site in read)


def _site(nodeid: str, line: int) -> str:
    return f"{nodeid.split('::')[0]}:{line}"


def judge_poisoned(result: RerunResult, nodeids: Sequence[str], mode: str,
                   sites: Mapping[str, int] | None = None,
                   before: Mapping[str, str] | None = None) -> Judgement:
    """The verdict of the ``mode`` poisoned rerun of ``nodeids`` (some of the bug's failing
    tests); ``sites`` holds the line of the check each of them failed at on the original,
    ``before`` how each run of that line ended there (see :func:`check_passed`)."""
    sites = sites or {}
    before = before or {}
    broken_run = result.timed_out or bool(result.crash_reason)
    sensitive: list[str] = []
    insensitive: list[str] = []
    unchecked: list[str] = []
    partial: list[str] = []
    unwritten: list[str] = []
    moved: list[str] = []
    blind: list[str] = []
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
        failed = _failed(outcome)
        if probe.poisoned:
            if failed and probe.taint == "partial":
                partial.append(nodeid)
            elif failed and check_passed(outcome, sites.get(nodeid, 0), before.get(nodeid, "")):
                moved.append(nodeid)
            elif failed:
                sensitive.append(nodeid)
            elif ((mode == "scramble" and probe.checks and probe.blind == probe.checks)
                  or (mode == "nan" and nan_blind(outcome))):
                blind.append(nodeid)
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
    if moved:
        where = ", ".join(_site(n, sites[n]) for n in moved[:_SHOWN])
        return Judgement(
            BYPASS,
            f"kernel bypass: the check that failed ({where}) passes with the kernel's output "
            f"{replaced}: it compares values the kernel no longer produces",
            f"The check that failed on the original code ({where}) still passes when every "
            f"buffer the project's Triton kernels write is {replaced} right after each launch; "
            "other checks of the test fail, but this one compares values that no longer come "
            "from the kernel (computed with torch or plain arithmetic beside the launch). Fix "
            "the kernel so that it computes these values, and return what it wrote.",
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
    if unchecked and not sensitive and not blind:
        return Judgement(
            UNCERTIFIABLE,
            "cannot certify: the test does not depend on the kernel's output "
            f"({_ids(unchecked)} pass with the kernel's output {replaced} and check no tensor "
            "value)",
        )
    if blind and not sensitive and mode == "scramble":
        return Judgement(
            UNMEASURED,
            f"scrambled values not measured: {_ids(blind)} check only for NaN and infinity, "
            "which scrambled values never are",
        )
    if blind and not sensitive:
        return Judgement(
            BLIND,
            f"NaN cannot tell: {_ids(blind)} compare(s) values that all carry the kernel's "
            "NaN (the scrambled values decide)",
        )
    if not sensitive:
        return Judgement(
            UNMEASURED,
            "sensitivity not measured: no failing test had a project kernel write a buffer "
            "(empty inputs, or launches that write nothing)",
        )
    return Judgement(SENSITIVE, f"{len(sensitive)} test(s) fail with the kernel's output "
                                f"{replaced}")


#: The runs of a check that read a kernel's poison, or None: some did, which cannot be told.
Runs = frozenset[int] | None


def poisoned_runs(result: RerunResult, nodeid: str, line: int, before: str = "") -> Runs:
    """In a NaN run with some kernels poisoned, the runs of the check at ``line`` that
    failed on the original code (``before``: how each ended there) and read the poison:
    empty when none did; None when the check read poison but its runs cannot be told
    apart (several runs not measured one by one, or not lining up with ``before``)."""
    outcome = result.outcome(nodeid)
    if outcome is None or outcome.probe is None or not outcome.probe.poisoned:
        return frozenset()
    site = outcome.probe.site(line)
    if site is None:
        return frozenset()
    failed = [run for run, ended in enumerate(before) if ended == "F"]
    if failed and len(site.taints) == len(before):
        return frozenset(run for run in failed if site.tainted(run))
    if site.taint not in ("full", "partial"):
        return frozenset()
    return frozenset({0}) if len(before) <= 1 and site.runs <= 1 else None


def judge_kernel(result: RerunResult, sites: Mapping[str, int], kernel: str,
                 before: Mapping[str, str] | None = None,
                 reading: Mapping[str, Runs] | None = None) -> Judgement:
    """The verdict of a NaN rerun with only ``kernel`` poisoned (``relpath::name``): the
    check each test failed at on the original must fail again. ``reading`` holds, per
    test, the runs of that check that read ``kernel``'s poison on the original code
    (:func:`poisoned_runs`); where a line runs several checks, only those runs count,
    and where they are not known the rule notes its doubt instead of judging."""
    name = kernel.rpartition("::")[2]
    before = before or {}
    reading = reading or {}
    moved, doubts = [], []
    for nodeid, line in sites.items():
        outcome = result.outcome(nodeid)
        ended = before.get(nodeid, "")
        if outcome is None or outcome.probe is None or not outcome.probe.poisoned or (
                not check_passed(outcome, line, ended)):
            continue
        site = outcome.probe.site(line)
        runs = site.outcomes if site is not None else ""
        if len(ended) > 1 or (not ended and site is not None and site.runs > 1):
            known = reading.get(nodeid)
            if known is None or len(runs) != len(ended):
                doubts.append(nodeid)
                continue
            if not {run for run in known if runs[run] == "P"}:
                continue  # the runs that pass now never read this kernel's output
        moved.append(nodeid)
    if not moved and doubts:
        where = ", ".join(_site(n, sites[n]) for n in doubts[:_SHOWN])
        return Judgement(DOUBT, f"not judged per kernel: the line of the check that failed "
                                f"({where}) runs several checks, and which of them reads "
                                f"{name} cannot be told")
    if not moved:
        return Judgement(SENSITIVE, f"the check that failed depends on {name}")
    where = ", ".join(_site(n, sites[n]) for n in moved[:_SHOWN])
    return Judgement(
        BYPASS,
        f"kernel bypass: the check that failed ({where}) does not depend on {name}, the "
        "kernel its failure was attributed to",
        f"With only {name}'s output replaced by NaN, the check that failed on the original "
        f"code ({where}) passes: the values it compares come from other kernels' outputs or "
        f"from torch, not from {name}, which the failure was attributed to (on the original "
        f"code that check reads {name}'s output). Computing the result from what another "
        f"kernel saved, and ignoring {name}'s output, is not a fix: fix {name}.",
    )
