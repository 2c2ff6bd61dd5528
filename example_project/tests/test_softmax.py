from __future__ import annotations

import pytest
import torch
from kernels.softmax import softmax


@pytest.mark.kernel
@pytest.mark.parametrize("scale", [1.0, 100.0], ids=["small", "large"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(4, 64), (7, 100), (16, 781)])
def test_softmax(shape: tuple[int, int], dtype: torch.dtype, scale: float, device: str) -> None:
    # Attention logits reach the hundreds: large inputs must not overflow exp().
    x = (scale * torch.randn(shape, device=device)).to(dtype)
    expected = torch.softmax(x.float(), dim=-1).to(dtype)
    torch.testing.assert_close(softmax(x), expected)
