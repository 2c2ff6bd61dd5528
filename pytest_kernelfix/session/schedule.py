"""Which bugs heal at the same time, and on how many workers.

Bugs that share an editable file, directly or through another bug, form one *chain*
healed in grouping order by one worker (their candidates would touch the same file);
chains share no file and heal in parallel, each worker in its own sandbox. The default
number of workers is one per visible GPU on a GPU (each worker's reruns pinned to its own
GPU through ``CUDA_VISIBLE_DEVICES``), else one per core: a bug's verification runs in
one rerun child at a time (its phases fork from it), which keeps one core busy. Workers
never outnumber the chains, so a single bug still splits a long rerun across the cores
(:func:`rerun_jobs`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from pytest_kernelfix.locate.grouping import BugGroup, partition


def chains(groups: Sequence[BugGroup]) -> list[list[int]]:
    """Indices into ``groups``, one list per chain, each in grouping order; chains are
    ordered by their first bug."""
    return partition([group.editable for group in groups])


def cpu_count() -> int:
    """Cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def visible_gpus(environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The GPUs the session sees, as ``CUDA_VISIBLE_DEVICES`` entries for its workers.

    ``CUDA_VISIBLE_DEVICES`` when set (indices or UUIDs); else torch's device count,
    which asks NVML and creates no CUDA context. Empty without a GPU or torch.
    """
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return tuple(entry.strip() for entry in listed.split(",") if entry.strip())
    torch = sys.modules.get("torch")
    if torch is None:
        return ()
    try:
        count = int(torch.cuda.device_count())
    except Exception:  # a broken driver counts as no GPU: one worker
        return ()
    return tuple(str(index) for index in range(count))


def worker_count(setting: int, device: str, gpus: Sequence[str] = ()) -> int:
    """``setting`` when given (> 0), else the default for the device."""
    if setting > 0:
        return setting
    if device == "cuda":
        return max(1, len(gpus))
    return cpu_count()


def worker_env(worker: int, gpus: Sequence[str], workers: int) -> dict[str, str]:
    """The rerun environment of worker ``worker``: its own GPU when several share them."""
    if workers < 2 or not gpus:
        return {}
    return {"CUDA_VISIBLE_DEVICES": gpus[worker % len(gpus)]}


#: Children of one rerun on a GPU by default. Each child creates its own CUDA context
#: (hundreds of MB of GPU memory, most of a second to start) and the kernels of several
#: processes take turns on the GPU rather than run together, so more children mostly
#: multiply start-up; two overlap one child's host work (collection, Triton's compile or
#: cache load, the test's Python) with the other's kernels.
GPU_RERUN_JOBS = 2


def rerun_jobs(setting: int, workers: int, device: str, cores: int) -> int:
    """How many children one rerun may use: ``setting`` when given (> 0), else the
    cores left to each of ``workers`` heal workers (each worker reruns at the same
    time), on a GPU at most :data:`GPU_RERUN_JOBS`."""
    if setting > 0:
        return setting
    share = max(1, cores // max(1, workers))
    return min(share, GPU_RERUN_JOBS) if device == "cuda" else share
