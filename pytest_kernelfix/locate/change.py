"""The change since a base: its files, its hunks, what reverting some of them leaves, and
how a prompt and a report show it.

In CI most red kernel tests are regressions of the change under review; locally, of the
last edit. The change is the strongest localization signal there is, and an experiment
can use it: revert some hunks in the sandbox, rerun the failing test, and the hunks whose
revert alone makes it pass are where the fault is (:mod:`pytest_kernelfix.verify.culprit`).
Where the base comes from (git, the CI's target branch, the last green run) is
:mod:`pytest_kernelfix.locate.base`; this module is pure functions over texts.

A *hunk* is a run of changed lines; runs closer than :data:`MERGE_GAP` unchanged lines
are one hunk, so a hunk is one edit as a reviewer reads it. Reverting a hunk puts the
base's lines back in its place; reverting every hunk of a file gives the base's text
byte for byte (line endings included).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

from pytest_kernelfix.locate.grouping import MAX_EDITABLE_FILES, BugGroup
from pytest_kernelfix.locate.outline import parse_module
from pytest_kernelfix.locate.reach import TIER_FIRST, TIER_HELPER, TIER_REST, Located
from pytest_kernelfix.markdown import fence
from pytest_kernelfix.project import Project

#: Changed runs separated by at most this many unchanged lines are one hunk.
MERGE_GAP = 2
#: What the prompt's view of the change takes at most, in characters: each hunk's current
#: lines first (the culprit's, then those closest to it), then the base's lines they
#: replaced, as far as they fit.
CHANGE_BUDGET = 5_000
#: One hunk's current lines take at most this much of it (a new file, a long rewrite).
HUNK_BUDGET = 1_500
#: Files the change adds to a bug's editable files at most (besides the culprit's).
MAX_CHANGED_FILES = 4
#: Definitions the change touched that are pinned (shown in full) at most, besides the
#: culprit's.
MAX_PINNED_TOUCHED = 4

#: What an experiment concluded (:class:`Regression.verdict`).
REGRESSION = "regression"
NOT_REGRESSION = "not_regression"
TEST_CHANGED = "test_changed"


@dataclass(frozen=True)
class Hunk:
    """Lines ``start``..``end`` of the current text (1-based, inclusive) were lines
    ``base_start``..``base_end`` at the base. An empty side has ``end == start - 1``:
    the lines were added (no base lines) or removed (no current lines, which stood
    before current line ``start``)."""

    path: str
    start: int
    end: int
    base_start: int
    base_end: int
    lines: tuple[str, ...] = ()
    base_lines: tuple[str, ...] = ()
    test: bool = False

    @property
    def span(self) -> str:
        """``12``, ``12-14``, or ``before 12`` for lines only removed."""
        if self.end < self.start:
            return f"before {self.start}"
        return f"{self.start}" if self.end == self.start else f"{self.start}-{self.end}"

    @property
    def label(self) -> str:
        return f"{self.path}:{self.span}"

    @property
    def line(self) -> int:
        """The line a reviewer is pointed at: the first changed line, or where lines were
        only removed, the line before them."""
        return self.start if self.end >= self.start else max(1, self.start - 1)


@dataclass(frozen=True)
class FileChange:
    """One file's text at the base and now (None: absent there), and whether it is a
    test file (tests and conftests are never reverted)."""

    path: str
    base: str | None
    current: str | None
    test: bool = False

    @functools.cached_property
    def hunks(self) -> tuple[Hunk, ...]:
        return file_hunks(self.path, self.base, self.current, test=self.test)


@dataclass(frozen=True)
class Change:
    """Every file that differs between a base and the working tree (``files``), under
    the base's name as a reader sees it (``base``: ``origin/main (merge base 1a2b3c4d)``,
    ``HEAD (uncommitted changes)``...). ``notes`` say what could not be compared."""

    base: str
    files: tuple[FileChange, ...]
    notes: tuple[str, ...] = ()

    @functools.cached_property
    def hunks(self) -> tuple[Hunk, ...]:
        return tuple(hunk for change in self.files for hunk in change.hunks)

    @property
    def source_hunks(self) -> tuple[Hunk, ...]:
        """The hunks an experiment may revert: none of a test file."""
        return tuple(hunk for hunk in self.hunks if not hunk.test)

    @property
    def test_hunks(self) -> tuple[Hunk, ...]:
        return tuple(hunk for hunk in self.hunks if hunk.test)

    def file(self, path: str) -> FileChange | None:
        return next((change for change in self.files if change.path == path), None)

    def reverted(self, hunks: Iterable[Hunk]) -> dict[str, str | None]:
        """The text of each file ``hunks`` are in, with just those hunks put back as they
        were at the base (None: the file did not exist there)."""
        by_path: dict[str, list[Hunk]] = {}
        for hunk in hunks:
            by_path.setdefault(hunk.path, []).append(hunk)
        texts: dict[str, str | None] = {}
        for path, chosen in by_path.items():
            change = self.file(path)
            if change is not None:
                texts[path] = revert_text(change, chosen)
        return texts

    @property
    def changed_tests(self) -> tuple[str, ...]:
        return tuple(change.path for change in self.files if change.test and change.hunks)


def _lines(text: str | None) -> list[str]:
    return [] if text is None else text.splitlines(keepends=True)


def file_hunks(path: str, base: str | None, current: str | None, *, test: bool = False
               ) -> tuple[Hunk, ...]:
    """The hunks of one file, from the base's text to the current one."""
    old, new = _lines(base), _lines(current)
    if old == new:
        return ()
    blocks: list[list[int]] = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if blocks and i1 - blocks[-1][1] <= MERGE_GAP and j1 - blocks[-1][3] <= MERGE_GAP:
            blocks[-1][1], blocks[-1][3] = i2, j2
        else:
            blocks.append([i1, i2, j1, j2])
    return tuple(
        Hunk(path, j1 + 1, j2, i1 + 1, i2,
             tuple(line.rstrip("\r\n") for line in new[j1:j2]),
             tuple(line.rstrip("\r\n") for line in old[i1:i2]), test)
        for i1, i2, j1, j2 in blocks)


def revert_text(change: FileChange, hunks: Iterable[Hunk]) -> str | None:
    """``change``'s current text with ``hunks`` (of this file) put back as at the base."""
    chosen = sorted({(h.start, h.end, h.base_start, h.base_end) for h in hunks}, reverse=True)
    if change.current is None:
        return change.base if chosen else None
    if change.base is None:
        return None if chosen else change.current
    lines, base = _lines(change.current), _lines(change.base)
    for start, end, base_start, base_end in chosen:
        lines[start - 1:end] = base[base_start - 1:base_end]
    text = "".join(lines)
    if len(chosen) == len(change.hunks):
        return change.base  # exactly, whatever difflib made of the line ends
    return text


# -- what the change touched -----------------------------------------------------------


def touched_definitions(hunks: Iterable[Hunk], text: str) -> tuple[str, ...]:
    """The innermost definitions of ``text`` (the current file) whose lines ``hunks``
    changed, in order of first change; a hunk that only removed lines touches the
    definition around where they were."""
    index = parse_module(text)
    if index.error:
        return ()
    found: list[str] = []
    for hunk in hunks:
        lines = range(hunk.start, hunk.end + 1) if hunk.end >= hunk.start else (
            hunk.start - 1, hunk.start)
        for line in lines:
            definition = index.at(line)
            if definition is not None and definition.qualname not in found:
                found.append(definition.qualname)
    return tuple(found)


def changed_editable(change: Change, project: Project) -> tuple[str, ...]:
    """The changed files a fix may edit (present now, project sources), in order."""
    return tuple(c.path for c in change.files if c.current is not None and not c.test
                 and c.hunks and project.editable(str(project.root / c.path)))


def with_change(group: BugGroup, change: Change, project: Project,
                culprits: Sequence[Hunk] = ()) -> BugGroup:
    """``group`` with the change's files editable and the definitions it touched ranked
    first: the culprit's definitions in the first tier, above the launched kernels
    (shown whatever the budget; the kernels stay pinned), the first others touched
    pinned first among the helpers, the rest first among what may give way.

    Files: the culprit's first, then the group's own, then the changed files closest to
    them (same folder first), at most :data:`MAX_CHANGED_FILES` more.
    """
    editable = list(dict.fromkeys([*(h.path for h in culprits), *group.editable]))
    editable = [path for path in editable if project.editable(str(project.root / path))]
    folders = {PurePosixPath(path).parent for path in editable}
    others = sorted((p for p in changed_editable(change, project) if p not in editable),
                    key=lambda p: PurePosixPath(p).parent not in folders)
    limit = max(len(editable), MAX_EDITABLE_FILES) + MAX_CHANGED_FILES
    editable = (editable + others)[:limit]
    top = max((item.score for item in group.located), default=100.0)
    ranked: dict[tuple[str, str], Located] = {item.key: item for item in group.located}
    culprit_keys: list[tuple[str, str]] = []
    for path in dict.fromkeys(h.path for h in culprits):
        text = change.file(path)
        if path not in editable or text is None or text.current is None:
            continue
        for name in touched_definitions([h for h in culprits if h.path == path], text.current):
            culprit_keys.append((path, name))
    touched: list[tuple[str, str]] = []
    for path in editable:
        text = change.file(path)
        if text is None or text.current is None or text.test:
            continue
        touched += [(path, name) for name in touched_definitions(text.hunks, text.current)
                    if (path, name) not in culprit_keys]
    why = f"changed since {change.base}"
    for key in culprit_keys:  # first of all: shown whatever the budget
        ranked[key] = Located(*key, top + 1, "reverting its changed lines alone makes the "
                              "test pass", jit=_jit(ranked.get(key)), tier=TIER_FIRST)
    for number, key in enumerate(touched):
        old = ranked.get(key)
        tier = TIER_HELPER if number < MAX_PINNED_TOUCHED else TIER_REST
        if old is not None and old.tier <= tier:
            score = old.score if old.tier < tier else max(old.score, top + 0.5)
            ranked[key] = replace(old, score=score, why=f"{old.why}; {why}")
        else:
            ranked[key] = Located(*key, top + 0.5, why, jit=_jit(old), tier=tier)
    located = sorted((item for item in ranked.values() if item.path in editable),
                     key=lambda item: item.order)
    return replace(group, editable=tuple(editable), located=tuple(located))


def _jit(item: Located | None) -> bool:
    return bool(item and item.jit)


# -- the experiment's conclusion -------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One rerun of the experiment: the hunks it reverted, whether its tests passed, how
    they ended (``outcome``: ``1 passed``...) and which tests it ran."""

    reverted: tuple[str, ...]
    passed: bool
    seconds: float = 0.0
    outcome: str = ""
    tests: tuple[str, ...] = ()


@dataclass(frozen=True)
class Regression:
    """What reverting parts of the change did to the representative failing test.

    ``verdict``: :data:`REGRESSION` (reverting ``culprits`` alone makes ``test`` pass),
    :data:`NOT_REGRESSION` (it fails with every source hunk reverted too) or
    :data:`TEST_CHANGED` (it passes only with the test files as they were at the base).
    ``hunks`` is how many hunks the search was over; ``minimal`` is False when the trial
    cap stopped it before the culprit set was minimal (every hunk of it still counts).
    ``tests`` are other failing tests of the bug that pass with the culprit reverted (the
    culprit holds what they needed besides ``test``'s share).
    """

    base: str
    verdict: str
    test: str
    culprits: tuple[Hunk, ...] = ()
    trials: tuple[Trial, ...] = ()
    hunks: int = 0
    minimal: bool = True
    tests: tuple[str, ...] = ()

    @property
    def reruns(self) -> int:
        return len(self.trials)

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(hunk.path for hunk in self.culprits))

    def lines_of(self, path: str) -> str:
        return ", ".join(hunk.span for hunk in self.culprits if hunk.path == path)

    @property
    def summary(self) -> str:
        """One sentence for the report, the terminal and the annotation."""
        reruns = _plural(self.reruns, "rerun")
        if self.verdict == REGRESSION:
            where = " and ".join(_lines_word(self.lines_of(path)) + f" of {path}"
                                 for path in self.files)
            rest = "" if self.minimal else ("; the rerun cap stopped the search before it "
                                            "was minimal")
            also = (f" and {_plural(len(self.tests), 'more failing test')}" if self.tests
                    else "")
            return (f"regression since {self.base}: {where} introduced it: reverting "
                    f"{'it' if _single(self.culprits) else 'them'} alone makes {self.test}"
                    f"{also} pass ({reruns} over {_plural(self.hunks, 'changed hunk')}{rest})")
        if self.verdict == TEST_CHANGED:
            return (f"the test changed since {self.base}: {self.test} passes with its test "
                    f"files as they were there and fails with every other change reverted "
                    f"({reruns}); changed: {', '.join(self.test_files)}")
        return (f"not a regression of the change since {self.base}: {self.test} fails with "
                f"every change of the project's non-test files reverted too ({reruns})")

    @property
    def test_files(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(h.path for h in self.culprits if h.test))


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _single(hunks: Sequence[Hunk]) -> bool:
    return len(hunks) == 1 and hunks[0].end <= hunks[0].start


def _lines_word(spans: str) -> str:
    """``line 12``, ``lines 12-14``, ``lines 3, 9``."""
    single = "," not in spans and "-" not in spans and not spans.startswith("before")
    return f"line {spans}" if single else f"lines {spans}"


#: Unchanged lines shown around each hunk.
CONTEXT = 1


def _around(text: str | None, start: int, end: int, lines: Sequence[str]) -> str:
    """Lines ``start``..``end`` of ``text`` with :data:`CONTEXT` lines each side, out to
    the nearest line with text on it (where nothing is, the lines around the place), or
    just ``lines`` without the text."""
    if text is None:
        return "\n".join(lines) or "(nothing here: the change removed the file)"
    rows = text.splitlines()
    first, last = start - 1, max(end, start - 1)  # the hunk is rows[first:last]
    low = first
    while low > 0:  # back to a line with text on it
        low -= 1
        if first - low >= CONTEXT and rows[low].strip():
            break
    high = last
    while high < len(rows):
        high += 1
        if high - last >= CONTEXT and rows[high - 1].strip():
            break
    return "\n".join([*rows[low:first], *lines, *rows[last:high]])


def _cut(text: str, limit: int, what: str) -> str:
    """``text`` within about ``limit`` characters, cut at a line, the lines left out
    counted."""
    if len(text) <= limit:
        return text
    lines = text.split("\n")
    kept: list[str] = []
    size = 0
    for line in lines:
        if size + len(line) + 1 > limit:
            break
        kept.append(line)
        size += len(line) + 1
    return "\n".join([*kept, f"[... {_plural(len(lines) - len(kept), 'more line')} {what} "
                             "left out]"])


def hunk_order(change: Change, regression: Regression | None = None,
               first: Sequence[str] = ()) -> tuple[Hunk, ...]:
    """The hunks of the project's non-test files in the order a prompt spends its room on
    them: the culprit's; then those of the culprit's files, the nearest to a culprit line
    first; then those of ``first`` (the bug's files), then the rest, each in line order."""
    culprits = regression.culprits if regression is not None and (
        regression.verdict == REGRESSION) else ()
    chosen = [hunk for hunk in culprits if not hunk.test]
    files = list(dict.fromkeys([*(hunk.path for hunk in chosen), *first]))

    def key(hunk: Hunk) -> tuple[int, str, int, int]:
        near = [abs(hunk.start - other.start) for other in chosen if other.path == hunk.path]
        rank = files.index(hunk.path) if hunk.path in files else len(files)
        return (rank, hunk.path if rank == len(files) else "", min(near, default=0),
                hunk.start)

    keys = {(h.path, h.start, h.end) for h in chosen}
    rest = sorted((hunk for hunk in change.source_hunks
                   if (hunk.path, hunk.start, hunk.end) not in keys), key=key)
    return (*chosen, *rest)


def _hunk_block(hunk: Hunk, now: str, was: str, *, around: bool) -> str:
    """One hunk for a prompt: its lines now, then the base's (``was``; "" when there was
    no room for them)."""
    where = (_lines_word(hunk.span) if hunk.lines
             else f"where the change removed lines, before line {hunk.start}")
    block = (f"{hunk.path}, {where}, now{' (with the lines around)' if around else ''}:\n"
             f"{fence(now, 'python')}\nbefore the change:")
    if not was:
        return f"{block} {_plural(len(hunk.base_lines), 'line')} (left out: no room)"
    return f"{block}\n{fence(was, 'python')}"


@dataclass(frozen=True)
class ChangeView:
    """The change as a prompt shows it: the base's name; ``culprit``: how the experiment
    found the culprit hunks, and each of them now and at the base ("" when none was
    found); ``diff``: the change's other hunks of the project's non-test files, the same
    way (the current lines, which a fix quotes, then the base's), those left out named;
    the changed test files (named, not shown)."""

    base: str
    diff: str
    culprit: str = ""
    tests: tuple[str, ...] = ()
    size: int = field(default=0, compare=False)


def change_view(change: Change, regression: Regression | None = None,
                first: Sequence[str] = (), limit: int = CHANGE_BUDGET) -> ChangeView:
    """What a prompt shows of ``change`` within ``limit`` characters; ``first`` are the
    bug's files, whose hunks come before the rest.

    Every hunk's current lines (with the lines around them, so the place of removed lines
    shows too) come first, in :func:`hunk_order`, while they fit: they are what a fix
    edits and quotes. The base's lines each replaced come next, in the same order, cut
    where the room ends.
    """
    found = regression is not None and regression.verdict == REGRESSION
    order = hunk_order(change, regression, first)
    culprits = sum(not hunk.test for hunk in regression.culprits) if (
        found and regression is not None) else 0
    intro = ""
    if found and regression is not None:
        intro = (f"{regression.test} fails on the current code and passes when only these "
                 f"lines of the change since {regression.base} are put back as they were "
                 f"(found by {_plural(regression.reruns, 'rerun')} in a sandbox copy). Fix "
                 "the fault there and keep what the change meant to do: a plain revert "
                 "undoes the change.")
    used = len(intro) + 200
    nows: list[str] = []
    for hunk in order:
        file = change.file(hunk.path)
        now = _cut(_around(file.current if file else None, hunk.start, hunk.end,
                           hunk.lines), HUNK_BUDGET, "of this hunk")
        cost = len(now) + len(hunk.path) + 80
        if nows and used + cost > limit:
            break
        nows.append(now)
        used += cost
    shown = order[:len(nows)]
    was: list[str] = []
    for hunk in shown:
        room = limit - used - 40
        if not hunk.base_lines or room < 80:
            was.append("" if hunk.base_lines else "(nothing: the change added them)")
            continue
        text = _cut("\n".join(hunk.base_lines), room, "of the base")
        was.append(text)
        used += len(text) + 40
    blocks = [_hunk_block(hunk, now, old, around=change.file(hunk.path) is not None)
              for hunk, now, old in zip(shown, nows, was, strict=True)]
    left = order[len(shown):]
    tail = ""
    if left:
        names = ", ".join(hunk.label for hunk in left[:8]) + (", ..." if len(left) > 8 else "")
        tail = f"[... {_plural(len(left), 'more changed hunk')} not shown: {names}]"
    culprit = "\n\n".join([intro, *blocks[:culprits]]) if found else ""
    rest = "\n\n".join([*blocks[culprits:], *([tail] if tail else [])])
    return ChangeView(change.base, rest, culprit, change.changed_tests,
                      len(rest) + len(culprit) + 400)


def reverts_only(change: Change, original: Mapping[str, str], final: Mapping[str, str]
                 ) -> bool:
    """Whether going from ``original`` to ``final`` only puts lines of ``change`` back as
    they were at the base: a revert, not a fix of the change."""
    changed = [path for path in final if original.get(path) != final[path]]
    if not changed:
        return False
    for path in changed:
        file = change.file(path)
        if file is None or file.current is None or original.get(path) != file.current:
            return False
        touched = file_hunks(path, original[path], final[path])
        chosen = [hunk for hunk in file.hunks if any(_overlaps(hunk, edit) for edit in touched)]
        if not chosen or revert_text(file, chosen) != final[path]:
            return False
    return True


def _overlaps(hunk: Hunk, edit: Hunk) -> bool:
    """Whether an edit of the current text (its base side is the current text) meets a
    hunk of the change (current side)."""
    low, high = edit.base_start, max(edit.base_end, edit.base_start)
    return hunk.start <= high + 1 and low <= max(hunk.end, hunk.start) + 1
