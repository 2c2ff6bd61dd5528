"""A Triton driver for the CPU, so code that asks ``triton.runtime.driver.active`` works.

Under ``TRITON_INTERPRET=1`` on a machine without a GPU no backend driver is active, and
``get_active_torch_device()``, autotuning with several configs and
``triton.testing.do_bench`` all fail with ``0 active drivers``. Installing a
``CpuDriver`` through the public ``driver.set_active`` fixes the three at once:

- ``get_active_torch_device()`` is ``cuda:0`` when the CUDA piece maps CUDA tensors to
  the CPU, else ``cpu``.
- ``get_benchmarker()`` returns equal timings for every config without running the
  kernel, so ``Autotuner`` keeps the first config (``min`` keeps the first of equals):
  deterministic, and no time is spent benchmarking on the interpreter.
- ``get_device_interface()`` gives ``do_bench`` wall-clock events and a no-op sync.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from pytest_kernelfix.shim.devices import properties_for

_state: dict[str, Any] = {}


class CpuEvent:
    """A ``torch.cuda.Event`` look-alike that times with ``perf_counter``."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False) -> None:
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream: object = None) -> None:
        self._time = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def wait(self, stream: object = None) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: CpuEvent) -> float:
        """Milliseconds between two recorded events, never exactly 0 (callers divide by it)."""
        if self._time is None or end_event._time is None:
            raise RuntimeError("both events must be recorded before elapsed_time()")
        return max((end_event._time - self._time) * 1000.0, 1e-6)


class CpuStream:
    """A ``torch.cuda.Stream`` look-alike: work on the CPU is already ordered."""

    cuda_stream = 0
    stream_id = 0
    device_index = 0
    device_type = 1  # torch's DeviceType for CUDA, as torch.cuda.set_stream reads it

    def __init__(self, device: object = None, priority: int = 0, **_: object) -> None:
        self.device = device
        self.priority = priority

    def synchronize(self) -> None:
        return None

    def wait_stream(self, stream: object) -> None:
        return None

    def wait_event(self, event: object) -> None:
        return None

    def record_event(self, event: CpuEvent | None = None) -> CpuEvent:
        event = event or CpuEvent()
        event.record()
        return event

    def query(self) -> bool:
        return True

    def __enter__(self) -> CpuStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


@contextmanager
def _null_stream(stream: object = None) -> Iterator[None]:
    yield


class CpuDeviceInterface:
    """What ``triton.testing.do_bench`` needs from ``driver.get_device_interface()``."""

    Event = CpuEvent
    Stream = CpuStream
    stream = staticmethod(_null_stream)

    @staticmethod
    def synchronize(device: object = None) -> None:
        return None

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_stream(device: object = None) -> CpuStream:
        return CpuStream()

    @staticmethod
    def default_stream(device: object = None) -> CpuStream:
        return CpuStream()


def first_config_benchmarker(
    kernel_call: Callable[[], Any], *, quantiles: Sequence[float] | None = None, **_: Any
) -> float | list[float]:
    """Equal timings for every config without running it: the autotuner keeps its first."""
    if quantiles is None:
        return 0.0
    return [0.0 for _ in quantiles]


class CpuUtils:
    """The part of ``driver.utils`` that kernel wrappers query (``get_device_properties``)."""

    def __init__(self, capability: tuple[int, int]) -> None:
        self._capability = capability

    def get_device_properties(self, device: object = 0) -> dict[str, Any]:
        props = properties_for(self._capability)
        return {
            "max_shared_mem": props.shared_memory_per_block_optin,
            "multiprocessor_count": props.multi_processor_count,
            "sm_clock_rate": props.clock_rate,
            "mem_clock_rate": props.memory_clock_rate,
            "mem_bus_width": props.memory_bus_width,
            "max_num_regs": props.regs_per_multiprocessor,
            "warpSize": props.warp_size,
            "arch": f"sm_{props.major}{props.minor}",
            **{k: v for k, v in asdict(props).items() if isinstance(v, (int, str))},
        }


def _driver_class() -> type:
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase

    class CpuDriver(DriverBase):
        """Answers the driver questions of host code with CPU answers."""

        def __init__(self, capability: tuple[int, int] | None) -> None:
            super().__init__()
            self.capability = capability
            self.torch_device = "cpu" if capability is None else "cuda"
            self.utils = CpuUtils(capability or (0, 0))
            if capability is None:
                self.target = GPUTarget("cpu", 0, 1)
            else:
                self.target = GPUTarget("cuda", capability[0] * 10 + capability[1], 32)

        @classmethod
        def is_active(cls) -> bool:
            return False  # never picked by discovery; only installed explicitly

        def map_python_to_cpp_type(self, ty: str) -> str:
            from triton.backends.nvidia.driver import ty_to_cpp

            return str(ty_to_cpp(ty))

        def get_current_target(self) -> Any:
            return self.target

        def get_active_torch_device(self) -> Any:
            import torch

            if self.torch_device == "cuda":
                return torch.device("cuda", 0)
            return torch.device("cpu")

        def get_current_device(self) -> int:
            return 0

        def set_current_device(self, device: object) -> None:
            return None

        def get_current_stream(self, device: object = None) -> int:
            return 0

        def get_device_capability(self, device: object = None) -> tuple[int, int]:
            return self.capability or (0, 0)

        def get_device_interface(self) -> type[CpuDeviceInterface]:
            return CpuDeviceInterface

        def get_benchmarker(self) -> Callable[..., Any]:
            return first_config_benchmarker

        def get_empty_cache_for_benchmark(self) -> Any:
            import torch

            return torch.empty(1024, dtype=torch.int8)

        def clear_cache(self, cache: Any) -> None:
            cache.zero_()

    return CpuDriver


def install(capability: tuple[int, int] | None) -> None:
    """Make a ``CpuDriver`` the active Triton driver.

    With a ``capability`` it reports that CUDA target and ``cuda:0`` as the torch device
    (which the CUDA piece maps to the CPU); with ``None``, a ``cpu`` target and device.
    """
    from triton.runtime.driver import driver

    if _state:
        return
    _state["previous"] = getattr(driver, "_active", None)
    _state["driver"] = _driver_class()(capability)
    driver.set_active(_state["driver"])


def uninstall() -> None:
    from triton.runtime.driver import driver

    if not _state:
        return
    if getattr(driver, "_active", None) is _state["driver"]:
        driver._active = _state["previous"]
    _state.clear()


def installed_driver() -> Any:
    """The installed ``CpuDriver``, or None."""
    return _state.get("driver")


def installed() -> bool:
    return bool(_state)
