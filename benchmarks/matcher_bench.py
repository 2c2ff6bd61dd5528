"""Benchmark the edit engine on model-style edits of real Triton kernels.

The kernels are read at run time from installed packages: liger-kernel's ``ops``
modules (the ``bench`` extra) and triton's own ``@jit`` helpers, plus one ~3,000-line
module and several ~2,000-line modules made by joining liger modules, for the size
bound. Nothing is copied into this repository.

Every case knows the intended original span and the text the file must have afterwards,
computed here without the engine. An outcome is ``correct`` (the file became exactly that
text, or, for kinds that must be refused, stayed unchanged), ``refused`` (unchanged) or
``wrong`` (anything else). Cases are drawn with a seeded RNG, so runs are reproducible.

Each edit's time is also given as a ratio to one ``ast.parse`` of the same file (the
best of several), so small and large files compare, and machines too.

Usage: python benchmarks/matcher_bench.py [--seed 0] [--per-kind 40] [--repeat 5] [--wall]
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import os
import platform
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import rapidfuzz
from rapidfuzz import fuzz, process

from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.engine.splice import apply_modifications, clear_caches

MARK = "  # kernelfix"
APPLY_KINDS = (
    "exact",
    "dedented",
    "re-indented",
    "trailing whitespace",
    "inner whitespace",
    "one-char typo",
    "blank line +/-",
    "tabs",
    "CRLF in model text",
    "CRLF file",
    "elision",
    "ambiguous + anchor",
    "replace_all",
    "line break at end",
    "line break at start",
    "deleted last line",
    "near blank lines",
    "continuation lines",
    "2,000-line module",
    "long block, 2,000 lines",
    "final line break dropped",
)
REFUSE_KINDS = ("hallucinated", "ambiguous, no anchor")
EITHER_KINDS = ("near-twin typo",)


@dataclass(frozen=True)
class Source:
    name: str
    text: str

    @property
    def lines(self) -> list[str]:
        return self.text.split("\n")


@dataclass(frozen=True)
class Case:
    kind: str
    source: str
    content: str
    modification: Modification
    expected: str | None  # None: the edit must be refused


@dataclass
class Tally:
    correct: int = 0
    wrong: int = 0
    refused: int = 0
    times: list[float] = field(default_factory=list)
    first_times: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)  # time / ast.parse of the file


# --- sources ---------------------------------------------------------------------------


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"{name} is not installed: pip install -e '.[bench]'")
    return Path(next(iter(spec.submodule_search_locations)))


def load_sources() -> list[Source]:
    """Kernel modules with @jit functions, smallest first; plus one ~3,000-line module."""
    jit = re.compile(r"^\s*@(triton\.)?jit\b", re.M)
    sources = []
    for root, pattern in (
        (package_dir("liger_kernel") / "ops", "**/*.py"),
        (package_dir("triton") / "language", "*.py"),
        (package_dir("triton") / "tools", "*.py"),
    ):
        for path in sorted(root.glob(pattern)):
            text = path.read_text(encoding="utf-8")
            if len(jit.findall(text)) >= 2 and 60 <= text.count("\n") <= 3000:
                sources.append(Source(f"{root.parent.name}/{path.relative_to(root)}", text))
    liger = [s for s in sources if "ops" in s.name]
    joined, lines = [], 0
    for source in sorted(liger, key=lambda s: s.name):
        body = source.text.replace("from __future__ import annotations\n", "")
        if lines + body.count("\n") <= 3000:
            joined.append(body)
            lines += body.count("\n")
    sources.append(Source(f"liger ops joined ({lines} lines)", "".join(joined)))
    return sources


def two_thousand_line_modules(sources: list[Source]) -> list[Source]:
    """Liger modules joined, in name order, into modules of about 2,000 lines each.

    The accelerator backends repeat the main kernels with small changes, so these files
    are full of near twins: the slow case for fuzzy matching.
    """
    liger = sorted((s for s in sources if s.name.startswith("liger_kernel/")), key=lambda s: s.name)
    modules: list[Source] = []
    joined: list[str] = []
    lines = 0
    for source in liger:
        body = source.text.replace("from __future__ import annotations\n", "")
        size = body.count("\n")
        if size > _LARGE[1]:
            continue
        if lines + size > _LARGE[1]:
            joined, lines = [], 0
        joined.append(body)
        lines += size
        if lines >= _LARGE[0]:
            name = f"liger ops joined #{len(modules) + 1} ({lines} lines)"
            modules.append(Source(name, "".join(joined)))
            joined, lines = [], 0
    return modules


_LARGE = (1900, 2100)  # lines of a "2,000-line" module


# --- building cases ------------------------------------------------------------------------


def indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def occurrences(text: str, part: str) -> int:
    count, position = 0, text.find(part)
    while position >= 0:
        count, position = count + 1, text.find(part, position + 1)
    return count


def normalized(line: str) -> str:
    return " ".join(line.split())


def window_count(keys: list[str], wanted: list[str]) -> int:
    size = len(wanted)
    return sum(keys[i : i + size] == wanted for i in range(len(keys) - size + 1))


class Builder:
    """Draws blocks of real code and turns them into model-style edits."""

    def __init__(self, source: Source, rng: random.Random) -> None:
        self.source = source
        self.rng = rng
        self.lines = source.lines
        self.trimmed = [line.strip() for line in self.lines]
        self.keys = [normalized(line) for line in self.lines]
        self.nonblank = [k for k in self.keys if k]

    # blocks

    def block(self, low: int, high: int, tries: int = 200) -> tuple[int, int] | None:
        """A unique block of low..high lines of code: (first, last) line indices."""
        for _ in range(tries):
            size = self.rng.randint(low, high)
            first = self.rng.randrange(0, max(1, len(self.lines) - size))
            last = first + size - 1
            chunk = self.lines[first : last + 1]
            if not chunk[0].strip() or not chunk[-1].strip():
                continue
            if not any(len(line.strip()) >= 12 for line in chunk):
                continue
            if any(line.rstrip().endswith("\\") for line in chunk):
                continue
            if self.unique(first, last):
                return first, last
        return None

    def block_where(
        self, low: int, high: int, fits: Callable[[int, int], bool], tries: int = 30
    ) -> tuple[int, int] | None:
        """A block as ``block`` draws them, for which ``fits(first, last)`` holds."""
        for _ in range(tries):
            found = self.block(low, high)
            if found is None or fits(*found):
                return found
        return None

    def unique(self, first: int, last: int) -> bool:
        """The block occurs once: as text, as trimmed lines, as non-blank normalized lines."""
        if occurrences(self.source.text, "\n".join(self.lines[first : last + 1])) != 1:
            return False
        if window_count(self.trimmed, self.trimmed[first : last + 1]) != 1:
            return False
        nonblank = [k for k in self.keys[first : last + 1] if k]
        return window_count(self.nonblank, nonblank) == 1

    def changed(self, first: int, last: int, line: int | None = None) -> list[str]:
        """The block with a comment appended to one code line: a syntax-safe fix."""
        chunk = list(self.lines[first : last + 1])
        candidates = [i for i, text in enumerate(chunk) if text.strip()]
        index = self.rng.choice(candidates) if line is None else line
        chunk[index] += MARK
        return chunk

    def expected(self, first: int, last: int, new: list[str]) -> str:
        return "\n".join([*self.lines[:first], *new, *self.lines[last + 1 :]])

    def case(
        self,
        kind: str,
        old: str,
        new: str,
        expected: str | None,
        *,
        replace_all: bool = False,
        anchor: str = "",
    ) -> Case:
        mod = Modification(old, new, replace_all=replace_all, anchor=anchor)
        return Case(kind, self.source.name, self.source.text, mod, expected)

    def similar_elsewhere(self, first: int, last: int) -> float:
        """Best similarity of the block to any same-sized window not overlapping it."""
        size = last - first + 1
        wanted = "\n".join(self.keys[first : last + 1])
        windows = [
            "\n".join(self.keys[i : i + size])
            for i in range(len(self.lines) - size + 1)
            if i + size <= first or i > last
        ]
        best = process.extractOne(wanted, windows, scorer=fuzz.ratio) if windows else None
        return best[1] / 100 if best else 0.0

    def repeated_lines(self) -> list[str]:
        """Whole lines of code that occur at least twice, always with the same indentation."""
        seen: dict[str, list[int]] = {}
        for index, line in enumerate(self.lines):
            if len(line.strip()) >= 12 and not line.rstrip().endswith("\\"):
                seen.setdefault(line.strip(), []).append(index)
        return [
            self.lines[spots[0]]
            for spots in seen.values()
            if len(spots) >= 2 and len({self.lines[i] for i in spots}) == 1
        ]


def dedent(lines: list[str], amount: int) -> list[str]:
    return [line[amount:] if line.strip() else "" for line in lines]


def generate(kind: str, builder: Builder) -> Case | None:
    """One case of a kind from one source, or None when the source offers none."""
    rng = builder.rng
    if kind in ("hallucinated", "ambiguous, no anchor", "ambiguous + anchor", "replace_all"):
        return _special(kind, builder)
    if kind == "near-twin typo":
        return _near_twin(builder)
    if kind == "elision":
        return _elision(builder)
    if kind in NEW_KINDS:
        return NEW_KINDS[kind](kind, builder)
    low, high = {"blank line +/-": (3, 7), "one-char typo": (1, 5)}.get(kind, (1, 6))
    found = builder.block(low, high)
    if found is None:
        return None
    first, last = found
    old = builder.lines[first : last + 1]
    new = builder.changed(first, last)
    expected = builder.expected(first, last, new)
    end = "\n" if rng.random() < 0.5 else ""
    transform = TRANSFORMS[kind]
    moved = transform(old, new, builder, first, last)
    if moved is None:
        return None
    old_m, new_m = moved
    content = builder.source.text
    if kind == "CRLF file":
        content, expected = content.replace("\n", "\r\n"), expected.replace("\n", "\r\n")
    if kind == "CRLF in model text":
        end = "\r\n" if end else ""
    mod = Modification(old_m + end, new_m + end)
    return Case(kind, builder.source.name, content, mod, expected)


Transform = Callable[[list[str], list[str], Builder, int, int], "tuple[str, str] | None"]


def _plain(old: list[str], new: list[str], *_: object) -> tuple[str, str]:
    return "\n".join(old), "\n".join(new)


def _dedented(old: list[str], new: list[str], *_: object) -> tuple[str, str] | None:
    common = min(len(indent_of(line)) for line in old if line.strip())
    if common < 4:
        return None
    return "\n".join(dedent(old, common)), "\n".join(dedent(new, common))


def _reindented(old: list[str], new: list[str], builder: Builder, *_: object) -> tuple[str, str]:
    pad = " " * builder.rng.choice((2, 4, 8))
    return "\n".join(pad + line for line in old), "\n".join(pad + line for line in new)


def _trailing(old: list[str], new: list[str], builder: Builder, *_: object) -> tuple[str, str]:
    rng = builder.rng
    spots = [i for i, line in enumerate(old) if line.strip()]
    dirty = list(old)
    for i in rng.sample(spots, rng.randint(1, len(spots))):
        dirty[i] += rng.choice([" ", "  ", "\t", "   "])
    return "\n".join(dirty), "\n".join(new)


def _inner(old: list[str], new: list[str], builder: Builder, *_: object) -> tuple[str, str] | None:
    rng = builder.rng
    spots = [i for i, line in enumerate(old) if " " in line.strip()]
    if not spots:
        return None
    dirty = list(old)
    for i in rng.sample(spots, rng.randint(1, min(3, len(spots)))):
        body = dirty[i].lstrip()
        cuts = [m.start() for m in re.finditer(r"(?<=\S) (?=\S)", body)]
        if cuts:
            cut = rng.choice(cuts)
            body = body[:cut] + rng.choice(["  ", "   ", "\t"]) + body[cut + 1 :]
        dirty[i] = indent_of(dirty[i]) + body
    if dirty == old:
        return None
    return "\n".join(dirty), "\n".join(new)


def _typo(
    old: list[str], new: list[str], builder: Builder, first: int, last: int
) -> tuple[str, str] | None:
    if builder.similar_elsewhere(first, last) >= 0.9:
        return None  # a near twin: that is the near-twin kind
    return _with_typo(old, builder.rng), "\n".join(new)


def _with_typo(lines: list[str], rng: random.Random) -> str:
    spots = [
        i
        for i, line in enumerate(lines)
        if len(line.strip()) >= 12 and any(ch.isalnum() for ch in line)
    ]
    i = rng.choice(spots)
    line = lines[i]
    positions = [p for p, ch in enumerate(line) if ch.isalnum()]
    p = rng.choice(positions)
    action = rng.choice(("swap", "drop", "double"))
    if action == "swap":
        letter = rng.choice([c for c in "abcdefghijklmnopqrstuvwxyz" if c != line[p].lower()])
        line = line[:p] + letter + line[p + 1 :]
    elif action == "drop":
        line = line[:p] + line[p + 1 :]
    else:
        line = line[:p] + line[p] + line[p:]
    return "\n".join([*lines[:i], line, *lines[i + 1 :]])


def _blank(old: list[str], new: list[str], builder: Builder, *_: object) -> tuple[str, str]:
    rng = builder.rng
    blanks = [i for i, line in enumerate(old) if not line.strip()]
    dirty = list(old)
    if blanks:
        dirty.pop(rng.choice(blanks))
    else:
        dirty.insert(rng.randint(1, len(old) - 1), "")
    return "\n".join(dirty), "\n".join(new)


def _tabs(old: list[str], new: list[str], *_: object) -> tuple[str, str] | None:
    if any(len(indent_of(line)) % 4 for line in old if line.strip()):
        return None

    def tabbed(lines: list[str]) -> str:
        return "\n".join("\t" * (len(indent_of(x)) // 4) + x.lstrip(" ") for x in lines)

    return tabbed(old), tabbed(new)


def _crlf(old: list[str], new: list[str], *_: object) -> tuple[str, str]:
    return "\r\n".join(old), "\r\n".join(new)


TRANSFORMS: dict[str, Transform] = {
    "exact": _plain,
    "dedented": _dedented,
    "re-indented": _reindented,
    "trailing whitespace": _trailing,
    "inner whitespace": _inner,
    "one-char typo": _typo,
    "blank line +/-": _blank,
    "tabs": _tabs,
    "CRLF in model text": _crlf,
    "CRLF file": _plain,
}


def _elision(builder: Builder) -> Case | None:
    found = builder.block(6, 14)
    if found is None:
        return None
    first, last = found
    lines, text = builder.lines, builder.source.text
    head, tail = lines[first : first + 2], lines[last - 1 : last + 1]
    head_text = "\n".join(head)
    if not all(line.strip() for line in (*head, *tail)) or occurrences(text, head_text) != 1:
        return None
    after_head = text.index(head_text) + len(head_text)
    if occurrences(text[after_head:], "\n".join(tail)) != 1:
        return None
    marker = indent_of(lines[first + 2] or lines[first + 1]) + "# ... existing code ..."
    new = builder.changed(first, last, line=builder.rng.randrange(2))
    old_m = "\n".join([*head, marker, *tail])
    new_m = "\n".join([*new[:2], marker, *tail])
    return builder.case("elision", old_m, new_m, builder.expected(first, last, new))


def _special(kind: str, builder: Builder) -> Case | None:
    rng, lines, text = builder.rng, builder.lines, builder.source.text
    if kind == "hallucinated":
        other = rng.choice([s for s in SOURCES if s.name != builder.source.name])
        donor = Builder(other, rng)
        found = donor.block(2, 5)
        if found is None:
            return None
        chunk = other.lines[found[0] : found[1] + 1]
        wanted = "\n".join(normalized(line) for line in chunk if line.strip())
        nonblank = builder.nonblank
        size = wanted.count("\n") + 1
        windows = [
            "\n".join(nonblank[i : i + k])
            for k in (size - 1, size, size + 1)
            if k >= 1
            for i in range(len(nonblank) - k + 1)
        ]
        best = process.extractOne(wanted, windows, scorer=fuzz.ratio)
        if best is not None and best[1] >= 70:
            return None  # too close to real code here to count as a hallucination
        return builder.case(kind, "\n".join(chunk), "\n".join(chunk) + MARK, None)
    repeated = builder.repeated_lines()
    if not repeated:
        return None
    target = rng.choice(repeated)
    spots = [i for i, line in enumerate(lines) if line == target]
    new_line = target + MARK
    if kind == "ambiguous, no anchor":
        return builder.case(kind, target, new_line, None)
    if kind == "replace_all":
        expected = "\n".join(new_line if line == target else line for line in lines)
        return builder.case(kind, target, new_line, expected, replace_all=True)
    k = rng.randrange(1, len(spots))
    between = range(spots[k] - 1, spots[k - 1], -1)
    anchor = next(
        (
            lines[i]
            for i in between
            if len(lines[i].strip()) >= 12 and occurrences(text, lines[i].strip()) == 1
        ),
        None,
    )
    if anchor is None:
        return None
    expected = "\n".join(new_line if i == spots[k] else line for i, line in enumerate(lines))
    return builder.case(kind, target, new_line, expected, anchor=anchor.strip())


def _near_twin(builder: Builder) -> Case | None:
    rng, lines, text = builder.rng, builder.lines, builder.source.text
    pool = [
        i
        for i, line in enumerate(lines)
        if len(line.strip()) >= 15 and occurrences(text, line.strip()) == 1
    ]
    if len(pool) < 2:
        return None
    sample = rng.sample(pool, min(len(pool), 600))
    keys = [builder.keys[i] for i in sample]
    scores = process.cdist(keys, keys, scorer=fuzz.ratio, score_cutoff=85)
    pairs = [
        (sample[a], sample[b])
        for a in range(len(sample))
        for b in scores[a].nonzero()[0]
        if a != b and scores[a][b] < 100
    ]
    if not pairs:
        return None
    target, _twin = rng.choice(pairs)
    old = _with_typo([lines[target]], rng)
    new = builder.changed(target, target, line=0)
    return builder.case(
        "near-twin typo", old, "\n".join(new), builder.expected(target, target, new)
    )


# --- line breaks, blank lines, continuation lines, large files -----------------------------


def parses(text: str) -> bool:
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):
        return False
    return True


def edges(text: str) -> tuple[int, str, int]:
    """Line breaks before the first non-blank line, the text from it to the last
    non-blank line, and line breaks after that."""
    lines = text.split("\n")
    nonblank = [i for i, line in enumerate(lines) if line.strip()]
    core = "\n".join(lines[nonblank[0] : nonblank[-1] + 1])
    return nonblank[0], core, len(lines) - 1 - nonblank[-1]


def plain_expected(content: str, exact_old: str, exact_new: str) -> str | None:
    """The file after a plain replacement of the (unique) exact quote.

    A line break that a non-blank new_string dropped is kept: at its end always, at its
    start where it ends a line with text outside the quote. Where the result does not
    parse (line breaks new_string added joined or split code), the engine keeps the file's
    line breaks at the ends instead, as documented; None when neither parses.
    """
    start = content.index(exact_old)
    if exact_new.strip():
        if exact_old.endswith("\n") and not exact_new.endswith("\n"):
            exact_new += "\n"
        joins = start > 0 and content[start - 1] != "\n"
        if joins and exact_old.startswith("\n") and not exact_new.startswith("\n"):
            exact_new = "\n" + exact_new
    plain = content[:start] + exact_new + content[start + len(exact_old) :]
    if parses(plain):
        return plain
    lead, _, tail = edges(exact_old)
    kept = "\n" * lead + edges(exact_new)[1] + "\n" * tail
    kept_text = content[:start] + kept + content[start + len(exact_old) :]
    return kept_text if parses(kept_text) else None


def model_copy(
    builder: Builder, old: list[str], new: list[str], first: int, last: int
) -> tuple[str, str] | None:
    """old and new as a model copies them: as is, dedented, or with a space doubled."""
    how = builder.rng.choice(("exact", "dedented", "inner whitespace"))
    return TRANSFORMS[how](old, new, builder, first, last)


def _line_break(kind: str, builder: Builder) -> Case | None:
    """A line break at one end that old_string and new_string do not agree on."""
    found = builder.block(1, 6)
    if found is None:
        return None
    first, last = found
    lines = builder.lines
    if (kind == "line break at start" and first == 0) or last + 1 >= len(lines):
        return None
    old, new = lines[first : last + 1], builder.changed(first, last)
    moved = model_copy(builder, old, new, first, last)
    if moved is None:
        return None
    breaks = builder.rng.choice((("\n", ""), ("", "\n")))
    heads, tails = (breaks, ("", "")) if kind == "line break at start" else (("", ""), breaks)
    expected = plain_expected(
        builder.source.text,
        heads[0] + "\n".join(old) + tails[0],
        heads[1] + "\n".join(new) + tails[1],
    )
    if expected is None:
        return None
    old_m, new_m = heads[0] + moved[0] + tails[0], heads[1] + moved[1] + tails[1]
    return builder.case(kind, old_m, new_m, expected)


def _deleted_last_line(kind: str, builder: Builder) -> Case | None:
    """The last line of the quote deleted, its line break kept (mostly before a blank line)."""
    lines, rng = builder.lines, builder.rng

    def fits(first: int, last: int) -> bool:
        return last + 1 < len(lines) and (not lines[last + 1].strip() or rng.random() < 0.3)

    found = builder.block_where(2, 6, fits)
    if found is None:
        return None
    first, last = found
    old = lines[first : last + 1]
    kept = builder.changed(first, last - 1) if rng.random() < 0.5 else old[:-1]
    moved = model_copy(builder, old, kept, first, last)
    if moved is None:
        return None
    expected = plain_expected(builder.source.text, "\n".join(old), "\n".join(kept) + "\n")
    if expected is None:
        return None
    return builder.case(kind, moved[0], moved[1] + "\n", expected)


def _near_blank(kind: str, builder: Builder) -> Case | None:
    """A block next to a blank line: the blank line quoted and kept or dropped, or added."""
    lines, rng = builder.lines, builder.rng

    def sides(first: int, last: int) -> list[str]:
        return [
            side
            for side, blank in (("before", first - 1), ("after", last + 1))
            if 0 < blank < len(lines) - 1 and lines[blank] == ""
        ]

    found = builder.block_where(1, 6, lambda first, last: bool(sides(first, last)))
    if found is None:
        return None
    first, last = found
    side, action = rng.choice(sides(first, last)), rng.choice(("keep", "drop", "add"))
    quoted, one = ("\n", "") if side == "before" else ("\n\n", "\n")
    old_edge, new_edge = {"keep": (quoted, quoted), "drop": (quoted, one), "add": (one, quoted)}[
        action
    ]
    old, new = lines[first : last + 1], builder.changed(first, last)
    how = rng.choice(("exact", "dedented"))
    moved = TRANSFORMS[how](old, new, builder, first, last)
    if moved is None:
        return None

    def framed(body: str, edge: str) -> str:
        return edge + body if side == "before" else body + edge

    expected = plain_expected(
        builder.source.text, framed("\n".join(old), old_edge), framed("\n".join(new), new_edge)
    )
    if expected is None:
        return None
    return builder.case(kind, framed(moved[0], old_edge), framed(moved[1], new_edge), expected)


def _continuation(kind: str, builder: Builder) -> Case | None:
    """A continuation line inside parentheses, copied a few columns off (maybe with a
    space doubled elsewhere); the model changes one line and copies the rest as it quoted
    them. Lines it did not change stay as the file has them."""
    lines, rng = builder.lines, builder.rng
    spots = [
        c
        for c in range(1, len(lines) - 1)
        if lines[c].strip()
        and lines[c - 1].count("(") > lines[c - 1].count(")")
        and len(indent_of(lines[c])) > len(indent_of(lines[c - 1]))
    ]
    rng.shuffle(spots)
    for c in spots[:30]:
        first, last = c - 1 - rng.randint(0, 1), min(len(lines) - 1, c + rng.randint(0, 2))
        chunk = lines[first : last + 1]
        if first >= 0 and chunk[0].strip() and chunk[-1].strip() and builder.unique(first, last):
            break
    else:
        return None
    cont = c - first
    copy = list(chunk)
    opener = len(indent_of(lines[c - 1]))
    width = len(indent_of(copy[cont])) + rng.choice((-3, -2, -1, 1, 2, 3))
    copy[cont] = " " * max(opener + 1, width) + copy[cont].lstrip()
    if copy[cont] == chunk[cont]:
        return None
    if rng.random() < 0.5:
        spot = rng.randrange(len(copy))
        body = copy[spot].lstrip()
        if re.search(r"(?<=\S) (?=\S)", body):
            copy[spot] = indent_of(copy[spot]) + re.sub(r"(?<=\S) (?=\S)", "  ", body, count=1)
    mark = rng.choice([i for i, line in enumerate(chunk) if line.strip()])
    model_new = list(copy)
    model_new[mark] += MARK
    fixed = list(chunk)
    fixed[mark] = indent_of(chunk[mark]) + model_new[mark].lstrip()
    common = min(len(indent_of(line)) for line in copy if line.strip())
    if rng.random() < 0.5 and common >= 4:
        copy, model_new = dedent(copy, common), dedent(model_new, common)
    end = rng.choice(("\n", ""))
    old_m, new_m = "\n".join(copy) + end, "\n".join(model_new) + end
    return builder.case(kind, old_m, new_m, builder.expected(first, last, fixed))


# Where a line break dropped from the end of new_string would join the next line onto
# the edit, and the result often still parse: (old line, the line after it).
SITES: dict[str, Callable[[str, str], bool]] = {
    "blank line": lambda line, after: not after.strip(),
    "comment": lambda line, after: after.lstrip().startswith("#"),
    "parameter": lambda line, after: line.rstrip().endswith(",") and bool(after.strip()),
    "deeper line": lambda line, after: (
        line.rstrip().endswith(":") and len(indent_of(after)) > len(indent_of(line))
    ),
}


def _dropped_break(kind: str, builder: Builder) -> Case | None:
    """Whole lines quoted with their final line break, new_string without it (the model
    dropped it), before a blank line, a comment, a deeper line or inside a parameter
    list; the fix mostly on the last line. The line break stays in the file."""
    lines, rng = builder.lines, builder.rng
    fits = SITES[rng.choice(list(SITES))]
    spots = [
        i
        for i in range(len(lines) - 1)
        if lines[i].strip() and not lines[i].rstrip().endswith("\\") and fits(*lines[i : i + 2])
    ]
    rng.shuffle(spots)
    for last in spots[:20]:
        first = max(0, last - rng.randint(0, 3))
        if lines[first].strip() and builder.unique(first, last):
            break
    else:
        return None
    old = lines[first : last + 1]
    new = builder.changed(first, last, line=last - first if rng.random() < 0.7 else None)
    how = rng.choice(("exact", "exact", "dedented", "inner whitespace", "one-char typo"))
    if how == "one-char typo" and not any(len(line.strip()) >= 12 for line in old):
        how = "exact"
    moved = TRANSFORMS[how](old, new, builder, first, last)
    if moved is None:
        return None
    content, expected = builder.source.text, builder.expected(first, last, new)
    if rng.random() < 0.25:
        content, expected = content.replace("\n", "\r\n"), expected.replace("\n", "\r\n")
    mod = Modification(moved[0] + "\n", moved[1])
    return Case(kind, builder.source.name, content, mod, expected)


LARGE_MIX = (
    "one-char typo",
    "inner whitespace",
    "dedented",
    "trailing whitespace",
    "blank line +/-",
    "deleted last line",
    "continuation lines",
    "line break at end",
)


def _large(kind: str, builder: Builder) -> Case | None:
    """A mix of the tolerant kinds, on a ~2,000-line module."""
    case = generate(builder.rng.choice(LARGE_MIX), builder)
    return None if case is None else dataclasses.replace(case, kind=kind)


def _long_block(kind: str, builder: Builder) -> Case | None:
    """15-50 lines with a typo and a few spaces doubled: fuzzy over long windows."""
    found = builder.block(15, 50)
    if found is None:
        return None
    first, last = found
    old, new = builder.lines[first : last + 1], builder.changed(first, last)
    dirty = _with_typo(old, builder.rng).split("\n")
    moved = _inner(dirty, new, builder)
    if moved is None:
        return None
    return builder.case(kind, moved[0], moved[1], builder.expected(first, last, new))


NEW_KINDS: dict[str, Callable[[str, Builder], Case | None]] = {
    "line break at end": _line_break,
    "line break at start": _line_break,
    "deleted last line": _deleted_last_line,
    "near blank lines": _near_blank,
    "continuation lines": _continuation,
    "2,000-line module": _large,
    "long block, 2,000 lines": _long_block,
    "final line break dropped": _dropped_break,
}
# Kinds added later are drawn after all others, so a seed still draws the same cases for
# the kinds before them.
LATER_KINDS = ("final line break dropped",)
LARGE_KINDS = ("2,000-line module", "long block, 2,000 lines")


SOURCES: list[Source] = []
LARGE: list[Source] = []


def build_corpus(seed: int, per_kind: int) -> list[Case]:
    rng = random.Random(seed)
    large = SOURCES[-1]
    cases = []
    kinds = (*APPLY_KINDS, *REFUSE_KINDS, *EITHER_KINDS)
    for kind in (*(k for k in kinds if k not in LATER_KINDS), *LATER_KINDS):
        made, attempts = 0, 0
        while made < per_kind and attempts < per_kind * 30:
            attempts += 1
            if kind in LARGE_KINDS:
                source = rng.choice(LARGE)
            else:
                source = large if rng.random() < 0.3 else rng.choice(SOURCES[:-1])
            case = generate(kind, Builder(source, rng))
            if case is not None:
                cases.append(case)
                made += 1
    return cases


# --- running ---------------------------------------------------------------------------


Clock = Callable[[], float]


def run_case(case: Case, clock: Clock) -> tuple[str, float]:
    """Outcome and time (seconds) of applying one case with cold caches."""
    clear_caches()
    start = clock()
    result = apply_modifications(case.content, [case.modification], path="kernel.py")
    elapsed = clock() - start
    if result.code == case.content:
        return ("correct" if case.expected is None else "refused"), elapsed
    return ("correct" if result.code == case.expected else "wrong"), elapsed


def parse_time(text: str, clock: Clock, repeat: int = 5) -> float:
    """The best of ``repeat`` ``ast.parse`` calls on the file (seconds): the unit of cost."""
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        ast.parse(text)
        best = min(best, clock() - start)
    return best


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def rows(tallies: dict[str, Tally]) -> Iterator[str]:
    yield (
        "| kind | cases | correct | wrong | refused | p50 ms | p99 ms | max ms "
        "| x parse p50 | x parse p99 |"
    )
    yield "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    for kind, t in tallies.items():
        n = t.correct + t.wrong + t.refused
        ms = [x * 1000 for x in t.times]
        yield (
            f"| {kind} | {n} | {t.correct} | {t.wrong} | {t.refused} | "
            f"{statistics.median(ms):.2f} | {percentile(ms, 0.99):.2f} | {max(ms):.2f} | "
            f"{statistics.median(t.ratios):.2f} | {percentile(t.ratios, 0.99):.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-kind", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=5, help="timed passes; the best counts")
    parser.add_argument("--show-wrong", action="store_true")
    parser.add_argument("--wall", action="store_true", help="wall-clock time, not CPU time")
    args = parser.parse_args()
    # The process's own CPU time by default: the work is single-threaded, so on an idle
    # machine it is the wall time, and other work on a shared machine does not inflate it.
    clock: Clock = time.perf_counter if args.wall else time.process_time
    SOURCES.extend(load_sources())
    LARGE.extend(two_thousand_line_modules(SOURCES))
    cases = build_corpus(args.seed, args.per_kind)
    parse_times = {case.content: float("inf") for case in cases}
    tallies: dict[str, Tally] = {}
    wrongs = []
    largest_times: list[float] = []
    large_names = {source.name for source in LARGE}
    large_ratios: list[float] = []
    # Whole passes over the corpus, so a burst of load on this shared machine spoils a
    # case in one pass, not in all of them; a case's time is its best pass. Each pass
    # also times ast.parse of every file, so both sides of the ratio see the same load.
    passes = []
    for _ in range(args.repeat):
        for content, best in parse_times.items():
            parse_times[content] = min(best, parse_time(content, clock, repeat=3))
        passes.append([run_case(case, clock) for case in cases])
    for index, case in enumerate(cases):
        outcome, first = passes[0][index]
        tally = tallies.setdefault(case.kind, Tally())
        setattr(tally, outcome, getattr(tally, outcome) + 1)
        tally.times.append(min(run[index][1] for run in passes))
        tally.ratios.append(tally.times[-1] / parse_times[case.content])
        if case.source == SOURCES[-1].name:
            largest_times.append(tally.times[-1] * 1000)
        if case.source in large_names:
            large_ratios.append(tally.ratios[-1])
        tally.first_times.append(first)
        if outcome == "wrong":
            wrongs.append(case)
    tallies = {k: tallies[k] for k in (*APPLY_KINDS, *REFUSE_KINDS, *EITHER_KINDS) if k in tallies}
    largest = max(s.text.count("\n") for s in SOURCES)
    print(
        f"{len(cases)} cases from {len(SOURCES) + len(LARGE)} kernel modules (up to {largest} "
        f"lines; {len(LARGE)} of about 2,000), seed {args.seed}; time per edit = one "
        f"apply_modifications call with cold caches ({'wall' if args.wall else 'CPU'} time), "
        f"best of {args.repeat} passes; x parse = that time / one ast.parse of the same file"
    )
    print(
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}, rapidfuzz {rapidfuzz.__version__}"
    )
    print()
    for line in rows(tallies):
        print(line)
    apply_tallies = [tallies[k] for k in APPLY_KINDS if k in tallies]
    total = sum(t.correct + t.wrong + t.refused for t in apply_tallies)
    correct = sum(t.correct for t in apply_tallies)
    everything = [x * 1000 for t in tallies.values() for x in t.times]
    ratios = [x for t in tallies.values() for x in t.ratios]
    firsts = [x * 1000 for t in tallies.values() for x in t.first_times]
    print()
    print(f"wrong, all kinds: {sum(t.wrong for t in tallies.values())}")
    print(f"correct on kinds that should apply: {correct}/{total} = {100 * correct / total:.1f}%")
    refuse = [tallies[k] for k in REFUSE_KINDS if k in tallies]
    print(
        f"refused where they must: {sum(t.correct for t in refuse)}/"
        f"{sum(t.correct + t.wrong + t.refused for t in refuse)}"
    )
    print(
        f"all edits: p50 {statistics.median(everything):.2f} ms, "
        f"p99 {percentile(everything, 0.99):.2f} ms, max {max(everything):.2f} ms "
        f"(first pass alone: p99 {percentile(firsts, 0.99):.2f} ms)"
    )
    print(
        f"all edits / ast.parse of the file: p50 {statistics.median(ratios):.2f}, "
        f"p99 {percentile(ratios, 0.99):.2f}, max {max(ratios):.2f}; "
        f"on the ~2,000-line modules ({len(large_ratios)} cases): "
        f"p50 {statistics.median(large_ratios):.2f}, p99 {percentile(large_ratios, 0.99):.2f}"
    )
    print(
        f"{SOURCES[-1].name}, its {len(largest_times)} cases: "
        f"p50 {statistics.median(largest_times):.2f} ms, "
        f"p99 {percentile(largest_times, 0.99):.2f} ms, max {max(largest_times):.2f} ms"
    )
    if args.show_wrong:
        for case in wrongs:
            print("\n--- WRONG", case.kind, case.source, repr(case.modification))


if __name__ == "__main__":
    main()
