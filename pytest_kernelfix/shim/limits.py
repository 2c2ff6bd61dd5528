"""What the Triton interpreter cannot check, how the shim says so, and how triage tells.

A failure that comes from the interpreter rather than the kernel must not be healed: a
model would "fix" a correct kernel, and the verdict on its fix would come from the same
wrong arithmetic. The shim raises :class:`InterpreterLimitation` where it knows it cannot
compute what a GPU would, and :class:`CudaNotEmulated` for a ``torch.cuda`` call it cannot
answer as a GPU would; :func:`bf16_limitation` recognises such failures, and failures
of kernels that take bf16 tensors while the interpreter's bf16 is not exact, from plain
data: the captured failure and whether bf16 was exact in the session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_kernelfix.capture.records import Failure


class InterpreterLimitation(NotImplementedError):
    """The interpreter cannot run this the way a GPU would; only a GPU can tell."""


class CudaNotEmulated(InterpreterLimitation):
    """A ``torch.cuda`` call the CUDA shim cannot answer as one GPU would; the message
    names the call and how to run without the shim."""


#: The shim's own exceptions, by name as failures record them: the shim's, not the kernel's.
LIMITATION_TYPES = (InterpreterLimitation.__name__, CudaNotEmulated.__name__)


def bf16_kernels(failure: Failure) -> tuple[str, ...]:
    """Names of the kernels the failing test launched with bf16 tensor arguments."""
    return tuple(dict.fromkeys(
        launch.name for launch in failure.launches
        if any(kind == "*bf16" for _, kind in launch.signature)
    ))


def bf16_limitation(failure: Failure, *, bf16_exact: bool) -> str:
    """Why the failure is the interpreter's bf16 and not the kernel's; "" when it is not.

    Two cases: the shim raised :class:`InterpreterLimitation` (or
    :class:`CudaNotEmulated`), or the test launched a
    kernel with bf16 tensors while the interpreter computed bf16 on raw storage
    (``bf16_exact`` False): a wrong value there says nothing about the kernel, and no
    rerun could confirm a fix.
    """
    if failure.error.type in LIMITATION_TYPES:
        return f"interpreter limitation: {failure.error.message}; nothing to heal"
    kernels = bf16_kernels(failure)
    if bf16_exact or not kernels:
        return ""
    return (f"interpreter limitation: {', '.join(kernels)} takes bf16 tensors, and the "
            "Triton interpreter computed bf16 on the raw 16-bit storage (the shim's bf16 "
            "emulation is off), so this result says nothing about the kernel; nothing to "
            "heal (run the test on a GPU to confirm)")
