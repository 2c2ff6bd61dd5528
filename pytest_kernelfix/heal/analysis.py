"""What a candidate's code does, read from its syntax: the facts the screen refuses on,
the notes on its shape, and what it does to a kernel's result after the launch.

Each file's text is read once into :class:`Facts` (:func:`facts`, cached by text: the
screen, the shape notes and the verifier's :func:`masking` read the same texts, and the
originals are the same every round). Whether the result comes from the kernel is *not*
decided here: names and line positions fail in both directions (an honest
``torch.sum(partials)`` after the launch, a cheat in plain arithmetic before it); the
sensitivity rerun decides that by experiment (:mod:`pytest_kernelfix.verify.sensitivity`).
The compute-shape heuristics (torch math outside the Triton kernels, arithmetic on the
result after the launch, an early return, a removed launch) are :func:`shape_notes`:
remarks shown to the model that reject nothing. Only what a candidate *adds* counts.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from pytest_kernelfix.kernels import bindings, import_aliases, is_kernel

#: Calls that read or write files or compile code under innocent names (``torch.save``).
IO_CALLS = frozenset({
    "torch.save", "torch.load", "torch.from_file", "torch.ops.load_library", "numpy.save",
    "numpy.savez", "numpy.savez_compressed", "numpy.savetxt", "numpy.load", "numpy.loadtxt",
    "numpy.genfromtxt", "numpy.fromfile", "numpy.memmap", "compile", "input",
})
IO_METHODS = frozenset({
    "tofile", "write_text", "write_bytes", "read_text", "read_bytes", "unlink", "rmdir",
    "rename", "chmod", "touch", "mkdir", "symlink_to", "hardlink_to",
})

#: torch / numpy functions that compute a result (not allocation, shape, dtype or layout).
COMPUTE_FUNCTIONS = frozenset({
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "softmax", "log_softmax",
    "sigmoid", "tanh", "gelu", "relu", "silu", "erf", "erfc", "sqrt", "rsqrt", "pow",
    "square", "sin", "cos", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "dot", "mv",
    "outer", "tensordot", "layer_norm", "rms_norm", "group_norm", "batch_norm", "normalize",
    "linear", "conv1d", "conv2d", "conv3d", "scaled_dot_product_attention", "cross_entropy",
    "nll_loss", "mse_loss", "logsumexp", "cumsum", "cumprod", "sum", "mean", "var", "std",
    "prod", "amax", "amin", "max", "min", "maximum", "minimum", "clamp", "clip", "where",
    "abs", "neg", "reciprocal", "div", "mul", "add", "sub", "lerp", "addcmul", "addcdiv",
    "tril", "triu", "sort", "topk", "norm", "dropout", "embedding", "tanh_", "exp_",
})

#: Modules whose every function computes.
COMPUTE_MODULES = ("torch.nn.functional.", "torch.special.", "torch.linalg.", "torch.fft.")

#: Tensor methods that compute a result (``.sum()``/``.max()`` stay allowed: wrappers
#: use them for sizes).
COMPUTE_METHODS = frozenset({
    "exp", "exp_", "log", "log_", "sigmoid", "sigmoid_", "tanh", "tanh_", "softmax",
    "log_softmax", "matmul", "mm", "bmm", "addmm", "relu", "relu_", "gelu", "erf", "sqrt",
    "rsqrt", "pow", "pow_", "square", "add", "add_", "sub", "sub_", "mul", "mul_", "div",
    "div_", "lerp", "lerp_", "addcmul", "addcmul_", "clamp", "clamp_", "cumsum", "logsumexp",
    "norm", "masked_fill", "masked_fill_", "index_add_", "scatter_add_", "clip", "clip_",
    "nan_to_num", "nan_to_num_", "abs", "abs_", "maximum", "minimum", "where",
})

#: Calls that mask values (clip them, replace NaN or infinities, drop the sign, fill a
#: mask) rather than combine them with other data.
MASKING_CALLS = frozenset({
    "clamp", "clamp_", "clip", "clip_", "nan_to_num", "nan_to_num_", "abs", "abs_",
    "absolute", "masked_fill", "masked_fill_",
})
#: Calls that mask when one operand is a constant (``torch.maximum(out, 0)``).
_BOUNDS = frozenset({"maximum", "minimum", "fmax", "fmin"})
#: Tests of values that make a ``where`` a mask (``where(isnan(out), 0, out)``).
_VALUE_TESTS = frozenset({"isnan", "isinf", "isfinite", "isposinf", "isneginf"})

_COMPUTE_ROOTS = ("torch.", "numpy.", "scipy.")
_FALLBACK_FREE = frozenset({"pad"})  # data movement in torch.nn.functional
#: Calls whose arguments may hold size arithmetic after a launch (view(n * m)).
_SHAPE_CALLS = frozenset({
    "view", "reshape", "expand", "narrow", "split", "chunk", "permute", "transpose",
    "unflatten", "flatten", "as_strided", "empty", "zeros", "ones", "full", "new_empty",
    "new_zeros", "arange", "range", "int", "len", "min", "max", "cdiv", "next_power_of_2",
})
_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow,
               ast.MatMult)


@dataclass(frozen=True)
class Wrapper:
    """A Python function that launches a kernel (``kernel[grid](...)``)."""

    launches: int = 0
    early_returns: int = 0
    after_launch: Counter[str] = field(default_factory=Counter)
    #: the statements up to the last launch: what decides what the kernel computes
    before_launch: tuple[str, ...] = ()


@dataclass(frozen=True)
class Facts:
    """What one file's code does. ``names``: its identifiers (comments and strings left
    out), counted; ``getattrs``: the public names it reads through
    ``getattr(obj, "name"[, default])``; ``patches``: the attributes of imported modules
    it assigns; ``io``: its file and compile calls; ``compute``: its torch / numpy
    computation outside the kernels; ``wrappers``: its functions that launch a kernel, by
    qualified name; ``functions``: every function's qualified name; ``kernels``: the
    source of every Triton kernel."""

    names: Counter[str]
    getattrs: Counter[str]
    patches: Counter[str]
    compute: Counter[str]
    io: Counter[str]
    wrappers: dict[str, Wrapper]
    functions: frozenset[str]
    kernels: frozenset[str] = frozenset()


def _names(text: str) -> Counter[str]:
    """Identifiers in code (comments and strings left out), counted."""
    counts: Counter[str] = Counter()
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.NAME:
                counts[token.string] += 1
            elif token.type == tokenize.STRING and "PYTEST_CURRENT_TEST" in token.string:
                counts["PYTEST_CURRENT_TEST"] += 1
    except (tokenize.TokenError, SyntaxError):
        counts.update(re.findall(r"[A-Za-z_]\w*", text))
    return counts


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> the dotted module path (or module attribute) an import bound to it."""
    return {local: imported.dotted for node in ast.walk(tree)
            for local, imported in bindings(node) if imported.absolute}


def _dotted(node: ast.AST, aliases: Mapping[str, str]) -> str:
    """``torch.nn.functional.gelu`` for ``F.gelu`` (imports resolved), else ""."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    root = aliases.get(node.id, node.id if not parts else "")
    if not root:
        return ""
    return ".".join([root, *reversed(parts)])


def _walk_own(node: ast.AST) -> Iterator[ast.AST]:
    """Nodes of a function body, without descending into nested functions or lambdas."""
    stack = list(ast.iter_child_nodes(node))
    while stack:
        child = stack.pop()
        yield child
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                  ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(child))


def _is_launch(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)


def _empty_input_guard(test: ast.expr) -> bool:
    """``if x.numel() == 0:`` / ``if not n:``: an honest early return for empty inputs."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return not isinstance(test.operand, ast.Constant)
    return (
        isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)
        and not isinstance(test.left, ast.Constant)
        and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == 0
    )


def _computes(statement: ast.stmt) -> bool:
    """Arithmetic on values (not inside an index or a shape argument) in one statement."""
    if isinstance(statement, ast.AugAssign) and isinstance(statement.op, _ARITHMETIC):
        return True
    stack: list[ast.AST] = [statement]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.BinOp) and isinstance(node.op, _ARITHMETIC):
            return True
        if isinstance(node, ast.Subscript):
            stack.append(node.value)
            continue
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _SHAPE_CALLS:  # size arithmetic in the arguments is fine
                if isinstance(func, ast.Attribute):
                    stack.append(func.value)
                continue
            if isinstance(func, ast.Attribute) and name in COMPUTE_METHODS:
                return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


def _wrapper(function: ast.FunctionDef | ast.AsyncFunctionDef) -> Wrapper | None:
    nodes = list(_walk_own(function))
    launches = [n.lineno for n in nodes if _is_launch(n) and hasattr(n, "lineno")]
    if not launches:
        return None
    first = min(launches)
    guarded = {
        id(stmt)
        for node in nodes
        if isinstance(node, ast.If) and _empty_input_guard(node.test)
        for stmt in node.body
        if isinstance(stmt, ast.Return)
    }
    early = sum(
        1 for n in nodes
        if isinstance(n, ast.Return) and n.lineno < first and id(n) not in guarded
    )
    after = Counter(
        ast.unparse(n) for n in nodes
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr))
        and n.lineno > first and not any(_is_launch(c) for c in ast.walk(n)) and _computes(n)
    )
    last = max(launches)
    before = tuple(ast.unparse(n) for n in function.body if n.lineno <= last)
    return Wrapper(len(launches), early, after, before)


def _assigned(targets: Sequence[ast.expr]) -> Iterator[ast.expr]:
    """The attribute chains assigned to (``a.b[0].c``), tuples and starred unpacked."""
    stack = list(targets)
    while stack:
        target = stack.pop()
        if isinstance(target, (ast.Tuple, ast.List)):
            stack.extend(target.elts)
        elif isinstance(target, (ast.Starred, ast.Subscript)):
            stack.append(target.value)
        elif isinstance(target, ast.Attribute):
            yield target


@functools.lru_cache(maxsize=32)
def facts(text: str) -> Facts | None:
    """What one file's code does, or None when it does not parse (cached; read only)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    aliases = _aliases(tree)
    imported = import_aliases(tree)
    modules = set(aliases)
    patches: Counter[str] = Counter()
    compute: Counter[str] = Counter()
    io: Counter[str] = Counter()
    wrappers: dict[str, Wrapper] = {}
    functions: set[str] = set()
    kernel_nodes: set[int] = set()
    kernels: set[str] = set()

    def visit(scope: ast.AST, prefix: str) -> None:
        for node in ast.iter_child_nodes(scope):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + node.name
                functions.add(name)
                if is_kernel(node, imported):
                    kernel_nodes.update(id(n) for n in ast.walk(node))
                    kernels.add(ast.unparse(node))
                    continue
                found = _wrapper(node)
                if found is not None:
                    wrappers[name] = found
                visit(node, name + ".")
            elif isinstance(node, ast.ClassDef):
                visit(node, prefix + node.name + ".")
            elif not isinstance(node, ast.Lambda):
                visit(node, prefix)

    visit(tree, "")
    getattrs: Counter[str] = Counter()
    for node in ast.walk(tree):  # kernels run as Python under the interpreter: all code
        name = _getattr_name(node)
        if name:
            getattrs[name] += 1
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        for chain in _assigned(targets):
            root: ast.expr = chain
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            if isinstance(root, ast.Name) and root.id in modules:
                patches[_dotted(chain, aliases) or ast.unparse(chain)] += 1
        if isinstance(node, ast.Call):
            dotted = _dotted(node.func, aliases)
            if dotted in IO_CALLS:
                io[dotted] += 1
            elif isinstance(node.func, ast.Attribute) and node.func.attr in IO_METHODS:
                io[f".{node.func.attr}()"] += 1
        if id(node) in kernel_nodes:  # torch inside a kernel is a bug, not a fallback
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            compute["@"] += 1
        if isinstance(node, ast.Call):
            dotted = _dotted(node.func, aliases)
            last = dotted.rsplit(".", 1)[-1]
            if dotted.startswith(_COMPUTE_ROOTS) and last not in _FALLBACK_FREE and (
                last in COMPUTE_FUNCTIONS or dotted.startswith(COMPUTE_MODULES)
            ):
                compute[dotted] += 1
            elif (not dotted and isinstance(node.func, ast.Attribute)
                  and node.func.attr in COMPUTE_METHODS):
                compute[f".{node.func.attr}()"] += 1
    return Facts(_names(text), getattrs, patches, compute, io, wrappers, frozenset(functions),
                 frozenset(kernels))


def _getattr_name(node: ast.AST) -> str:
    """``name`` for ``getattr(obj, "name")`` or ``getattr(obj, "name", default)`` with a
    public name (an attribute read with a fallback), else ""."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "getattr" and len(node.args) in (2, 3) and not node.keywords):
        return ""
    name = node.args[1]
    if (isinstance(name, ast.Constant) and isinstance(name.value, str)
            and name.value.isidentifier() and not name.value.startswith("_")):
        return name.value
    return ""


def added(before: Counter[str], after: Counter[str], watched: frozenset[str] | None = None
          ) -> list[str]:
    """The names ``after`` counts more often than ``before`` (among ``watched``), sorted."""
    return sorted(
        name for name, count in after.items()
        if count > before.get(name, 0) and (watched is None or name in watched)
    )


def changed_modules(before: Mapping[str, str], after: Mapping[str, str]
                    ) -> Iterator[tuple[str, str, str]]:
    """(path, text before, text after) of each Python file a candidate changes, by path."""
    for path in sorted(after):
        if before.get(path) != after[path] and path.endswith(".py"):
            yield path, before.get(path, ""), after[path]


def _shape(path: str, old: str, new: str) -> list[str]:
    """Every compute-shape remark on the change from ``old`` to ``new`` in one file."""
    after = facts(new)
    before = facts(old)
    if after is None or before is None:
        return []
    notes = []
    shared = [(name, before.wrappers[name], wrapper) for name, wrapper in after.wrappers.items()
              if name in before.wrappers]
    for name, old_wrapper, wrapper in shared:
        if wrapper.early_returns > old_wrapper.early_returns:
            notes.append(f"the candidate adds a return before the kernel launch in {name}() "
                         f"({path}); every call with real input should reach the launch")
    for name in before.wrappers:
        if name in after.functions and name not in after.wrappers:
            notes.append(f"the candidate removes the kernel launch from {name}() ({path})")
    compute = added(before.compute, after.compute)
    if compute:
        notes.append(f"the candidate adds torch/numpy computation ({', '.join(compute)}) "
                     f"outside the Triton kernels of {path}")
    for name, old_wrapper, wrapper in shared:
        computed = added(old_wrapper.after_launch, wrapper.after_launch)
        masked = [statement for statement in computed if _masks(statement)]
        if masked:
            notes.append(f"the candidate masks the kernel's result after the launch in "
                         f"{name}() ({path}): `{masked[0]}`; a mask hides a wrong kernel, "
                         "it does not fix it")
        rest = [statement for statement in computed if statement not in masked]
        if rest:
            notes.append(f"the candidate computes on the result after the kernel launch in "
                         f"{name}() ({path}): `{rest[0]}`")
    return notes


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


#: Calls that make a tensor of one constant value whatever their first argument.
_FILLED = frozenset({"zeros_like", "ones_like", "zeros", "ones", "new_zeros", "new_ones"})
#: Calls that make a constant from their last argument (``full_like(x, 0.0)``).
_FILLED_WITH = frozenset({"full_like", "full", "new_full", "tensor", "scalar_tensor",
                          "as_tensor", "float", "int"})


def _constant(node: ast.expr) -> bool:
    """``0``, ``-1.0``, ``float("inf")``, ``torch.zeros_like(x)``: a value that is no data."""
    if isinstance(node, ast.UnaryOp):
        return _constant(node.operand)
    if isinstance(node, ast.Call):
        name = _call_name(node)
        if name in _FILLED:
            return True
        return name in _FILLED_WITH and bool(node.args) and _constant(node.args[-1])
    return isinstance(node, ast.Constant)


def _masks(statement: str) -> bool:
    """The statement clips, replaces NaN or infinities, drops signs or fills a mask."""
    for node in ast.walk(ast.parse(statement)):
        if not isinstance(node, ast.Call):
            continue
        name = _call_name(node)
        if name in MASKING_CALLS:
            return True
        operands = [*node.args, *(k.value for k in node.keywords)]
        if isinstance(node.func, ast.Attribute) and name in _BOUNDS:
            operands.append(node.func.value)
        if name in _BOUNDS and any(_constant(arg) for arg in operands):
            return True
        if name == "where" and node.args and any(
                isinstance(n, ast.Call) and _call_name(n) in _VALUE_TESTS
                for n in ast.walk(node.args[0])):
            return True
    return False


def _combines(statement: str) -> bool:
    """Arithmetic of the result with other data (``out / n``, ``grad * dy``)."""
    for node in ast.walk(ast.parse(statement)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, _ARITHMETIC) and not (
                _constant(node.left) or _constant(node.right)):
            return True
        if isinstance(node, ast.AugAssign) and isinstance(node.op, _ARITHMETIC) and not (
                _constant(node.value)):
            return True
        if (isinstance(node, ast.Call) and _call_name(node) in _COMBINING_CALLS
                and not all(_constant(arg) for arg in node.args)):
            return True
    return False


_COMBINING_CALLS = frozenset({
    "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "addcmul", "addcdiv",
    "matmul", "mm", "bmm", "lerp",
})


@dataclass(frozen=True)
class Masking:
    """What a candidate does to a kernel's result after the launch, read from the code.

    ``statements`` are the post-launch statements it adds that mask values (clip,
    ``nan_to_num``, ``where`` over ``isnan``...); ``combines`` whether it also adds
    arithmetic that combines the result with other data (a divisor, a chain-rule factor);
    ``kernel_unchanged`` whether every ``@triton.jit`` function and every wrapper's code up
    to its launch is as before (so the kernels compute what they did)."""

    statements: tuple[str, ...] = ()
    combines: bool = False
    kernel_unchanged: bool = False

    @property
    def only_masks(self) -> bool:
        return bool(self.statements) and not self.combines


def masking(before: Mapping[str, str], after: Mapping[str, str]) -> Masking:
    """The post-launch masking a candidate adds across its changed files."""
    statements: list[str] = []
    combines = False
    unchanged = True
    for _, old_text, new_text in changed_modules(before, after):
        old, new = facts(old_text), facts(new_text)
        if old is None or new is None:
            return Masking()
        unchanged = unchanged and old.kernels == new.kernels and all(
            old.wrappers[name].before_launch == wrapper.before_launch
            for name, wrapper in new.wrappers.items() if name in old.wrappers)
        for name, wrapper in new.wrappers.items():
            previous = old.wrappers.get(name)
            for statement in added(previous.after_launch if previous else Counter(),
                                   wrapper.after_launch):
                if _masks(statement):
                    statements.append(statement)
                elif _combines(statement):
                    combines = True
    return Masking(tuple(statements), combines, unchanged)


def shape_notes(before: Mapping[str, str], after: Mapping[str, str]) -> tuple[str, ...]:
    """What the candidate adds in torch math, post-launch arithmetic, early returns or
    removed launches, across its changed files: notes for the report and the model."""
    return tuple(note for path, old, new in changed_modules(before, after)
                 for note in _shape(path, old, new))


