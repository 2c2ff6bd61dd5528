from __future__ import annotations

import pytest
import torch
from kernels.add import add


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("size", [1, 1000, 4096, 98_433])
def test_add(size: int, dtype: torch.dtype, device: str) -> None:
    x = torch.randn(size, dtype=dtype, device=device)
    y = torch.randn(size, dtype=dtype, device=device)
    torch.testing.assert_close(add(x, y), x + y)
