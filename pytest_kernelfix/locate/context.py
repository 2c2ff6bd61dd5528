"""What a fixer gets to see about one bug: editable sources, tests, the error log.

Within a budget. A real kernel module runs to a thousand lines, and a model shown
whole files pays for all of them in every round and finds the faulty line less often.
A module over :data:`VIEW_LINES` lines is shown *focused*: the definitions
:mod:`pytest_kernelfix.locate.reach` found (the kernel, its helpers, the wrapper, the
constants and ``triton.Config`` lists they read) in full, each span headed by its line
numbers, and a one-line outline of every other definition. The edits still apply to
the whole file. The first prompt of a bug stays under :data:`PROMPT_BUDGET` characters,
under 6,000 tokens, whatever the module sizes.
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
from pytest_kernelfix.locate.outline import Definition, ModuleIndex, parse_module
from pytest_kernelfix.locate.reach import Located, nodeid_qualname
from pytest_kernelfix.project import Project
from pytest_kernelfix.redact import redact

#: The whole first prompt (system and user messages), in characters. Kernel code runs
#: about 3.7 characters per token (cl100k_base and o200k_base, measured on liger-kernel
#: prompts by benchmarks/reach_bench.py), so this keeps a prompt under 6,000 tokens.
PROMPT_BUDGET = 22_000
#: Characters per token of these prompts, for the report's token estimate.
CHARS_PER_TOKEN = 3.7
#: What the templates' own text takes (the rules, headings, how the fix is verified).
RESERVED = 7_000
#: The error log and the test sources, at most.
LOG_BUDGET = 4_000
TESTS_BUDGET = 3_000
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
    ``outline`` then has one line per definition left out.
    """

    path: str
    text: str
    view: str = ""
    outline: tuple[str, ...] = ()
    shown: tuple[str, ...] = ()

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
    """What a focused view shows besides its definitions: the module's import header
    and the constants the definitions read. Both give way first under the budget (a
    constant left out keeps its outline line, value included)."""

    header: bool = True
    constants: bool = True


def _spans(index: ModuleIndex, symbols: Sequence[str], shape: Shape) -> list[tuple[int, int]]:
    """Line spans to show for ``symbols``: the imports, each definition (a method with
    its class line), and the module constants each reads."""
    spans: list[tuple[int, int]] = []
    if shape.header and index.import_span != (0, 0):
        spans.append(index.import_span)
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
    return spans


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


def render_source(path: str, text: str, symbols: Sequence[str], *,
                  limit: int | None = None, keep: int = 1, shape: Shape = Shape()
                  ) -> SourceFile:
    """``text`` shown focused on ``symbols`` (qualified names, most important first).

    Over ``limit`` characters the last symbols (all but ``keep``) are left to the
    outline; when those kept are still too long, the longest span is cut at a line
    boundary. A module that does not parse is shown whole.
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
        view = _render(path, text, index, lines, kept, shape,
                       room=limit - rendered_size(view))
    return view


def _render(path: str, text: str, index: ModuleIndex, lines: Sequence[str],
            symbols: Sequence[str], shape: Shape, room: int = 0) -> SourceFile:
    """The focused view; a negative ``room`` cuts that many characters off the longest
    span (its head is kept)."""
    spans = _merge(_spans(index, symbols, shape), lines)
    if room < 0 and spans:
        longest = max(spans, key=lambda span: span[1] - span[0])
        start, end = longest
        size = sum(len(line) + 1 for line in lines[start - 1:end])
        keep_end = start
        budget = max(size + room, 400)
        while keep_end < end and budget - len(lines[keep_end - 1]) - 1 >= 0:
            budget -= len(lines[keep_end - 1]) + 1
            keep_end += 1
        spans[spans.index(longest)] = (start, max(start, keep_end - 1))
    parts: list[str] = []
    for start, end in spans:
        parts.append(f"# --- lines {start}-{end} ---")
        parts += lines[start - 1:end]
    outline: list[str] = []
    start, end = index.import_span
    if not shape.header and start and not any(a <= start and end <= b for a, b in spans):
        outline.append(f"{start}-{end}: imports")
    for definition in index.definitions:
        if _covered(definition, spans):
            continue
        if definition.kind == "method":
            owner = index.find(definition.qualname.split(".")[0])
            if owner is not None and not _covered(owner, spans) and owner.end - (
                    owner.start) < 40:
                continue  # a small class unshown is one outline line
        span = (f"{definition.start}-{definition.end}" if definition.end > definition.start
                else f"{definition.start}")
        indent = "  " if definition.kind == "method" else ""
        outline.append(f"{indent}{span}: {definition.header}")
    shown = tuple(name for name in symbols if index.find(name) is not None)
    most = MAX_OUTLINE if shown else MAX_OUTLINE_UNSHOWN
    if len(outline) > most:
        outline = [*outline[:most], f"... and {len(outline) - most} more"]
    view = "\n".join(parts) + "\n" if parts else "# (nothing of this file is shown in full)\n"
    return SourceFile(path, text, view, tuple(outline), shown)


def rendered_size(source: SourceFile) -> int:
    """Characters a prompt spends on one file (its heading, code and outline)."""
    return len(source.path) + 40 + len(source.content) + sum(len(line) + 3
                                                              for line in source.outline)


def _ranks(located: Sequence[Located]) -> dict[tuple[str, str], int]:
    """How firmly each definition is shown: 0 for those tied at the best score (the
    launched kernels), 1 for the pinned ones (the launching function and what sizes
    the launch), 2 for the rest, shown while they fit."""
    best = located[0].score if located else 0.0
    return {item.key: 0 if item.score >= best else 1 if item.pinned else 2
            for item in located}


def choose_focus(
    located: Sequence[Located], texts: Mapping[str, str], limit: int
) -> dict[str, tuple[str, ...]]:
    """Per file, the definitions to show in full (absent: the whole file), within ``limit``.

    Greedy: a short module whole, a long one focused on its definitions, the launched
    kernels and the pinned definitions first, then the others by score while the total
    fits. :func:`fit_views` makes room for the first two when they alone exceed the
    limit. What does not fit stays in the outline.
    """
    small = {path for path, text in texts.items() if _line_count(text) <= VIEW_LINES}
    focus: dict[str, list[str]] = {path: [] for path in texts if path not in small}
    whole: set[str] = set()
    ranks = _ranks(located)

    def total() -> int:
        size = 0
        for path, text in texts.items():
            if path in whole:
                size += len(path) + 40 + len(text)
            elif path in focus:
                size += rendered_size(render_source(path, text, focus[path]))
        return size

    for item in sorted(located, key=lambda item: ranks[item.key]):  # stable: by score
        path = item.path
        forced = ranks[item.key] < 2
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


def fit_views(
    located: Sequence[Located], texts: Mapping[str, str], limit: int
) -> tuple[dict[str, tuple[str, ...]], dict[str, SourceFile]]:
    """The focus per file and the views, together within ``limit``.

    While over it, the views give up, in this order: whole files become focused (the
    largest first); focused ones leave out their import headers, then the constants
    their definitions read (the largest first); then definitions go to the outline
    wherever they are, those not pinned first, the lowest scored first, never the
    launched kernels; last, the longest span of the largest view is cut.
    """
    focus = choose_focus(located, texts, limit)
    ranks = _ranks(located)
    shapes = {path: Shape() for path in texts}
    views = {path: render_source(path, text, focus[path]) if path in focus
             else SourceFile(path, text) for path, text in texts.items()}

    def excess() -> int:
        return sum(rendered_size(view) for view in views.values()) - limit

    def largest(paths: Iterable[str]) -> list[str]:
        return sorted(paths, key=lambda path: -rendered_size(views[path]))

    def show(path: str, symbols: Sequence[str], shape: Shape) -> None:
        focus[path], shapes[path] = tuple(symbols), shape
        views[path] = render_source(path, texts[path], symbols, shape=shape)

    for path in largest(path for path in texts if path not in focus):
        if excess() > 0:
            show(path, [item.qualname for item in sorted(located, key=lambda i: ranks[i.key])
                        if item.path == path], shapes[path])
    for part in ({"header": False}, {"constants": False}):
        for path in largest(focus):
            if excess() > 0:
                show(path, focus[path], replace(shapes[path], **part))
    scores = {item.key: item.score for item in located}
    yielding = sorted(((path, name) for path in focus for name in focus[path]
                       if ranks.get((path, name), 2) > 0),
                      key=lambda key: (-ranks.get(key, 2), scores.get(key, 0.0)))
    for path, name in yielding:  # the lowest ranked first, wherever it is
        if excess() > 0:
            show(path, [symbol for symbol in focus[path] if symbol != name], shapes[path])
    for _ in range(len(focus)):
        over = excess()
        if over <= 0:
            break
        path = largest(focus)[0]
        views[path] = render_source(path, texts[path], focus[path], keep=len(focus[path]),
                                    shape=shapes[path],
                                    limit=max(rendered_size(views[path]) - over, 1_000))
    return focus, views


def _test_view(path: str, text: str, nodeids: Sequence[str], limit: int) -> SourceFile:
    """A test module: whole when short, else the failing tests and what they use."""
    if len(text) <= limit:
        return SourceFile(path, text)
    index = parse_module(text)
    if index.error:
        return SourceFile(path, text[:limit] + "\n# ... [file cut] ...\n")
    wanted: list[str] = []
    for nodeid in nodeids:
        name = nodeid_qualname(nodeid)
        if index.find(name) is not None and name not in wanted:
            wanted.append(name)
    helpers: list[str] = []
    for name in wanted:
        definition = index.find(name)
        for used in () if definition is None else definition.names:
            helper = index.find(used.split(".")[0])
            if helper is not None and helper.kind in ("function", "class") and (
                    helper.qualname not in wanted + helpers):
                helpers.append(helper.qualname)
    view = render_source(path, text, wanted + helpers)
    if len(view.content) > limit:
        view = render_source(path, text, wanted, limit=limit)
    return SourceFile(path, text, view.view, view.outline[:10], view.shown)


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
    test_paths = dict.fromkeys(failure.test_path for failure in group.failures if failure.test_path)
    tests = tuple(
        _test_view(project.display(path), redact(read_source(Path(path)), environ),
                   group.nodeids, TESTS_BUDGET // max(1, len(test_paths)))
        for path in test_paths
        if os.path.isfile(path)
    )
    texts = {rel: redact(read_source(project.root / rel), environ) for rel in group.editable}
    nodeid_chars = sum(len(nodeid) + 3 for nodeid in group.nodeids[:10])
    limit = budget - RESERVED - len(error_log) - nodeid_chars - sum(
        rendered_size(test) for test in tests) - (change.size if change is not None else 0)
    focus, views = fit_views(group.located, texts, max(limit, 2_000))
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
        tests=tests,
        kernel_lines=tuple(redact(line, environ) for line in
                           kernel_lines(group.first.error, project, group.editable)),
        device=device,
        checks=checks,
        focus=focus,
        kernel_frames=frames,
        change=change,
    )
