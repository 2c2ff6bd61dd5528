"""CUDA tensors stay CUDA tensors: Parameters, moved modules, and what autograd hands back.

On a GPU a module made with ``device="cuda"`` or moved with ``.cuda()`` has CUDA
parameters, CUDA autocast casts them, and a custom Function's backward sees CUDA saved
tensors and gradients (kernel libraries branch on that: liger's norms size their partial
sums by the SM count). Each test here failed under the shim before it carried the flag
through ``Parameter``, ``.data =`` and autograd.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F

from pytest_kernelfix.shim import autocast, bf16, cuda

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() and not cuda.installed(), reason="a real GPU is present"
)

@pytest.fixture
def on_cpu() -> Iterator[None]:
    """The CUDA piece as an sm_80 GPU, with autocast emulation and exact bf16 (so the GPU
    supports bf16 autocast); session-wide pieces are put back afterwards."""
    held, had_autocast, had_bf16 = cuda.capability(), autocast.installed(), bf16.installed()
    cuda.uninstall()
    bf16.install()
    assert cuda.install((8, 0))
    autocast.install()
    yield
    cuda.uninstall()
    if not had_autocast:
        autocast.uninstall()
    if not had_bf16:
        bf16.uninstall()
    if held is not None:
        cuda.install(held)


def assert_cuda(tensor: torch.Tensor | None) -> None:
    """Every device answer a GPU gives for a tensor on it."""
    assert tensor is not None
    assert (tensor.is_cuda, tensor.device, tensor.get_device()) == (
        True, torch.device("cuda", 0), 0), tensor.device


BIAS_FREE: dict[str, Callable[..., torch.nn.Module]] = {
    "linear": lambda **kw: torch.nn.Linear(8, 4, bias=False, **kw),
    "conv1d": lambda **kw: torch.nn.Conv1d(8, 4, 3, bias=False, **kw),
    "conv2d": lambda **kw: torch.nn.Conv2d(8, 4, 3, bias=False, **kw),
}
INPUT_SHAPES = {"linear": (2, 8), "conv1d": (2, 8, 6), "conv2d": (2, 8, 6, 6)}
FUNCTIONALS: dict[str, Callable[..., torch.Tensor]] = {
    "linear": F.linear, "conv1d": F.conv1d, "conv2d": F.conv2d}
MOVES: dict[str, Callable[[torch.nn.Module], torch.nn.Module]] = {
    "made on cuda": lambda module: module,  # the module is built with device="cuda"
    ".cuda()": lambda module: module.cuda(),
    ".to('cuda')": lambda module: module.to("cuda"),
    ".to(device, dtype)": lambda module: module.to(torch.device("cuda"), torch.float32),
}


def build(kind: str, move: str) -> torch.nn.Module:
    made_on = {"device": "cuda"} if move == "made on cuda" else {}
    return MOVES[move](BIAS_FREE[kind](**made_on))


@pytest.mark.parametrize("move", list(MOVES))
@pytest.mark.parametrize("kind", list(BIAS_FREE))
def test_module_parameters_on_cuda_are_cuda_tensors(on_cpu: None, kind: str, move: str) -> None:
    module = build(kind, move)
    assert_cuda(module.weight)
    assert isinstance(module.weight, torch.nn.Parameter)
    assert not module.cpu().weight.is_cuda  # and back, as on a GPU


def test_module_cuda_moves_buffers_and_existing_grads(on_cpu: None) -> None:
    norm = torch.nn.BatchNorm1d(4)
    norm(torch.randn(3, 4)).sum().backward()
    norm.cuda()
    for tensor in (norm.weight, norm.weight.grad, norm.running_mean, norm.num_batches_tracked):
        assert_cuda(tensor)


def test_a_parameter_is_where_its_data_is(on_cpu: None) -> None:
    assert_cuda(torch.nn.Parameter(torch.randn(3, device="cuda")))
    assert_cuda(torch.nn.Parameter(torch.randn(3).cuda(), requires_grad=False))
    assert not torch.nn.Parameter(torch.randn(3)).is_cuda


def test_assigning_data_moves_the_tensor(on_cpu: None) -> None:
    weight = torch.nn.Parameter(torch.randn(3))
    weight.data = torch.rand(3, device="cuda")  # how liger's tests share weights
    assert_cuda(weight)
    weight.data = torch.rand(3)
    assert not weight.is_cuda


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("move", ["made on cuda", ".cuda()"])
@pytest.mark.parametrize("kind", list(BIAS_FREE))
def test_bias_free_modules_run_under_autocast(
    on_cpu: None, kind: str, move: str, dtype: torch.dtype
) -> None:
    """The false failure: ``expected m1 and m2 to have the same dtype (Half != float)``."""
    module = build(kind, move)
    x = torch.randn(*INPUT_SHAPES[kind], device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        out = module(x)
    assert out.dtype == dtype
    assert_cuda(out)
    expected = FUNCTIONALS[kind](x.to(dtype), module.weight.detach().to(dtype))
    torch.testing.assert_close(out, expected)

