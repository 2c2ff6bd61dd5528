"""``torch.cuda``'s functions as one GPU answers them, for the CUDA piece to put in place.

Conftests and test utilities ask ``torch.cuda`` about the device, its memory, its random
state and its streams before and after the kernels run. On the CPU each gets the answer
of one idle GPU of the chosen properties: queries return that GPU's numbers, memory
management and synchronisation do nothing, random state is the CPU generator's (the one
``device="cuda"`` tensors draw from, so ``torch.random.fork_rng``, checkpointing and
``torch.compile``'s RNG bookkeeping work), streams and events are the CPU driver's.
A device index other than 0 is refused as on a one-GPU machine. The calls no such answer
can stand in for (CUDA graphs, raw allocations, custom allocators, library handles)
raise :class:`~pytest_kernelfix.shim.limits.CudaNotEmulated` (:mod:`.unemulated`).

Each name gets its own function object: torch._dynamo indexes ``torch.cuda`` by object
and refuses one object under two rules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import contextmanager
from typing import Any

from pytest_kernelfix.shim import bf16
from pytest_kernelfix.shim.devices import DeviceProperties
from pytest_kernelfix.shim.driver import CpuDeviceInterface, CpuEvent, CpuStream
from pytest_kernelfix.shim.unemulated import refusing, refusing_class

#: ``torch.cuda.memory_stats``' statistics, each with current/peak/allocated/freed.
_POOLED = ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
           "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
_UNPOOLED = ("oversize_allocations", "oversize_segments")
_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
             "num_device_free")

_GRAPHS = "CUDA graphs record GPU work to replay it, and the interpreter launches nothing "\
    "on a GPU"
_ALLOCATOR = "it hands out or swaps GPU memory itself, and there is no GPU memory"
_HANDLES = "it returns a handle of a CUDA library, and there is no CUDA library"


def device_index(device: object = None) -> int:
    """The index ``device`` names (None, 0, "cuda", "cuda:0", a torch.device), refused
    unless it is the one GPU, as torch refuses an index past ``device_count()``. A
    ``torch.cuda.device`` context names its device too, as torch allows:
    ``torch.cuda.get_device_properties(torch.cuda.device_of(q))`` (FlagAttention)."""
    import torch

    if isinstance(device, DeviceContext):
        device = None if device.idx < 0 else device.idx
    if device is None:
        return 0
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "cuda":
            raise ValueError(f"Expected a cuda device, but got: {device}")
        device = 0 if device.index is None else device.index
    if not isinstance(device, int) or isinstance(device, bool):
        raise ValueError(f"Expected a cuda device, but got: {device!r}")
    if device >= 1:
        raise RuntimeError(f"CUDA error: invalid device ordinal (cuda:{device}; the kernelfix "
                           "CUDA shim has one GPU, cuda:0)")
    return 0


class DeviceContext:
    """``torch.cuda.device(i)``: nothing to switch with one device (``i`` may be another
    such context, as torch allows)."""

    idx: int

    def __init__(self, device: object = None) -> None:
        if isinstance(device, DeviceContext):
            device = device.idx
        unset = device is None or (isinstance(device, int) and device < 0)
        self.idx = -1 if unset else device_index(device)
        self.prev_idx = -1

    def __enter__(self) -> DeviceContext:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class DeviceOf(DeviceContext):
    """``torch.cuda.device_of(tensor)``: the tensor's device, which is the one GPU or none."""

    def __init__(self, obj: Any) -> None:
        super().__init__(0 if getattr(obj, "is_cuda", False) else -1)


class MemoryFraction:
    """What ``set_per_process_memory_fraction`` set; nothing enforces it on the CPU."""

    def __init__(self) -> None:
        self.fraction = 1.0

    def set(self, fraction: float, device: object = None) -> None:
        device_index(device)
        if not isinstance(fraction, float):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if fraction < 0 or fraction > 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        self.fraction = fraction

    def get(self, device: object = None) -> float:
        device_index(device)
        return self.fraction


def nested_memory_stats() -> dict[str, Any]:
    """``memory_stats_as_nested_dict()`` of a GPU that holds nothing."""
    counts = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
    stats: dict[str, Any] = {
        name: {pool: dict(counts) for pool in ("all", "large_pool", "small_pool")}
        for name in _POOLED
    }
    stats.update({name: dict(counts) for name in _UNPOOLED})
    stats.update(dict.fromkeys(_COUNTERS, 0))
    stats["max_split_size"] = -1
    return stats


def flat_memory_stats() -> dict[str, Any]:
    """``memory_stats()``: the nested statistics flattened and sorted, as torch does."""
    flat: list[tuple[str, Any]] = []

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat.append((prefix, value))

    walk("", nested_memory_stats())
    return dict(sorted(flat))


def returning(value: Any) -> Any:
    def answer(*args: object, **kwargs: object) -> Any:
        return value

    return answer


def on_device(make: Callable[[], Any]) -> Any:
    """A query of one device (``device=None`` is the current one) answered by ``make()``."""

    def answer(device: object = None) -> Any:
        device_index(device)
        return make()

    return answer


def _rng() -> dict[str, Any]:
    """The random-state calls, answered by the CPU generator "cuda" tensors draw from."""
    import torch

    generator = torch.default_generator

    def get_rng_state(device: object = "cuda") -> Any:
        device_index(device)
        return generator.get_state()

    def set_rng_state(new_state: Any, device: object = "cuda") -> None:
        device_index(device)
        generator.set_state(new_state.clone())

    def get_rng_state_all() -> list[Any]:
        return [generator.get_state()]

    def set_rng_state_all(new_states: Iterable[Any]) -> None:
        for state in new_states:
            generator.set_state(state.clone())

    def initial_seed() -> int:
        return int(generator.initial_seed())

    def seeding() -> Any:
        def seed(seed: int) -> None:
            generator.manual_seed(int(seed))

        return seed

    def reseeding() -> Any:
        def seed() -> None:
            generator.seed()

        return seed

    return {
        "get_rng_state": get_rng_state,
        "set_rng_state": set_rng_state,
        "get_rng_state_all": get_rng_state_all,
        "set_rng_state_all": set_rng_state_all,
        "manual_seed": seeding(),
        "manual_seed_all": seeding(),
        "seed": reseeding(),
        "seed_all": reseeding(),
        "initial_seed": initial_seed,
        "default_generators": (generator,),
    }


def _memory(props: DeviceProperties) -> dict[str, Any]:
    fraction = MemoryFraction()
    zero = ("memory_allocated", "max_memory_allocated", "memory_reserved",
            "max_memory_reserved", "memory_cached", "max_memory_cached", "memory_usage",
            "utilization", "device_memory_used")
    nothing = ("empty_cache", "ipc_collect", "reset_peak_memory_stats",
               "reset_max_memory_allocated", "reset_max_memory_cached",
               "reset_accumulated_memory_stats", "reset_peak_host_memory_stats",
               "reset_accumulated_host_memory_stats", "caching_allocator_enable")
    answers: dict[str, Any] = {name: on_device(lambda: 0) for name in zero}
    answers.update({name: returning(None) for name in nothing})
    answers.update({
        "mem_get_info": on_device(lambda: (props.total_memory, props.total_memory)),
        "memory_stats": on_device(flat_memory_stats),
        "memory_stats_as_nested_dict": on_device(nested_memory_stats),
        "host_memory_stats": returning({}),
        "host_memory_stats_as_nested_dict": returning({}),
        "memory_snapshot": returning([]),
        "list_gpu_processes": on_device(lambda: "GPU:0\nno processes are running"),
        "set_per_process_memory_fraction": fraction.set,
        "get_per_process_memory_fraction": fraction.get,
        "get_allocator_backend": returning("native"),
        "temperature": on_device(lambda: 40),  # an idle GPU: degrees C, mW, MHz
        "power_draw": on_device(lambda: 60_000),
        "clock_rate": on_device(lambda: props.clock_rate // 1000),
        "caching_allocator_alloc": refusing("torch.cuda.caching_allocator_alloc", _ALLOCATOR),
        "caching_allocator_delete": refusing("torch.cuda.caching_allocator_delete", _ALLOCATOR),
        "caching_allocator_disabled":
            refusing("torch.cuda.caching_allocator_disabled", _ALLOCATOR),
        "change_current_allocator": refusing("torch.cuda.change_current_allocator", _ALLOCATOR),
        "use_mem_pool": refusing("torch.cuda.use_mem_pool", _ALLOCATOR),
        "MemPool": refusing_class("torch.cuda.MemPool", _ALLOCATOR),
        "CUDAPluggableAllocator": refusing_class("torch.cuda.CUDAPluggableAllocator",
                                                 _ALLOCATOR),
    })
    return answers


def _devices(props: DeviceProperties) -> dict[str, Any]:
    def set_device(device: object) -> None:
        if not (isinstance(device, int) and device < 0):
            device_index(device)

    def can_device_access_peer(device: object, peer_device: object) -> bool:
        device_index(device)
        device_index(peer_device)
        return False  # there is no other device

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return props.major >= 8 and bf16.exact()  # announced only where computed right

    return {
        "is_available": returning(True),
        "is_initialized": returning(True),
        "init": returning(None),
        "device_count": returning(1),
        "current_device": returning(0),
        "set_device": set_device,
        "synchronize": on_device(lambda: None),
        "get_device_capability": on_device(lambda: props.capability),
        "get_device_properties": on_device(lambda: props),
        "get_device_name": on_device(lambda: props.name),
        "get_arch_list": returning([f"sm_{props.major}{props.minor}"]),
        "is_bf16_supported": is_bf16_supported,
        "can_device_access_peer": can_device_access_peer,
        "get_sync_debug_mode": returning(0),
        "set_sync_debug_mode": returning(None),
        "device": DeviceContext,
        "device_of": DeviceOf,
        "cudart": refusing("torch.cuda.cudart", _HANDLES),
        "check_error": refusing("torch.cuda.check_error", _HANDLES),
        "current_blas_handle": refusing("torch.cuda.current_blas_handle", _HANDLES),
        "current_solver_handle": refusing("torch.cuda.current_solver_handle", _HANDLES),
        "GreenContext": refusing_class("torch.cuda.GreenContext",
                                       "it partitions a GPU's multiprocessors"),
    }


@contextmanager
def _stream(stream: object = None) -> Any:
    yield


def _streams() -> dict[str, Any]:
    def make_graphed_callables(callables: Any, *args: Any, **kwargs: Any) -> Any:
        return callables  # replaying a graph computes what the callables compute

    def get_stream_from_external(data_ptr: int, device: object = None) -> CpuStream:
        return CpuStream(device)

    return {
        "Event": CpuEvent,
        "Stream": CpuStream,
        "ExternalStream": CpuStream,
        "stream": _stream,
        "set_stream": returning(None),
        "current_stream": CpuDeviceInterface.current_stream,
        "default_stream": CpuDeviceInterface.default_stream,
        "get_stream_from_external": get_stream_from_external,
        "is_current_stream_capturing": returning(False),
        "make_graphed_callables": make_graphed_callables,
        "CUDAGraph": refusing_class("torch.cuda.CUDAGraph", _GRAPHS),
        "graph": refusing_class("torch.cuda.graph", _GRAPHS),
        "graph_pool_handle": refusing("torch.cuda.graph_pool_handle", _GRAPHS),
    }


def functions(props: DeviceProperties) -> dict[str, Any]:
    """Replacements for ``torch.cuda`` members, by name."""
    return {**_devices(props), **_memory(props), **_rng(), **_streams()}


def nvtx_functions() -> dict[str, Any]:
    """Replacements for ``torch.cuda.nvtx``: annotations for a profiler that is not there."""
    return {
        "range_push": returning(0),
        "range_pop": returning(0),
        "range_start": returning(0),
        "range_end": returning(None),
        "mark": returning(None),
    }
