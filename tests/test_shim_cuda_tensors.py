"""CUDA tensors stay CUDA tensors: Parameters, moved modules, and what autograd hands back.

On a GPU a module made with ``device="cuda"`` or moved with ``.cuda()`` has CUDA
parameters, CUDA autocast casts them, and a custom Function's backward sees CUDA saved
tensors and gradients (kernel libraries branch on that: liger's norms size their partial
sums by the SM count). Each test here failed under the shim before it carried the flag
through ``Parameter``, ``.data =`` and autograd.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from pytest_kernelfix.shim import autocast, bf16, cuda

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() and not cuda.installed(), reason="a real GPU is present"
)

SM_COUNT = 108  # the A100 the fixture installs


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


class Recorder(torch.autograd.Function):
    """``x * w``; its backward records the device answers of what autograd hands it and
    sizes its partial sums as liger's norms do."""

    seen: list[dict[str, Any]] = []  # noqa: RUF012 - one record per backward, read by tests

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = x * w
        scale = torch.ones_like(w)  # made in forward, saved, not returned
        ctx.save_for_backward(x, w, out, scale)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, w, out, scale = ctx.saved_tensors
        sm_count = 1
        if x.device.type == "cuda":
            sm_count = torch.cuda.get_device_properties(x.device).multi_processor_count
        Recorder.seen.append({
            "saved": [(t.is_cuda, t.device.type, t.get_device()) for t in (x, w, out, scale)],
            "grad": (grad_out.is_cuda, grad_out.device.type, grad_out.get_device()),
            "sm_count": sm_count,
            "workspace": torch.empty(sm_count, device="cuda").device.type,
        })
        return grad_out * w * scale, (grad_out * x).sum(0)


GPU_BACKWARD = {"saved": [(True, "cuda", 0)] * 4, "grad": (True, "cuda", 0),
                "sm_count": SM_COUNT, "workspace": "cuda"}


def run_backward(how: str, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Gradients of ``sum(tanh(Recorder(x, w)))``: the Function's grad_out comes from
    torch's own backward of tanh, made in C++ (as every gradient in a real graph is)."""
    loss = Recorder.apply(x, w).tanh().sum()
    if how == "backward":
        loss.backward()
        assert x.grad is not None and w.grad is not None
        return x.grad, w.grad
    return torch.autograd.grad(loss, (x, w))


@pytest.mark.parametrize("how", ["backward", "autograd.grad"])
def test_backward_sees_cuda_tensors(on_cpu: None, how: str) -> None:
    Recorder.seen.clear()
    x = torch.randn(4, 3, device="cuda", requires_grad=True)
    w = torch.randn(3, device="cuda", requires_grad=True)
    grads = run_backward(how, x, w)
    assert Recorder.seen == [GPU_BACKWARD]
    for grad in grads:
        assert_cuda(grad)


def test_backward_of_a_module_on_cuda_sees_cuda_tensors(on_cpu: None) -> None:
    """A Parameter from a module moved with .cuda(), through a Function, under autocast."""
    Recorder.seen.clear()
    linear = torch.nn.Linear(3, 3, bias=False).cuda()
    x = torch.randn(4, 3, device="cuda")
    with torch.autocast("cuda"):
        hidden = linear(x)
    Recorder.apply(hidden.float(), linear.weight[0]).tanh().sum().backward()
    assert Recorder.seen == [GPU_BACKWARD]
    assert_cuda(linear.weight.grad)


def test_saved_tensors_stay_cuda_on_every_access(on_cpu: None) -> None:
    """A saved output is unpacked into a new object on each access of ctx.saved_tensors."""

    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            out = x * x
            ctx.save_for_backward(out)
            return out

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
            first, second = ctx.saved_tensors[0], ctx.saved_tensors[0]
            assert first is not second
            assert first.is_cuda and second.is_cuda
            return 2 * grad_out * first.sqrt()

    x = torch.rand(5, device="cuda", requires_grad=True)
    Square.apply(x).sum().backward()
    assert_cuda(x.grad)


def test_an_input_returned_as_is_stays_a_cuda_tensor(on_cpu: None) -> None:
    """torch hands back an input returned unchanged by forward as a new view of it: the
    view, and the gradient backward is given for it, are CUDA tensors."""

    class Identity(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x

        @staticmethod
        def backward(ctx: Any, grad_out: torch.Tensor) -> torch.Tensor:
            assert grad_out.is_cuda
            return grad_out

    x = torch.randn(3, device="cuda", requires_grad=True)
    out = Identity.apply(x)
    assert out is not x
    assert_cuda(out)
    out.tanh().sum().backward()
    assert_cuda(x.grad)


@pytest.mark.skipif("apply_boxed" not in torch.autograd.function.BackwardCFunction.__dict__,
                    reason="this torch has no boxed backward")
def test_a_boxed_backward_is_given_cuda_gradients(on_cpu: None) -> None:
    seen: list[bool] = []

    class Boxed(torch.autograd.Function):
        boxed_grads_call = True  # backward gets one list of gradients, to free early

        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, grads: list[torch.Tensor]) -> torch.Tensor:
            seen.extend(grad.is_cuda for grad in grads)
            return grads[0] * 2

    x = torch.randn(3, device="cuda", requires_grad=True)
    Boxed.apply(x).tanh().sum().backward()
    assert seen == [True]


def test_gradients_given_to_tensor_hooks_are_cuda_tensors(on_cpu: None) -> None:
    seen: list[bool] = []
    x = torch.randn(3, device="cuda", requires_grad=True)
    hidden = x * 2
    hidden.register_hook(lambda grad: seen.append(grad.is_cuda))
    hidden.tanh().sum().backward()
    assert seen == [True]


def test_double_backward_keeps_cuda_tensors(on_cpu: None) -> None:
    x = torch.randn(4, 3, device="cuda", requires_grad=True)
    w = torch.randn(3, device="cuda", requires_grad=True)
    (grad_x,) = torch.autograd.grad((Recorder.apply(x, w) ** 2).sum(), x, create_graph=True)
    assert_cuda(grad_x)
    grad_x.sum().backward()  # backward through a backward that ran with the mode on
    assert_cuda(w.grad)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
def test_checkpointed_code_recomputes_as_on_a_gpu(on_cpu: None, reentrant: bool) -> None:
    """Recomputation runs in backward, and checkpoint's pack hook inside an op: both see
    the CUDA tensors the forward saw (else ``CheckpointError``: cpu != cuda metadata)."""
    w = torch.randn(4, device="cuda")

    def layer(x: torch.Tensor) -> torch.Tensor:
        return (x * w * torch.ones(4, device="cuda")).tanh()

    x = torch.randn(3, 4, device="cuda", requires_grad=True)
    twin = x.detach().clone().requires_grad_()
    checkpoint(layer, x, use_reentrant=reentrant).sum().backward()
    layer(twin).sum().backward()
    assert_cuda(x.grad)
    torch.testing.assert_close(x.grad, twin.grad)


def test_tensors_saved_on_the_cpu_come_back_as_cuda_tensors(on_cpu: None) -> None:
    x = torch.randn(4, device="cuda", requires_grad=True)
    w = torch.randn(4, device="cuda", requires_grad=True)
    with torch.autograd.graph.save_on_cpu(pin_memory=True):
        y = (x * w).tanh()
    y.sum().backward()
    assert_cuda(w.grad)
    torch.testing.assert_close(w.grad, x.detach() * (1 - y.detach() ** 2))


# A GPU kernel suite run by the plugin on the interpreter. Its backward sums the weight's
# gradient in one partial row per SM on a GPU; ``floordiv`` drops the last rows when the
# row count is not a multiple of the SM count: on a GPU it fails. The shim used to hand
# the backward CPU tensors, so it took the one-row path and the bug passed.
GPU_SUITE = """
    import operator

    import pytest
    import torch
    import torch.nn.functional as F
    import triton
    import triton.language as tl

    pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


    @triton.jit
    def partial_column_sums(x_ptr, g_ptr, out_ptr, n_rows, n_cols, rows_per_program,
                            BLOCK: tl.constexpr):
        program = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        end = tl.minimum((program + 1) * rows_per_program, n_rows)
        for row in range(program * rows_per_program, end):
            x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
            g = tl.load(g_ptr + row * n_cols + cols, mask=mask, other=0.0)
            acc += x * g
        tl.store(out_ptr + program * n_cols + cols, acc, mask=mask)


    def scale_columns(split):
        class ScaleColumns(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w):
                ctx.save_for_backward(x, w)
                return x * w

            @staticmethod
            def backward(ctx, grad):
                x, w = ctx.saved_tensors
                programs = 1
                if x.device.type == "cuda":
                    programs = torch.cuda.get_device_properties(x.device).multi_processor_count
                grad = grad.contiguous()
                partial = torch.empty(programs, x.shape[1], device=w.device)
                partial_column_sums[(programs,)](x, grad, partial, x.shape[0], x.shape[1],
                                                 split(x.shape[0], programs), BLOCK=64)
                return grad * w, partial.sum(0)

        return ScaleColumns.apply


    @pytest.mark.parametrize("split", [triton.cdiv, operator.floordiv],
                             ids=["cdiv", "floordiv"])
    def test_weight_grad(split):
        x = torch.randn(300, 64, device="cuda")
        w = torch.randn(64, device="cuda", requires_grad=True)
        scale_columns(split)(x, w).tanh().sum().backward()
        expected = torch.autograd.grad((x * w).tanh().sum(), w)[0]
        torch.testing.assert_close(w.grad, expected)


    def test_bias_free_linear_under_autocast():
        linear = torch.nn.Linear(64, 32, bias=False).cuda()
        x = torch.randn(8, 64, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            out = linear(x)
        torch.testing.assert_close(out, F.linear(x.half(), linear.weight.half()))
"""


def test_a_gpu_suite_fails_on_the_interpreter_where_it_fails_on_a_gpu(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_gpu=textwrap.dedent(GPU_SUITE))
    result = pytester.runpytest_subprocess(
        "--kernelfix-device=interpret", "-p", "no:cacheprovider", "-p", "no:randomly", "-rA")
    result.assert_outcomes(passed=2, failed=1)
    for line in ("PASSED test_gpu.py::test_weight_grad[[]cdiv[]]",
                 "PASSED test_gpu.py::test_bias_free_linear_under_autocast",
                 "FAILED test_gpu.py::test_weight_grad[[]floordiv[]] - *Tensor-like*"):
        result.stdout.fnmatch_lines([line])  # the GPU's verdict on each test
