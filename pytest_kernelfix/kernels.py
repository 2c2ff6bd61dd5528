"""Which functions are Triton kernels: one answer for the outline, the guards, the recipes
and the selection of failing tests, read from a module's syntax. Standard library only.

A function is a kernel when a decorator of its stack names Triton's ``jit``, ``autotune``
or ``heuristics``: the decorator's last name is one of the three, and the name it is
written under, resolved through the module's imports, runs through ``triton``:
``@triton.jit`` under ``import triton`` (or under ``import triton.language as tl`` alone,
which binds no ``triton``: a name no import binds is read as written),
``from triton import jit as tjit`` with ``@tjit``, vLLM's re-export
``from vllm.triton_utils import triton``, Gluon's ``triton.experimental.gluon.jit``.
Decisions, taken on the decorator stacks of Liger-Kernel, flash-linear-attention and
FlagGems:

- A stack is one kernel: ``@triton.autotune(...) @triton.heuristics(...) @triton.jit``,
  and so is a stack that adds the project's own decorators to a Triton one (FlagGems'
  ``@libentry()`` and ``@pointwise_dynamic``, flash-linear-attention's
  ``@fla_cache_autotune``).
- Other languages' compilers are no kernels, whatever their last name: an import binds
  ``@cute.jit`` to ``cutlass``, ``@tilelang.jit`` to ``tilelang``, ``@jit`` to ``numba``
  or ``jax``; ``@torch.jit.script`` and ``@numba.njit`` end in another name.
- A custom decorator that wraps ``triton.jit`` (``from .utils import jit``, a
  ``def my_jit(fn): return triton.jit(fn)``) is no kernel by itself: the predicate reads
  one module's syntax and does not follow a name into the code that defines it. Every
  kernel of the three libraries carries a Triton decorator in its own stack; a bare
  ``@jit`` that no import binds is read as written, and is one.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

#: The last names of Triton's decorators that make a function a kernel or a jit helper.
KERNEL_DECORATORS = frozenset({"jit", "autotune", "heuristics"})
#: What every module that defines a kernel holds somewhere (a check before parsing).
_MENTIONS = re.compile(rb"jit|autotune|heuristics")
#: A decorator line, for a module that does not parse.
_DECORATOR_LINE = re.compile(rb"^[ \t]*@(?:triton\.)?(?:jit|autotune|heuristics)\b", re.M)

Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Import:
    """``module`` (dotted, relative to the file when ``level`` > 0) and the imported
    ``name`` (``""`` for ``import module``)."""

    module: str
    name: str = ""
    level: int = 0

    @property
    def dotted(self) -> str:
        """``module.name`` (``module`` for ``import module``)."""
        return f"{self.module}.{self.name}" if self.name else self.module

    @property
    def absolute(self) -> bool:
        return bool(self.module) and not self.level


def bindings(node: ast.AST) -> list[tuple[str, Import]]:
    """(local name, what it names) for each name an import statement binds: ``import a.b``
    binds ``a``; other statements and ``from x import *`` bind none."""
    if isinstance(node, ast.Import):
        return [(alias.asname, Import(alias.name)) if alias.asname
                else (alias.name.split(".")[0], Import(alias.name.split(".")[0]))
                for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return [(alias.asname or alias.name, Import(node.module or "", alias.name, node.level))
                for alias in node.names if alias.name != "*"]
    return []


def import_aliases(tree: ast.AST) -> dict[str, Import]:
    """Every name an import anywhere in ``tree`` binds, and what it names."""
    return {local: imported for node in ast.walk(tree) for local, imported in bindings(node)}


def is_kernel_decorator(decorator: ast.expr, aliases: Mapping[str, Import]) -> bool:
    """Whether ``decorator`` (called or not) is Triton's jit, autotune or heuristics."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    parts: list[str] = []
    while isinstance(target, ast.Attribute):
        parts.append(target.attr)
        target = target.value
    if not isinstance(target, ast.Name):
        return False
    bound = aliases.get(target.id)
    path = [*(bound.dotted.split(".") if bound else [target.id]), *reversed(parts)]
    return path[-1] in KERNEL_DECORATORS and (len(path) == 1 or "triton" in path[:-1])


def is_kernel(function: Function, aliases: Mapping[str, Import]) -> bool:
    """Whether a decorator of ``function``'s stack makes it a Triton kernel."""
    return any(is_kernel_decorator(d, aliases) for d in function.decorator_list)


def kernel_functions(tree: ast.AST) -> Iterator[Function]:
    """The Triton kernels defined anywhere in ``tree`` (a module's syntax)."""
    aliases = import_aliases(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and is_kernel(node,
                                                                                    aliases):
            yield node


def defines_kernel(source: bytes) -> bool:
    """Whether a module's code defines a Triton kernel (one in a string, such as a code
    generator's template, or in a comment is none). Most modules name none of the
    decorators and are not parsed; one that does not parse is read line by line."""
    if _MENTIONS.search(source) is None:
        return False
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return _DECORATOR_LINE.search(source) is not None
    return next(kernel_functions(tree), None) is not None
