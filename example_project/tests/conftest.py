"""Shared fixtures: the device kernels run on, and a fixed seed per test.

On a machine without a GPU the tensors stay on the CPU and the kernels need the Triton
interpreter (``TRITON_INTERPRET=1`` before the kernel modules are imported).
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def device() -> str:
    """``"cuda"`` when a GPU is visible, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _seed() -> None:
    """Same inputs for a test whatever ran before it, also under pytest-xdist."""
    torch.manual_seed(0)


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """Readable test ids: ``test_matmul[100x70x50-fp16]`` rather than ``[mnk2-dtype1]``."""
    if isinstance(val, torch.dtype):
        return {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}.get(
            val, str(val).removeprefix("torch.")
        )
    if isinstance(val, tuple) and all(isinstance(v, int) for v in val):
        return "x".join(map(str, val))
    return None
