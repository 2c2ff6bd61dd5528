"""Attribute patches that remember what they replaced, so every shim piece can undo itself."""

from __future__ import annotations

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

    def restore(self) -> None:
        while self._changes:
            obj, name, original = self._changes.pop()
            if original is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, original)
