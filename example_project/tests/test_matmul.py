from __future__ import annotations

import pytest
import torch
from kernels.matmul import matmul

# On a GPU fp32 dots run in TF32 (10-bit mantissa), so fp32 gets fp16-like tolerances.
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2}


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("mnk", [(64, 64, 64), (128, 64, 96), (100, 70, 50)])
def test_matmul(mnk: tuple[int, int, int], dtype: torch.dtype, device: str) -> None:
    m, n, k = mnk
    a = torch.randn((m, k), dtype=dtype, device=device)
    b = torch.randn((k, n), dtype=dtype, device=device)
    expected = (a.float() @ b.float()).to(dtype)
    torch.testing.assert_close(matmul(a, b), expected, **TOLERANCE)


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matmul_transposed_operand(dtype: torch.dtype, device: str) -> None:
    a = torch.randn((80, 48), dtype=dtype, device=device)
    b = torch.randn((72, 48), dtype=dtype, device=device).t()
    expected = (a.float() @ b.float()).to(dtype)
    torch.testing.assert_close(matmul(a, b), expected, **TOLERANCE)
