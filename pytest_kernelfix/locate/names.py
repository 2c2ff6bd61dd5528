"""What an error about a name points at: the name, and the lines of a function that
bind or use it, with the branch headers around them.

An ``UnboundLocalError`` raised two hundred lines into a launch wrapper is decided by
an ``if``/``else`` at its top that binds the name on one branch only. A view cut for
length keeps its head, its tail and the lines around the one that raised; the
assignment and the ``else`` that lacks it fall in the cut. :func:`error_names` reads
which name an error is about (``NameError``, ``UnboundLocalError``, ``AttributeError``,
``KeyError``, a ``TypeError`` naming an argument), and :func:`name_lines` finds, in the
function that raised, every line where one of those names is bound, read, passed as a
keyword or used as a key, and the headers of the ``if``/``elif``/``else``, ``for``,
``while``, ``with`` and ``try`` blocks around them, so that a cut keeps those. Pure
functions over text.
"""

from __future__ import annotations

import ast
import functools
import itertools
import re
from collections.abc import Iterable, Iterator, Sequence

from pytest_kernelfix.capture.errors import ErrorInfo

#: What each kind of error says about the name it is about (the quoted name is group 1).
_SAID = {
    "NameError": (r"name '([^']+)' is not defined", r"free variable '([^']+)'"),
    "UnboundLocalError": (r"local variable '([^']+)'", r"free variable '([^']+)'"),
    "AttributeError": (r"has no attribute '([^']+)'", r"attribute '([^']+)' of"),
    "TypeError": (r"unexpected keyword argument '([^']+)'",
                  r"multiple values for (?:keyword )?argument '([^']+)'",
                  r"required (?:positional|keyword-only) arguments?: (.+)$",
                  r"passed as keyword arguments: (.+)$"),
}
#: Lines between two kept ones that are kept too: a cut's marker costs about as much.
SHORT_GAP = 2
_QUOTED = re.compile(r"'([A-Za-z_][A-Za-z0-9_]*)'")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def error_names(error: ErrorInfo) -> tuple[str, ...]:
    """The names ``error`` is about: the variable of a ``NameError`` or an
    ``UnboundLocalError``, the attribute of an ``AttributeError``, the key of a
    ``KeyError`` (when it is a name), the arguments a ``TypeError`` names; else ()."""
    message = error.message.strip().splitlines()[0] if error.message.strip() else ""
    if error.type == "KeyError":
        key = message.strip().strip("'\"")
        return (key,) if _IDENTIFIER.fullmatch(key) else ()
    names: list[str] = []
    for pattern in _SAID.get(error.type, ()):
        found = re.search(pattern, message)
        if found is None:
            continue
        said = found.group(1)
        names += _QUOTED.findall(f"'{said}'" if "'" not in said else said)
    return tuple(dict.fromkeys(name for name in names if _IDENTIFIER.fullmatch(name)))


def _mentions(node: ast.AST, names: frozenset[str]) -> bool:
    """Whether ``node`` itself binds, reads or passes one of ``names`` (a variable, an
    attribute, a parameter, a keyword argument, a key written as a string)."""
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute):
        return node.attr in names
    if isinstance(node, (ast.arg, ast.keyword)):
        return node.arg in names
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in names
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return bool(names.intersection(node.names))
    if isinstance(node, ast.alias):
        return (node.asname or node.name).split(".")[0] in names
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name in names
    return False


#: Blocks whose header says under what a line runs.
_BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try)


def _header(node: ast.stmt) -> range:
    """The lines of a block's header: ``if``/``while`` and its condition, ``for`` and
    its iterable, ``with`` and its items, ``try``."""
    if isinstance(node, (ast.If, ast.While)):
        last = node.test.end_lineno or node.lineno
    elif isinstance(node, (ast.For, ast.AsyncFor)):
        last = node.iter.end_lineno or node.lineno
    elif isinstance(node, (ast.With, ast.AsyncWith)):
        last = max(item.context_expr.end_lineno or node.lineno for item in node.items)
    else:
        last = node.lineno
    return range(node.lineno, last + 1)


def _keyword_line(lines: Sequence[str], before: int, word: str, after: int) -> int:
    """The line of an ``else:`` or ``finally:`` (no node of its own) between line
    ``after`` and the first statement of its block, ``before``; 0 when not found."""
    for number in range(before - 1, after, -1):
        if re.match(rf"{word}\s*:", lines[number - 1].strip()):
            return number
    return 0


def _branch_headers(node: ast.stmt, lines: Sequence[str]) -> Iterator[int]:
    """Every header line of a block and the first line of each of its branches: its own,
    and those of its ``elif``, ``else``, ``except`` and ``finally`` branches (a branch
    that lacks the name is part of the story)."""
    yield from _header(node)
    body = getattr(node, "body", [])
    if body:
        yield body[0].lineno
    end = max((child.end_lineno or child.lineno for child in body), default=node.lineno)
    for handler in getattr(node, "handlers", []):
        yield from range(handler.lineno, handler.body[0].lineno + 1)
        end = handler.end_lineno or handler.lineno
    orelse = getattr(node, "orelse", [])
    if orelse and isinstance(node, ast.If) and len(orelse) == 1 and isinstance(
            orelse[0], ast.If) and orelse[0].col_offset == node.col_offset:
        yield from _branch_headers(orelse[0], lines)  # an elif
    elif orelse:
        found = _keyword_line(lines, orelse[0].lineno, "else", end)
        yield from (found, orelse[0].lineno) if found else ()
        end = max(child.end_lineno or child.lineno for child in orelse)
    final = getattr(node, "finalbody", [])
    if final:
        found = _keyword_line(lines, final[0].lineno, "finally", end)
        yield from (found, final[0].lineno) if found else ()


def _walk(node: ast.AST, outer: tuple[ast.stmt, ...]) -> Iterator[
        tuple[ast.AST, tuple[ast.stmt, ...]]]:
    """Every node under ``node`` with the blocks it sits in, outermost first."""
    for child in ast.iter_child_nodes(node):
        yield child, outer
        inside = (*outer, child) if isinstance(child, _BLOCKS) else outer
        yield from _walk(child, inside)


def _statement_start(node: ast.AST, statements: dict[int, int]) -> int:
    return statements.get(getattr(node, "lineno", 0), getattr(node, "lineno", 0))


@functools.lru_cache(maxsize=64)
def _tree(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def name_lines(text: str, line: int, names: Iterable[str]) -> tuple[int, ...]:
    """In the function of ``text`` that holds ``line`` (the innermost), the lines that
    bind or use one of ``names`` (each with the first line of its statement), the
    headers of the blocks around them with all their branches, and the ``def`` line;
    () when nothing there mentions them or the text does not parse."""
    wanted = frozenset(names)
    tree = _tree(text) if wanted else None
    if tree is None:
        return ()
    owner = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                node.lineno <= line <= (node.end_lineno or node.lineno)) and (
                owner is None or node.lineno > owner.lineno):
            owner = node
    if owner is None:
        return ()
    source = text.splitlines()
    starts: dict[int, int] = {}  # line -> the first line of the simple statement it belongs to
    for statement in ast.walk(owner):
        if isinstance(statement, ast.stmt) and not hasattr(statement, "body"):
            for number in range(statement.lineno, (statement.end_lineno or statement.lineno) + 1):
                starts.setdefault(number, statement.lineno)
    kept: set[int] = set()
    blocks: dict[int, ast.stmt] = {}
    for node, outer in _walk(owner, ()):
        if not _mentions(node, wanted) or not hasattr(node, "lineno"):
            continue
        first = node.lineno
        kept.update(range(first, (getattr(node, "end_lineno", None) or first) + 1))
        kept.add(_statement_start(node, starts))
        blocks.update((id(block), block) for block in outer)
    if not kept:
        return ()
    for block in blocks.values():
        kept.update(_branch_headers(block, source))
    kept.add(owner.lineno)
    end = owner.end_lineno or owner.lineno
    ordered = sorted(number for number in kept if owner.lineno <= number <= end)
    gaps = {number for before, after in itertools.pairwise(ordered)
            if after - before <= SHORT_GAP + 1 for number in range(before + 1, after)}
    return tuple(sorted({*ordered, *gaps}))
