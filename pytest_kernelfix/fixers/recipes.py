"""Deterministic fixes for well-known Triton failures, without a model.

Each recipe is recognised from the error (type and message) and rewrites the whole
source text; the edits sent to the loop are the changed lines of that rewrite, copied
from the file byte for byte and grown with context until each is unique, so they match
at the exact level. Recipes run in CI without keys and are the fallback when no model
is configured.
"""

from __future__ import annotations

import ast
import difflib
import io
import json
import re
import threading
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeGuard

from pytest_kernelfix.capture.errors import ErrorInfo
from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.fixers.base import FixerError, Proposal, ProposalRequest, Usage
from pytest_kernelfix.kernels import Function, kernel_functions
from pytest_kernelfix.locate.context import BugContext, SourceFile

#: Recipes cover a few mechanical bugs; the rest need a model.
_ASK_A_MODEL = "; pass --kernelfix-model to ask an LLM"

SOURCE = "recipes"
_MAX_POWER = 4


@dataclass(frozen=True)
class Recipe:
    """``rewrite`` returns the fixed text of a file (the same text: nothing to do)."""

    name: str
    applies: Callable[[ErrorInfo], bool]
    rewrite: Callable[[str, str, BugContext], str]
    reason: str


class RecipeFixer:
    """Propose the first recipe that fits the error; once per bug, then give up."""

    name = SOURCE
    free = True  # offline rewrites, no model

    def __init__(self) -> None:
        self._proposed: set[str] = set()
        self._lock = threading.Lock()

    def propose(self, request: ProposalRequest) -> Proposal:
        context = request.context
        with self._lock:
            if context.group_id in self._proposed:
                raise FixerError(f"no recipe for {context.error.headline} (already proposed "
                                 f"once){_ASK_A_MODEL}")
        files = request.files or context.editable
        for recipe in RECIPES:
            if not recipe.applies(context.error):
                continue
            modifications = [
                modification
                for source in files
                for modification in file_modifications(source, recipe, context)
            ]
            if modifications:
                with self._lock:
                    self._proposed.add(context.group_id)
                return _proposal(recipe, tuple(modifications))
        raise FixerError(f"no recipe for {context.error.headline}{_ASK_A_MODEL}")


def file_modifications(
    source: SourceFile, recipe: Recipe, context: BugContext
) -> list[Modification]:
    try:
        fixed = recipe.rewrite(source.text, source.path, context)
    except (SyntaxError, ValueError):
        return []
    if fixed == source.text:
        return []
    return line_edits(source.path, source.text, fixed, recipe.reason)


def _proposal(recipe: Recipe, modifications: tuple[Modification, ...]) -> Proposal:
    analysis = f"recipe {recipe.name}: {recipe.reason}"
    raw = json.dumps(
        {
            "analysis": analysis,
            "modifications": [
                {"file": m.file, "old_string": m.old_string, "new_string": m.new_string,
                 "reason": m.reason, "replace_all": m.replace_all, "anchor": m.anchor}
                for m in modifications
            ],
            "summary": recipe.reason,
        },
        indent=2,
    )
    return Proposal(modifications, raw, analysis, usage=Usage(), source=SOURCE,
                    origin=f"the offline recipe {recipe.name}; no model was asked")


# --- edits from a rewrite -------------------------------------------------------------


def line_edits(path: str, old: str, new: str, reason: str) -> list[Modification]:
    """Search/replace edits turning ``old`` into ``new``: whole lines, each unique in ``old``."""
    old_lines, new_lines = _lines(old), _lines(new)
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    hunks = [
        _grow_until_unique(old, old_lines, i1, i2, j1, j2)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]
    merged: list[tuple[int, int, int, int]] = []
    for hunk in hunks:
        if merged and hunk[0] <= merged[-1][1]:
            last = merged.pop()
            hunk = (last[0], max(last[1], hunk[1]), last[2], max(last[3], hunk[3]))
        merged.append(hunk)
    edits = [
        Modification("".join(old_lines[i1:i2]), "".join(new_lines[j1:j2]), reason, file=path)
        for i1, i2, j1, j2 in merged
    ]
    if _apply(old, edits) != new:  # cannot happen for unique chunks; never send a wrong edit
        return [Modification(old, new, reason, file=path)]
    return edits


def _grow_until_unique(
    text: str, lines: list[str], i1: int, i2: int, j1: int, j2: int
) -> tuple[int, int, int, int]:
    """Add equal lines around a hunk until its old text is non-blank and occurs once."""
    before = True
    while True:
        chunk = "".join(lines[i1:i2])
        if chunk.strip() and text.count(chunk) == 1:
            return i1, i2, j1, j2
        can_before, can_after = i1 > 0, i2 < len(lines)
        if not (can_before or can_after):
            return i1, i2, j1, j2
        if can_before and (before or not can_after):
            i1, j1 = i1 - 1, j1 - 1
        else:
            i2, j2 = i2 + 1, j2 + 1
        before = not before


def _apply(text: str, edits: list[Modification]) -> str:
    for edit in edits:
        if text.count(edit.old_string) != 1:
            return ""
        text = text.replace(edit.old_string, edit.new_string, 1)
    return text


def _lines(text: str) -> list[str]:
    """Lines with their endings, split where Python's parser splits them."""
    return io.StringIO(text, newline="").readlines()


# --- source helpers -------------------------------------------------------------------


def language_aliases(text: str) -> tuple[str, ...]:
    """Names under which ``triton.language`` is imported (``tl`` in nearly every file)."""
    found = re.findall(r"import\s+triton\.language\s+as\s+(\w+)", text)
    found += re.findall(r"from\s+triton\s+import\s+language\s+as\s+(\w+)", text)
    return tuple(dict.fromkeys([*found, "tl"]))


def code_mask(text: str) -> str:
    """``text`` with strings and comments blanked (same length), so scans see only code."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return text
    starts = _Offsets(text).starts
    chars = list(text)
    for token in tokens:
        if token.type not in (tokenize.STRING, tokenize.COMMENT):
            continue
        begin = starts[token.start[0] - 1] + token.start[1]
        end = starts[token.end[0] - 1] + token.end[1]
        for index in range(begin, min(end, len(chars))):
            if chars[index] not in "\r\n":
                chars[index] = " "
    return "".join(chars)


def matching_paren(masked: str, open_index: int) -> int | None:
    depth = 0
    for index in range(open_index, len(masked)):
        char = masked[index]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return index
    return None


def rewrite_calls(
    text: str, pattern: re.Pattern[str], build: Callable[[re.Match[str], str], str]
) -> str:
    """Replace every call matched by ``pattern`` (which ends at the ``(``), innermost too."""
    masked = code_mask(text)
    out: list[str] = []
    position = 0
    for match in pattern.finditer(masked):
        if match.start() < position:
            continue
        close = matching_paren(masked, match.end() - 1)
        if close is None:
            continue
        argument = rewrite_calls(text[match.end():close], pattern, build)
        out.append(text[position:match.start()])
        out.append(build(match, argument))
        position = close + 1
    out.append(text[position:])
    return "".join(out)


def _alias_pattern(text: str, attribute: str) -> re.Pattern[str]:
    aliases = "|".join(re.escape(alias) for alias in language_aliases(text))
    return re.compile(rf"(?<![\w.])(?P<alias>{aliases})\s*\.\s*{attribute}\s*\(")


def _atom(expression: str) -> str:
    """``expression`` as an operand: bare when it is a name or number, else parenthesised."""
    stripped = expression.strip()
    if re.fullmatch(r"[\w.]+", stripped):
        return stripped
    if stripped.startswith("(") and matching_paren(code_mask(stripped), 0) == len(stripped) - 1:
        return stripped
    return f"({stripped})"


class _Offsets:
    """Maps the ast's (line, UTF-8 byte column) positions to offsets into the text."""

    def __init__(self, text: str) -> None:
        self.lines = _lines(text)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def __call__(self, lineno: int, byte_col: int) -> int:
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode()[:byte_col].decode(errors="ignore"))

    def span(self, node: ast.expr | ast.arg) -> tuple[int, int]:
        end_lineno = node.end_lineno or node.lineno
        return self(node.lineno, node.col_offset), self(end_lineno, node.end_col_offset or 0)


def _is_language_call(node: ast.AST, attribute: str, aliases: set[str]) -> TypeGuard[ast.Call]:
    """Whether ``node`` calls ``tl.<attribute>`` (under any alias of triton.language)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attribute
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id in aliases
    )


def _splice(text: str, spans: list[tuple[int, int, str]]) -> str:
    for start, end, replacement in sorted(spans, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


# --- the recipes ----------------------------------------------------------------------


#: How a missing ``tl`` attribute arrives: raised by the interpreter, or met by the GPU
#: compiler (whose CompilationError carries the AttributeError in its message).
_ATTRIBUTE_ERRORS = ("AttributeError", "CompilationError")


def _missing_attribute(*names: str) -> Callable[[ErrorInfo], bool]:
    def applies(error: ErrorInfo) -> bool:
        return error.type in _ATTRIBUTE_ERRORS and any(
            f"has no attribute '{name}'" in error.message for name in names
        )

    return applies


def rewrite_tanh(text: str, path: str = "", context: BugContext | None = None) -> str:
    """``tl.tanh(E)`` and ``tl.math.tanh(E)`` become ``(2 * tl.sigmoid(2 * E) - 1)``."""
    pattern = _alias_pattern(text, r"(?:math\s*\.\s*)?tanh")
    return rewrite_calls(
        text,
        pattern,
        lambda match, argument: f"(2 * {match['alias']}.sigmoid(2 * {_atom(argument)}) - 1)",
    )


def rewrite_math_minmax(text: str, path: str = "", context: BugContext | None = None) -> str:
    """``tl.math.max/min(a, b)`` (removed in Triton 3) become ``tl.maximum/minimum(a, b)``."""
    for old, new in (("max", "maximum"), ("min", "minimum")):

        def build(match: re.Match[str], argument: str, new: str = new) -> str:
            return f"{match['alias']}.{new}({argument})"

        text = rewrite_calls(text, _alias_pattern(text, rf"math\s*\.\s*{old}"), build)
    return text


def rewrite_integer_powers(text: str, path: str = "", context: BugContext | None = None) -> str:
    """``E ** n`` and ``tl.pow(E, n)`` (n = 2..4) inside kernels become ``(E * E ...)``."""
    for _ in range(8):  # nested powers: rewrite, parse again
        spans = _power_spans(text)
        if not spans:
            break
        text = _splice(text, spans)
    return text


def _power_spans(text: str) -> list[tuple[int, int, str]]:
    tree = ast.parse(text)
    offsets = _Offsets(text)
    aliases = set(language_aliases(text))
    spans: list[tuple[int, int, str]] = []
    for function in kernel_functions(tree):
        for node in ast.walk(function):
            if not isinstance(node, (ast.BinOp, ast.Call)):
                continue
            base: ast.expr | None = None
            exponent: ast.expr | None = None
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
                base, exponent = node.left, node.right
            elif (
                _is_language_call(node, "pow", aliases)
                and len(node.args) == 2
                and not node.keywords
            ):
                base, exponent = node.args
            power = _small_power(exponent)
            if base is None or isinstance(base, ast.Constant) or not power:
                continue
            start, end = offsets.span(node)
            operand = ast.get_source_segment(text, base) or ""
            if not isinstance(base, (ast.Name, ast.Attribute)):
                operand = f"({operand})"
            spans.append((start, end, "(" + " * ".join([operand] * power) + ")"))
    return _outermost(spans)


def _small_power(node: ast.expr | None) -> int:
    """The exponent when it is an integer literal from 2 to 4, else 0."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value if 2 <= node.value <= _MAX_POWER else 0
    return 0


def _outermost(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Drop spans nested in others (they are rewritten on the next pass)."""
    kept: list[tuple[int, int, str]] = []
    for span in sorted(spans, key=lambda s: (s[0], -s[1])):
        if kept and span[0] < kept[-1][1]:
            continue
        kept.append(span)
    return kept


def rewrite_arange_constexpr(text: str, path: str = "", context: BugContext | None = None) -> str:
    """Annotate kernel parameters used in ``tl.arange`` bounds as ``tl.constexpr``.

    Only the kernels on the failing traceback are changed when they can be told apart.
    """
    tree = ast.parse(text)
    offsets = _Offsets(text)
    aliases = language_aliases(text)
    functions = list(kernel_functions(tree))
    failing = [f for f in functions if _on_traceback(f, path, context)]
    spans: list[tuple[int, int, str]] = []
    for function in failing or functions:
        for argument in _arange_parameters(function, set(aliases)):
            start, end = offsets.span(argument)
            replacement = f"{argument.arg}: {aliases[0]}.constexpr"
            if text[end:end + 1] == "=":  # PEP 8 wants spaces around = with an annotation
                replacement += " "
                if text[end + 1:end + 2] != " ":
                    spans.append((end + 1, end + 1, " "))
            spans.append((start, end, replacement))
    return _splice(text, spans)


def _arange_parameters(function: Function, aliases: set[str]) -> list[ast.arg]:
    parameters = {
        arg.arg: arg
        for arg in [*function.args.posonlyargs, *function.args.args, *function.args.kwonlyargs]
        if arg.annotation is None or "constexpr" not in ast.unparse(arg.annotation)
    }
    used: dict[str, ast.arg] = {}
    for node in ast.walk(function):
        if _is_language_call(node, "arange", aliases):
            for bound in [*node.args, *(keyword.value for keyword in node.keywords)]:
                for name in ast.walk(bound):
                    if isinstance(name, ast.Name) and name.id in parameters:
                        used[name.id] = parameters[name.id]
    return list(used.values())


def _on_traceback(function: Function, path: str, context: BugContext | None) -> bool:
    if context is None or not path:
        return False
    end = function.end_lineno or function.lineno
    return any(
        (frame.path == path or frame.path.endswith("/" + path))
        and function.lineno <= frame.lineno <= end
        for frame in context.error.frames
    )


RECIPES: tuple[Recipe, ...] = (
    Recipe(
        "tanh",
        _missing_attribute("tanh"),
        rewrite_tanh,
        "triton.language has no tanh in Triton 3.x: tanh(x) = 2 * sigmoid(2 * x) - 1",
    ),
    Recipe(
        "math-max-min",
        _missing_attribute("max", "min"),
        rewrite_math_minmax,
        "tl.math.max/min were removed in Triton 3.x: use tl.maximum/tl.minimum",
    ),
    Recipe(
        "arange-constexpr",
        lambda error: "arguments must be of type tl.constexpr" in error.message,
        rewrite_arange_constexpr,
        "tl.arange bounds must be compile-time: annotate the block size as tl.constexpr",
    ),
    Recipe(
        "integer-power",
        lambda error: "for ** or pow()" in error.message
        or (error.type in _ATTRIBUTE_ERRORS and "has no attribute 'pow'" in error.message),
        rewrite_integer_powers,
        "Triton tensors support neither ** nor tl.pow: multiply small integer powers out",
    ),
)
