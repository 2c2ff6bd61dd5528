"""The GPU a CPU run stands in for: one default, and how a target string reads.

The compile gate compiles for this target, and the CPU shim's ``torch.cuda`` answers as a
GPU of its compute capability, so both come from the same string. Import-light: the
plugin's entry point reads it.
"""

from __future__ import annotations

import re

#: The target when none is configured: an H100 (sm_90).
DEFAULT_TARGET = "cuda:90"
#: Words that turn the compile gate off.
OFF = ("", "off", "none")


def gate_enabled(target: str) -> bool:
    """Whether ``target`` asks for the compile gate at all (``off`` does not)."""
    return target.strip().lower() not in OFF


def cuda_capability(target: str) -> tuple[int, int] | None:
    """The (major, minor) a ``cuda:NN`` (or ``cuda:sm_NN``) target names, the default's
    for a bare ``cuda``; None for any other backend or an arch that is no capability."""
    backend, _, arch = target.strip().lower().partition(":")
    if backend != "cuda":
        return None
    digits = re.fullmatch(r"(?:sm_?)?(\d{2,3})", arch or DEFAULT_TARGET.partition(":")[2])
    return None if digits is None else divmod(int(digits.group(1)), 10)


#: What the shim's ``torch.cuda`` answers when the target names no CUDA capability.
DEFAULT_CAPABILITY: tuple[int, int] = cuda_capability(DEFAULT_TARGET) or (0, 0)


def capability_of(target: str) -> tuple[int, int]:
    """The compute capability a ``cuda:NN`` target names; the default's otherwise.

    A HIP target or ``off`` still needs a capability for the shim's ``torch.cuda``: it
    answers as the default GPU.
    """
    return cuda_capability(target) or DEFAULT_CAPABILITY
