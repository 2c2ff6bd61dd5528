"""What conftests and test utilities call on torch.cuda, answered under the CUDA shim as
one GPU would, or refused with an error that names the call and the way out."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest
import torch

from pytest_kernelfix.shim import cuda, unemulated
from pytest_kernelfix.shim.limits import CudaNotEmulated

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() and not cuda.installed(), reason="a real GPU is present"
)


def test_memory_management_behaves_as_on_an_idle_gpu(on_cpu: None) -> None:
    torch.cuda.set_per_process_memory_fraction(0.5)
    torch.cuda.set_per_process_memory_fraction(0.25, 0)
    assert torch.cuda.get_per_process_memory_fraction() == 0.25
    with pytest.raises(ValueError, match="Allowed range"):
        torch.cuda.set_per_process_memory_fraction(1.5)
    with pytest.raises(TypeError, match="float"):
        torch.cuda.set_per_process_memory_fraction(1)
    free, total = torch.cuda.mem_get_info()
    assert free == total == torch.cuda.get_device_properties(0).total_memory
    stats = torch.cuda.memory_stats()
    assert stats["allocated_bytes.all.peak"] == stats["reserved_bytes.all.current"] == 0
    assert torch.cuda.memory_stats_as_nested_dict()["active_bytes"]["all"]["current"] == 0
    assert "PyTorch CUDA memory summary" in torch.cuda.memory_summary()
    for call in (torch.cuda.empty_cache, torch.cuda.ipc_collect, torch.cuda.synchronize,
                 torch.cuda.reset_peak_memory_stats, torch.cuda.reset_accumulated_memory_stats):
        assert call() is None
    assert torch.cuda.memory_allocated() == torch.cuda.max_memory_reserved(0) == 0
    assert torch.cuda.memory_snapshot() == []


def test_device_calls_know_there_is_one_gpu(on_cpu: None) -> None:
    torch.cuda.set_device(0)
    torch.cuda.set_device("cuda:0")
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.cuda.set_device(1)
    with pytest.raises(RuntimeError, match="invalid device ordinal"):
        torch.cuda.get_device_properties(1)
    assert [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] == [
        "NVIDIA A100-SXM4-80GB"]
    x = torch.ones(3, device="cuda")
    with torch.cuda.device(x.device), torch.cuda.device_of(x) as inside:
        assert inside.idx == 0
        assert torch.cuda.current_device() == 0
    assert torch.cuda.device_of(torch.ones(3)).idx == -1
    # a wrapper may name the device by another context (FlagAttention's launches)
    with torch.cuda.device(torch.cuda.device_of(x)) as inside:
        assert inside.idx == 0
    assert torch.cuda.get_device_properties(torch.cuda.device_of(x)).multi_processor_count
    assert torch.cuda.device(torch.cuda.device_of(torch.ones(3))).idx == -1
    assert torch.cuda.can_device_access_peer(0, 0) is False
    assert torch.cuda.is_current_stream_capturing() is False


def test_streams_and_events_order_nothing_and_time_with_the_clock(on_cpu: None) -> None:
    side = torch.cuda.Stream()
    torch.cuda.set_stream(side)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        start = torch.cuda.Event(enable_timing=True)
        start.record()
        y = torch.ones(8, device="cuda") * 2
        end = side.record_event(torch.cuda.Event(enable_timing=True))
    torch.cuda.current_stream().wait_event(end)
    end.synchronize()
    assert start.elapsed_time(end) > 0
    assert y.is_cuda and side.query()


def test_random_state_is_the_generator_cuda_tensors_draw_from(on_cpu: None) -> None:
    torch.cuda.manual_seed(3)
    saved = torch.cuda.get_rng_state()
    first = torch.randn(4, device="cuda")
    torch.cuda.set_rng_state(saved)
    assert torch.equal(first, torch.randn(4, device="cuda"))
    assert len(torch.cuda.get_rng_state_all()) == torch.cuda.device_count() == 1
    torch.cuda.set_rng_state_all([saved])
    assert torch.equal(first, torch.randn(4, device="cuda"))
    with torch.random.fork_rng(device_type="cuda"):
        torch.randn(100, device="cuda")
    after_fork = torch.randn(4, device="cuda")
    torch.cuda.set_rng_state(saved)
    torch.randn(4, device="cuda")
    assert torch.equal(after_fork, torch.randn(4, device="cuda"))
    assert torch.cuda.initial_seed() == 3


def test_torch_compile_keeps_the_rng_state_of_the_one_gpu(on_cpu: None) -> None:
    """dynamo saves and restores torch.cuda's RNG state around every frame it compiles
    (scattermoe's and mlstm_kernels' tests died there, in ``_cuda_getDevice``)."""
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x.sort()[0] + 1, backend="eager")
    x = torch.randn(6, device="cuda")
    torch.testing.assert_close(compiled(x), x.sort()[0] + 1)


def test_checkpointing_replays_the_random_state_of_cuda_tensors(on_cpu: None) -> None:
    x = torch.randn(16, device="cuda", requires_grad=True)

    def noisy(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.dropout(t, 0.5, training=True) * 3

    out = torch.utils.checkpoint.checkpoint(noisy, x, use_reentrant=False,
                                            preserve_rng_state=True)
    out.sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, (out != 0).float() * 6)


#: Arguments for the public torch.cuda callables that take some.
ARGS: dict[str, tuple[Any, ...]] = {
    "set_per_process_memory_fraction": (0.5,), "manual_seed": (0,), "manual_seed_all": (0,),
    "set_device": (0,), "device": (0,), "caching_allocator_alloc": (16,),
    "caching_allocator_delete": (0,), "can_device_access_peer": (0, 0), "check_error": (0,),
    "get_stream_from_external": (0,), "set_sync_debug_mode": (0,), "ExternalStream": (0,),
    "StreamContext": (None,), "stream": (None,), "use_mem_pool": (None,),
    "change_current_allocator": (None,), "make_graphed_callables": ((abs,), ((1,),)),
    "graph": (None,), "CUDAPluggableAllocator": ("lib.so", "alloc", "free"),
    "GreenContext": (), "cast": (int, 1), "lru_cache": (), "classproperty": (property,),
    "NewType": ("T", int),
}
#: What the shim refuses on purpose: no one-GPU answer stands in for these.
REFUSED = frozenset({
    "CUDAGraph", "graph", "graph_pool_handle", "MemPool", "use_mem_pool",
    "CUDAPluggableAllocator", "change_current_allocator", "caching_allocator_alloc",
    "caching_allocator_delete", "caching_allocator_disabled", "cudart", "check_error",
    "current_blas_handle", "current_solver_handle", "GreenContext",
})


def _special(name: str) -> Any:
    if name == "set_rng_state":
        return (torch.cuda.get_rng_state(),)
    if name == "set_rng_state_all":
        return (torch.cuda.get_rng_state_all(),)
    if name == "set_stream":
        return (torch.cuda.current_stream(),)
    if name == "device_of":
        return (torch.ones(1, device="cuda"),)
    return ARGS.get(name, ())


def test_every_torch_cuda_call_answers_or_names_itself_and_the_way_out(on_cpu: None) -> None:
    names = sorted(name for name in dir(torch.cuda)
                   if not name.startswith("_") and callable(getattr(torch.cuda, name))
                   and not name.endswith(("Storage", "Tensor", "Error", "Optional", "Any",
                                          "Callable")))
    refused = set()
    for name in names:
        try:
            made = getattr(torch.cuda, name)(*_special(name))
            if hasattr(made, "__enter__") and name not in ("StreamContext",):
                with made:
                    pass
        except CudaNotEmulated as error:
            assert f"torch.cuda.{name}" in str(error)
            assert unemulated.OFF_HINT in str(error)
            refused.add(name)
    assert refused == REFUSED & set(names)


def test_a_call_the_shim_does_not_cover_names_itself_not_torch_c(on_cpu: None) -> None:
    with pytest.raises(CudaNotEmulated) as raised:
        torch.cuda.tunable.enable()
    assert str(raised.value).startswith("torch.cuda.tunable.enable is not emulated")
    assert "torch._C._cuda_tunableop_enable" in str(raised.value)
    assert unemulated.OFF_HINT in str(raised.value)


def test_uninstall_removes_the_stubs_and_restores_torchs_own_functions(on_cpu: None) -> None:
    assert hasattr(torch._C, "_cuda_setMemoryFraction")
    assert torch.cuda.random.device_count() == 1
    cuda.uninstall()
    assert not hasattr(torch._C, "_cuda_setMemoryFraction")
    assert not torch.cuda._is_compiled()
    assert torch.cuda.random.device_count() == 0
    assert torch.cuda.get_rng_state_all() == []
    assert torch.cuda.default_generators == ()


CONFTEST = """
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(0.9)
        torch.cuda.empty_cache()

    def pytest_sessionstart(session):
        torch.cuda.reset_peak_memory_stats()
"""

TESTS = """
    import pytest
    import torch

    @pytest.mark.parametrize("device_id", range(torch.cuda.device_count()))
    def test_on_each_gpu(device_id):
        with torch.cuda.device(device_id):
            x = torch.ones(4, device=f"cuda:{device_id}")
        torch.cuda.synchronize()
        assert x.is_cuda and torch.cuda.max_memory_allocated() >= 0

    @torch.compile(backend="eager")
    def shifted(x):
        return x.sort()[0] + 1

    def test_compiled():
        x = torch.randn(8, device="cuda")
        torch.testing.assert_close(shifted(x), x.sort()[0] + 1)

    def test_graph():
        torch.cuda.CUDAGraph()
"""


def test_a_gpu_suites_conftest_and_collection_run_under_the_shim(
    pytester: pytest.Pytester,
) -> None:
    """A conftest sizing the GPU's memory and a parametrization over the GPUs (FlagAttention)
    work at collection time; what cannot be emulated fails naming the call and the way out."""
    pytester.makeconftest(textwrap.dedent(CONFTEST))
    pytester.makepyfile(test_gpu=textwrap.dedent(TESTS))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider",
                                           "--kernelfix-device", "interpret")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*CudaNotEmulated: torch.cuda.CUDAGraph is not emulated*"])
    result.stdout.fnmatch_lines([f"*{unemulated.OFF_HINT}*"])
