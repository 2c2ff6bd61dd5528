"""A mask is not a fix: is the kernel's output the same as when the tests failed?

A candidate may leave a wrong kernel as it is and transform its output after the launch
so that the tested values come out right (``out.clip(min=0)``, ``torch.nan_to_num(out)``,
``where(isnan(out), 0, out)``). NaN survives a clamp, so poisoning cannot tell it from a
fix. What can: the kernel computes exactly what it computed in the failing run. The
representative's launches are fingerprinted on the original code and on the candidate
(what each launch read and what it wrote, bit for bit,
:class:`~pytest_kernelfix.rerun.report.Fingerprint`); when every launch of the candidate
read what an original launch read and wrote what it wrote, the kernels are unchanged.
Where the launches read other bytes (inputs drawn without a seed), the code says it
instead: no ``@triton.jit`` function and no wrapper up to its launch changed
(:func:`pytest_kernelfix.heal.analysis.masking`). Arithmetic that combines the output with
other data (a divisor, a chain-rule factor) is a fix of the wrapper, not a mask.
"""

from __future__ import annotations

from collections.abc import Sequence

from pytest_kernelfix.rerun.report import Fingerprint, RerunResult
from pytest_kernelfix.vocabulary import Verdict, VerdictKind


def _fingerprints(result: RerunResult, nodeid: str) -> tuple[Fingerprint, ...]:
    outcome = result.outcome(nodeid)
    return () if outcome is None or outcome.probe is None else outcome.probe.fingerprints


def kernel_output_unchanged(original: RerunResult, candidate: RerunResult, nodeid: str,
                            kernels: Sequence[str] = ()) -> bool | None:
    """Did ``kernels`` (every project kernel when empty) write, in ``nodeid``, the same
    bytes from the same inputs as on the original code? None when no launch of the
    candidate read what an original launch read: nothing to compare."""
    before = _fingerprints(original, nodeid)
    after = _fingerprints(candidate, nodeid)
    wanted = set(kernels) or {f.kernel for f in before}
    wrote = {(f.kernel, f.inputs): f.outputs for f in before if f.kernel in wanted}
    launches = [f for f in after if f.kernel in wanted]
    comparable = [f for f in launches if (f.kernel, f.inputs) in wrote]
    if not comparable:
        return None
    if any(wrote[(f.kernel, f.inputs)] != f.outputs for f in comparable):
        return False
    return True if len(comparable) == len(launches) else None


def masked_verdict(statements: Sequence[str], *, measured: bool) -> Verdict:
    """The verdict on a candidate that masks an unchanged kernel output."""
    shown = "; ".join(f"`{statement}`" for statement in statements[:3])
    evidence = ("measured: the kernels read and wrote the same bytes as in the failing run"
                if measured else "read from the code: no kernel and no launch changed")
    return Verdict(
        False,
        f"masks the kernel's output ({shown}): the kernel's output is unchanged ({evidence})",
        f"The kernel's output is unchanged; the candidate masks it after the launch with "
        f"{shown}. A mask hides a wrong kernel (the tested values come out right, the kernel "
        "still computes what it computed when the tests failed): fix the kernel.",
        kind=VerdictKind.MASKED,
    )
