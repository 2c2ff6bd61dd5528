"""CUDA autocast on the CPU: torch references get the dtypes a GPU gives them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from pytest_kernelfix.shim import autocast, bf16, cuda

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() and not cuda.installed(), reason="a real GPU is present"
)


@pytest.fixture
def on_cpu() -> Iterator[None]:
    """The CUDA piece with autocast emulation (and exact bf16, so the GPU supports bf16);
    session-wide pieces are put back afterwards."""
    held, had_autocast, had_bf16 = cuda.capability(), autocast.installed(), bf16.installed()
    cuda.uninstall()
    bf16.install()
    assert cuda.install((9, 0))
    autocast.install()
    yield
    cuda.uninstall()
    if not had_autocast:
        autocast.uninstall()
    if not had_bf16:
        bf16.uninstall()
    if held is not None:
        cuda.install(held)


@pytest.fixture
def no_emulation(on_cpu: None) -> Iterator[None]:
    """The CUDA piece as it was before autocast emulation: CPU references, no casts."""
    autocast.uninstall()
    yield
    autocast.install()


def cuda_randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=dtype)


def test_the_op_lists_cover_what_the_installed_torch_autocasts_on_cuda() -> None:
    registered = {name.split("::")[1].split(".")[0] for name in
                  torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")}
    assert registered, "this torch registers no AutocastCUDA kernels"
    assert registered - set(autocast.ATEN_POLICIES) == set()  # a new op needs a policy
    assert set(autocast.ATEN_POLICIES) - registered == set()  # no stale entry


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_lower_precision_ops_run_in_the_autocast_dtype(on_cpu: None, dtype: torch.dtype) -> None:
    x, w, b = cuda_randn(4, 8), cuda_randn(16, 8), cuda_randn(16)
    with torch.autocast("cuda", dtype=dtype):
        results = [F.linear(x, w, b), x @ w.t(), torch.matmul(x, w.t()), torch.mm(x, w.t()),
                   torch.addmm(b, x, w.t()), torch.bmm(x[None], w.t()[None]),
                   F.linear(x.half(), w, b) if dtype == torch.float16 else F.linear(x, w)]
    assert [r.dtype for r in results] == [dtype] * len(results)
    assert all(r.is_cuda for r in results)
    torch.testing.assert_close(results[0].float(), F.linear(x, w, b), atol=0.05, rtol=0.02)


def test_fp32_ops_run_in_fp32(on_cpu: None) -> None:
    x = cuda_randn(4, 10, dtype=torch.float16)
    target = torch.randint(0, 10, (4,), device="cuda")
    with torch.autocast("cuda"):
        results = {
            "softmax": torch.softmax(x, -1), "F.softmax": F.softmax(x, dim=-1),
            "log_softmax": F.log_softmax(x, -1), "layer_norm": F.layer_norm(x, (10,)),
            "group_norm": F.group_norm(x[None], 2), "rms_norm": F.rms_norm(x, (10,)),
            "cross_entropy": F.cross_entropy(x, target), "nll_loss": F.nll_loss(x, target),
            "mse_loss": F.mse_loss(x, x), "kl_div": F.kl_div(x, x, reduction="batchmean"),
            "exp": torch.exp(x), "pow": x ** 2, "rsqrt": x.abs().rsqrt(), "1/x": 1 / x,
            "sum": x.sum(), "cumsum": x.cumsum(0), "norm": x.norm(),
            "normalize": F.normalize(x), "softmin": F.softmin(x, -1),
        }
    assert {name: r.dtype for name, r in results.items()} == dict.fromkeys(results, torch.float32)


def test_an_explicit_dtype_is_respected(on_cpu: None) -> None:
    x = cuda_randn(4, 10, dtype=torch.float16)
    with torch.autocast("cuda"):
        assert x.sum(dtype=torch.float16).dtype == torch.float16
        assert torch.softmax(x, -1, dtype=torch.float64).dtype == torch.float64


def test_promote_ops_run_at_the_widest_input_type(on_cpu: None) -> None:
    wide, narrow = cuda_randn(8), cuda_randn(8, dtype=torch.float16)
    with torch.autocast("cuda"):
        assert torch.addcmul(wide, narrow, narrow).dtype == torch.float32
        assert torch.addcmul(narrow, narrow, narrow).dtype == torch.float16
        assert torch.atan2(narrow, wide).dtype == torch.float32
        assert torch.dot(narrow, wide).dtype == torch.float32
        assert torch.cat([narrow, wide]).dtype == torch.float32  # torch's own promotion
        assert torch.stack([narrow, wide]).dtype == torch.float32
        with pytest.raises(RuntimeError, match="prioritize"):  # as CUDA autocast refuses
            torch.addcmul(narrow, narrow.bfloat16(), narrow)


def test_what_cuda_autocast_leaves_alone_is_left_alone(on_cpu: None) -> None:
    host, double = torch.randn(4, 4), cuda_randn(4, 4).double()
    x = cuda_randn(4, 4)
    with torch.autocast("cuda"):
        assert (host @ host).dtype == torch.float32  # a CPU tensor: CUDA autocast ignores it
        assert (double @ double).dtype == torch.float64
        assert F.gelu(x.half()).dtype == torch.float16  # not on any list
        assert x.clone().exp_().dtype == torch.float32  # in-place: not autocast
        out = torch.empty(4, 4, device="cuda")
        assert torch.mm(x, x, out=out).dtype == torch.float32
        exact = torch.mm(x, x, out_dtype=torch.float32)  # mm.dtype: not on CUDA's lists
        with torch.autocast("cuda", enabled=False):
            torch.testing.assert_close(exact, x @ x, rtol=0, atol=1e-6)
        with torch.autocast("cuda", enabled=False):
            assert (x @ x).dtype == torch.float32
    assert (x @ x).dtype == torch.float32


def test_binary_cross_entropy_is_refused_as_on_a_gpu(on_cpu: None) -> None:
    p, t = torch.rand(4, device="cuda"), torch.rand(4, device="cuda")
    with torch.autocast("cuda"), pytest.raises(RuntimeError, match="unsafe to autocast"):
        F.binary_cross_entropy(p, t)
    with torch.autocast("cuda"):
        assert F.binary_cross_entropy_with_logits(p, t).dtype == torch.float32


def test_autograd_flows_through_the_casts(on_cpu: None) -> None:
    x = cuda_randn(4, 8).requires_grad_()
    w = cuda_randn(16, 8).requires_grad_()
    with torch.autocast("cuda"):
        loss = F.cross_entropy(F.linear(x, w), torch.randint(0, 16, (4,), device="cuda"))
    loss.backward()
    assert loss.dtype == torch.float32
    assert x.grad is not None and x.grad.dtype == torch.float32 and x.grad.is_cuda
    assert w.grad is not None and w.grad.dtype == torch.float32


# The three false failures seen on a real suite: a library under autocast returns the
# dtype a GPU gives (fp16 here), the torch reference runs on CPU tensors.

def linear_reference() -> None:
    hidden = cuda_randn(4, 8, dtype=torch.float16)  # what the library returned under autocast
    weight, bias = cuda_randn(16, 8), cuda_randn(16)
    with torch.autocast("cuda"):
        assert F.linear(hidden, weight, bias).dtype == torch.float16


def cross_entropy_reference() -> None:
    logits = cuda_randn(4, 10, dtype=torch.float16)
    target = torch.randint(0, 10, (4,), device="cuda")
    with torch.autocast("cuda"):
        assert F.cross_entropy(logits, target, weight=torch.rand(10, device="cuda")).dtype == (
            torch.float32)


def layer_norm_reference() -> None:
    x = cuda_randn(4, 10, dtype=torch.float16)
    gpu_result = F.layer_norm(x.float(), (10,))  # CUDA autocast runs layer_norm in fp32
    with torch.autocast("cuda"):
        expected = F.layer_norm(x, (10,))
    torch.testing.assert_close(gpu_result, expected)


FALSE_FAILURES = [
    (linear_reference, RuntimeError, "mat1 and mat2 must have the same dtype, but got Half and "
     "Float"),
    (cross_entropy_reference, RuntimeError, "expected scalar type Half but found Float"),
    (layer_norm_reference, AssertionError, "The values for attribute 'dtype' do not match: "
     "torch.float32 != torch.float16"),
]


each_false_failure = pytest.mark.parametrize(
    ("check", "error", "message"), FALSE_FAILURES,
    ids=[check.__name__ for check, _, _ in FALSE_FAILURES])


@each_false_failure
def test_the_false_failures_of_a_real_suite_are_gone(
    on_cpu: None, check: object, error: type[Exception], message: str
) -> None:
    assert callable(check)
    check()


@each_false_failure
def test_without_the_emulation_they_come_back(
    no_emulation: None, check: object, error: type[Exception], message: str
) -> None:
    assert callable(check)
    with pytest.raises(error, match=message.replace("(", r"\(")):
        check()
