"""Run code written for ``device="cuda"`` on the CPU.

Two parts. ``torch.cuda`` answers as one GPU of the chosen compute capability
(``cuda_api.py``: ``is_available()`` is True, ``get_device_properties`` comes from
``devices.py``, memory management and ``synchronize`` do nothing, random state is the
CPU generator's), and what it cannot answer so raises an error that names the call
(``unemulated.py``). A ``TorchFunctionMode`` rewrites every
CUDA device argument to the CPU and remembers which tensors were meant for the GPU
(a flag, ``marks.py``, passed on to the results of ops that read them), so that those
tensors still say ``device == cuda:0``, ``is_cuda`` and ``get_device() == 0``, and
``.cuda()`` / ``.cpu()`` copy exactly when a real move would. A ``Parameter`` made from
a CUDA tensor is one, ``t.data = cuda_tensor`` makes ``t`` one (``module.cuda()`` and
``module.to("cuda")`` move parameters that way), and autograd hands CUDA tensors back as
CUDA tensors (``autograd.py``).

The same mode applies CUDA autocast's casts to those tensors under ``torch.autocast("cuda")``
(``autocast.py``) and computes the overloads torch has only for CUDA (``cuda_ops.py``).

Limits: the mode is per thread (torch keeps the mode stack thread-local), tensors made
outside torch functions (``torch.Generator(device="cuda")``, ``torch.cuda.FloatTensor``)
are not covered, CUDA graphs are refused, and nothing is faster than on the CPU.
"""

from __future__ import annotations

import functools
from typing import Any

from pytest_kernelfix.shim import autocast, autograd, cuda_api, cuda_ops, unemulated
from pytest_kernelfix.shim._patches import Patches
from pytest_kernelfix.shim.devices import properties_for
from pytest_kernelfix.shim.marks import MARK, any_marked, is_marked, set_marked

__all__ = ["MARK", "capability", "install", "installed", "is_cuda_device", "is_marked",
           "uninstall"]

_state: dict[str, Any] = {}


def is_cuda_device(device: object) -> bool:
    """True for ``"cuda"``, ``"cuda:0"``, ``torch.device("cuda", 0)`` and bare indices."""
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True  # torch reads a bare index as the current accelerator
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    return getattr(device, "type", None) == "cuda"


def _parameter_keeping_mark(new: Any) -> Any:
    """``Parameter.__new__`` (which wraps its data in a new object, out of the mode's
    sight) with the data's flag passed on: a Parameter made on "cuda" is a CUDA tensor.
    Not ``Tensor._make_subclass``: torch._dynamo substitutes that one by identity."""

    @functools.wraps(new)
    def __new__(cls: Any, *args: Any, **kwargs: Any) -> Any:
        made = new(cls, *args, **kwargs)
        data = args[0] if args else kwargs.get("data")
        return set_marked(made) if is_marked(data) else made

    return staticmethod(__new__)


def _mode_class() -> type:
    import torch
    from torch.overrides import TorchFunctionMode

    base = torch._C.TensorBase
    device_get = base.__dict__["device"]
    is_cuda_get = base.__dict__["is_cuda"]
    data_descriptor = base.__dict__["data"]
    register_hook = torch.Tensor.register_hook
    cuda_device = torch.device("cuda", 0)
    cpu = torch.device("cpu")

    def moved(tensor: torch.Tensor, result: torch.Tensor, to_cuda: bool) -> torch.Tensor:
        """Copy when a real move would have copied, so aliasing matches a GPU."""
        if result is tensor and is_marked(tensor) != to_cuda:
            result = tensor.clone()
        return set_marked(result) if to_cuda else result

    def target_of_to(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool | None:
        """Where ``Tensor.to(...)`` sends the tensor: True for CUDA, None when it stays put."""
        if "device" in kwargs and kwargs["device"] is not None:
            return is_cuda_device(kwargs["device"])
        if len(args) < 2 or isinstance(args[1], torch.dtype):
            return None
        if isinstance(args[1], torch.Tensor):
            return is_marked(args[1])
        return is_cuda_device(args[1])

    class CudaOnCpu(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
        ) -> Any:
            __tracebackhide__ = True  # an error here is the torch call's, not the shim's
            kwargs = dict(kwargs or {})
            owner = getattr(func, "__self__", None)
            if owner is device_get:
                return cuda_device if is_marked(args[0]) else func(*args, **kwargs)
            if owner is is_cuda_get:
                return is_marked(args[0]) or func(*args, **kwargs)
            if func is base.get_device:
                return 0 if is_marked(args[0]) else func(*args, **kwargs)
            if owner is data_descriptor and func.__name__ == "__set__":
                func(*args, **kwargs)  # t.data = new: t is now where new is (module.cuda())
                set_marked(args[0], is_marked(args[1]))
                return None
            if func is base.pin_memory:
                return args[0]
            if func is register_hook and len(args) > 1 and is_marked(args[0]):
                args = (args[0], autograd.with_cuda_grads(args[1]), *args[2:])
            if func is base.cuda:
                return moved(args[0], args[0], to_cuda=True)
            if func is base.cpu:
                return moved(args[0], func(*args, **kwargs), to_cuda=False)
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
            if func is base.to:
                target = target_of_to(args, kwargs)
                if target is None:
                    result = func(*args, **kwargs)
                    return set_marked(result) if is_marked(args[0]) else result
                if is_cuda_device(kwargs.get("device")):
                    kwargs["device"] = cpu
                if len(args) > 1 and not isinstance(args[1], (torch.dtype, torch.Tensor)):
                    args = (args[0], cpu, *args[2:])
                return moved(args[0], func(*args, **kwargs), to_cuda=target)
            explicit = kwargs.get("device")
            if explicit is not None:
                to_cuda = is_cuda_device(explicit)
                if to_cuda:
                    kwargs["device"] = cpu
            else:
                to_cuda = any_marked(args, kwargs)
            if to_cuda and autocast.enabled():
                args, kwargs = autocast.autocast_inputs(func, args, kwargs, is_marked)
            if to_cuda and cuda_ops.needs_emulation(func, kwargs, args):
                result = cuda_ops.run(func, args, kwargs)
            else:
                result = func(*args, **kwargs)
            return set_marked(result) if to_cuda else result

    return CudaOnCpu


def install(capability: tuple[int, int]) -> bool:
    """Answer ``torch.cuda`` as one GPU and map CUDA tensors to the CPU.

    Returns False, changing nothing, where torch has a real CUDA device.
    """
    import torch

    if _state:
        return True
    if torch.cuda.is_available():
        return False
    patches = Patches()
    for name, value in cuda_api.functions(properties_for(capability)).items():
        patches.set_in_package(torch.cuda, name, value, "torch.cuda")
    for name, value in cuda_api.nvtx_functions().items():
        patches.set_in_package(torch.cuda.nvtx, name, value, "torch.cuda")
    unemulated.stub_bindings(patches, torch.cuda)
    patches.set(torch.nn.Parameter, "__new__",
                _parameter_keeping_mark(torch.nn.Parameter.__dict__["__new__"].__func__))
    mode = _mode_class()()
    mode.__enter__()
    autograd.install(mode)
    _state.update(patches=patches, mode=mode, capability=capability)
    return True


def uninstall() -> None:
    if not _state:
        return
    autograd.uninstall()
    _state["patches"].restore()
    _remove_mode(_state["mode"])
    _state.clear()


def _remove_mode(mode: Any) -> None:
    """Pop ``mode`` from torch's function-mode stack even when others were pushed after it."""
    from torch.overrides import _get_current_function_mode_stack, _pop_mode, _push_mode

    above = []
    for _ in range(len(_get_current_function_mode_stack())):
        top = _pop_mode()
        if top is mode:
            break
        above.append(top)
    for other in reversed(above):
        _push_mode(other)


def installed() -> bool:
    return bool(_state)


def capability() -> tuple[int, int] | None:
    """The compute capability ``torch.cuda`` reports, or None when not installed."""
    held: tuple[int, int] | None = _state.get("capability")
    return held
