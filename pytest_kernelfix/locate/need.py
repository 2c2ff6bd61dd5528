"""A model's request for more code (``"need"`` in its answer), resolved within a budget.

A focused view leaves most of a long module in its outline, and reach can miss a helper
it cannot resolve statically. An answer may therefore ask for code instead of (or
besides) proposing edits::

    "need": ["ops/activations.py:silu", "search: BLOCK_SIZE_N"]

Each item is resolved through :mod:`pytest_kernelfix.locate.reach`, never outside the project:
``path:symbol`` (a definition in a file), ``path`` (a file's outline), a bare name (a
definition anywhere) or ``search: text`` (the definitions holding the text, ranked).
Project sources a fix may edit join the editable files with the definition shown;
tests and conftests are shown read-only. The next round shows what was found within
:data:`NEED_BUDGET` characters and says what was not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pytest_kernelfix.locate.context import VIEW_LINES, SourceFile, render_source, rendered_size
from pytest_kernelfix.locate.outline import parse_module
from pytest_kernelfix.locate.reach import Reach, is_posix_relative, split_need
from pytest_kernelfix.project import Project
from pytest_kernelfix.redact import redact

#: Characters one request may add to the next prompt.
NEED_BUDGET = 8_000
#: Items of one request that are looked at, and hits kept per item.
MAX_ITEMS = 8
MAX_HITS = 4


@dataclass(frozen=True)
class NeedAnswer:
    """What a request added: ``files`` are new editable files (their original text),
    ``focus`` the definitions to show per editable file, ``whole`` those of them asked
    for by name (shown whole, where the view had cut them for length), ``context``
    read-only views; ``found`` and ``missing`` say so in words for the next prompt."""

    files: Mapping[str, str] = field(default_factory=dict)
    focus: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    context: tuple[SourceFile, ...] = ()
    found: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    whole: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def describe(self, why: str = "as you asked") -> str:
        lines = []
        if self.found:
            lines.append(f"Added to the files shown above, {why}: "
                         + "; ".join(self.found) + ".")
        if self.missing:
            lines.append("Not added: " + "; ".join(self.missing) + ".")
        return "\n".join(lines)


class NeedResolver:
    """Resolves requests for one bug against the project (and the current candidate)."""

    def __init__(self, project: Project, reach: Reach | None = None,
                 budget: int = NEED_BUDGET) -> None:
        self.project = project
        self.reach = reach or Reach(project)
        self.budget = budget

    def _file(self, name: str) -> str:
        """The project path (relative) a request names, or "" (suffix matches allowed)."""
        wanted = name.strip().replace("\\", "/").removeprefix("./")
        if not wanted or not is_posix_relative(wanted):
            return ""
        path = self.project.root / wanted
        if path.is_file() and self.project.contains(path):
            return self.project.relative(path)
        matches = [self.project.relative(p) for p in self.reach.files()
                   if self.project.relative(p).endswith("/" + wanted)]
        return matches[0] if len(matches) == 1 else ""

    def _hits(self, item: str) -> tuple[list[tuple[str, str]], str]:
        """(path, qualname) pairs for one item (qualname "" = the file's outline), or why
        there are none."""
        kind, path, what = split_need(item)
        if kind == "search":
            hits = self.reach.search_text(what)[:MAX_HITS]
            return [(h.path, h.qualname) for h in hits], f"{item!r}: nothing in the project"
        if kind == "file" or (kind == "symbol" and path):
            rel = self._file(path)
            if not rel:
                return [], f"{item!r}: no such file in the project"
            if kind == "file":
                return [(rel, "")], ""
            text = self._read(rel)
            index = parse_module(text)
            found = index.find(what) or next(
                (d for d in index.definitions if d.name == what), None)
            if found is None:
                return [], f"{item!r}: {rel} defines no {what!r}"
            return [(rel, found.qualname)], ""
        hits = self.reach.search_definition(what)[:MAX_HITS]
        return [(h.path, h.qualname) for h in hits], f"{item!r}: no definition of that name"

    def _read(self, rel: str) -> str:
        try:
            return Path(self.project.root / rel).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def __call__(self, items: Sequence[str], current: Mapping[str, str],
                 focus: Mapping[str, tuple[str, ...]]) -> NeedAnswer:
        files: dict[str, str] = {}
        new_focus: dict[str, list[str]] = {path: list(symbols) for path, symbols in
                                           focus.items()}
        context: list[SourceFile] = []
        found: list[str] = []
        missing: list[str] = []
        whole: dict[str, list[str]] = {}
        spent = 0
        for item in list(items)[:MAX_ITEMS]:
            hits, why = self._hits(item)
            if not hits:
                missing.append(why)
                continue
            for rel, qualname in hits:
                label = f"{rel}:{qualname}" if qualname else rel
                editable = self.project.editable(str(self.project.root / rel))
                text = current.get(rel) if rel in current else self._read(rel)
                if text is None or not text:
                    missing.append(f"{label}: cannot be read")
                    continue
                symbols = [qualname] if qualname else []
                new_file = bool(editable) and rel not in current and (
                    text.count("\n") <= VIEW_LINES)
                view = SourceFile(rel, redact(text)) if new_file else render_source(
                    rel, redact(text), symbols)
                # a definition of a file already shown costs its own lines only
                cost = (_definition_size(text, qualname) if rel in current and qualname
                        else rendered_size(view))
                if spent + cost > self.budget:
                    missing.append(f"{label}: over the budget of {self.budget} characters "
                                   "(ask for fewer or smaller definitions)")
                    continue
                spent += cost
                if editable and new_file:
                    files[rel] = text
                    found.append(f"{rel} (editable, shown whole)")
                elif editable:
                    if rel not in current:
                        files[rel] = text
                    shown = new_focus.get(rel)
                    if rel in current and shown is None:
                        found.append(f"{label} (the whole file is already shown)")
                        continue
                    merged = list(shown or [])
                    if qualname and qualname not in merged:
                        merged.append(qualname)
                    new_focus[rel] = merged
                    if qualname:
                        whole.setdefault(rel, []).append(qualname)
                    found.append(f"{label} (editable)")
                else:  # every path asked for resolves inside the project
                    context.append(view)
                    found.append(f"{label} (read-only)")
        return NeedAnswer(files, {path: tuple(symbols) for path, symbols in new_focus.items()},
                          tuple(context), tuple(found), tuple(missing),
                          {path: tuple(names) for path, names in whole.items()})


def _definition_size(text: str, qualname: str) -> int:
    """Characters of one definition's lines in ``text`` (0 when it is not there)."""
    definition = parse_module(text).find(qualname)
    if definition is None:
        return 0
    return sum(len(line) + 1 for line in text.splitlines()[definition.start - 1:definition.end])
