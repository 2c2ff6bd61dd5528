"""Attribute patches that remember what they replaced, so every shim piece can undo itself."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

_MISSING = object()


class Patches:
    """A stack of ``setattr`` calls, undone in reverse order by ``restore``."""

    def __init__(self) -> None:
        self._changes: list[tuple[Any, str, Any]] = []

    def __bool__(self) -> bool:
        return bool(self._changes)

    def set(self, obj: Any, name: str, value: Any) -> None:
        self._changes.append((obj, name, obj.__dict__.get(name, _MISSING)))
        setattr(obj, name, value)

    def set_in_package(self, module: ModuleType, name: str, value: Any, package: str) -> None:
        """``module.name = value``, and the same in every loaded module of ``package`` that
        bound the replaced object under that name (``from . import current_device``):
        torch's own functions then call the replacement too, so ``get_rng_state_all``
        counts the devices ``device_count`` reports."""
        original = module.__dict__.get(name, _MISSING)
        self.set(module, name, value)
        if original is _MISSING:
            return
        for other in list(sys.modules.values()):
            if (other is not module and isinstance(other, ModuleType)
                    and (other.__name__ == package or other.__name__.startswith(package + "."))
                    and other.__dict__.get(name, _MISSING) is original):
                self.set(other, name, value)

    def restore(self) -> None:
        while self._changes:
            obj, name, original = self._changes.pop()
            if original is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, original)
