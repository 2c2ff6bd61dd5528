"""CPU shim that lets GPU-minded Triton code run on the Triton interpreter.

``install()`` is called after ``TRITON_INTERPRET=1`` is set and before kernel modules
are imported, in the pytest session and in every rerun subprocess. It puts in place
seven independent pieces, each undone by ``uninstall()``:

- ``driver``: a CPU Triton driver (``driver.active``, autotune, ``do_bench``).
- ``cuda``: ``device="cuda"`` tensors live on the CPU, and they, the Parameters of
  modules on "cuda" and what autograd hands back say they are CUDA tensors;
  ``torch.cuda`` answers as one GPU of ``target_capability`` (skipped with
  ``cuda=False`` or when CUDA is real); ops the CPU lacks or computes differently
  (``out_dtype`` matmuls, hard-swish's gradient at its knees) compute as CUDA's.
- ``autocast``: ``torch.autocast("cuda")`` casts those tensors per CUDA's op lists
  (with the CUDA piece; off with ``autocast=False``).
- ``bf16``: the interpreter computes bf16 as a GPU does instead of on raw 16-bit
  storage (off with ``bf16=False``; then ``torch.cuda.is_bf16_supported()`` is False).
- ``libdevice``: ``tl.extra.libdevice`` functions compute with NumPy.
- ``scalars``: float kernel arguments arrive as fp32 scalars (``eps.to(...)`` works),
  ``range`` loop indices as int32 tensors, integer masks as boolean ones.
- ``leaks``: calls to ``@triton.jit`` helpers no longer leave interpreter patches in
  ``triton.language.core`` (which broke later GPU compiles in the same process).

This module imports nothing heavy; each piece imports torch / triton when installed.
"""

from __future__ import annotations

from dataclasses import dataclass

from pytest_kernelfix.target import DEFAULT_CAPABILITY

__all__ = ["ShimState", "bf16_exact", "install", "installed", "state", "uninstall"]


@dataclass(frozen=True)
class ShimState:
    """The options ``install`` was called with, and what they gave.

    ``cuda_mapped`` is False with ``cuda=False`` and where torch has a real GPU;
    ``autocast`` is True when CUDA autocast is emulated (it needs the mapping);
    ``bf16_exact`` is False when the interpreter computes bf16 on raw storage.
    """

    cuda: bool
    target_capability: tuple[int, int]
    cuda_mapped: bool
    autocast: bool = False
    bf16_exact: bool = True


_state: list[ShimState] = []
_options: list[tuple[bool, tuple[int, int], bool, bool]] = []


def install(
    *,
    cuda: bool = True,
    target_capability: tuple[int, int] = DEFAULT_CAPABILITY,
    autocast: bool = True,
    bf16: bool = True,
) -> None:
    """Install the shim; a second call with the same options does nothing.

    A call with other options reinstalls with the new ones. Refused unless Triton runs
    interpreted: compiled launches on a real GPU need the real driver.
    """
    from triton import knobs

    if not knobs.runtime.interpret:
        raise RuntimeError("the kernelfix CPU shim needs TRITON_INTERPRET=1 set before install()")
    capability = (int(target_capability[0]), int(target_capability[1]))
    if _state:
        if _options[0] == (cuda, capability, autocast, bf16):
            return
        uninstall()
    from pytest_kernelfix.shim import autocast as autocast_piece
    from pytest_kernelfix.shim import bf16 as bf16_piece
    from pytest_kernelfix.shim import cuda as cuda_piece
    from pytest_kernelfix.shim import driver, leaks, libdevice, scalars

    if bf16:
        bf16_piece.install()  # before the CUDA piece, which asks it about bf16 support
    mapped = cuda and cuda_piece.install(capability)
    if mapped and autocast:
        autocast_piece.install()
    driver.install(capability if cuda else None)
    libdevice.install()
    scalars.install()
    leaks.install()
    _options.append((cuda, capability, autocast, bf16))
    _state.append(ShimState(cuda, capability, mapped, autocast_piece.installed(),
                            bf16_piece.exact()))


def uninstall() -> None:
    """Undo ``install``; safe to call when nothing is installed."""
    if not _state:
        return
    from pytest_kernelfix.shim import autocast, bf16, cuda, driver, leaks, libdevice, scalars

    leaks.uninstall()
    scalars.uninstall()
    libdevice.uninstall()
    driver.uninstall()
    autocast.uninstall()
    cuda.uninstall()
    bf16.uninstall()
    _state.clear()
    _options.clear()


def installed() -> bool:
    return bool(_state)


def state() -> ShimState | None:
    """The options of the installed shim, or None."""
    return _state[0] if _state else None


def bf16_exact() -> bool:
    """Whether this process's interpreter computes bf16 as a GPU does (True without a shim:
    nothing here changed the interpreter, so nothing here can speak for it)."""
    return _state[0].bf16_exact if _state else True
