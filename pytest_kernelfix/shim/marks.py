"""Which CPU tensors are CUDA tensors: a flag on the tensor's Python object.

The CUDA piece keeps ``device="cuda"`` tensors on the CPU and flags them (``MARK`` in the
object's ``__dict__``); its mode answers ``.device`` / ``is_cuda`` from the flag. The flag
lives on one Python object, so wherever torch hands back a new object for the same data
(a ``Parameter``, a tensor autograd saved, a gradient) someone must set it again: these
helpers are shared by the pieces that do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

MARK = "_kernelfix_cuda"


def is_marked(value: object) -> bool:
    return bool(getattr(value, MARK, False))


def set_marked(value: Any, marked: bool = True) -> Any:
    """Flag ``value`` (a tensor, or tensors in a tuple / list) as a CUDA tensor or not."""
    import torch

    if isinstance(value, torch.Tensor):
        with contextlib.suppress(AttributeError, RuntimeError):  # subclasses without __dict__
            setattr(value, MARK, marked)
    elif isinstance(value, (tuple, list)):
        for item in value:
            set_marked(item, marked)
    return value


def any_marked(args: Iterable[Any], kwargs: Mapping[str, Any]) -> bool:
    """Whether a call reads a CUDA tensor, directly or in a tuple / list argument."""
    for value in (*args, *kwargs.values()):
        if is_marked(value):
            return True
        if isinstance(value, (tuple, list)) and any(is_marked(v) for v in value):
            return True
    return False


def marks_of(values: Iterable[object]) -> tuple[bool, ...]:
    return tuple(is_marked(value) for value in values)


def mark_like(values: Sequence[Any], marks: Sequence[bool]) -> None:
    """Flag ``values[i]`` as a CUDA tensor where ``marks[i]`` says it was one."""
    for value, marked in zip(values, marks, strict=False):  # no record: no marks
        if marked:
            set_marked(value)
