"""Which calls of a ``@triton.jit`` function a launch runs, from its constexpr values.

A jit dispatcher (``if ACT == "silu": y = silu(x) elif ACT == "gelu": ...``) calls
twenty helpers, but Triton folds a condition on ``tl.constexpr`` values at compile
time, so a launch runs one branch. The launch record knows those values (and the
``None`` arguments Triton specialised). :mod:`~pytest_kernelfix.locate.outline` indexes
each call and name a jit function uses with the conditions that guard it (the
enclosing ``if`` statements and conditional expressions, :class:`Branching`);
:func:`decide` evaluates a condition on the known values to True, False, or None when
it cannot tell. A use is dropped only when one of its guards is decided False: an
undecidable condition never drops a branch.

Values known in a callee are those the caller passes down: a literal
(``_act(x, "silu")``) or a name whose value is known (``_act(x, ACT)``); Triton
specialises the callee on both. A parameter the function assigns to is never known.
"""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

#: A constexpr value as the launch recorded it (``"dtype:fp32"`` for a ``tl.float32``).
Scalar = int | float | bool | str | None
#: Known values by parameter name, sorted: hashable, so a walk can key visits on it.
Env = tuple[tuple[str, Scalar], ...]

DTYPE_PREFIX = "dtype:"
#: ``tl.<attribute>`` -> the dtype's name as recorded (``tl.float32.name == "fp32"``).
DTYPE_NAMES = {
    "float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "float64": "fp64",
    "float8e4nv": "fp8e4nv", "float8e5": "fp8e5", "float8e4b15": "fp8e4b15",
    "float8e4b8": "fp8e4b8", "float8e5b16": "fp8e5b16",
    "int1": "int1", "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
}
_TRITON_LANGUAGE = frozenset({"tl", "triton.language", "language"})


@dataclass(frozen=True)
class Use:
    """A dotted name a jit function reads or calls, under ``guards``: each a condition's
    source and whether the use needs it true. A call keeps its arguments' sources
    (``*args`` as ``"*args"``)."""

    name: str
    guards: tuple[tuple[str, bool], ...] = ()
    call: bool = False
    args: tuple[str, ...] = ()
    keywords: tuple[tuple[str, str], ...] = ()
    spread: bool = False  # ``*args`` or ``**kwargs``: any parameter may be passed


@dataclass(frozen=True)
class Branching:
    """What a jit function's branches depend on: its parameters (``positional`` of them
    may be passed by position), literal defaults, the names its body assigns, and every
    use with its guards."""

    params: tuple[str, ...] = ()
    positional: int = 0
    defaults: tuple[tuple[str, str], ...] = ()
    rebound: tuple[str, ...] = ()
    uses: tuple[Use, ...] = ()

    @property
    def called(self) -> frozenset[str]:
        return frozenset(use.name for use in self.uses if use.call)


# -- evaluating ------------------------------------------------------------------------


class _Unknown:
    """A value the recorded constexprs do not determine."""

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Any = _Unknown()


@dataclass(frozen=True)
class _Dtype:
    """A ``tl.dtype``: equal to another of the same name, comparable to nothing else."""

    name: str


def _known(value: Scalar) -> Any:
    if isinstance(value, str) and value.startswith(DTYPE_PREFIX):
        return _Dtype(value[len(DTYPE_PREFIX):])
    return value


@functools.lru_cache(maxsize=4096)
def _expression(source: str) -> ast.expr | None:
    try:
        return ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError):
        return None


_ORDER: Mapping[type, Callable[[Any, Any], bool]] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
}
_SINGLETONS = (None, True, False)


def _equal(left: Any, right: Any) -> Any:
    if isinstance(left, _Dtype) or isinstance(right, _Dtype):
        return left == right if type(left) is type(right) else UNKNOWN
    return left == right


def _member(item: Any, container: Any) -> Any:
    if isinstance(container, str):
        return item in container if isinstance(item, str) else UNKNOWN
    found: Any = False
    for element in container:
        equal = _equal(item, element)
        if equal is UNKNOWN:
            found = UNKNOWN
        elif equal:
            return True
    return found


def _compare(op: ast.cmpop, left: Any, right: Any) -> Any:
    if left is UNKNOWN or right is UNKNOWN:
        return UNKNOWN
    if isinstance(op, (ast.Eq, ast.NotEq)):
        equal = _equal(left, right)
        return equal if equal is UNKNOWN or isinstance(op, ast.Eq) else not equal
    if isinstance(op, (ast.In, ast.NotIn)):
        if not isinstance(right, (tuple, str)):
            return UNKNOWN
        member = _member(left, right)
        return member if member is UNKNOWN or isinstance(op, ast.In) else not member
    if isinstance(op, (ast.Is, ast.IsNot)):
        if not any(side is value for side in (left, right) for value in _SINGLETONS):
            return UNKNOWN  # identity of strings and numbers is CPython's business
        same = left is right
        return same if isinstance(op, ast.Is) else not same
    order = _ORDER.get(type(op))
    numbers = (int, float)
    if order is None or not (isinstance(left, numbers) and isinstance(right, numbers)):
        return UNKNOWN
    return order(left, right)


def _value(node: ast.expr, env: Mapping[str, Any]) -> Any:
    """The value of ``node`` when the known constexprs determine it, else UNKNOWN."""
    if isinstance(node, ast.Constant):
        value = node.value
        return value if value is None or isinstance(value, (bool, int, float, str)) else UNKNOWN
    if isinstance(node, ast.Name):
        return env.get(node.id, UNKNOWN)
    if isinstance(node, ast.Attribute):
        if ast.unparse(node.value) in _TRITON_LANGUAGE and node.attr in DTYPE_NAMES:
            return _Dtype(DTYPE_NAMES[node.attr])
        return UNKNOWN
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = tuple(_value(element, env) for element in node.elts)
        return UNKNOWN if any(item is UNKNOWN for item in items) else items
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.Not):
            truth = _truth(node.operand, env)
            return truth if truth is UNKNOWN else not truth
        operand = _value(node.operand, env)
        if isinstance(operand, (int, float)) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -operand if isinstance(node.op, ast.USub) else +operand
        return UNKNOWN
    if isinstance(node, ast.Compare):
        left = _value(node.left, env)
        result: Any = True
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _value(comparator, env)
            outcome = _compare(op, left, right)
            if outcome is False:
                return False  # a chain is false once one link is false
            if outcome is UNKNOWN:
                result = UNKNOWN
            left = right
        return result
    if isinstance(node, ast.BoolOp):
        return _truth(node, env)
    return UNKNOWN


def _truth(node: ast.expr, env: Mapping[str, Any]) -> Any:
    """Whether ``node`` is true, when the known constexprs determine it, else UNKNOWN."""
    if isinstance(node, ast.BoolOp):
        truths = [_truth(value, env) for value in node.values]
        decisive = isinstance(node.op, ast.Or)  # True decides an or, False an and
        if any(truth is decisive for truth in truths):
            return decisive
        return UNKNOWN if any(truth is UNKNOWN for truth in truths) else not decisive
    value = _value(node, env)
    if value is UNKNOWN or isinstance(value, _Dtype):
        return UNKNOWN
    return bool(value)


def decide(condition: str, env: Env | Mapping[str, Scalar]) -> bool | None:
    """Whether ``condition`` (Python source) holds under the known values ``env``; None
    when it cannot be told."""
    return _decided(condition, tuple(sorted(dict(env).items())))


@functools.lru_cache(maxsize=16384)
def _decided(condition: str, env: Env) -> bool | None:
    """:func:`decide`, once per condition and values: a dispatcher's last branch is
    guarded by every condition before it."""
    node = _expression(condition)
    if node is None:
        return None
    truth = _truth(node, {name: _known(value) for name, value in env})
    return None if truth is UNKNOWN else bool(truth)


def taken(use: Use, env: Env) -> bool:
    """Whether a launch with ``env`` may run ``use``: no guard is decided against it."""
    if not env:
        return True
    for condition, needed in use.guards:
        decided = decide(condition, env)
        if decided is not None and decided != needed:
            return False
    return True


# -- passing values down -----------------------------------------------------------------


def entry_env(branching: Branching, values: Mapping[str, Scalar]) -> Env:
    """The known values of a jit function's parameters on entry, from ``values`` (a
    launch's constexprs, or what a caller passes); never a parameter the body assigns
    to."""
    return tuple(sorted((name, value) for name, value in values.items()
                        if name in branching.params and name not in branching.rebound))


def _literal(source: str, env: Mapping[str, Scalar]) -> Any:
    """A call argument's value as a recorded scalar, or UNKNOWN (a dtype comes back
    as ``"dtype:<name>"``)."""
    node = _expression(source)
    if node is None:
        return UNKNOWN
    value = _value(node, {name: _known(v) for name, v in env.items()})
    if isinstance(value, _Dtype):
        return DTYPE_PREFIX + value.name
    if value is UNKNOWN or isinstance(value, tuple):
        return UNKNOWN
    return value


def callee_env(use: Use, callee: Branching, env: Env) -> Env:
    """What the callee of ``use`` knows on entry, when called under ``env``: the
    arguments whose values are known, and the literal defaults of the parameters the
    call does not pass (all of them may be passed through ``*args``/``**kwargs``)."""
    known = dict(env)
    passed: set[str] = set()
    values: dict[str, Scalar] = {}
    arguments: list[tuple[str, str]] = []
    for position, source in enumerate(use.args):
        if source.startswith("*") or position >= callee.positional:
            break  # after *args, positions are unknown
        arguments.append((callee.params[position], source))
    for name, source in [*arguments, *use.keywords]:
        passed.add(name)
        value = _literal(source, known)
        if value is not UNKNOWN:
            values[name] = value
    if not use.spread:
        for name, source in callee.defaults:
            value = _literal(source, {})
            if name not in passed and value is not UNKNOWN:
                values[name] = value
    return entry_env(callee, values)


def constexpr_env(constexprs: tuple[tuple[str, Scalar], ...], exact: bool = True) -> Env:
    """The known values of a recorded launch. A launch that is not ``exact`` may have
    kept a value as its ``repr``, a string: its strings are not trusted."""
    return tuple(sorted(
        (name, value) for name, value in dict(constexprs).items()
        if exact or not isinstance(value, str) or value.startswith(DTYPE_PREFIX)
    ))
