from __future__ import annotations

import pytest
import torch
from kernels.autotuned_matmul import autotuned_matmul

# On a GPU fp32 dots run in TF32 (10-bit mantissa), so fp32 gets fp16-like tolerances.
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2}


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("mnk", [(64, 64, 64), (128, 96, 64), (100, 70, 50)])
def test_autotuned_matmul(mnk: tuple[int, int, int], dtype: torch.dtype, device: str) -> None:
    m, n, k = mnk
    a = torch.randn((m, k), dtype=dtype, device=device)
    b = torch.randn((k, n), dtype=dtype, device=device)
    expected = (a.float() @ b.float()).to(dtype)
    torch.testing.assert_close(autotuned_matmul(a, b), expected, **TOLERANCE)
