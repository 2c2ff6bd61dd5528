"""Judge a candidate: write it into the sandbox, rerun the tests, read the verdict.

Before round 1 the unpatched code is rerun once (the baseline): a failure that does not
reproduce there, or that is the interpreter's rather than the kernel's, is not a bug to
heal (:meth:`Verifier.triage`). After that, a candidate passes only when every failing
test of the bug passes, no test that passed before breaks, the tests still launch a
Triton kernel, nothing the tests check with was changed while they ran (the run-time
integrity check, compared with the baseline's), the rerun neither crashed nor hung, and,
last, the failing tests fail again once the kernel's output is poisoned (the
sensitivity reruns, :mod:`pytest_kernelfix.verify.sensitivity`): only then does the result come
from the kernel. Every rejection carries the detail the model needs next round.

A candidate's failing tests run first, and that rerun stops at the first one that still
fails (most candidates fail; the rest would only repeat it); the regression set runs in
a second rerun only once they all pass.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from pytest_kernelfix.capture.records import Failure
from pytest_kernelfix.heal.guards import shape_notes
from pytest_kernelfix.heal.outcomes import UNCERTIFIABLE, Verdict
from pytest_kernelfix.locate.context import truncate_log
from pytest_kernelfix.redact import redact
from pytest_kernelfix.rerun.launcher import (
    RerunResult,
    RerunSetup,
    RerunSpec,
    TestOutcome,
    run_tests,
)
from pytest_kernelfix.rerun.plan import POISON_MODES
from pytest_kernelfix.rerun.probes.gate import GateResult
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.shim.limits import bf16_limitation
from pytest_kernelfix.verify.sensitivity import BYPASS, UNMEASURED, judge_poisoned

_FEEDBACK_TESTS = 3
#: Verdicts on the failing tests that the regression set may still overrule, as it would
#: in one combined rerun (:meth:`Verifier.judge` reaches them after the regression check).
#: An integrity finding is not among them: a candidate that changed what the tests check
#: is rejected for that, whatever the regression set says, so it costs no second rerun.
_JUDGED_AFTER_REGRESSION = ("bypass", "gate")


Runner = Callable[[RerunSpec], RerunResult]


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


def gate_results(result: RerunResult) -> list[GateResult]:
    """The compile gate's verdicts on every project kernel the rerun launched."""
    return [GateResult.from_json(item) for item in _gate_items(result)]


def gate_rejections(result: RerunResult) -> list[GateResult]:
    return [gate for gate in gate_results(result) if not gate.ok]


def integrity_findings(result: RerunResult) -> frozenset[str]:
    """Everything the integrity check found changed in any test of a rerun."""
    return frozenset(item for outcome in result.outcomes for item in outcome.integrity)


def integrity_verdict(result: RerunResult, allowed: frozenset[str]) -> Verdict | None:
    """A rejection for what the candidate changed that the unpatched code did not, or for a
    rerun whose integrity check could not even start."""
    failed = result.extra.get("integrity_error")
    if failed:
        return Verdict(False, f"the run-time integrity check could not start: {failed}",
                       kind="rerun")
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
        kind="integrity",
    )


def no_outcomes(result: RerunResult) -> str:
    """Why a rerun that reported no test at all is no verdict on the candidate."""
    lines = [line.strip() for line in result.output.splitlines() if line.strip()]
    last = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else "")
    return (f"the rerun reported no test outcome (exit status {result.returncode}): "
            f"{last[:300]}").rstrip(": ")


def raised_in_kernel(failure: Failure) -> str:
    """The launched kernel whose code raised the error under the interpreter, or ""."""
    launched = {(launch.name, os.path.abspath(launch.file)) for launch in failure.launches}
    for frame in reversed(failure.error.frames):
        if (frame.name, os.path.abspath(frame.path)) in launched:
            return frame.name
    return ""


def did_not_reproduce(baseline: RerunResult, nodeids: Sequence[str]) -> str:
    """Why the unpatched rerun is no bug to heal (gone, uncollectable, unrunnable), or ""."""
    if baseline.timed_out or baseline.crash_reason:
        return ""
    if baseline.collection_errors:
        return ("the tests cannot be collected in the sandbox copy: "
                + first_line(baseline.collection_errors[0]))
    if len(baseline.missing(nodeids)) == len(nodeids):
        return "the unpatched tests cannot be rerun in the sandbox: " + no_outcomes(baseline)
    if all(baseline.passed([n]) for n in nodeids):
        return ("the failure does not reproduce in a sandbox rerun (flaky, order-dependent or "
                "environment-dependent); nothing to heal")
    return ""


def interpreter_limitation(failure: Failure, baseline: RerunResult, target: str) -> str:
    """Why the failure is the interpreter's, not the kernel's: "" when it is the kernel's.

    Errors raised while the interpreter runs a kernel are the ones the compiler checks
    too; when the gate compiles the very same launch for a GPU, the interpreter is wrong.
    """
    kernel = raised_in_kernel(failure)
    if not kernel:
        return ""
    verdicts = [gate for gate in gate_results(baseline) if gate.kernel == kernel]
    if not verdicts or not all(gate.ok and not gate.error for gate in verdicts):
        return ""  # not compiled (skipped, or not launched in the rerun) or really broken
    return (f"interpreter limitation: the Triton interpreter raises "
            f"{failure.error.headline!r} in {kernel}, but the same launch compiles for "
            f"{target}; nothing to heal (run the test on a GPU to confirm)")


CUDA_SHIM_LIMITATION = (
    "interpreter limitation: the tests pass once device='cuda' tensors and torch.cuda "
    "queries are mapped to the CPU (kernelfix_cuda_shim is off); nothing to heal"
)


class Verifier:
    """Reruns one bug's tests (and its regression set) on candidates, in one sandbox."""

    def __init__(
        self,
        sandbox: Sandbox,
        setup: RerunSetup,
        nodeids: Sequence[str],
        regression: Sequence[str] = (),
        *,
        launched: Sequence[str] = (),
        protected: Sequence[str] = (),
        runner: Runner = run_tests,
    ) -> None:
        self.sandbox = sandbox
        self.setup = setup
        self.nodeids = tuple(nodeids)
        self.regression = tuple(n for n in regression if n not in self.nodeids)
        self.launched = frozenset(launched)
        self.protected = tuple(protected)
        self.runner = runner
        self.regression_baseline: frozenset[str] = frozenset(self.regression)
        self.baseline_findings: frozenset[str] = frozenset()
        self.originals: dict[str, str] = {}
        self.written: dict[str, str] = {}

    def _spec(self, nodeids: tuple[str, ...], setup: RerunSetup | None = None, *,
              stop_early: bool = False, poison: str = "") -> RerunSpec:
        return RerunSpec(setup or self.setup, self.sandbox.root, nodeids, poison=poison,
                         stop_early=stop_early)

    def _write(self, files: Mapping[str, str]) -> None:
        for path, text in files.items():
            if self.written.get(path) != text:
                self.sandbox.write(path, text)
                self.written[path] = text

    def restore(self) -> None:
        """Put the original bytes back for every file this verifier wrote."""
        for path in self.written:
            self.sandbox.reset(path)
        self.written = {}

    def baseline(self, originals: Mapping[str, str]) -> RerunResult:
        """Rerun the unpatched code: does the failure reproduce, which tests pass?"""
        self.originals = dict(originals)
        self._write(originals)
        result = self.runner(self._spec(self.nodeids + self.regression))
        self.regression_baseline = frozenset(
            nodeid for nodeid in self.regression if result.passed([nodeid])
        )
        self.baseline_findings = integrity_findings(result)
        return result

    def triage(self, baseline: RerunResult, failure: Failure) -> str:
        """Why the bug behind ``baseline`` is not the kernel's to heal, or "".

        In interpret mode an error the gate compiles fine is the interpreter's, and so is a
        bf16 result the interpreter could not compute exactly; with the CUDA shim off, a
        failure that passes once it is on is the CPU mapping's.
        """
        device = self.setup.device
        why_not = did_not_reproduce(baseline, self.nodeids)
        if why_not or not device.interpret:
            return why_not
        why_not = interpreter_limitation(failure, baseline, device.gate_target)
        if not why_not:  # the child's shim says whether its bf16 was exact, not this process
            exact = baseline.extra.get("bf16_exact", True) is not False
            why_not = bf16_limitation(failure, bf16_exact=exact)
        if not why_not and not device.cuda_shim and self._passes_with_cuda_shim():
            why_not = CUDA_SHIM_LIMITATION
        return why_not

    def _passes_with_cuda_shim(self) -> bool:
        setup = replace(self.setup, device=replace(self.setup.device, cuda_shim=True))
        return self.runner(self._spec(self.nodeids, setup, stop_early=True)).passed(self.nodeids)

    def _tampered(self) -> list[str]:
        """Protected files whose sandbox bytes differ from the original tree's (or are
        gone), and written-through links. The original is the reference: a snapshot of the
        shared sandbox could already hold an earlier candidate's damage."""
        changed = []
        for path in self.protected:
            try:
                same = (self.sandbox.path(path).read_bytes()
                        == (self.sandbox.source / path).read_bytes())
            except OSError:
                same = False
            if not same:
                changed.append(path)
        return changed + list(self.sandbox.touched_links())

    def __call__(self, candidate: Mapping[str, str]) -> Verdict:
        notes = shape_notes(self.originals, candidate) if self.originals else ()
        return replace(self._verdict(candidate), notes=notes)

    def _verdict(self, candidate: Mapping[str, str]) -> Verdict:
        self._write(candidate)
        tampered = self._tampered()
        if tampered:
            return Verdict(False, f"test files changed: {', '.join(tampered)}",
                           kind="tampered")
        first = self._run(self._spec(self.nodeids, stop_early=True))
        if isinstance(first, Verdict):
            return first
        verdict = self.judge(first, regression=())
        if self.regression_baseline and verdict.kind in ("", *_JUDGED_AFTER_REGRESSION):
            # The failing tests pass: run the regression set too; a broken regression test
            # is reported before a bypass or a gate rejection, as in one combined rerun.
            second = self._run(self._spec(tuple(sorted(self.regression_baseline))))
            if isinstance(second, Verdict):
                return second
            verdict = self.judge(merge_results(first, second))
        return self.sensitivity(verdict) if verdict.ok else verdict

    def _run(self, spec: RerunSpec) -> RerunResult | Verdict:
        """Run, then check that the candidate's code wrote no test or data file."""
        result = self.runner(spec)
        return self._untampered() or result

    def sensitivity(self, passed: Verdict) -> Verdict:
        """Rerun the failing tests with the kernels' outputs poisoned: they must fail.

        Runs only for a candidate that passed everything else: one rerun per poison
        (NaN, then scrambled values), the second only when the first found no bypass.
        """
        notes: list[str] = []
        for mode in POISON_MODES:
            result = self._run(self._spec(self.nodeids, poison=mode))
            if isinstance(result, Verdict):
                return result
            changed = integrity_verdict(result, self.baseline_findings)
            if changed is not None:
                return changed
            judgement = judge_poisoned(result, self.nodeids, mode)
            if judgement.state == BYPASS:
                return Verdict(False, judgement.summary, judgement.feedback, kind="insensitive")
            if judgement.state == UNCERTIFIABLE:
                return Verdict(False, judgement.summary, judgement.summary, kind=UNCERTIFIABLE)
            if judgement.state == UNMEASURED:
                notes.append(judgement.summary)
                break  # nothing was poisoned: another poison measures nothing either
        summary = passed.summary + (f"; {notes[0]}" if notes else
                                    "; the tests fail once the kernel's output is poisoned")
        return replace(passed, summary=summary)

    def _untampered(self) -> Verdict | None:
        """A rejection when the rerun (the candidate's code ran) wrote test files."""
        tampered = self._tampered()
        if not tampered:
            return None
        for path in tampered:  # later rounds and bugs share this sandbox: undo it
            self.sandbox.reset(path)
        return Verdict(False, f"the rerun changed test or data files: {', '.join(tampered)}",
                       "Running the patched code changed files it must not touch: "
                       + ", ".join(tampered), kind="tampered")

    def judge(self, result: RerunResult, regression: Sequence[str] | None = None) -> Verdict:
        """Turn a rerun into a verdict, most fundamental problem first.

        ``regression`` are the tests that must still pass (default: those that passed
        in the baseline; ``()`` while only the failing tests ran).
        """
        regression = (tuple(sorted(self.regression_baseline)) if regression is None
                      else tuple(regression))
        if result.timed_out:
            return Verdict(
                False,
                f"rerun timed out after {self.setup.timeout:g} s (a hung kernel or an endless "
                "loop?)",
                "The tests did not finish: the patched kernel probably never terminates "
                "(check loop bounds and loop variables).\n" + truncate_log(result.output),
                kind="timeout",
            )
        if result.crash_reason:
            unfinished = result.missing(self.nodeids)
            return Verdict(
                False,
                first_line(result.crash_reason),
                result.crash_reason
                + (f"\nTests that never finished: {', '.join(unfinished[:5])}" if unfinished
                   else "")
                + "\n" + truncate_log(result.output, head=10, tail=40),
                kind="crash",
            )
        if result.collection_errors:
            errors = "\n".join(result.collection_errors)
            return Verdict(False, f"tests could not be collected: {first_line(errors)}",
                           redact(truncate_log(errors)), kind="collection")
        if len(result.missing(self.nodeids)) == len(self.nodeids):
            return Verdict(False, no_outcomes(result), redact(truncate_log(result.output)),
                           kind="rerun")
        failing = [n for n in self.nodeids if not result.passed([n])]
        if failing:
            return self._still_failing(result, failing)
        broken = [n for n in regression if not result.passed([n])]
        if broken:
            outcomes = [result.outcome(n) for n in broken]
            shown = [describe_outcome(o) for o in outcomes if o is not None][:_FEEDBACK_TESTS]
            return Verdict(
                False,
                f"breaks {len(broken)} test(s) that passed before: {', '.join(broken[:3])}",
                "The change fixed the failing tests but broke tests that passed before:\n\n"
                + "\n\n".join(shown),
                kind="regression",
            )
        changed = integrity_verdict(result, self.baseline_findings)
        if changed is not None:
            return changed
        bypassed = [  # regression tests were chosen because they launched an editable kernel
            n for n in self.nodeids + regression
            if (n in self.launched or n in self.regression_baseline)
            and (o := result.outcome(n)) is not None and o.launch_count == 0
        ]
        if bypassed:
            return Verdict(
                False,
                f"kernel bypass: {len(bypassed)} test(s) pass without launching a Triton kernel",
                "The tests passed without launching any Triton kernel: replacing the kernel "
                "with a torch or Python fallback, or returning early, is not a fix. Fix the "
                "kernel itself.",
                kind="bypass",
            )
        rejected = gate_rejections(result)
        if rejected:
            target = self.setup.device.gate_target or "the GPU target"
            return Verdict(
                False,
                f"passes on the interpreter but does not compile for {target}: "
                f"{first_line(rejected[0].error)}",
                "The tests pass on the Triton interpreter, but compiling the kernel for a real "
                f"GPU ({target}) failed; the interpreter cannot see this:\n\n"
                + "\n\n".join(gate.error for gate in rejected[:3]),
                kind="gate",
            )
        return Verdict(True, f"{len(self.nodeids)} failing test(s) pass"
                       + (f", {len(regression)} regression test(s) still pass"
                          if regression else ""))

    def _still_failing(self, result: RerunResult, failing: Sequence[str]) -> Verdict:
        """Failing tests that still fail; those the stopped rerun never ran are named as
        not run, not as failing."""
        ran = [n for n in failing if result.outcome(n) is not None]
        not_run = len(failing) - len(ran)
        outcomes = [result.outcome(n) for n in ran]
        shown = [describe_outcome(o) for o in outcomes if o is not None][:_FEEDBACK_TESTS]
        headline = next((o.error.headline for o in outcomes if o and o.error), "")
        summary = f"{len(ran)} of {len(self.nodeids)} failing tests still fail"
        if not_run:
            summary += f" ({not_run} not run: the rerun stops at the first that still fails)"
        if headline:
            summary += f": {headline}"
        return Verdict(False, first_line(summary), "\n\n".join(shown) or summary,
                       kind="failing")


def _gate_items(result: RerunResult) -> list[Any]:
    items = result.extra.get("gate")
    return list(items) if isinstance(items, list) else []


def merge_results(first: RerunResult, second: RerunResult) -> RerunResult:
    """The failing tests' rerun and the regression rerun as one result to judge: the
    outcomes and gate verdicts of both, how the second ended."""
    extra = {**first.extra, **second.extra}
    if "gate" in first.extra or "gate" in second.extra:
        extra["gate"] = [item for r in (first, second) for item in _gate_items(r)]
    return replace(second, outcomes=first.outcomes + second.outcomes,
                   output=second.output or first.output, seconds=first.seconds + second.seconds,
                   extra=extra)
