"""One module as an index of its definitions: spans, outline lines, names used and called.

Everything later stages need from a Python file, read once from its syntax tree: each
top-level function, class, method and constant with its line span (decorators
included) and a one-line outline, whether it is a ``@triton.jit`` function, which
dotted names it reads and calls, which kernels it launches (``kernel[grid](...)``) and
which calls compute what those launches receive, and the module's imports. Pure
functions over text; :func:`parse_module` caches by content.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

#: Decorators that make a function a Triton kernel or helper (the last dotted part).
JIT_DECORATORS = frozenset({"jit", "autotune", "heuristics"})
_HEADER_CHARS = 110


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


@dataclass(frozen=True)
class Definition:
    """A top-level function, class, method (``Class.method``) or constant.

    ``start``/``end`` are 1-based and inclusive, decorators included; ``line`` is the
    ``def``/``class``/assignment line. ``names`` are the dotted names it reads, ``calls``
    those it calls, ``launches`` the kernels it launches with ``kernel[grid](...)``, and
    ``feeds`` the calls whose results reach such a launch (grid, block sizes, dtypes,
    strides, output tensors).
    """

    qualname: str
    kind: str  # function | class | method | constant
    start: int
    end: int
    line: int
    header: str
    jit: bool = False
    configs: bool = False
    names: tuple[str, ...] = ()
    calls: tuple[str, ...] = ()
    launches: tuple[str, ...] = ()
    feeds: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return self.qualname.rpartition(".")[2]


@dataclass(frozen=True)
class ModuleIndex:
    """The definitions and imports of one module's text (``error`` when it does not parse)."""

    definitions: tuple[Definition, ...] = ()
    imports: tuple[tuple[str, Import], ...] = ()
    import_span: tuple[int, int] = (0, 0)
    error: str = ""

    @functools.cached_property
    def by_name(self) -> dict[str, Definition]:
        return {d.qualname: d for d in self.definitions}

    @functools.cached_property
    def import_map(self) -> dict[str, Import]:
        return dict(self.imports)

    def find(self, qualname: str) -> Definition | None:
        return self.by_name.get(qualname)

    def at(self, line: int) -> Definition | None:
        """The innermost definition whose span holds ``line`` (a method before its class)."""
        best: Definition | None = None
        for definition in self.definitions:
            if definition.start <= line <= definition.end and (
                best is None or definition.end - definition.start < best.end - best.start
            ):
                best = definition
        return best


def dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name or a chain of Attributes on a Name, else ""."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    parts.append(node.id)
    return ".".join(reversed(parts))


def _is_jit(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if dotted(target).rpartition(".")[2] in JIT_DECORATORS:
            return True
    return False


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _HEADER_CHARS else text[: _HEADER_CHARS - 3] + "..."


def _loads(nodes: Iterable[ast.AST]) -> Iterator[str]:
    """Dotted names read anywhere under ``nodes`` (the longest chain of each)."""
    for root in nodes:
        for node in ast.walk(root):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                name = dotted(node)
                if name:
                    yield name
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                yield node.id


def _called(node: ast.Call) -> str:
    """The dotted callee, or the kernel of ``kernel[grid](...)``."""
    func = node.func
    if isinstance(func, ast.Subscript):
        return dotted(func.value)
    return dotted(func)


def _targets(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _assignment(node: ast.AST) -> tuple[set[str], list[ast.AST]] | None:
    """(names bound, expressions they are bound from) for a binding statement, else None."""
    if isinstance(node, ast.Assign):
        return set().union(*(_targets(t) for t in node.targets)), [node.value]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
        return _targets(node.target), [node.value]
    if isinstance(node, (ast.For, ast.AsyncFor)):
        return _targets(node.target), [node.iter]
    if isinstance(node, (ast.With, ast.AsyncWith)):
        bound = [item for item in node.items if item.optional_vars is not None]
        if bound:
            return (set().union(*(_targets(i.optional_vars) for i in bound)),  # type: ignore[arg-type]
                    [item.context_expr for item in bound])
        return None
    if isinstance(node, ast.NamedExpr):
        return _targets(node.target), [node.value]
    return None


def _launch_flow(launches: list[ast.Call], assignments: list[tuple[set[str], list[ast.AST]]]) -> (
    tuple[tuple[str, ...], tuple[str, ...]]
):
    """(kernels launched with ``k[grid](...)``, calls whose results reach a launch).

    A backward slice within the function: the names a launch reads (grid and
    arguments), then every assignment to one of them, and what those read, to a fixed
    point. Calls in the launch itself and in those assignments feed the launch.
    """
    if not launches:
        return (), ()
    wanted: set[str] = set()
    feeding: list[ast.AST] = []
    for call in launches:
        inputs = [call.func.slice, *call.args, *(k.value for k in call.keywords)]  # type: ignore[attr-defined]
        feeding += inputs
        wanted |= {name.split(".")[0] for name in _loads(inputs)}
    used: set[int] = set()
    changed = True
    while changed:
        changed = False
        for index, (targets, values) in enumerate(assignments):
            if index in used or not targets & wanted:
                continue
            used.add(index)
            feeding += values
            wanted |= {name.split(".")[0] for name in _loads(values)}
            changed = True
    calls = [
        _called(node) for root in feeding for node in ast.walk(root)
        if isinstance(node, ast.Call)
    ]
    kernels = [_called(call) for call in launches]
    return (tuple(dict.fromkeys(k for k in kernels if k)),
            tuple(dict.fromkeys(c for c in calls if c and c not in kernels)))


def _function(node: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str, kind: str,
              start: int) -> Definition:
    """One walk over the function collects its names, calls, launches and bindings."""
    names: list[str] = []
    calls: list[str] = []
    launches: list[ast.Call] = []
    assignments: list[tuple[set[str], list[ast.AST]]] = []
    for root in [*node.decorator_list, *node.body, node.args]:
        for child in ast.walk(root):
            if isinstance(child, ast.Call):
                calls.append(_called(child))
                if isinstance(child.func, ast.Subscript):
                    launches.append(child)
            elif isinstance(child, ast.Attribute) and isinstance(child.ctx, ast.Load):
                name = dotted(child)
                if name:
                    names.append(name)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Load):
                names.append(child.id)
            elif isinstance(child, ast.stmt | ast.NamedExpr):
                bound = _assignment(child)
                if bound is not None:
                    assignments.append(bound)
    launched, feeds = _launch_flow(launches, assignments)
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    jit = _is_jit(node)
    decorated = "@triton.jit " if jit else ""
    header = _short(f"{decorated}{prefix} {node.name}({ast.unparse(node.args)})")
    return Definition(
        qualname=qualname, kind=kind, start=start, end=node.end_lineno or node.lineno,
        line=node.lineno, header=header, jit=jit,
        names=tuple(dict.fromkeys(names)),
        calls=tuple(dict.fromkeys(c for c in calls if c)),
        launches=launched, feeds=feeds,
    )


def _start(node: ast.AST) -> int:
    decorators = getattr(node, "decorator_list", ())
    return min([node.lineno, *(d.lineno for d in decorators)])  # type: ignore[attr-defined]


def _containers(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Top-level statements, including those inside top-level if/try/with blocks."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            inner = list(node.body) + list(getattr(node, "orelse", []))
            inner += list(getattr(node, "finalbody", []))
            for handler in getattr(node, "handlers", []):
                inner += handler.body
            yield from _containers(inner)
        elif hasattr(ast, "TryStar") and isinstance(node, ast.TryStar):
            yield from _containers(list(node.body) + list(node.orelse))


def _has_config(value: ast.AST) -> bool:
    return any(
        isinstance(node, ast.Call) and dotted(node.func).rpartition(".")[2] == "Config"
        for node in ast.walk(value)
    )


@functools.lru_cache(maxsize=256)
def parse_module(text: str) -> ModuleIndex:
    """Index ``text`` (a module's source); a module that does not parse has no definitions."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError) as error:
        return ModuleIndex(error=f"{type(error).__name__}: {error}")
    definitions: list[Definition] = []
    imports: list[tuple[str, Import]] = []
    import_lines: list[int] = []
    for node in _containers(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            definitions.append(_function(node, node.name, "function", _start(node)))
        elif isinstance(node, ast.ClassDef):
            bases = ", ".join(ast.unparse(base) for base in node.bases)
            header = _short(f"class {node.name}({bases})" if bases else f"class {node.name}")
            definitions.append(Definition(
                node.name, "class", _start(node), node.end_lineno or node.lineno, node.lineno,
                header, names=tuple(dict.fromkeys(_loads([*node.bases, *node.decorator_list]))),
            ))
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    definitions.append(_function(item, f"{node.name}.{item.name}", "method",
                                                 _start(item)))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            value = ast.unparse(node.value)
            for name in names:
                definitions.append(Definition(
                    name, "constant", node.lineno, node.end_lineno or node.lineno, node.lineno,
                    _short(f"{name} = {value}"), configs=_has_config(node.value),
                    names=tuple(dict.fromkeys(_loads([node.value]))),
                    calls=tuple(dict.fromkeys(
                        _called(n) for n in ast.walk(node.value) if isinstance(n, ast.Call)
                    )),
                ))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            import_lines += [node.lineno, node.end_lineno or node.lineno]
            imports += bindings(node)
    span = (min(import_lines), max(import_lines)) if import_lines else (0, 0)
    return ModuleIndex(tuple(definitions), tuple(imports), span)
