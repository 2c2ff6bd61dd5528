"""The CUDA piece of the shim: device="cuda" on the CPU, and torch.cuda's answers."""

from __future__ import annotations

import textwrap

import pytest
import torch
from kernels_catalog import shim_kernels

from pytest_kernelfix.shim import cuda, driver

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() and not cuda.installed(), reason="a real GPU is present"
)


def test_factories_and_moves_land_on_the_cpu(on_cpu: None) -> None:
    made = [
        torch.zeros(4, device="cuda"),
        torch.randn(4, device="cuda:0"),
        torch.arange(4, device=torch.device("cuda", 0)),
        torch.full((4,), 2.0, device=torch.device("cuda")),
        torch.tensor([1.0, 2.0], device="cuda"),
        torch.ones(4).cuda(),
        torch.ones(4).to("cuda"),
        torch.ones(4).to(device="cuda", dtype=torch.float16),
        torch.empty(4, device=0),
    ]
    for tensor in made:
        assert tensor.untyped_storage().device.type == "cpu"  # really on the CPU
        assert tensor.is_cuda
        assert tensor.device == torch.device("cuda", 0)
        assert tensor.get_device() == 0
    assert not torch.ones(4).is_cuda
    assert torch.ones(4).device == torch.device("cpu")


def test_results_of_cuda_tensors_stay_cuda(on_cpu: None) -> None:
    x = torch.randn(8, device="cuda")
    assert (x * 2).is_cuda
    assert torch.empty_like(x).is_cuda
    assert x.to(torch.float16).is_cuda
    assert x.sum().is_cuda
    assert not torch.empty_like(x, device="cpu").is_cuda
    with pytest.raises(AssertionError, match="device"):  # as on a GPU: cuda vs cpu differ
        torch.testing.assert_close(x, x.cpu())
    torch.testing.assert_close(x, x.cpu().cuda())


def test_moves_copy_exactly_when_a_real_move_would(on_cpu: None) -> None:
    host = torch.zeros(4)
    device = host.cuda()
    assert device.data_ptr() != host.data_ptr()
    assert device.cuda() is device
    assert device.to("cuda") is device
    back = device.cpu()
    assert back.data_ptr() != device.data_ptr()
    assert not back.is_cuda
    device.add_(1)  # a kernel writing its output must not reach the host copies
    assert host.sum() == 0
    assert back.sum() == 0
    assert host.cpu() is host


def test_torch_cuda_answers_as_the_target_gpu(on_cpu: None) -> None:
    assert torch.cuda.is_available()
    assert torch.cuda.device_count() == 1
    assert torch.cuda.current_device() == 0
    assert torch.cuda.get_device_capability() == (8, 0)
    assert torch.cuda.get_device_capability(0) == (8, 0)
    props = torch.cuda.get_device_properties(0)
    assert (props.major, props.minor) == (8, 0)
    assert props.multi_processor_count == 108
    assert props.total_memory > 16 * 1024**3
    assert "A100" in props.name == torch.cuda.get_device_name(0)
    assert torch.cuda.is_bf16_supported()
    torch.cuda.set_device(0)
    torch.cuda.synchronize()
    with torch.cuda.device(0), torch.cuda.stream(torch.cuda.Stream()):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.randn(16, device="cuda").sum()
        end.record()
    assert start.elapsed_time(end) > 0


def test_cuda_seed_makes_cuda_tensors_reproducible(on_cpu: None) -> None:
    torch.cuda.manual_seed(7)
    first = torch.randn(5, device="cuda")
    torch.cuda.manual_seed_all(7)
    assert torch.equal(first, torch.randn(5, device="cuda"))


def test_a_cuda_wrapper_runs_its_kernel_on_the_interpreter(on_cpu: None) -> None:
    already = driver.installed()
    if not already:
        driver.install((8, 0))
    try:
        x = torch.randn(300, device="cuda")
        y = torch.randn(300, device="cuda")
        out = shim_kernels.gpu_add(x, y)
    finally:
        if not already:
            driver.uninstall()
    assert out.is_cuda
    torch.testing.assert_close(out, x + y)


def test_uninstall_puts_torch_cuda_back(on_cpu: None) -> None:
    cuda.uninstall()
    assert not torch.cuda.is_available()
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")
    assert not hasattr(torch.zeros(1), cuda.MARK)
    assert cuda.capability() is None


GPU_SUITE = """
    import pytest
    import torch
    import triton
    import triton.language as tl

    pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

    @triton.jit
    def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, tl.where(x > 0, x, 0.0), mask=mask)

    @pytest.mark.parametrize("n", [100, 1000])
    def test_relu(n):
        x = torch.randn(n, device="cuda")
        out = torch.empty_like(x)
        relu_kernel[(triton.cdiv(n, 256),)](x, out, n, BLOCK=256)
        torch.cuda.synchronize()
        torch.testing.assert_close(out, torch.relu(x))
"""


@pytest.mark.parametrize("with_shim", [True, False])
def test_a_gpu_test_suite_runs_on_the_cpu_with_the_shim(
    pytester: pytest.Pytester, with_shim: bool
) -> None:
    install = "from pytest_kernelfix import shim\nshim.install()\n" if with_shim else ""
    pytester.makeconftest(
        'import os\nos.environ["TRITON_INTERPRET"] = "1"\n' + install
    )
    pytester.makepyfile(test_gpu=textwrap.dedent(GPU_SUITE))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    if with_shim:
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(skipped=2)


def test_cuda_only_out_dtype_matmuls_compute_on_the_cpu(on_cpu: None) -> None:
    generator = torch.Generator().manual_seed(0)
    a, b = (torch.randn(4, 8, generator=generator).half().cuda() for _ in range(2))
    acc = torch.zeros(4, 4, device="cuda")
    wide = a.float() @ b.float().t()
    product = torch.mm(a, b.t(), out_dtype=torch.float32)
    assert product.dtype == torch.float32 and product.is_cuda
    torch.testing.assert_close(product, wide)
    assert torch.addmm(acc, a, b.t(), out_dtype=torch.float32, out=acc) is acc
    torch.testing.assert_close(acc, wide)
    batched = torch.baddbmm(acc[None], a[None], b.t()[None], out_dtype=torch.float32)
    torch.testing.assert_close(batched[0], 2 * wide)
    with pytest.raises(NotImplementedError, match=r"mm\.dtype"):  # CPU tensors: as torch says
        torch.mm(a.cpu(), b.cpu().t(), out_dtype=torch.float32)


def test_hardswish_gradient_at_its_knees_is_the_one_a_gpu_computes(on_cpu: None) -> None:
    # Activation inputs of exactly -3 or 3 are common in fp16/bf16 activations; the CUDA
    # kernel keeps both knees inside the sloped band, the CPU kernel does not.
    knees = torch.tensor([-3.5, -3.0, -1.5, 0.0, 2.0, 3.0, 3.5])
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = knees.to(dtype).cuda().requires_grad_()
        out = torch.nn.functional.hardswish(x)
        upstream = torch.full_like(out, 2.0)
        (grad,) = torch.autograd.grad(out, x, upstream)
        assert grad.is_cuda and grad.dtype == dtype
        expected = torch.tensor([0.0, -1.0, 0.0, 1.0, 2 * (2 / 3 + 0.5), 3.0, 2.0])
        torch.testing.assert_close(grad.float().cpu(), expected, atol=1e-2, rtol=0)
        plain = torch.nn.functional.hardswish(knees.to(dtype))  # forward values unchanged
        assert torch.equal(out.detach().cpu(), plain)
    module_input = knees.cuda().requires_grad_()
    torch.nn.Hardswish()(module_input).sum().backward()
    assert module_input.grad is not None
    assert module_input.grad[[1, 5]].tolist() == [-0.5, 1.5]
    on_the_cpu = knees.clone().requires_grad_()  # a CPU tensor keeps what CPU torch says
    torch.nn.functional.hardswish(on_the_cpu).sum().backward()
    assert on_the_cpu.grad is not None
    expected_cpu = torch.ops.aten.hardswish_backward(torch.ones_like(knees), knees)
    assert torch.equal(on_the_cpu.grad, expected_cpu)
