"""Put the process on the chosen device before any kernel module is imported.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a function, so interpret
mode must be set (and the CPU shim installed) before conftest files and test modules
import kernels. The same preparation runs in the session and in every rerun.
"""

from __future__ import annotations

import os

import pytest


def prepare(
    device: str, *, cuda_shim: bool = True, capability: tuple[int, int] = (9, 0)
) -> None:
    """Set up ``interpret`` (interpreter + CPU shim) or ``cuda`` in this process.

    ``capability`` is what the shim's ``torch.cuda`` answers: the compile gate's target.
    """
    if device == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"
        from pytest_kernelfix import shim

        try:
            shim.install(cuda=cuda_shim, target_capability=capability)
        except ImportError as error:
            raise pytest.UsageError(
                f"kernelfix: running kernels on the Triton interpreter needs triton, torch "
                f"and numpy: {error}"
            ) from None
    elif device == "cuda":
        os.environ.pop("TRITON_INTERPRET", None)
