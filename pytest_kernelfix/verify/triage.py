"""Is the failure the kernel's to heal? Read from the unpatched code's rerun.

Before round 1 the unpatched code is rerun once (the baseline). A failure that does not
reproduce there (flaky, order- or environment-dependent), that cannot be collected or run
in the sandbox, or that is the interpreter's rather than the kernel's, is not a bug to
heal: a model would "fix" a correct kernel, and its fix would be judged by the same wrong
arithmetic. Each function here returns why not, or "".
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from pytest_kernelfix.capture.records import Failure
from pytest_kernelfix.rerun.plan import DevicePlan
from pytest_kernelfix.rerun.report import RerunResult
from pytest_kernelfix.shim.limits import bf16_limitation
from pytest_kernelfix.verify.judge import first_line, no_outcomes

CUDA_SHIM_LIMITATION = (
    "interpreter limitation: the tests pass once device='cuda' tensors and torch.cuda "
    "queries are mapped to the CPU (kernelfix_cuda_shim is off); nothing to heal"
)


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
    verdicts = [gate for gate in baseline.report.gate_results if gate.kernel == kernel]
    if not verdicts or not all(gate.ok and not gate.error for gate in verdicts):
        return ""  # not compiled (skipped, or not launched in the rerun) or really broken
    return (f"interpreter limitation: the Triton interpreter raises "
            f"{failure.error.headline!r} in {kernel}, but the same launch compiles for "
            f"{target}; nothing to heal (run the test on a GPU to confirm)")


def triage(baseline: RerunResult, failure: Failure, nodeids: Sequence[str],
           device: DevicePlan) -> str:
    """Why the bug behind ``baseline`` is not the kernel's to heal, or "".

    In interpret mode an error the gate compiles fine is the interpreter's, and so is a
    bf16 result the interpreter could not compute exactly (the child's shim says whether
    its bf16 was exact, not this process). Whether a failure is the CUDA shim's being
    off takes another rerun: :data:`CUDA_SHIM_LIMITATION`, decided by the verifier.
    """
    why_not = did_not_reproduce(baseline, nodeids)
    if why_not or not device.interpret:
        return why_not
    why_not = interpreter_limitation(failure, baseline, device.gate_target)
    if not why_not:
        why_not = bf16_limitation(failure, bf16_exact=baseline.report.bf16_exact is not False)
    return why_not
