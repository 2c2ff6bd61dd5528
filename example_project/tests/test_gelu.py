from __future__ import annotations

import pytest
import torch
from kernels.gelu import gelu


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1000,), (64, 64), (3, 1025)])
def test_gelu(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> None:
    x = 3 * torch.randn(shape, dtype=dtype, device=device)
    expected = torch.nn.functional.gelu(x.float(), approximate="tanh").to(dtype)
    torch.testing.assert_close(gelu(x), expected)
