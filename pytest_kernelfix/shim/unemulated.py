"""What the CUDA piece cannot answer as a GPU would says so, naming the call and the way out.

Under the shim ``torch.cuda.is_available()`` is True, so a project's code goes on to
calls that a CPU build of torch cannot make: they end in ``torch._C._cuda_*`` bindings
that do not exist, and the user would read ``AttributeError: module 'torch._C' has no
attribute '_cuda_setMemoryFraction'``, which blames nobody. Instead, the call raises
:class:`~pytest_kernelfix.shim.limits.CudaNotEmulated` naming the ``torch.cuda`` function
the project called and ``--kernelfix-shim off``, in two ways:

- the calls no one-GPU answer can stand in for (CUDA graphs, raw allocations, custom
  allocators, library handles) are replaced by :func:`refusing` ones, with the reason;
- every binding that ``torch.cuda``'s own code uses and this build lacks gets a stub
  (:func:`stub_bindings`) that names the outermost ``torch.cuda`` function on the stack,
  so any call the shim does not cover fails the same way, in this torch or the next.

Left out of the stubs: ``_cuda_getDeviceCount`` (its presence is how torch tells a CUDA
build, ``torch.cuda._is_compiled()``) and the bindings torch probes once at import.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pytest_kernelfix.shim._patches import Patches
from pytest_kernelfix.shim.limits import CudaNotEmulated

#: How to run a project's tests without the CUDA shim.
OFF_HINT = "--kernelfix-cuda-shim off"

#: Bindings whose presence torch reads as "this build has CUDA", or probes at import.
_PROBED = frozenset({"_cuda_getDeviceCount", "_cuda_isInBadFork", "_cuda_exchangeDevice",
                     "_cuda_maybeExchangeDevice"})
_BINDING = re.compile(r"\b_C\.(_cuda_\w+)")


def message(call: str, why: str) -> str:
    return (f"{call} is not emulated by the kernelfix CUDA shim ({why}); if the project "
            f"runs its tests without CUDA, run them with {OFF_HINT}")


def refusing(call: str, why: str) -> Any:
    """A function that raises :class:`CudaNotEmulated` for ``call``, whatever it is given."""

    def refuse(*args: object, **kwargs: object) -> Any:
        __tracebackhide__ = True
        raise CudaNotEmulated(message(call, why))

    refuse.__name__ = refuse.__qualname__ = call.rpartition(".")[2]
    return refuse


def refusing_class(call: str, why: str) -> type:
    """A class (``isinstance`` checks keep working) whose instantiation raises."""

    def __init__(self: object, *args: object, **kwargs: object) -> None:
        __tracebackhide__ = True
        raise CudaNotEmulated(message(call, why))

    name = call.rpartition(".")[2]
    return type(name, (), {"__init__": __init__, "__qualname__": name,
                           "__doc__": f"{call}: not emulated by the kernelfix CUDA shim."})


@functools.cache
def missing_bindings(cuda_dir: str) -> tuple[str, ...]:
    """The ``torch._C._cuda_*`` names ``torch.cuda``'s sources use and this build lacks."""
    import torch

    found: set[str] = set()
    for source in sorted(Path(cuda_dir).rglob("*.py")):
        try:
            found.update(_BINDING.findall(source.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return tuple(sorted(name for name in found - _PROBED if not hasattr(torch._C, name)))


def stub_bindings(patches: Patches, cuda_module: ModuleType) -> None:
    """Give ``torch._C`` a naming stub for every binding ``torch.cuda`` lacks here."""
    import torch

    cuda_dir = str(Path(cuda_module.__file__ or "").parent)
    for name in missing_bindings(cuda_dir):
        patches.set(torch._C, name, _stub(name))


def _stub(binding: str) -> Any:
    def stub(*args: object, **kwargs: object) -> Any:
        __tracebackhide__ = True
        raise CudaNotEmulated(message(public_caller(binding), f"a CPU build of torch has no "
                                                               f"torch._C.{binding}"))

    stub.__name__ = stub.__qualname__ = binding
    return stub


def public_caller(binding: str) -> str:
    """The outermost ``torch.cuda`` function on the stack: the call the project made."""
    frame = sys._getframe(2)
    outermost = ""
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module == "torch.cuda" or module.startswith("torch.cuda."):
            outermost = _spelling(module, frame.f_code)
        elif outermost:
            break
        frame = frame.f_back  # type: ignore[assignment]
    return outermost or f"torch._C.{binding}"


def _spelling(module: str, code: Any) -> str:
    """``torch.cuda.memory.empty_cache`` as the user writes it: ``torch.cuda.empty_cache``."""
    name = getattr(code, "co_qualname", code.co_name)
    cuda = sys.modules.get("torch.cuda")
    if "." not in name and cuda is not None and hasattr(cuda, name):
        return f"torch.cuda.{name}"
    return f"{module}.{name}"
