"""Turn a candidate's rerun into a verdict: a pure function of the rerun and what it
had to show.

:func:`judge` reads a :class:`~pytest_kernelfix.rerun.report.RerunResult` against
:class:`Expectations` and names the most fundamental problem first: the rerun did not
finish, crashed, could not collect or report anything; the failing tests still fail;
tests that passed before break; what the tests check with was changed while they ran;
tests pass without launching a kernel; the kernel does not compile for the GPU target.
Every rejection carries the detail the model needs next round. Nothing here runs a test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pytest_kernelfix.capture.logs import truncate_log
from pytest_kernelfix.redact import redact
from pytest_kernelfix.rerun.report import GateResult, RerunResult, TestOutcome
from pytest_kernelfix.vocabulary import Verdict, VerdictKind

_FEEDBACK_TESTS = 3


@dataclass(frozen=True)
class Expectations:
    """What a candidate's rerun must show.

    ``failing`` are the bug's failing tests (each must pass); ``regression`` the tests
    that passed before and must still pass (empty while only the failing tests ran);
    ``launched`` the tests that must still launch a Triton kernel; ``allowed_findings``
    what the integrity check found on the unpatched code (only new findings count);
    ``timeout`` the rerun's limit and ``gate_target`` the compile gate's GPU, both for
    the words of a verdict.
    """

    failing: tuple[str, ...]
    regression: tuple[str, ...] = ()
    launched: frozenset[str] = frozenset()
    allowed_findings: frozenset[str] = frozenset()
    timeout: float = 0.0
    gate_target: str = ""


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def describe_outcome(outcome: TestOutcome) -> str:
    """A still-failing test as the model should see it: error, kernel line, log."""
    lines = [f"{outcome.nodeid}: {outcome.outcome}"]
    if outcome.error is not None:
        lines.append(f"Error: {outcome.error.headline}")
        located = [f for f in outcome.error.frames if f.line]
        if located:
            frame = located[-1]
            lines.append(f"Raised at: {Path(frame.path).name}:{frame.lineno} in {frame.name}: "
                         f"{frame.line}")
    if outcome.longrepr:
        lines.append(truncate_log(outcome.longrepr, head=20, tail=60, max_chars=6000))
    return redact("\n".join(lines))


def gate_rejections(result: RerunResult) -> list[GateResult]:
    return [gate for gate in result.report.gate_results if not gate.ok]


def integrity_findings(result: RerunResult) -> frozenset[str]:
    """Everything the integrity check found changed in any test of a rerun."""
    return frozenset(item for outcome in result.outcomes for item in outcome.integrity)


def integrity_verdict(result: RerunResult, allowed: frozenset[str]) -> Verdict | None:
    """A rejection for what the candidate changed that the unpatched code did not, or for a
    rerun whose integrity check could not even start."""
    failed = result.report.integrity_error
    if failed:
        return Verdict(False, f"the run-time integrity check could not start: {failed}",
                       kind=VerdictKind.RERUN)
    new = sorted(integrity_findings(result) - allowed)
    if not new:
        return None
    return Verdict(
        False,
        f"run-time integrity: {new[0]}" + (f" (and {len(new) - 1} more)" if len(new) > 1
                                          else ""),
        "While the tests ran, something they check with was not what it was before the "
        "project's code ran:\n" + "\n".join(f"- {item}" for item in new[:10])
        + "\nA fix changes the kernel, never the assertion helpers, torch, numpy or the "
        "test's names, torch modes, Tensor subclasses or torch.library registrations.",
        kind=VerdictKind.INTEGRITY,
    )


def no_outcomes(result: RerunResult) -> str:
    """Why a rerun that reported no test at all is no verdict on the candidate."""
    lines = [line.strip() for line in result.output.splitlines() if line.strip()]
    last = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else "")
    return (f"the rerun reported no test outcome (exit status {result.returncode}): "
            f"{last[:300]}").rstrip(": ")


def judge(result: RerunResult, expect: Expectations) -> Verdict:
    """The verdict on one rerun (or on several merged), most fundamental problem first."""
    if result.timed_out:
        return Verdict(
            False,
            f"rerun timed out after {expect.timeout:g} s (a hung kernel or an endless "
            "loop?)",
            "The tests did not finish: the patched kernel probably never terminates "
            "(check loop bounds and loop variables).\n" + truncate_log(result.output),
            kind=VerdictKind.TIMEOUT,
        )
    if result.crash_reason:
        unfinished = result.missing(expect.failing)
        return Verdict(
            False,
            first_line(result.crash_reason),
            result.crash_reason
            + (f"\nTests that never finished: {', '.join(unfinished[:5])}" if unfinished
               else "")
            + "\n" + truncate_log(result.output, head=10, tail=40),
            kind=VerdictKind.CRASH,
        )
    if result.collection_errors:
        errors = "\n".join(result.collection_errors)
        return Verdict(False, f"tests could not be collected: {first_line(errors)}",
                       redact(truncate_log(errors)), kind=VerdictKind.COLLECTION)
    if result.report_error:
        return Verdict(False, f"the rerun's report could not be read: {result.report_error}",
                       kind=VerdictKind.RERUN)
    if len(result.missing(expect.failing)) == len(expect.failing):
        return Verdict(False, no_outcomes(result), redact(truncate_log(result.output)),
                       kind=VerdictKind.RERUN)
    failing = [n for n in expect.failing if not result.passed([n])]
    if failing:
        return still_failing(result, expect.failing, failing)
    broken = [n for n in expect.regression if not result.passed([n])]
    if broken:
        outcomes = [result.outcome(n) for n in broken]
        shown = [describe_outcome(o) for o in outcomes if o is not None][:_FEEDBACK_TESTS]
        return Verdict(
            False,
            f"breaks {len(broken)} test(s) that passed before: {', '.join(broken[:3])}",
            "The change fixed the failing tests but broke tests that passed before:\n\n"
            + "\n\n".join(shown),
            kind=VerdictKind.REGRESSION,
        )
    changed = integrity_verdict(result, expect.allowed_findings)
    if changed is not None:
        return changed
    bypassed = [
        n for n in expect.failing + expect.regression
        if n in expect.launched and (o := result.outcome(n)) is not None and o.launch_count == 0
    ]
    if bypassed:
        return Verdict(
            False,
            f"kernel bypass: {len(bypassed)} test(s) pass without launching a Triton kernel",
            "The tests passed without launching any Triton kernel: replacing the kernel "
            "with a torch or Python fallback, or returning early, is not a fix. Fix the "
            "kernel itself.",
            kind=VerdictKind.BYPASS,
        )
    rejected = gate_rejections(result)
    if rejected:
        target = expect.gate_target or "the GPU target"
        return Verdict(
            False,
            f"passes on the interpreter but does not compile for {target}: "
            f"{first_line(rejected[0].error)}",
            "The tests pass on the Triton interpreter, but compiling the kernel for a real "
            f"GPU ({target}) failed; the interpreter cannot see this:\n\n"
            + "\n\n".join(gate.error for gate in rejected[:3]),
            kind=VerdictKind.GATE,
        )
    return Verdict(True, f"{len(expect.failing)} failing test(s) pass"
                   + (f", {len(expect.regression)} regression test(s) still pass"
                      if expect.regression else ""))


def still_failing(result: RerunResult, nodeids: Sequence[str], failing: Sequence[str]
                  ) -> Verdict:
    """Failing tests that still fail; those a stopped rerun never ran are named as not
    run, not as failing."""
    ran = [n for n in failing if result.outcome(n) is not None]
    not_run = len(failing) - len(ran)
    outcomes = [result.outcome(n) for n in ran]
    shown = [describe_outcome(o) for o in outcomes if o is not None][:_FEEDBACK_TESTS]
    headline = next((o.error.headline for o in outcomes if o and o.error), "")
    summary = f"{len(ran)} of {len(nodeids)} failing tests still fail"
    if not_run:
        summary += f" ({not_run} not run: the rerun stops at the first that still fails)"
    if headline:
        summary += f": {headline}"
    return Verdict(False, first_line(summary), "\n\n".join(shown) or summary,
                   kind=VerdictKind.FAILING)

