"""What a fixer gets to see about one bug: editable sources, tests, the error log.

Within a budget. A real kernel module runs to a thousand lines, and a model shown
whole files pays for all of them in every round and finds the faulty line less often.
A module over :data:`VIEW_LINES` lines is shown *focused*: the definitions
:mod:`pytest_kernelfix.locate.reach` found (the kernel, its helpers, the wrapper, the
constants and ``triton.Config`` lists they read) in full, each span headed by its line
numbers, and a one-line outline of every other definition. The edits still apply to
the whole file. The first prompt of a bug stays under :data:`PROMPT_BUDGET` characters,
about 6,500 tokens, whatever the module sizes.

What is shown first, and cut last, is decided by each definition's tier
(:attr:`~pytest_kernelfix.locate.reach.Located.tier`), and :func:`fit` makes everything
fit, giving way in a fixed order (docstrings, test sources, outlines, headers, then
code, the last tier first). A stage that wants a definition shown (the code a diff
touched) gives it a low tier: ``replace(item, tier=TIER_FIRST)``, or a new
:class:`~pytest_kernelfix.locate.reach.Located` for it.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pytest_kernelfix.capture.errors import ErrorInfo, Frame
from pytest_kernelfix.capture.logs import clean_log, relative_paths, truncate_log
from pytest_kernelfix.locate.change import ChangeView
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.locate.names import error_names, name_lines
from pytest_kernelfix.locate.outline import Definition, ModuleIndex, parse_module
from pytest_kernelfix.locate.reach import (
    TIER_FIRST,
    TIER_HELPER,
    TIER_KERNEL,
    TIER_REST,
    Located,
    nodeid_qualname,
)
from pytest_kernelfix.locate.signals import expects_raise
from pytest_kernelfix.project import Project
from pytest_kernelfix.redact import redact

#: The whole first prompt (system and user messages), in characters. Kernel code runs
#: about 3.7 characters per token (cl100k_base and o200k_base, measured on liger-kernel
#: prompts by benchmarks/reach_bench.py), so this keeps a prompt under 6,500 tokens.
PROMPT_BUDGET = 24_000
#: Characters per token of these prompts, for the report's token estimate.
CHARS_PER_TOKEN = 3.7
#: What the templates' own text takes (the rules, headings, how the fix is verified), as
#: an estimate: a session measures the prompt it renders and gives back what this leaves
#: unused (:func:`pytest_kernelfix.session.asking.fill_budget`).
RESERVED = 7_000
#: The error log, at most; the test sources: a module shown whole up to TESTS_WHOLE, the
#: failing tests and their helpers up to TESTS_BUDGET (what they give way to), then the
#: failing tests alone up to TESTS_LEAST.
LOG_BUDGET = 4_000
TESTS_WHOLE = 5_000
TESTS_BUDGET = 3_000
#: The failing tests alone, at most, when the launched kernels would be cut otherwise.
TESTS_LEAST = 1_500
#: Modules longer than this are shown focused rather than whole.
VIEW_LINES = 150
#: Outline lines per file, at most (fewer for a file none of whose definitions is shown).
MAX_OUTLINE = 30
MAX_OUTLINE_UNSHOWN = 10


@dataclass(frozen=True)
class SourceFile:
    """A file of the project: ``path`` is relative to the rootdir, with ``/``.

    ``text`` is the whole file. ``view`` is set when the file is shown focused: the
    definitions in ``shown`` in full, each span headed ``# --- lines A-B ---``; the
    ``outline`` then has one line per definition left out. ``cut`` are those of
    ``shown`` cut for length (the outline says which lines are missing).
    """

    path: str
    text: str
    view: str = ""
    outline: tuple[str, ...] = ()
    shown: tuple[str, ...] = ()
    cut: tuple[str, ...] = ()

    @property
    def focused(self) -> bool:
        return bool(self.view)

    @property
    def content(self) -> str:
        """What a prompt shows of the file."""
        return self.view or self.text

    @property
    def lines(self) -> int:
        return _line_count(self.text)


@dataclass(frozen=True)
class BugContext:
    """One bug as a fixer sees it.

    ``editable`` are the only files edits may target; ``tests`` are read-only context.
    Both are views for a prompt (redacted); the healing loop edits the real bytes.
    ``error_log`` is already cleaned, cut and redacted. ``checks`` say in words how a
    candidate will be verified (interpreter run, GPU compile gate) so a prompt can tell
    the model what the checks can and cannot see. ``focus`` holds, per focused file,
    the definitions shown in full (later rounds show the same ones, in the current
    text); ``kernel_frames`` are the traceback frames in editable files (relative
    paths), from which later rounds show the current lines. ``notes`` are what the
    baseline rerun measured about the failure, in words for the prompt (a failing check
    that compares no tensor value, say). ``change`` is the change since the base, and the
    lines whose revert alone makes the test pass (:mod:`pytest_kernelfix.locate.change`).
    """

    group_id: str
    nodeids: tuple[str, ...]
    error: ErrorInfo
    error_log: str
    editable: tuple[SourceFile, ...]
    tests: tuple[SourceFile, ...] = ()
    kernel_lines: tuple[str, ...] = ()
    device: str = "interpret"
    checks: tuple[str, ...] = ()
    focus: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    kernel_frames: tuple[Frame, ...] = ()
    notes: tuple[str, ...] = ()
    change: ChangeView | None = None

    def view(self, path: str, text: str) -> SourceFile:
        """``text`` (the current candidate of ``path``) as this bug shows it: the first
        round's view while it is unchanged, else the same definitions in the new text."""
        symbols = self.focus.get(path)
        for source in self.editable:
            if source.path == path and source.text == text and (
                    not source.focused or source.shown == symbols):
                return source
        return render_source(path, text, symbols) if symbols is not None else (
            SourceFile(path, text))


def project_frames(error: ErrorInfo, project: Project, editable: Sequence[str]) -> (
    tuple[Frame, ...]
):
    """Traceback frames inside editable files, with relative paths, closest to the fault
    last."""
    frames = []
    for frame in error.frames:
        if not project.contains(frame.path):
            continue
        rel = project.relative(frame.path)
        if rel in editable:
            frames.append(Frame(rel, frame.lineno, frame.name, frame.line))
    return tuple(dict.fromkeys(frames))


def _frame_line(frame: Frame, line: str) -> str:
    return f"{frame.path}:{frame.lineno} in {frame.name}: {line}".rstrip(": ")


def kernel_lines(error: ErrorInfo, project: Project, editable: tuple[str, ...]) -> tuple[str, ...]:
    """Traceback lines inside editable files, closest to the fault last."""
    lines = [_frame_line(frame, frame.line) for frame in project_frames(error, project, editable)]
    return tuple(dict.fromkeys(lines))


def current_kernel_lines(context: BugContext, files: Sequence[SourceFile]) -> tuple[str, ...]:
    """The kernel lines of the traceback as they read in ``files`` (the current candidate).

    A line an earlier round changed is shown as it is now, at its current number, so a
    model does not quote text that is gone.
    """
    if not context.kernel_frames:
        return context.kernel_lines
    originals = {source.path: source.text for source in context.editable}
    current = {source.path: source.text for source in files}
    lines = []
    for frame in context.kernel_frames:
        before, now = originals.get(frame.path), current.get(frame.path)
        if before is None or now is None or before == now:
            lines.append(_frame_line(frame, frame.line))
            continue
        number, changed = map_line(before, now, frame.lineno)
        text = now.splitlines()[number - 1].strip() if 0 < number <= now.count("\n") + 1 else ""
        where = Frame(frame.path, number, frame.name)
        lines.append(_frame_line(where, text) + (" (changed by an earlier round)" if changed
                                                 else ""))
    return tuple(dict.fromkeys(lines))


def map_line(before: str, after: str, lineno: int) -> tuple[int, bool]:
    """Where line ``lineno`` of ``before`` is in ``after``, and whether it was changed."""
    old, new = before.splitlines(), after.splitlines()
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    index = lineno - 1
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if i1 <= index < i2 or (i1 == i2 == index):
            if tag == "equal":
                return j1 + (index - i1) + 1, False
            if j2 <= j1:  # deleted: the line that follows it now
                return j1 + 1, True
            line = old[index] if index < len(old) else ""
            best = max(range(j1, j2), key=lambda j: difflib.SequenceMatcher(
                None, line, new[j]).ratio())
            return best + 1, True
    return lineno, False


def error_report(group: BugGroup, project: Project) -> str:
    """The error a fixer sees first: the real exception, its kernel line, then the log.

    The interpreter wraps kernel errors in ``InterpreterError``; the real exception and
    its kernel line are stated up front so they are not lost in a cut log. The log is
    cleaned (:func:`~pytest_kernelfix.capture.errors.clean_log`): relative paths, no plugin or
    interpreter frames, one copy of a wrapped traceback.
    """
    failure = group.first
    roots = project.roots
    others = len(group.failures) - 1
    parts = [f"Test: {failure.nodeid}" + (f" (and {others} more with the same error)"
                                         if others else "")]
    parts.append(f"Error: {relative_paths(failure.error.headline, roots)}")
    located = kernel_lines(failure.error, project, group.editable)
    if located:
        parts.append(f"Raised at: {located[-1]}")
    parts.append("")
    head = "\n".join(parts)
    budget = max(1_000, LOG_BUDGET - len(head))
    parts.append(truncate_log(clean_log(failure.longrepr, roots), head=25, tail=60,
                              max_chars=budget))
    return "\n".join(parts)


def read_source(path: Path) -> str:
    """A project file as text (undecodable bytes replaced)."""
    return path.read_text(encoding="utf-8", errors="replace")


# -- focused views ---------------------------------------------------------------------


def _line_count(text: str) -> int:
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


@dataclass(frozen=True)
class Shape:
    """What a focused view shows besides its definitions' code: the module's import
    header, the constants the definitions read, their docstrings, and the outline of
    what is left out. Each gives way under the budget before any code does (a docstring
    to a one-line marker, an outline to one line, a constant to its outline line, value
    included)."""

    header: bool = True
    constants: bool = True
    docs: bool = True
    outline: bool = True


#: A cut that misses its size (the markers of the pieces it leaves cost characters
#: too) is made again this much deeper; what it frees is given back at the end of fit.
CUT_MARGIN = 200
#: A definition cut in more places than this has one outline line for all of them.
GROUPED_CUTS = 2
#: A docstring of at least this many lines gives way to a marker under the budget.
DOC_LINES = 4
#: A span cut for length keeps at least this many characters, and the lines this close to
#: an anchor (the line that raised, a launch).
MIN_CUT = 400
ANCHOR_LINES = 8


def _spans(index: ModuleIndex, symbols: Sequence[str], shape: Shape) -> list[tuple[int, int]]:
    """Line spans to show for ``symbols``: the imports (only beside a definition: an
    import header alone says nothing), each definition (a method with its class line),
    and the module constants each reads."""
    spans: list[tuple[int, int]] = []
    for name in symbols:
        definition = index.find(name)
        if definition is None:
            continue
        spans.append((definition.start, definition.end))
        if definition.kind == "method":
            owner = index.find(name.split(".")[0])
            if owner is not None:
                spans.append((owner.start, owner.line))
        for used in definition.names if shape.constants else ():
            constant = index.find(used.split(".")[0])
            if constant is not None and constant.kind == "constant":
                spans.append((constant.start, constant.end))
    if spans and shape.header and index.import_span != (0, 0):
        spans.append(index.import_span)
    return spans


def _holes(index: ModuleIndex, symbols: Sequence[str], shape: Shape) -> list[tuple[int, int]]:
    """The docstrings a view leaves out: those of its definitions, of DOC_LINES lines or
    more, once ``shape`` gives them up."""
    if shape.docs:
        return []
    holes = []
    for name in symbols:
        definition = index.find(name)
        if definition is not None and definition.doc[1] - definition.doc[0] + 1 >= DOC_LINES:
            holes.append(definition.doc)
    return sorted(set(holes))


def _merge(spans: list[tuple[int, int]], lines: Sequence[str]) -> list[tuple[int, int]]:
    """Sorted spans, joined when only blank lines lie between them."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged:
            last_start, last_end = merged[-1]
            gap = lines[last_end:start - 1]
            if start <= last_end + 1 or all(not line.strip() for line in gap):
                merged[-1] = (last_start, max(last_end, end))
                continue
        merged.append((start, end))
    return merged


def _covered(definition: Definition, spans: Sequence[tuple[int, int]]) -> bool:
    return any(start <= definition.start and definition.end <= end for start, end in spans)


def _overlaps(definition: Definition, spans: Sequence[tuple[int, int]]) -> bool:
    return any(start <= definition.end and definition.start <= end for start, end in spans)


def render_source(path: str, text: str, symbols: Sequence[str], *,
                  limit: int | None = None, keep: int = 1, shape: Shape = Shape(),
                  order: Sequence[str] = (), anchors: Sequence[int] = (),
                  marked: Sequence[int] = (), spare: Sequence[str] = ()) -> SourceFile:
    """``text`` shown focused on ``symbols`` (qualified names, most important first).

    Over ``limit`` characters the last symbols (all but ``keep``) are left to the
    outline; when those kept are still too long, the longest definitions are cut in the
    middle at line boundaries (in ``order`` when given, else the longest first; never
    those in ``spare``), the lines around each of ``anchors`` and the ``marked`` lines
    kept, and the outline says which lines are missing. A module that does not parse is
    shown whole.
    """
    index = parse_module(text)
    if index.error:
        return SourceFile(path, text)
    lines = text.splitlines()
    kept = list(symbols)
    view = _render(path, text, index, lines, kept, shape)
    while limit is not None and len(kept) > max(keep, 1) and rendered_size(view) > limit:
        kept.pop()
        view = _render(path, text, index, lines, kept, shape)
    if limit is not None and rendered_size(view) > limit:
        room = limit - rendered_size(view)
        for _ in range(4):  # the markers of a cut cost characters too: cut more for them
            cut = _render(path, text, index, lines, kept, shape, room=room, order=order,
                          anchors=anchors, marked=marked, spare=spare)
            over = rendered_size(cut) - limit
            if over <= 0:
                break
            room -= over
        view = cut
    return view


def _size(lines: Sequence[str], start: int, end: int) -> int:
    return sum(len(line) + 1 for line in lines[start - 1:end])


def _kept(start: int, end: int, lines: Sequence[str], budget: int,
          anchors: Sequence[int], marked: Sequence[int] = ()) -> set[int]:
    """The lines of ``start``-``end`` kept within ``budget`` characters: the ``marked``
    ones (about the name an error is about), those around each anchor (a traceback
    line, a launch), then the head and the tail."""
    keep = {line for line in marked if start <= line <= end}
    keep |= {line for anchor in anchors if start <= anchor <= end
             for line in range(max(start, anchor - ANCHOR_LINES),
                               min(end, anchor + ANCHOR_LINES) + 1)}
    left = budget - sum(len(lines[line - 1]) + 1 for line in keep)
    head = left * 0.6
    for line in range(start, end + 1):
        if line in keep:
            continue
        if len(lines[line - 1]) + 1 > head:
            break
        head -= len(lines[line - 1]) + 1
        left -= len(lines[line - 1]) + 1
        keep.add(line)
    for line in range(end, start - 1, -1):
        if line in keep:
            continue
        if len(lines[line - 1]) + 1 > left:
            break
        left -= len(lines[line - 1]) + 1
        keep.add(line)
    return keep


def _runs(lines: Iterable[int]) -> list[tuple[int, int]]:
    """Consecutive line numbers as (first, last) runs."""
    runs: list[tuple[int, int]] = []
    for line in sorted(lines):
        if runs and runs[-1][1] == line - 1:
            runs[-1] = (runs[-1][0], line)
        else:
            runs.append((line, line))
    return runs


def _cut(spans: list[tuple[int, int]], lines: Sequence[str], room: int,
         ranges: Sequence[tuple[int, int]], anchors: Sequence[int] = (),
         marked: Sequence[int] = ()) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """``spans`` with ``-room`` characters cut out of ``ranges`` (the definitions shown, in
    the order they may be cut). Each keeps its head, its tail (a kernel's fault is as
    often in its final store as in its loads) and the lines around its ``anchors`` (the
    line that raised, the launch) and its ``marked`` lines. Returns the spans left and the
    line ranges cut."""
    cuts: list[tuple[int, int]] = []
    remaining = -room
    for start, end in ranges:
        if remaining <= 0:
            break
        size = _size(lines, start, end)
        keep = _kept(start, end, lines, max(size - remaining, MIN_CUT), anchors, marked)
        gone = _runs(set(range(start, end + 1)) - keep)
        if not gone:
            continue
        cuts += gone
        remaining -= sum(_size(lines, a, b) for a, b in gone)
    left = list(spans)
    for a, b in cuts:
        pieces = []
        for start, end in left:
            if b < start or a > end:
                pieces.append((start, end))
                continue
            pieces += [piece for piece in ((start, a - 1), (b + 1, end)) if piece[0] <= piece[1]]
        left = pieces
    return sorted(left), sorted(cuts)


def _render(path: str, text: str, index: ModuleIndex, lines: Sequence[str],
            symbols: Sequence[str], shape: Shape, room: int = 0,
            order: Sequence[str] = (), anchors: Sequence[int] = (),
            marked: Sequence[int] = (), spare: Sequence[str] = ()) -> SourceFile:
    """The focused view; a negative ``room`` cuts that many characters out of the
    definitions shown but ``spare``, in ``order`` (those not in it after), the longest
    first."""
    spans = _merge(_spans(index, symbols, shape), lines)
    cuts: list[tuple[int, int]] = []
    if room < 0 and spans:
        defined = [d for name in symbols
                   if (d := index.find(name)) is not None and name not in spare]
        ranges = [(d.start, d.end) for d in sorted(
            defined, key=lambda d: (order.index(d.qualname) if d.qualname in order
                                    else len(order), d.start - d.end))]
        spans, cuts = _cut(spans, lines, room, ranges if ranges or spare else spans, anchors,
                           marked)
    holes = [hole for hole in _holes(index, symbols, shape)
             if any(start <= hole[0] and hole[1] <= end for start, end in spans)]
    parts: list[str] = []
    for start, end in spans:
        note = next((f" (lines {a}-{b} cut for length)" for a, b in cuts if b + 1 == start), "")
        segments = []
        for a, b in [hole for hole in holes if start <= hole[0] and hole[1] <= end]:
            if a > start:
                segments.append((start, a - 1, note))
                note = ""
            note += f" (docstring, lines {a}-{b}, not shown)"
            start = b + 1
        segments.append((start, end, note))
        for first, last, said in segments:
            if first > last:  # nothing after the docstring
                parts.append(f"# ---{said} ---")
                continue
            parts.append(f"# --- lines {first}-{last}{said} ---")
            parts += lines[first - 1:last]
    outline: list[str] = []
    owners: dict[Definition | None, list[tuple[int, int]]] = {}
    for a, b in cuts:
        owner = next((d for d in index.definitions if d.start <= a and b <= d.end
                      and d.kind != "class"), None)
        owners.setdefault(owner, []).append((a, b))
    for owner, ranges in owners.items():
        name = f"{owner.qualname} (lines {owner.start}-{owner.end})" if owner else "a definition"
        ask = f'; "need": ["{path}:{owner.qualname}"] shows it whole' if owner else ""
        if len(ranges) > GROUPED_CUTS:  # one line for a definition cut in many places
            spans_cut = ", ".join(f"{a}-{b}" for a, b in ranges)
            outline.append(f"{spans_cut}: parts of {name}, cut for length{ask}")
            continue
        outline += [f"{a}-{b}: part of {name}, cut for length{ask}" for a, b in ranges]
    cut_lines = len(outline)
    cut = tuple(owner.qualname for owner in owners if owner is not None)
    start, end = index.import_span
    if spans and not shape.header and start and not any(
            a <= start and end <= b for a, b in spans):
        outline.append(f"{start}-{end}: imports")
    left = 0
    for definition in index.definitions:
        if _covered(definition, spans) or (cuts and _overlaps(definition, spans)
                                           and definition.kind != "class"):
            continue
        if definition.kind == "method":
            owner = index.find(definition.qualname.split(".")[0])
            if owner is not None and not _covered(owner, spans) and owner.end - (
                    owner.start) < 40:
                continue  # a small class unshown is one outline line
        left += 1
        span = (f"{definition.start}-{definition.end}" if definition.end > definition.start
                else f"{definition.start}")
        indent = "  " if definition.kind == "method" else ""
        outline.append(f"{indent}{span}: {definition.header}")
    shown = tuple(name for name in symbols if index.find(name) is not None)
    most = MAX_OUTLINE if shown else MAX_OUTLINE_UNSHOWN
    if not shape.outline and left and not parts:  # one line says it all
        return SourceFile(path, text, f'# (nothing of this file is shown: "need": ["{path}"] '
                                      f"lists its {left} definitions)\n", (), ())
    if not shape.outline and left:
        outline = [*outline[:cut_lines], f"{left} definitions (\"need\": [\"{path}\"] lists "
                                    "them)"]
    elif len(outline) > most:
        outline = [*outline[:most], f"... and {len(outline) - most} more"]
    view = "\n".join(parts) + "\n" if parts else "# (nothing of this file is shown in full)\n"
    return SourceFile(path, text, view, tuple(outline), shown, cut)


#: What the fix template adds around a file: the heading and fences of one shown whole
#: (a test's heading is the longest), of one shown focused, and the outline's heading.
FILE_FRAME = 50
FOCUSED_FRAME = 160
OUTLINE_FRAME = 100


def rendered_size(source: SourceFile) -> int:
    """Characters a prompt spends on one file (its heading, code and outline)."""
    outline = (len(source.path) + OUTLINE_FRAME + sum(len(line) + 3 for line in source.outline)
               if source.outline else 0)
    frame = FOCUSED_FRAME if source.focused else FILE_FRAME
    return len(source.path) + frame + len(source.content) + outline


def choose_focus(
    located: Sequence[Located], texts: Mapping[str, str], limit: int
) -> dict[str, tuple[str, ...]]:
    """Per file, the definitions to show in full (absent: the whole file), within ``limit``.

    Greedy, by tier then score: a short module whole, a long one focused on its
    definitions; every pinned definition (all tiers but the last) first, then the others
    while the total fits. :func:`fit` makes room for the pinned ones when they alone
    exceed the limit. What does not fit stays in the outline.
    """
    small = {path for path, text in texts.items() if _line_count(text) <= VIEW_LINES}
    focus: dict[str, list[str]] = {path: [] for path in texts if path not in small}
    whole: set[str] = set()

    def total() -> int:
        size = 0
        for path, text in texts.items():
            if path in whole:
                size += len(path) + FILE_FRAME + len(text)
            elif path in focus:
                size += rendered_size(render_source(path, text, focus[path]))
        return size

    for item in sorted(located, key=lambda item: item.order):
        path = item.path
        forced = item.pinned
        if path not in texts or path in whole:
            continue
        if path in small and path not in focus:
            whole.add(path)
            if forced or total() <= limit:
                continue
            whole.discard(path)
            focus[path] = []
        chosen = focus[path]
        if item.qualname in chosen:
            continue
        chosen.append(item.qualname)
        if not forced and total() > limit:
            chosen.pop()
    for path in texts:  # editable files nothing was located in: whole when they fit
        if path in small and path not in focus and path not in whole:
            whole.add(path)
            if total() > limit:
                whole.discard(path)
                focus[path] = []
    return {path: tuple(symbols) for path, symbols in focus.items()}


@dataclass(frozen=True)
class Fitted:
    """The editable files' views and the test sources' views, together within a limit:
    ``focus`` holds the definitions shown in full per focused file."""

    focus: dict[str, tuple[str, ...]]
    views: dict[str, SourceFile]
    tests: tuple[SourceFile, ...] = ()


def fit(located: Sequence[Located], texts: Mapping[str, str], limit: int,
        tests: Sequence[tuple[SourceFile, ...]] = (),
        anchors: Mapping[str, Sequence[int]] | None = None, *,
        kernels_last: bool = True, marked: Mapping[str, Sequence[int]] | None = None) -> Fitted:
    """The views of the editable files ``texts`` and of the tests (each given as its
    preferred view, its lesser one (the failing tests and their helpers) and maybe its
    least (the failing tests alone, cut short)), within
    ``limit`` characters; ``anchors`` are, per file, the lines a cut keeps with the lines
    around them (where the error was raised, where kernels were launched), ``marked``
    those it keeps as they are (:func:`~pytest_kernelfix.locate.names.name_lines`).
    ``kernels_last``: the launched kernels are the last code cut; else (the wrapper
    raised, or the test expected it to) the first-tier functions are.

    What is shown is ordered by the tiers of ``located`` (the frame that raised and the
    functions that launch the kernels, the launched kernels, their helpers, the rest),
    then by score. While over the limit, the views give way in this order: whole files
    become focused (the largest first); the docstrings of the definitions shown become a
    one-line marker; the test sources keep only the failing tests and their helpers; a
    module none of whose definitions is shown keeps one outline line; import headers,
    then the constants the definitions read, are left out (the largest view first).
    Only then does code go: definitions move to the outline, the last tier first and the
    lowest scored first, never one of the first two tiers (the launching functions and
    the launched kernels); last, the largest views are cut, their definitions' heads,
    tails, anchors (the line that raised, the launch) and marked lines kept, each cut
    named in its view's outline: every file's definitions but the kept tier (the launched
    kernels, or the first tier when a wrapper raised) first, then the test sources to
    their least view, then the kept tier too. What gave way comes back while the limit
    has room for it.
    """
    anchors = anchors or {}
    marked = marked or {}
    chosen = [views_of_test[0] for views_of_test in tests]
    focus = choose_focus(located, texts, limit - sum(rendered_size(t) for t in chosen))
    shapes = {path: Shape() for path in texts}
    views = {path: render_source(path, text, focus[path]) if path in focus
             else SourceFile(path, text) for path, text in texts.items()}

    def excess() -> int:
        return (sum(rendered_size(view) for view in views.values())
                + sum(rendered_size(test) for test in chosen) - limit)

    def largest(paths: Iterable[str]) -> list[str]:
        return sorted(paths, key=lambda path: -rendered_size(views[path]))

    def show(path: str, symbols: Sequence[str], shape: Shape) -> None:
        focus[path], shapes[path] = tuple(symbols), shape
        views[path] = render_source(path, texts[path], symbols, shape=shape)

    def focused(path: str) -> list[str]:
        return [item.qualname for item in sorted(located, key=lambda i: i.order)
                if item.path == path]

    # a short module whose definitions are all found saves little focused, and its whole
    # text keeps the imports a fix may add to: it is focused last (below)
    for path in largest(path for path in texts if path not in focus):
        if excess() > 0:
            whole = rendered_size(views[path])
            lean = render_source(path, texts[path], focused(path), shape=Shape(docs=False))
            if whole - rendered_size(lean) >= whole // 3:
                show(path, focused(path), shapes[path])
    for path in largest(focus):
        if excess() > 0:
            show(path, focus[path], replace(shapes[path], docs=False))
    for position in sorted(range(len(tests)), key=lambda i: -rendered_size(chosen[i])):
        if excess() > 0:
            chosen[position] = tests[position][1]
    for path in largest(path for path in focus if not focus[path]):
        if excess() > 0:
            show(path, (), replace(shapes[path], outline=False))
    for part in ({"header": False}, {"constants": False}):
        for path in largest(focus):
            if excess() > 0:
                show(path, focus[path], replace(shapes[path], **part))
    tiers = {item.key: item for item in located}
    yielding = sorted(((path, name) for path in focus for name in focus[path]
                       if (path, name) not in tiers or tiers[path, name].tier >= TIER_HELPER),
                      key=lambda key: (-tiers[key].tier, tiers[key].score) if key in tiers
                      else (-TIER_REST - 1, 0.0))
    yielded: list[tuple[str, str]] = []  # to the outline before any cut
    for path, name in yielding:  # the last tier first, the lowest scored first
        if excess() > 0:
            show(path, [symbol for symbol in focus[path] if symbol != name], shapes[path])
            yielded.append((path, name))
    for path in largest(path for path in focus if not focus[path]):  # emptied by the above
        if excess() > 0 and shapes[path].outline:
            show(path, (), replace(shapes[path], outline=False))
    for path in largest(path for path in texts if path not in focus):
        if excess() > 0:
            show(path, focused(path), shapes[path])
    for path in largest(focus):  # the outlines of the views that show code, last
        if excess() > 0 and shapes[path].outline:
            show(path, focus[path], replace(shapes[path], outline=False))
    kept = TIER_KERNEL if kernels_last else TIER_FIRST

    def last_cut(path: str, name: str) -> bool:
        return (path, name) in tiers and tiers[path, name].tier == kept

    def cut(spared: bool) -> None:
        """The largest views cut, their definitions' anchors and marked lines kept: with
        ``spared``, every definition but the ``kept`` tier; else those too, last."""
        done: set[str] = set()
        for _ in range(2 * len(focus)):
            over = excess()
            paths = [path for path in largest(focus) if path not in done and any(
                not (spared and last_cut(path, name)) for name in focus[path])]
            if over <= 0 or not paths:
                return
            path = paths[0]
            order = sorted(focus[path], key=lambda name: (
                last_cut(path, name), tiers[path, name].score if (path, name) in tiers
                else 0.0))
            before = rendered_size(views[path])
            for target in (before - over, before - over - CUT_MARGIN):
                views[path] = render_source(
                    path, texts[path], focus[path], keep=len(focus[path]), shape=shapes[path],
                    order=order, anchors=anchors.get(path, ()), marked=marked.get(path, ()),
                    spare=[name for name in focus[path] if spared and last_cut(path, name)],
                    limit=max(target, 1_000))
                if rendered_size(views[path]) <= target:
                    break
            if rendered_size(views[path]) >= before:  # cut as far as it goes
                done.add(path)

    cut(spared=True)
    for position, views_of_test in enumerate(tests):  # the kept tier whole before a test
        if excess() > 0 and len(views_of_test) > 2:
            chosen[position] = views_of_test[2]
    cut(spared=False)
    # cut to their heads, tails and anchors, the pinned definitions still do not fit: they
    # go to the outline one by one (each named there), the ``kept`` tier and the frame that
    # raised last, the lowest scored first
    last = sorted(((path, name) for path in focus for name in focus[path]),
                  key=lambda key: (tiers[key].why == "raised the error" if key in tiers else 0,
                                   (tiers[key].tier == kept) if key in tiers else 0,
                                   tiers[key].score if key in tiers else 0.0))
    removed: list[tuple[str, str]] = []  # pinned, to the outline after the cuts
    for path, name in last[:-1]:
        if excess() <= 0:
            break
        show(path, [symbol for symbol in focus[path] if symbol != name], shapes[path])
        removed.append((path, name))
        cut(spared=False)

    def bring_back(path: str, name: str, *, whole: bool) -> None:
        """``name`` shown again in the room left (cut to it unless ``whole``), when that
        takes no line from what ``path`` shows."""
        room = -excess()
        symbols = [symbol for symbol in focused(path) if symbol in {*focus[path], name}]
        before = views[path]
        view = render_source(path, texts[path], symbols, keep=len(symbols), shape=shapes[path],
                             order=sorted(symbols, key=lambda symbol: (
                                 symbol != name, last_cut(path, symbol))),
                             anchors=anchors.get(path, ()), marked=marked.get(path, ()),
                             limit=rendered_size(before) + room)
        shown = {line for line in before.content.splitlines() if not line.startswith("# ---")}
        if room > 0 and rendered_size(view) <= rendered_size(before) + room and (
                name in view.shown and not (whole and name in view.cut)
                and shown <= set(view.content.splitlines())):
            focus[path], views[path] = tuple(symbols), view

    # what gave way comes back while room is left (one removal or cut can free more than
    # was needed), the most firmly shown first: what went after the cuts cut to the room,
    # what went before any cut whole and only while nothing is cut
    uncut = not any(view.cut for view in views.values())
    for path, name in sorted([*removed, *(yielded if uncut else ())], key=lambda key: (
            tiers[key].order if key in tiers else (TIER_REST + 1, 0.0, *key))):
        bring_back(path, name, whole=(path, name) not in removed)
    return Fitted(dict(focus), views, tuple(chosen))


def fit_views(
    located: Sequence[Located], texts: Mapping[str, str], limit: int
) -> tuple[dict[str, tuple[str, ...]], dict[str, SourceFile]]:
    """:func:`fit` without test sources: the focus per file and the views."""
    fitted = fit(located, texts, limit)
    return fitted.focus, fitted.views


def _test_view(path: str, text: str, nodeids: Sequence[str], limit: int, *,
               whole: bool = True, helpers: bool = True) -> SourceFile:
    """A test module: whole when short (and ``whole``), else the failing tests and (with
    ``helpers``) the module-level functions and classes they use, cut to ``limit``."""
    if whole and len(text) <= limit:
        return SourceFile(path, text)
    index = parse_module(text)
    if index.error:
        return SourceFile(path, text[:limit] + "\n# ... [file cut] ...\n")
    wanted: list[str] = []
    for nodeid in nodeids:
        name = nodeid_qualname(nodeid)
        if index.find(name) is not None and name not in wanted:
            wanted.append(name)
    callees: list[str] = []
    frontier = list(wanted) if helpers else []
    for _ in range(2):  # what the tests use, and what that uses
        found = []
        for name in frontier:
            definition = index.find(name)
            for used in () if definition is None else definition.names:
                helper = index.find(used.split(".")[0])
                if helper is not None and helper.kind in ("function", "class") and (
                        helper.qualname not in wanted + callees):
                    callees.append(helper.qualname)
                    found.append(helper.qualname)
        frontier = found
    view = render_source(path, text, wanted + callees, limit=limit, keep=len(wanted))
    return SourceFile(path, text, view.view, view.outline[:10], view.shown, view.cut)


def anchors_of(group: BugGroup, project: Project) -> dict[str, list[int]]:
    """Per editable file, the lines a cut keeps: the traceback's and the launches'."""
    anchors: dict[str, list[int]] = {}
    failure = group.first
    places = [(frame.path, frame.lineno) for frame in failure.error.frames]
    places += [(file, line) for launch in failure.launches for file, line, _ in launch.sites]
    for path, line in places:
        if project.contains(path) and (rel := project.relative(path)) in group.editable:
            anchors.setdefault(rel, []).append(line)
    return anchors


def marked_lines(group: BugGroup, project: Project, texts: Mapping[str, str]) -> (
    dict[str, tuple[int, ...]]
):
    """For an error about a name, the lines a cut of the function that raised keeps: each
    that binds or uses the name, and the branch headers around them (empty otherwise)."""
    names = error_names(group.first.error)
    frames = project_frames(group.first.error, project, group.editable) if names else ()
    if not frames or frames[-1].path not in texts:
        return {}
    raised = frames[-1]
    lines = name_lines(texts[raised.path], raised.lineno, names)
    return {raised.path: lines} if lines else {}


def build_context(
    group: BugGroup,
    project: Project,
    *,
    device: str,
    checks: tuple[str, ...] = (),
    environ: Mapping[str, str] | None = None,
    budget: int = PROMPT_BUDGET,
    change: ChangeView | None = None,
) -> BugContext:
    """Everything a fixer may see about ``group``, redacted and within ``budget``; the
    change since the base (``change``) takes its share first."""
    if change is not None:
        change = replace(change, diff=redact(change.diff, environ),
                         culprit=redact(change.culprit, environ))
    error_log = redact(error_report(group, project), environ)
    test_paths = [path for path in dict.fromkeys(
        failure.test_path for failure in group.failures if failure.test_path)
        if os.path.isfile(path)]
    share = max(1, len(test_paths))
    tests = []
    for path in test_paths:
        shown, text = project.display(path), redact(read_source(Path(path)), environ)
        tests.append((_test_view(shown, text, group.nodeids, TESTS_WHOLE // share),
                      _test_view(shown, text, group.nodeids, TESTS_BUDGET // share,
                                 whole=False),
                      _test_view(shown, text, group.nodeids, TESTS_LEAST // share,
                                 whole=False, helpers=False)))
    texts = {rel: redact(read_source(project.root / rel), environ) for rel in group.editable}
    nodeid_chars = sum(len(nodeid) + 3 for nodeid in group.nodeids[:10])
    located_lines = kernel_lines(group.first.error, project, group.editable)
    said = len(group.first.error.headline) + sum(len(line) + 3 for line in located_lines)
    limit = budget - RESERVED - len(error_log) - nodeid_chars - said - (
        change.size if change is not None else 0)
    python_raised = any(item.why == "raised the error" and not item.jit for item in group.located)
    fitted = fit(group.located, texts, max(limit, 2_000), tests, anchors_of(group, project),
                 kernels_last=not (python_raised or expects_raise(group.first)),
                 marked=marked_lines(group, project, texts))
    focus, views = fitted.focus, fitted.views
    editable = list(views.values())
    roots = project.roots
    error = ErrorInfo(
        group.first.error.type,
        redact(relative_paths(group.first.error.message, roots), environ),
        group.first.error.frames,
    )
    frames = tuple(
        Frame(frame.path, frame.lineno, frame.name, redact(frame.line, environ))
        for frame in project_frames(group.first.error, project, group.editable)
    )
    return BugContext(
        group_id=group.id,
        nodeids=group.nodeids,
        error=error,
        error_log=error_log,
        editable=tuple(editable),
        tests=fitted.tests,
        kernel_lines=tuple(redact(line, environ) for line in located_lines),
        device=device,
        checks=checks,
        focus=focus,
        kernel_frames=frames,
        change=change,
    )
