"""One module as an index of its definitions: spans, outline lines, names used and called.

Everything later stages need from a Python file, read once from its syntax tree: each
top-level function, class, method and constant with its line span (decorators
included) and a one-line outline, whether it is a Triton kernel
(:mod:`~pytest_kernelfix.kernels`), which dotted names it reads and calls, which kernels
it launches (``kernel[grid](...)``) and which calls compute what those launches receive
(and size them), under which constexpr conditions a jit function uses what
(:mod:`~pytest_kernelfix.locate.branches`), and the module's imports. Pure functions over
text; :func:`parse_module` caches by content.
"""

from __future__ import annotations

import ast
import functools
import textwrap
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from pytest_kernelfix.kernels import Import, bindings, import_aliases, is_kernel
from pytest_kernelfix.locate.branches import Branching, Use

_HEADER_CHARS = 110


@dataclass(frozen=True)
class Definition:
    """A top-level function, class, method (``Class.method``) or constant.

    ``start``/``end`` are 1-based and inclusive, decorators included; ``line`` is the
    ``def``/``class``/assignment line. ``names`` are the dotted names it reads, ``calls``
    those it calls, ``launches`` the kernels it launches with ``kernel[grid](...)``,
    ``feeds`` the calls whose results reach such a launch (grid, block sizes, dtypes,
    strides, output tensors) and ``sizes`` those of them that size it (grid, block
    sizes, warps, the shapes of the buffers it is passed). A jit function's
    ``branching`` says which of its uses each constexpr value leads to. ``doc`` is the
    line span of a function's or class's docstring ((0, 0) when it has none), which a
    view may leave out under its budget; ``bases`` are a class's base classes.
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
    sizes: tuple[str, ...] = ()
    doc: tuple[int, int] = (0, 0)
    bases: tuple[str, ...] = ()
    source: str = ""  # a jit function's text, read for its branching when reach needs it

    @property
    def name(self) -> str:
        return self.qualname.rpartition(".")[2]

    @property
    def branching(self) -> Branching | None:
        """A jit function's :class:`Branching` (indexed on first use, once per text)."""
        return index_source(self.source) if self.jit else None


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


#: Launch options that size a launch (besides the grid and the block-size constexprs).
SIZE_OPTIONS = frozenset({"num_warps", "num_stages", "num_ctas", "maxnreg"})


def _size_inputs(call: ast.Call) -> list[ast.AST]:
    """What sizes a launch: its grid, the keyword arguments that are launch options or
    named in upper case (``BLOCK_SIZE=``, the constexpr convention) and the upper-case
    names passed by position."""
    inputs: list[ast.AST] = [call.func.slice]  # type: ignore[attr-defined]
    inputs += [k.value for k in call.keywords if k.arg and (k.arg in SIZE_OPTIONS
                                                            or k.arg.isupper())]
    return inputs + [a for a in call.args if isinstance(a, ast.Name) and a.id.isupper()]


#: Calls that allocate a buffer of the shape their arguments give (``torch.empty((n, m))``,
#: ``x.new_zeros(sm_count, n)``); ``*_like`` takes its shape from a tensor, not a size.
ALLOCATIONS = frozenset({"empty", "zeros", "ones", "full", "new_empty", "new_zeros",
                         "new_ones", "new_full", "empty_strided"})


def _buffer_shapes(call: ast.Call, assignments: list[tuple[set[str], list[ast.AST]]]) -> (
    list[ast.AST]
):
    """The shapes of the buffers a launch is passed by name: the arguments of the
    allocation that binds each (a per-program partial-gradient buffer sized
    ``(sm_count, n_cols)`` sizes the launch as much as its grid)."""
    passed = {a.id for a in [*call.args, *(k.value for k in call.keywords)]
              if isinstance(a, ast.Name)}
    shapes: list[ast.AST] = []
    for targets, values in assignments:
        if not targets & passed:
            continue
        for value in values:
            if isinstance(value, ast.Call) and _called(value).rpartition(".")[2] in ALLOCATIONS:
                shapes += [*value.args, *(k.value for k in value.keywords if k.arg == "size")]
    return shapes


def _calls_feeding(inputs: list[ast.AST], assignments: list[tuple[set[str], list[ast.AST]]]) -> (
    list[str]
):
    """The calls whose results reach ``inputs``: a backward slice within the function.

    The names the inputs read, then every assignment to one of them, and what those
    read, to a fixed point; the calls in the inputs and in those assignments.
    """
    feeding = list(inputs)
    wanted = {name.split(".")[0] for name in _loads(inputs)}
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
    return [_called(node) for root in feeding for node in ast.walk(root)
            if isinstance(node, ast.Call)]


def _launch_flow(launches: list[ast.Call], assignments: list[tuple[set[str], list[ast.AST]]]) -> (
    tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]
):
    """(kernels launched with ``k[grid](...)``, calls whose results reach a launch, and
    those of them that size it: grid, block sizes, warps)."""
    if not launches:
        return (), (), ()
    kernels = [_called(call) for call in launches]
    everything = [i for c in launches
                  for i in [c.func.slice, *c.args, *(k.value for k in c.keywords)]]  # type: ignore[attr-defined]
    sizing = [i for call in launches
              for i in [*_size_inputs(call), *_buffer_shapes(call, assignments)]]

    def project(calls: list[str]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for c in calls if c and c not in kernels))

    return (tuple(dict.fromkeys(k for k in kernels if k)),
            project(_calls_feeding(everything, assignments)),
            project(_calls_feeding(sizing, assignments)))


def _uses(node: ast.AST, guards: tuple[tuple[str, bool], ...]) -> Iterator[Use]:
    """The names read and called under ``node``; the branches of an ``if`` and of a
    conditional expression add their condition to the guards."""
    if isinstance(node, (ast.If, ast.IfExp)):
        test = ast.unparse(node.test)
        yield from _uses(node.test, guards)
        body = node.body if isinstance(node.body, list) else [node.body]
        orelse = node.orelse if isinstance(node.orelse, list) else [node.orelse]
        for child in body:
            yield from _uses(child, (*guards, (test, True)))
        for child in orelse:
            yield from _uses(child, (*guards, (test, False)))
        return
    if isinstance(node, ast.Call):
        args = tuple(("*" if isinstance(a, ast.Starred) else "") + ast.unparse(
            a.value if isinstance(a, ast.Starred) else a) for a in node.args)
        keywords = tuple((k.arg, ast.unparse(k.value)) for k in node.keywords if k.arg)
        spread = any(a.startswith("*") for a in args) or any(not k.arg for k in node.keywords)
        name = _called(node)
        if name:
            yield Use(name, guards, True, args, keywords, spread)
    elif isinstance(node, (ast.Attribute, ast.Name)) and isinstance(node.ctx, ast.Load):
        name = dotted(node)
        if name:
            yield Use(name, guards)
    for inner in ast.iter_child_nodes(node):
        yield from _uses(inner, guards)


def index_branching(node: ast.FunctionDef | ast.AsyncFunctionDef) -> Branching:
    """What a jit function's branches depend on: its parameters, their literal defaults,
    the names its body assigns, and every name it uses with the conditions guarding it."""
    arguments = node.args
    positional = [a.arg for a in [*arguments.posonlyargs, *arguments.args]]
    defaults = list(zip(positional[len(positional) - len(arguments.defaults):],
                        arguments.defaults, strict=True))
    defaults += [(a.arg, d) for a, d in zip(arguments.kwonlyargs, arguments.kw_defaults,
                                           strict=True) if d is not None]
    inner = [child for statement in node.body for child in ast.walk(statement)]
    rebound = {child.id for child in inner
               if isinstance(child, ast.Name) and not isinstance(child.ctx, ast.Load)}
    rebound |= {child.arg for child in inner if isinstance(child, ast.arg)}  # nested defs
    roots = [*node.decorator_list, arguments, *node.body]
    return Branching(
        params=(*positional, *(a.arg for a in arguments.kwonlyargs)),
        positional=len(positional),
        defaults=tuple((name, ast.unparse(value)) for name, value in defaults),
        rebound=tuple(sorted(rebound)),
        uses=tuple(dict.fromkeys(use for root in roots for use in _uses(root, ()))),
    )


@functools.lru_cache(maxsize=1024)
def index_source(source: str) -> Branching | None:
    """The branching of a jit function's text, or None when it does not parse (then
    every branch is followed)."""
    try:
        node = ast.parse(textwrap.dedent(source)).body[0]
    except (SyntaxError, ValueError, IndexError):
        return None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return index_branching(node)


def _docstring(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> tuple[int, int]:
    """The line span of the docstring of ``node``, or (0, 0)."""
    first = node.body[0] if node.body else None
    if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)):
        return first.lineno, first.end_lineno or first.lineno
    return 0, 0


def _function(node: ast.FunctionDef | ast.AsyncFunctionDef, qualname: str, kind: str,
              start: int, lines: list[str], aliases: Mapping[str, Import]) -> Definition:
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
    launched, feeds, sizes = _launch_flow(launches, assignments)
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    jit = is_kernel(node, aliases)
    decorated = "@triton.jit " if jit else ""
    header = _short(f"{decorated}{prefix} {node.name}({ast.unparse(node.args)})")
    return Definition(
        qualname=qualname, kind=kind, start=start, end=node.end_lineno or node.lineno,
        line=node.lineno, header=header, jit=jit,
        names=tuple(dict.fromkeys(names)),
        calls=tuple(dict.fromkeys(c for c in calls if c)),
        launches=launched, feeds=feeds, sizes=sizes, doc=_docstring(node),
        source="\n".join(lines[start - 1:node.end_lineno or node.lineno]) if jit else "",
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
    lines = text.splitlines()
    aliases = import_aliases(tree)
    definitions: list[Definition] = []
    imports: list[tuple[str, Import]] = []
    import_lines: list[int] = []
    for node in _containers(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            definitions.append(_function(node, node.name, "function", _start(node), lines,
                                         aliases))
        elif isinstance(node, ast.ClassDef):
            bases = ", ".join(ast.unparse(base) for base in node.bases)
            header = _short(f"class {node.name}({bases})" if bases else f"class {node.name}")
            definitions.append(Definition(
                node.name, "class", _start(node), node.end_lineno or node.lineno, node.lineno,
                header, names=tuple(dict.fromkeys(_loads([*node.bases, *node.decorator_list]))),
                doc=_docstring(node), bases=tuple(dotted(base) for base in node.bases),
            ))
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    definitions.append(_function(item, f"{node.name}.{item.name}", "method",
                                                 _start(item), lines, aliases))
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
