"""One strict reader for typed data that crossed a process boundary or a disk as JSON.

:func:`read` builds a frozen dataclass from what :func:`json.loads` returned, by the
dataclass's own annotations, and takes nothing it was not written as: an ``int`` field
refuses ``"3"`` and ``true``, a ``bool`` refuses ``"false"``, a ``str`` refuses a number,
an enum or a ``Literal`` refuses a value it does not name, an unknown key is refused, and a
field with no default must be there. Nested dataclasses, tuples (of any length, or of a
fixed shape), mappings with string keys and optional fields are read the same way, all
the way down. A dataclass is written as a JSON object, or, where it is compact, as an
array of its fields in order (its trailing defaults may be left out). Each refusal is a
:class:`FieldError` that names the path of the bad field (``gate[0].ok``), so a wrong
value is a sentence, never a ``KeyError`` or a silently truthy ``"false"``.

The standard library only, and nothing else of the package: the rerun child reads its
plan with it before anything else is imported.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
          type(None): "null"}


class FieldError(ValueError):
    """A value that does not fit its field; ``path`` says which (``""``: the whole)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


def read(cls: type[T], data: Any, *, complete: bool = False,
         ignore: Collection[str] = ()) -> T:
    """``data`` read as a ``cls`` (a dataclass), strictly (see the module docstring).

    ``complete``: every field must be written, those with a default too (a contract
    whose writer always writes them all: a missing one means another version).
    ``ignore``: keys of the outer object that are not fields (an event's name).
    """
    return _dataclass(cls, data, "", complete, frozenset(ignore))


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    type: Any
    required: bool


_KNOWN: dict[type, tuple[_Field, ...]] = {}


def _fields(cls: type) -> tuple[_Field, ...]:
    """The init fields of dataclass ``cls``, their types resolved (once per class)."""
    known = _KNOWN.get(cls)
    if known is None:
        hints = typing.get_type_hints(cls)
        known = _KNOWN[cls] = tuple(
            _Field(f.name, hints[f.name], f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING)
            for f in dataclasses.fields(cls) if f.init)
    return known


def _dataclass(cls: type[T], data: Any, path: str, complete: bool,
               ignore: frozenset[str] = frozenset()) -> T:
    fields = _fields(cls)
    if isinstance(data, (list, tuple)):
        if len(data) > len(fields):
            raise FieldError(path, f"expected at most {len(fields)} items, got {len(data)}")
        data = {field.name: item for field, item in zip(fields, data, strict=False)}
    elif not isinstance(data, Mapping):
        raise FieldError(path, f"expected a JSON object, got {_shown(data)}")
    names = {field.name for field in fields} | ignore
    unknown = sorted(str(key) for key in data if key not in names)
    if unknown:
        raise FieldError(path, f"unknown keys: {', '.join(unknown)}")
    values = {}
    for field in fields:
        where = f"{path}.{field.name}" if path else field.name
        if field.name in data:
            values[field.name] = _value(field.type, data[field.name], where, complete)
        elif field.required or complete:
            raise FieldError(where, "missing")
    try:
        return cls(**values)
    except (TypeError, ValueError) as error:  # the dataclass's own checks
        raise FieldError(path, str(error)) from None


def _value(kind: Any, data: Any, path: str, complete: bool) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        return _union(kind, args, data, path, complete)
    if origin is typing.Literal:
        if any(_is(data, arg) for arg in args):
            return data
        raise FieldError(path, f"expected one of {', '.join(map(repr, args))}, "
                               f"got {_shown(data)}")
    if origin is tuple:
        return _tuple(args, data, path, complete)
    if origin in (dict, Mapping):
        return _mapping(args[1], data, path, complete)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        member = next((m for m in kind if _is(data, m.value)), None)
        if member is None:
            raise FieldError(path, f"expected one of {', '.join(repr(m.value) for m in kind)}, "
                                   f"got {_shown(data)}")
        return member
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return _dataclass(kind, data, path, complete)
    if kind in _NAMES:
        return _scalar(kind, data, path)
    raise TypeError(f"{path}: fields cannot read values of type {kind!r}")


def _scalar(kind: type, data: Any, path: str) -> Any:
    if kind is float and isinstance(data, int) and not isinstance(data, bool):
        return float(data)  # JSON writes 2.0 as 2 where a float was an integer
    if not isinstance(data, kind) or (kind is not bool and isinstance(data, bool)):
        raise FieldError(path, f"expected {_NAMES[kind]}, got {_shown(data)}")
    return data


def _is(data: Any, value: Any) -> bool:
    """``data`` is ``value`` as JSON tells them apart: ``true`` is not ``1``."""
    return data == value and isinstance(data, bool) == isinstance(value, bool)


def _union(kind: Any, args: tuple[Any, ...], data: Any, path: str, complete: bool) -> Any:
    if data is None and type(None) in args:
        return None
    options = [arg for arg in args if arg is not type(None)]
    if len(options) == 1:  # an optional field: the value's own error is the clearer one
        return _value(options[0], data, path, complete)
    for option in options:
        try:
            return _value(option, data, path, complete)
        except FieldError:
            continue
    names = [_NAMES.get(arg, getattr(arg, "__name__", repr(arg))) for arg in args]
    raise FieldError(path, f"expected {', '.join(names[:-1])} or {names[-1]}, "
                           f"got {_shown(data)}")


def _tuple(args: tuple[Any, ...], data: Any, path: str, complete: bool) -> tuple[Any, ...]:
    if not isinstance(data, (list, tuple)):
        raise FieldError(path, f"expected a list, got {_shown(data)}")
    if len(args) == 2 and args[1] is Ellipsis:
        kinds = [args[0]] * len(data)
    elif len(data) != len(args):
        raise FieldError(path, f"expected {len(args)} items, got {len(data)}")
    else:
        kinds = list(args)
    return tuple(_value(kind, item, f"{path}[{index}]", complete)
                 for index, (kind, item) in enumerate(zip(kinds, data, strict=True)))


def _mapping(kind: Any, data: Any, path: str, complete: bool) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise FieldError(path, f"expected a JSON object, got {_shown(data)}")
    values = {}
    for key, item in data.items():
        if not isinstance(key, str):
            raise FieldError(path, f"expected string keys, got {_shown(key)}")
        values[key] = _value(kind, item, f"{path}[{key!r}]", complete)
    return values


def _shown(data: Any) -> str:
    """A value in an error, bounded (a wrong value may be a whole log)."""
    text = repr(data)
    return text if len(text) <= 80 else text[:77] + "..."
