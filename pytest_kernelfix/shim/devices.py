"""Nominal properties of the GPUs the shim can pretend to be, keyed by compute capability.

The CPU shim answers ``torch.cuda.get_device_properties`` and the Triton driver's
``utils.get_device_properties`` from this table, and the compile gate takes its
shared-memory limits from it, so the two never disagree. Numbers are the usual
datasheet values; code under test only needs them to be plausible and consistent.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class DeviceProperties:
    """The fields of ``torch.cuda.get_device_properties`` that kernel code reads."""

    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    shared_memory_per_block_optin: int
    shared_memory_per_multiprocessor: int
    L2_cache_size: int
    clock_rate: int = 1_755_000  # kHz
    memory_clock_rate: int = 2_619_000  # kHz
    memory_bus_width: int = 5120
    shared_memory_per_block: int = 49152
    max_threads_per_multi_processor: int = 2048
    max_threads_per_block: int = 1024
    regs_per_multiprocessor: int = 65536
    warp_size: int = 32
    is_integrated: bool = False
    is_multi_gpu_board: bool = False
    gcnArchName: str = ""  # torch's spelling
    uuid: str = "GPU-00000000-0000-0000-0000-6b65726e6c66"

    @property
    def capability(self) -> tuple[int, int]:
        return (self.major, self.minor)

    def __repr__(self) -> str:
        return (
            f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // 1024**2}MB, "
            f"multi_processor_count={self.multi_processor_count}, kernelfix shim)"
        )


_TABLE: dict[tuple[int, int], DeviceProperties] = {
    (7, 0): DeviceProperties("Tesla V100-SXM2-32GB", 7, 0, 32 * GIB, 80, 98304, 98304, 6 << 20),
    (7, 5): DeviceProperties("Tesla T4", 7, 5, 15 * GIB, 40, 65536, 65536, 4 << 20),
    (8, 0): DeviceProperties(
        "NVIDIA A100-SXM4-80GB", 8, 0, 80 * GIB, 108, 166912, 167936, 40 << 20
    ),
    (8, 6): DeviceProperties("NVIDIA A10", 8, 6, 24 * GIB, 72, 101376, 102400, 6 << 20),
    (8, 9): DeviceProperties("NVIDIA L4", 8, 9, 24 * GIB, 58, 101376, 102400, 48 << 20),
    (9, 0): DeviceProperties(
        "NVIDIA H100 80GB HBM3", 9, 0, 80 * GIB, 132, 232448, 233472, 50 << 20
    ),
    (10, 0): DeviceProperties("NVIDIA B200", 10, 0, 180 * GIB, 148, 232448, 233472, 126 << 20),
    (12, 0): DeviceProperties(
        "NVIDIA GeForce RTX 5090", 12, 0, 32 * GIB, 170, 101376, 102400, 96 << 20
    ),
}


def known_capabilities() -> tuple[tuple[int, int], ...]:
    return tuple(sorted(_TABLE))


def properties_for(capability: tuple[int, int]) -> DeviceProperties:
    """The table entry for ``capability``, or a generic GPU of that capability."""
    known = _TABLE.get(capability)
    if known is not None:
        return known
    major, minor = capability
    return DeviceProperties(
        f"NVIDIA GPU sm_{major}{minor}", major, minor, 80 * GIB, 100, 101376, 102400, 40 << 20
    )


def shared_limit(capability: tuple[int, int]) -> int | None:
    """Opt-in shared memory per block in bytes, for capabilities the table knows."""
    known = _TABLE.get(capability)
    return None if known is None else known.shared_memory_per_block_optin
