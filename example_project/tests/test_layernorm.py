from __future__ import annotations

import pytest
import torch
from kernels.layernorm import layernorm

TOLERANCES = {
    torch.float32: {"atol": 1e-5, "rtol": 1e-5},
    torch.float16: {"atol": 1e-2, "rtol": 1e-2},
}


@pytest.mark.kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(4, 64), (7, 100), (2, 3, 781)])
def test_layernorm(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> None:
    n = shape[-1]
    x = (2 * torch.randn(shape, device=device) + 0.5).to(dtype)
    weight = torch.randn(n, device=device).to(dtype)
    bias = torch.randn(n, device=device).to(dtype)
    expected = torch.nn.functional.layer_norm(
        x.float(), (n,), weight.float(), bias.float(), eps=1e-5
    ).to(dtype)
    torch.testing.assert_close(layernorm(x, weight, bias, eps=1e-5), expected, **TOLERANCES[dtype])
