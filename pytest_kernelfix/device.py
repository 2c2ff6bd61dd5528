"""Put the process on the chosen device before any kernel module is imported.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a function, so interpret
mode must be set (and the CPU shim installed) before conftest files and test modules
import kernels. The same preparation runs in the session and in every rerun.
"""

from __future__ import annotations

import os


def prepare(device: str, *, cuda_shim: bool = True) -> None:
    """Set up ``interpret`` (interpreter + CPU shim) or ``cuda`` in this process."""
    if device == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"
        from pytest_kernelfix import shim

        shim.install(cuda=cuda_shim)
    elif device == "cuda":
        os.environ.pop("TRITON_INTERPRET", None)
