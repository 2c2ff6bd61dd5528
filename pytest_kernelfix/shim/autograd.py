"""Autograd hands the CUDA piece's tensors back as CUDA tensors.

On a GPU, a custom ``Function``'s backward sees CUDA tensors in ``ctx.saved_tensors`` and
in the gradients it is given, and kernel libraries branch on them (liger's norms take
``sm_count`` from the device and sum partial rows per SM; on ``cpu`` they use one row).
Under the CUDA piece three things hid that:

- torch calls ``Tensor.backward`` and ``torch.autograd.grad`` from inside the mode's own
  handler, where the mode is off, and the engine keeps that state: every backward ran
  without the mode (saved tensors said ``cpu``, ``torch.empty(device="cuda")`` raised).
  The engine now runs with the mode on: ``_engine_run_backward`` is wrapped, as
  ``torch.compiler`` wraps it for its own tracing. So do saved-tensor hooks
  (``torch.utils.checkpoint``, ``save_on_cpu``), which torch calls from inside an op.
- a tensor saved as an output comes back from ``ctx.saved_tensors`` as a new object on
  every access: the flags the tensors had at ``save_for_backward`` are set again.
- gradients are made in C++, unflagged: a backward is given its gradients flagged as the
  outputs of its forward were (``Function.apply`` records them on the node), and a hook
  on a CUDA tensor its gradient flagged (``with_cuda_grads``, applied by the mode).

Installed and removed with the CUDA piece, which owns the mode.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from pytest_kernelfix.shim._patches import Patches
from pytest_kernelfix.shim.marks import mark_like, marks_of, set_marked

SAVED_MARKS = "_kernelfix_saved_marks"  # on a ctx: which saved tensors were CUDA tensors
OUTPUT_MARKS = "_kernelfix_output_marks"  # on a node: which forward outputs were

_state: dict[str, Patches] = {}


def under_mode(mode: Any, run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` with ``mode`` on while it runs (pushed only where it is off)."""
    from torch.overrides import _get_current_function_mode_stack

    @functools.wraps(run)
    def with_mode(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # a failing backward or hook is the code's error
        if mode in _get_current_function_mode_stack():
            return run(*args, **kwargs)
        with mode:
            return run(*args, **kwargs)

    return with_mode


def _hooks_under_mode(mode: Any, init: Callable[..., None]) -> Callable[..., None]:
    """``saved_tensors_hooks.__init__`` with both hooks run under ``mode``: torch calls the
    pack hook from inside the op that saves, where the mode is off (checkpoint's pack hook
    recorded ``device == cpu``, its check in backward read ``cuda``)."""

    @functools.wraps(init)
    def __init__(self: Any, pack_hook: Any, unpack_hook: Any) -> None:
        init(self, under_mode(mode, pack_hook), under_mode(mode, unpack_hook))

    return __init__


def _outputs_of(result: Any) -> tuple[Any, ...]:
    return result if isinstance(result, tuple) else (result,)


def record_outputs(result: Any) -> None:
    """Record on the node of a Function's outputs which of them are CUDA tensors: their
    gradients will be. (An input returned as is comes back as ``view_as`` of it, which the
    mode sees and flags.)"""
    import torch

    outputs = _outputs_of(result)
    nodes = (out.grad_fn for out in outputs if isinstance(out, torch.Tensor))
    node = next((fn for fn in nodes if fn is not None), None)
    if node is not None:
        setattr(node, OUTPUT_MARKS, marks_of(outputs))


def _recording_apply(apply: Callable[..., Any]) -> Any:
    @functools.wraps(apply)
    def recording_apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # an error in forward is the Function's
        result = apply(cls, *args, **kwargs)
        record_outputs(result)
        return result

    return classmethod(recording_apply)


def _recording_save(save: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(save)
    def save_for_backward(ctx: Any, *tensors: Any) -> None:
        save(ctx, *tensors)
        setattr(ctx, SAVED_MARKS, marks_of(tensors))

    return save_for_backward


def _remarked_saved(getter: Any) -> property:
    def saved_tensors(ctx: Any) -> Any:
        __tracebackhide__ = True  # "freed" errors are the caller's, as on a GPU
        tensors = getter.__get__(ctx, type(ctx))
        mark_like(tensors, getattr(ctx, SAVED_MARKS, ()))
        return tensors

    return property(saved_tensors, doc=getattr(getter, "__doc__", None))


def _marking_grads(apply: Callable[..., Any], boxed: bool) -> Callable[..., Any]:
    @functools.wraps(apply)
    def apply_with_cuda_grads(node: Any, *args: Any) -> Any:
        __tracebackhide__ = True  # an error in backward is the Function's
        grads = args[0] if boxed and args else args  # boxed: one list of gradients
        mark_like(grads, getattr(node, OUTPUT_MARKS, ()))
        return apply(node, *args)

    return apply_with_cuda_grads


def with_cuda_grads(hook: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A tensor hook given its gradient flagged: the mode registers hooks on CUDA tensors
    this way, as a GPU hands them CUDA gradients."""

    @functools.wraps(hook)
    def cuda_grad_hook(grad: Any) -> Any:
        return hook(set_marked(grad))

    return cuda_grad_hook


def install(mode: Any) -> None:
    """Run backward under ``mode`` and flag saved tensors and gradients; idempotent."""
    import torch
    from torch.autograd import function, graph

    if _state:
        return
    patches = Patches()
    run_backward = under_mode(mode, graph._engine_run_backward)
    patches.set(graph, "_engine_run_backward", run_backward)
    patches.set(torch.autograd, "_engine_run_backward", run_backward)  # imported by name
    patches.set(graph.saved_tensors_hooks, "__init__",
                _hooks_under_mode(mode, graph.saved_tensors_hooks.__init__))
    patches.set(function.Function, "apply",
                _recording_apply(function.Function.__dict__["apply"].__func__))
    patches.set(function.FunctionCtx, "save_for_backward",
                _recording_save(function.FunctionCtx.save_for_backward))
    node = function.BackwardCFunction
    patches.set(node, "saved_tensors", _remarked_saved(torch._C._FunctionBase.saved_tensors))
    patches.set(node, "apply", _marking_grads(node.apply, boxed=False))
    if "apply_boxed" in node.__dict__:  # newer torch: boxed_grads_call Functions
        patches.set(node, "apply_boxed", _marking_grads(node.apply_boxed, boxed=True))
    _state["patches"] = patches


def uninstall() -> None:
    if _state:
        _state.pop("patches").restore()


def installed() -> bool:
    return bool(_state)
