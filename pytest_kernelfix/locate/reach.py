"""Find the code behind a failing kernel test, wherever it lives in the project.

A bug that produces wrong numbers without an exception leaves no traceback frame in
the faulty file: the launch grid may be computed by a wrapper in another module, the
wrong value by a ``@triton.jit`` helper imported from a third, the block size by a
Python helper in a ``utils`` module. :class:`Reach` starts from what the test run
recorded (launched kernels, launch sites, traceback frames) and follows the project's
own imports (module attributes, ``from x import y``, aliases, relative imports,
``__init__`` re-exports) to:

- the ``@triton.jit`` functions a launched kernel calls, transitively;
- the project functions a launch site calls to compute what the launch receives
  (grid, block sizes, dtypes, strides, output tensors), and the constants and
  ``triton.Config`` lists they read.

Every definition found is scored (how close to the fault it is: the kernel and the
innermost frames first) and put in a *tier* (what a prompt shows first, and cuts last:
:data:`TIER_FIRST` to :data:`TIER_REST`), and the list is bounded. When nothing is found, the search
widens level by level (AutoCodeRover's bug-location fallback): the functions the test
calls, then a text search of the project. The same search answers a model's ``need``
(``"ops/act.py:silu"``, ``"search: BLOCK_SIZE_N"``). Never tests, conftests or
installed packages: the :class:`~pytest_kernelfix.project.Project` decides.
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from pytest_kernelfix.locate.branches import Env, callee_env, entry_env, taken
from pytest_kernelfix.locate.outline import Definition, ModuleIndex, parse_module
from pytest_kernelfix.project import Project, walk_files

#: Bounds: definitions kept per bug, depth of Python helper calls, files scanned by search.
MAX_LOCATED = 40
MAX_PYTHON_DEPTH = 2
MAX_JIT_DEPTH = 6
MAX_SCAN_FILES = 4000
MAX_SCAN_BYTES = 1024 * 1024
#: Distinct sets of constexpr values a jit function is followed with; past that, all
#: its branches are.
MAX_ENVS = 8
#: Score added to a definition the failing tests' ids name (``test_act[silu-float32]``),
#: by a word that names at most MAX_NAMED of those found.
WORD_BONUS = 6.0
MAX_NAMED = 3


#: Tiers, lowest shown first and cut last. FIRST: the frame that raised and the functions
#: that launch the kernels (for a gradient failure the autograd Function's ``forward`` and
#: ``backward``, for a test that expects an exception every project frame on the launch
#: stack); KERNEL: the launched kernels; HELPER: their jit helpers and what sizes the
#: launches (grid, block sizes, warps, buffer shapes); REST: everything else, shown while
#: it fits.
TIER_FIRST, TIER_KERNEL, TIER_HELPER, TIER_REST = 0, 1, 2, 3
#: Score taken from a kernel a wrapper's code launches but the test run did not (a
#: branch that never ran): below the wrapper itself.
NOT_LAUNCHED_PENALTY = 30.0

#: Records a found definition: (file, definition, score, why, depth, constexpr values a
#: jit function runs with (None: those the launches reach it with), tier).
_Add = Callable[[str, Definition, float, str, int, "Env | None", int], None]


@dataclass(frozen=True)
class Located:
    """A definition that may hold the fault: ``path`` is rootdir-relative.

    ``tier`` says how firmly a prompt shows it (:data:`TIER_FIRST` first and cut last);
    within a tier, ``score`` orders. The definitions of every tier but
    :data:`TIER_REST` are *pinned*: shown in full before anything of lower tier.
    """

    path: str
    qualname: str
    score: float
    why: str
    jit: bool = False
    tier: int = TIER_REST

    @property
    def key(self) -> tuple[str, str]:
        return self.path, self.qualname

    @property
    def pinned(self) -> bool:
        return self.tier < TIER_REST

    @property
    def order(self) -> tuple[int, float, str, str]:
        """How a list of them is sorted: by tier, then best score first."""
        return self.tier, -self.score, self.path, self.qualname


@dataclass(frozen=True)
class Seeds:
    """What the test run recorded about one failure, as plain data.

    ``kernels``: (file, def line) of each launched kernel; ``constexprs``: the values
    each was launched with, in the same order (absent or empty: unknown); ``sites``:
    each launch's project frames (file, line, function), innermost first; ``frames``:
    traceback frames (file, line), outermost first; ``test``: the test file and the
    test's qualified name (``TestClass.test_x``), for the fallback. ``gradients``: the
    failure involves gradients (the autograd Functions on the way are shown whole);
    ``gradient_check``: the check that failed reads gradients (or autograd raised);
    ``backward_kernels``: the kernels launched from a ``backward`` (ranked above the
    forward's for a gradient check, below for another check);
    ``expects_raise``: the test expected an exception that did not come (every project
    frame on the launch stack may be where the check is missing); ``returned_by``: the
    autograd Function whose ``backward`` returned what the engine rejected (too few
    gradients, one of a wrong shape): that ``backward`` is where the error was raised,
    though no frame of it is in the traceback.
    """

    kernels: tuple[tuple[str, int], ...] = ()
    sites: tuple[tuple[tuple[str, int, str], ...], ...] = ()
    frames: tuple[tuple[str, int], ...] = ()
    test_path: str = ""
    test_name: str = ""
    constexprs: tuple[Env, ...] = ()
    gradients: bool = False
    expects_raise: bool = False
    gradient_check: bool = False
    backward_kernels: tuple[tuple[str, int], ...] = ()
    returned_by: str = ""


def high_group(scores: Sequence[float]) -> int:
    """How many of the descending ``scores`` form the group above the largest gap.

    The largest gap counts only when it stands out (more than twice the mean of the
    other gaps); applied again when the first cut keeps more than half (findHighGroups):
    an adaptive cut-off instead of a fixed top-k.
    """
    keep = len(scores)
    for _ in range(2):
        if keep <= 2:
            return keep
        gaps = [scores[i] - scores[i + 1] for i in range(keep - 1)]
        widest = max(gaps)
        cut = gaps.index(widest)
        others = [gap for index, gap in enumerate(gaps) if index != cut]
        if widest <= 0 or widest <= 2 * (sum(others) / len(others)):
            return keep
        before, keep = keep, cut + 1
        if keep <= before / 2:
            break
    return keep


class Reach:
    """Static reach over one project; parses each file once per (mtime, size)."""

    def __init__(self, project: Project) -> None:
        self.project = project
        self.root = os.path.abspath(project.root)
        self._modules: dict[str, tuple[int, int, ModuleIndex | None]] = {}
        self._module_files: dict[tuple[str, int, str], str] = {}
        self._files: list[str] | None = None
        self._readable: dict[str, bool] = {}

    # -- files and modules --------------------------------------------------------------

    def readable(self, path: str) -> bool:
        """A project source that reach may read (:meth:`Project.is_source`; tests and
        conftests are read-only context, not code to follow), decided once per path."""
        known = self._readable.get(path)
        if known is None:
            known = self._readable[path] = self.project.is_source(path)
        return known

    def module(self, path: str) -> ModuleIndex | None:
        """The index of a project file (None when unreadable)."""
        path = os.path.abspath(path)
        try:
            stat = os.stat(path)
        except OSError:
            return None
        cached = self._modules.get(path)
        if cached is not None and cached[:2] == (stat.st_mtime_ns, stat.st_size):
            return cached[2]
        index: ModuleIndex | None = None
        if stat.st_size <= MAX_SCAN_BYTES:
            try:
                index = parse_module(Path(path).read_text(encoding="utf-8", errors="replace"))
            except OSError:
                index = None
        self._modules[path] = (stat.st_mtime_ns, stat.st_size, index)
        return index

    def _bases(self, from_path: str) -> list[str]:
        """Directories an absolute import may start from, nearest package base first."""
        directory = os.path.dirname(os.path.abspath(from_path))
        package_base = directory
        while os.path.isfile(os.path.join(package_base, "__init__.py")) and (
            package_base != self.root
        ):
            package_base = os.path.dirname(package_base)
        bases = [package_base, self.root, os.path.join(self.root, "src")]
        current = directory
        while current.startswith(self.root) and current != self.root:
            bases.append(current)
            current = os.path.dirname(current)
        return list(dict.fromkeys(bases))

    def module_file(self, module: str, level: int, from_path: str) -> str:
        """The project file of ``module`` as imported from ``from_path``, or ""."""
        key = (module, level, os.path.dirname(from_path) if level else from_path)
        if key in self._module_files:
            return self._module_files[key]
        parts = [part for part in module.split(".") if part]
        if level:
            base = os.path.dirname(os.path.abspath(from_path))
            for _ in range(level - 1):
                base = os.path.dirname(base)
            bases = [base]
        else:
            bases = self._bases(from_path)
        found = ""
        for base in bases:
            stem = os.path.join(base, *parts)
            for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
                if (parts or level) and os.path.isfile(candidate) and self.readable(candidate):
                    found = candidate
                    break
            if found:
                break
        self._module_files[key] = found
        return found

    # -- names ---------------------------------------------------------------------------

    def resolve(self, path: str, name: str, depth: int = 0) -> tuple[str, Definition] | None:
        """The project definition ``name`` (dotted) means in the module at ``path``."""
        index = self.module(path)
        if index is None or depth > 6 or not name:
            return None
        parts = name.split(".")
        local = index.find(parts[0])
        if local is not None:
            if len(parts) == 1:
                return path, local
            if local.kind == "class":
                method = index.find(f"{parts[0]}.{parts[1]}")
                return path, method or local
            return None  # an attribute of a function or a constant
        imported = index.import_map.get(parts[0])
        if imported is None:
            return None
        rest = parts[1:]
        if imported.name:  # from module import name [as head]
            target = self.module_file(imported.module, imported.level, path)
            if target:
                found_there = self.resolve(target, ".".join([imported.name, *rest]), depth + 1)
                if found_there is not None:
                    return found_there
            sub = ".".join(p for p in (imported.module, imported.name) if p)
            target = self.module_file(sub, imported.level, path)
            if target and rest:
                return self.resolve(target, ".".join(rest), depth + 1)
            return None
        module_parts = imported.module.split(".")
        chain = module_parts + rest[: max(0, len(rest) - 1)]
        for cut in range(len(chain), 0, -1):  # the longest importable module prefix
            target = self.module_file(".".join(chain[:cut]), 0, path)
            remaining = [*chain[cut:], *rest[max(0, len(rest) - 1):]]
            if target and remaining and cut >= len(module_parts):
                return self.resolve(target, ".".join(remaining), depth + 1)
        return None

    # -- locating -----------------------------------------------------------------------

    def locate(self, seeds: Seeds, *, limit: int = MAX_LOCATED) -> tuple[Located, ...]:
        """Definitions that may hold the fault, best first, at most ``limit``.

        Level 1 follows the recorded kernels, launch sites and traceback; when it finds
        nothing, level 2 follows what the test function calls; level 3 searches the
        project's text for the test's words.
        """
        found = self._from_records(seeds)
        if not found and seeds.test_path:
            found = self._from_test(seeds)
        if not found and seeds.test_name:
            words = [w for w in re.split(r"[^a-zA-Z0-9]+|_", seeds.test_name)
                     if len(w) > 2 and w not in ("test", "Test")]
            hits: dict[tuple[str, str], Located] = {}
            for word in words:
                for item in self.search_text(word, jit_only=True):
                    hits.setdefault(item.key, item)
            found = hits
        ranked = sorted(found.values(), key=lambda item: item.order)
        return tuple(ranked[:limit])

    def _from_records(self, seeds: Seeds) -> dict[tuple[str, str], Located]:
        found: dict[tuple[str, str], Located] = {}
        best: dict[tuple[str, str, Env, int], float] = {}
        queue: list[tuple[float, int, str, str, int, Env, int]] = []
        counter = 0

        def at(path: str, line: int) -> Definition | None:
            if not self.readable(path):
                return None
            index = self.module(path)
            return None if index is None else index.at(line)

        kernels = []
        backward: set[tuple[str, str]] = set()
        for position, (file, line) in enumerate(seeds.kernels):
            definition = at(file, line)
            if definition is not None and (file, line) in seeds.backward_kernels:
                backward.add((file, definition.qualname))
            if definition is not None:
                values = seeds.constexprs[position] if position < len(seeds.constexprs) else ()
                branching = definition.branching
                kernels.append((file, definition, () if branching is None
                                else entry_env(branching, dict(values))))
        launched = self._launch_envs(kernels)

        def add(path: str, definition: Definition, score: float, why: str, depth: int,
                env: Env | None = None, tier: int = TIER_REST) -> None:
            nonlocal counter
            key = (self.project.relative(path), definition.qualname)
            known = found.get(key)
            if known is None or score > known.score:
                found[key] = Located(*key, score, why, definition.jit,
                                     tier if known is None else min(tier, known.tier))
            elif tier < known.tier:
                found[key] = replace(known, tier=tier)
            if not definition.jit:
                envs: Sequence[Env] = [()]
            elif env is not None:
                envs = [env]
            else:  # jit code entered from outside runs only as the launches ran it
                envs = launched.get(key, [()])
            for values in envs:
                visit = (*key, values, tier)
                if best.get(visit, -math.inf) >= score:
                    continue
                best[visit] = score
                counter += 1
                heapq.heappush(queue, (-score, counter, path, definition.qualname, depth,
                                       values, tier))

        for file, definition, values in kernels:
            from_backward = (file, definition.qualname) in backward
            second = from_backward != seeds.gradient_check and seeds.gradients
            add(file, definition, 99.0 if second else 100.0, "launched kernel", 0, values,
                TIER_KERNEL)
        project_frames = [(f, n) for f, n in seeds.frames if self.readable(f)]
        for rank, (file, line) in enumerate(reversed(project_frames)):
            definition = at(file, line)
            if definition is not None:
                add(file, definition, max(60.0, 98.0 - 4 * rank),
                    "raised the error" if rank == 0 else "in the traceback", 0, None,
                    TIER_FIRST if rank == 0 else TIER_REST)
        for chain in seeds.sites:
            rank = 0
            for file, line, name in chain:
                definition = at(file, line)
                if definition is None:
                    continue
                # a closure (a decorator's wrapper) passes the call on: not where it is made
                first = rank == 0 or (seeds.expects_raise and name == definition.name)
                add(file, definition, max(55.0, 95.0 - 6 * rank),
                    "launches the kernel" if rank == 0 else "on the stack at the launch", 0,
                    None, TIER_FIRST if first else TIER_REST)
                rank += 1
        if seeds.gradients:
            self._add_autograd(seeds, at, add)
        ran = frozenset((self.project.relative(file), definition.qualname)
                        for file, definition, _ in kernels)
        while queue and len(found) < 4 * MAX_LOCATED:
            negative, _, path, qualname, depth, values, tier = heapq.heappop(queue)
            score = -negative
            if best.get((self.project.relative(path), qualname, values, tier), score) > score:
                continue  # superseded by a better path to the same visit
            index = self.module(path)
            definition = None if index is None else index.find(qualname)
            if definition is not None:
                self._expand(path, definition, score, depth, values, tier, add, ran)
        return found

    def _add_autograd(self, seeds: Seeds, at: Callable[[str, int], Definition | None],
                      add: _Add) -> None:
        """For a failure that involves gradients: the ``forward`` and ``backward`` of each
        ``torch.autograd.Function`` a launch or the traceback went through, and the
        project functions they call that launch kernels, in the first tier; ``backward``
        among the helpers when it never ran (no launch or frame in it) and the check that
        failed reads no gradient (a forward failure of a test that goes on to gradients).
        When a gradient check failed, the project frames of a launch made outside any
        autograd Function are first too: its output carries no gradient, unless
        something on the way gives it one."""
        places = [(file, line) for chain in seeds.sites for file, line, _ in chain]
        places += list(seeds.frames)
        ran = seeds.gradient_check or any(
            name == "backward" for chain in seeds.sites for _, _, name in chain) or any(
            (found := at(file, line)) is not None and found.name == "backward"
            for file, line in seeds.frames)
        seen: set[tuple[str, str]] = set()
        if seeds.gradient_check:
            for chain in seeds.sites:
                defined = [(file, found) for file, line, name in chain
                           if (found := at(file, line)) is not None and found.name == name]
                if not any(autograd_methods(self.module(file), d.qualname.partition(".")[0])
                           for file, d in defined if d.kind == "method"):
                    for file, outside in defined:
                        add(file, outside, 97.0, "launches outside any autograd Function "
                            "(no gradient flows back through its output)", 0, None, TIER_FIRST)
        for file, line in places:
            definition = at(file, line)
            if definition is None or definition.kind != "method":
                continue
            owner = definition.qualname.partition(".")[0]
            if (file, owner) in seen:
                continue
            seen.add((file, owner))
            for method in autograd_methods(self.module(file), owner):
                tier = TIER_FIRST if ran or method.name != "backward" else TIER_HELPER
                if method.name == "backward" and owner == seeds.returned_by:
                    add(file, method, 98.0, "raised the error", 0, None, TIER_FIRST)
                    continue
                add(file, method, 92.0, f"{method.name} of the autograd Function {owner}", 0,
                    None, tier)
                for callee in method.calls:
                    target = self.resolve(file, callee)
                    if target is not None and target[1].launches and target[1].kind in (
                            "function", "method"):
                        add(*target, 90.0, f"launches kernels for {method.qualname}", 1,
                            None, tier)

    def _jit_callees(self, path: str, definition: Definition, env: Env) -> (
        Iterator[tuple[str, Definition, Env]]
    ):
        """The jit functions ``definition`` calls when it runs with ``env``, and what
        each then knows: calls on branches the values rule out are not followed."""
        branching = definition.branching
        targets: dict[str, tuple[str, Definition] | None] = {}
        for use in () if branching is None else branching.uses:
            if not use.call:
                continue
            if use.name not in targets:  # tl.load(...) is called many times
                target = self.resolve(path, use.name)
                targets[use.name] = target if target is not None and target[1].jit else None
            target = targets[use.name]
            if target is not None and target[1].branching is not None and taken(use, env):
                yield target[0], target[1], callee_env(use, target[1].branching, env)

    def _launch_envs(self, kernels: Sequence[tuple[str, Definition, Env]]) -> (
        dict[tuple[str, str], list[Env]]
    ):
        """Per jit function the launched kernels reach, the values it runs with: how a
        traceback frame or a wrapper's launch enters it. Past MAX_ENVS, unknown."""
        reached: dict[tuple[str, str], list[Env]] = {}
        stack = [(file, definition, env, 0) for file, definition, env in kernels]
        while stack:
            path, definition, env, depth = stack.pop()
            envs = reached.setdefault((self.project.relative(path), definition.qualname), [])
            if env in envs or envs == [()]:
                continue
            if len(envs) >= MAX_ENVS:
                envs[:] = [()]
                env = ()
            else:
                envs.append(env)
            if depth < MAX_JIT_DEPTH:
                stack += [(*callee, depth + 1) for callee in
                          self._jit_callees(path, definition, env)]
        return reached

    def _expand(self, path: str, definition: Definition, score: float, depth: int,
                env: Env, tier: int, add: _Add, ran: frozenset[tuple[str, str]] = frozenset()
                ) -> None:
        """Queue what ``definition`` reaches: jit callees on the branches ``env`` takes,
        the kernels it launches (those the test run did not launch, when ``ran`` says
        which it did, rank low), feeding
        calls (those sizing the launch of a function in the first tier are helpers),
        constants."""
        name = definition.qualname
        names = definition.names
        helper = TIER_HELPER if tier <= TIER_HELPER else TIER_REST
        if definition.jit and definition.branching is not None:
            if depth >= MAX_JIT_DEPTH:
                return
            for file, jitted, values in self._jit_callees(path, definition, env):
                add(file, jitted, score - 4, f"called by {name}", depth + 1, values, helper)
            called = definition.branching.called
            names = tuple(dict.fromkeys(use.name for use in definition.branching.uses
                                        if not use.call and use.name not in called
                                        and taken(use, env)))
        elif definition.kind in ("function", "method"):
            for kernel in definition.launches:
                target = self.resolve(path, kernel)
                if target is None or not target[1].jit:
                    continue
                key = (self.project.relative(target[0]), target[1].qualname)
                if not ran or key in ran:
                    add(*target, score - 2, f"launched by {name}", depth, None,
                        TIER_KERNEL if key in ran else TIER_REST)
                else:  # a branch of the wrapper the test run did not take
                    add(*target, score - NOT_LAUNCHED_PENALTY,
                        f"launched by {name} (not in this test run)", depth, None, TIER_REST)
            if depth < MAX_PYTHON_DEPTH:
                for callee in definition.feeds:
                    target = self.resolve(path, callee)
                    if target is None or target[1].kind not in ("function", "method"):
                        continue
                    sizes = tier == TIER_FIRST and callee in definition.sizes
                    add(*target, score - 8, f"{'sizes' if sizes else 'computes'} launch "
                        f"arguments for {name}", depth + 1, None,
                        TIER_HELPER if sizes else TIER_REST)
                for callee in definition.calls:
                    if callee in definition.feeds or callee in definition.launches:
                        continue
                    target = self.resolve(path, callee)
                    if target is not None and target[1].kind in ("function", "method"):
                        add(*target, score - 30, f"called by {name}", MAX_PYTHON_DEPTH,
                            None, TIER_REST)
        for used in names:
            if used in definition.calls:
                continue
            target = self.resolve(path, used)
            if target is None:
                continue
            kind = target[1].kind
            if kind == "constant":
                add(*target, score - 3, f"read by {name}", MAX_PYTHON_DEPTH, None, TIER_REST)
            elif target[1].jit and definition.jit:  # a helper passed as a constexpr
                add(*target, score - 4, f"used by {name}", depth + 1, None, helper)

    def _from_test(self, seeds: Seeds) -> dict[tuple[str, str], Located]:
        """Level 2: the project functions the test calls, and what they launch: each
        function the test calls, a class's methods (``Function.apply(...)`` runs them),
        and what an alias names (``l2_warp = L2Wrap.apply``)."""
        index = self.module(seeds.test_path)
        test = None if index is None else index.find(seeds.test_name)
        if index is None or test is None:
            return {}
        chains: list[tuple[tuple[str, int, str], ...]] = []
        for callee in test.calls:
            target = self.resolve(seeds.test_path, callee)
            if target is not None and target[1].kind == "constant":  # an alias
                target = next((aliased for name in target[1].names
                               if (aliased := self.resolve(target[0], name)) is not None), None)
            if target is None:
                continue
            file, definition = target
            if definition.kind in ("function", "method"):
                chains.append(((file, definition.line, definition.qualname),))
            elif definition.kind == "class":  # Function.apply(...): its methods run
                methods = self.module(file)
                chains.append(tuple(
                    (file, member.line, member.qualname)
                    for member in (() if methods is None else methods.definitions)
                    if member.qualname.startswith(definition.qualname + ".")))
        chains = [chain for chain in chains if chain]
        if not chains:
            return {}
        found = self._from_records(Seeds(sites=tuple(chains), gradients=seeds.gradients,
                                         gradient_check=seeds.gradient_check))
        return {key: replace(item, score=item.score - 25, why=f"called by the test ({item.why})")
                for key, item in found.items()}

    # -- search -------------------------------------------------------------------------

    def files(self) -> list[str]:
        """Every project source reach may read (bounded; hidden and build dirs pruned)."""
        if self._files is None:
            readable = (path for path in walk_files(self.root) if self.readable(path))
            self._files = list(itertools.islice(readable, MAX_SCAN_FILES))
        return self._files

    def search_definition(self, name: str) -> tuple[Located, ...]:
        """Definitions named ``name`` (``f``, ``Class`` or ``Class.method``) anywhere."""
        hits = []
        for path in self.files():
            index = self.module(path)
            if index is None:
                continue
            for definition in index.definitions:
                if definition.qualname == name or definition.name == name:
                    score = 100.0 if definition.qualname == name else 90.0
                    hits.append(Located(self.project.relative(path), definition.qualname,
                                        score, f"defines {name}", definition.jit))
        hits.sort(key=lambda item: (-item.score, item.path))
        return tuple(hits)

    def search_text(self, text: str, *, jit_only: bool = False) -> tuple[Located, ...]:
        """The definitions whose text holds ``text``, ranked by occurrences and cut at the
        largest score gap."""
        needle = text.strip()
        if not needle:
            return ()
        scored: list[Located] = []
        for path in self.files():
            try:
                source = Path(path).read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if needle not in source:
                continue
            index = self.module(path)
            if index is None:
                continue
            lines = source.splitlines()
            for definition in index.definitions:
                if jit_only and not definition.jit:
                    continue
                if definition.kind == "class":
                    continue
                body = "\n".join(lines[definition.start - 1 : definition.end])
                count = body.count(needle)
                if count:
                    name_hit = 5.0 if needle in definition.qualname else 0.0
                    scored.append(Located(self.project.relative(path), definition.qualname,
                                          count + name_hit + (1.0 if definition.jit else 0.0),
                                          f"contains {needle!r}", definition.jit))
        scored.sort(key=lambda item: (-item.score, item.path, item.qualname))
        return tuple(scored[: high_group([item.score for item in scored])])


def autograd_methods(index: ModuleIndex | None, owner: str) -> tuple[Definition, ...]:
    """The ``forward`` and ``backward`` of class ``owner`` when it is an autograd Function:
    a subclass of ``Function`` (``torch.autograd.Function``), or a class that defines
    both."""
    cls = None if index is None else index.find(owner)
    if index is None or cls is None or cls.kind != "class":
        return ()
    methods = tuple(method for name in ("forward", "backward")
                    if (method := index.find(f"{owner}.{name}")) is not None)
    function = any(base.rpartition(".")[2] == "Function" for base in cls.bases)
    return methods if function or len(methods) == 2 else ()


def seeds_of(
    frames: Iterable[tuple[str, int]],
    launches: Iterable[tuple[str, int, Sequence[tuple[str, int, str]]]],
    test_path: str = "",
    nodeid: str = "",
    constexprs: Sequence[Env] = (),
    *,
    gradients: bool = False,
    expects_raise: bool = False,
    gradient_check: bool = False,
    returned_by: str = "",
) -> Seeds:
    """:class:`Seeds` from traceback frames and (kernel file, def line, sites) triples;
    ``constexprs``, when given, are the launches' values in the same order."""
    kernels, values, sites, backward = [], [], [], []
    for position, (file, line, launch_sites) in enumerate(launches):
        if file:
            kernels.append((file, line))
            values.append(constexprs[position] if position < len(constexprs) else ())
            if any(name == "backward" for _, _, name in launch_sites):
                backward.append((file, line))
        if launch_sites:
            sites.append(tuple(launch_sites))
    return Seeds(tuple(kernels), tuple(sites), tuple(frames), test_path, nodeid_qualname(nodeid),
                 tuple(values) if any(values) else (), gradients, expects_raise, gradient_check,
                 tuple(backward), returned_by)


def id_words(nodeid: str) -> set[str]:
    """The names a test id gives: each parameter (``silu`` and ``float32`` of
    ``test_act[silu-float32]``) and the test's name without ``test_``, lower case."""
    name, _, parameters = nodeid.rpartition("::")[2].partition("[")
    words = set(re.split(r"[^a-z0-9_]+", parameters.lower()))
    words.add(re.sub(r"^test_?", "", name.lower()))
    return {word.strip("_") for word in words
            if len(word.strip("_")) > 2 and re.search("[a-z]", word)
            and word not in ("true", "false", "none")}


def _named(word: str, qualname: str) -> bool:
    """Whether ``word`` names the definition: its ``_``-separated parts occur in a row in
    the definition's name (``gelu_tanh`` names ``gelu_tanh_grad``, not ``gelu``)."""
    parts = word.split("_")
    name = qualname.rpartition(".")[2].lower().strip("_").split("_")
    return any(name[i:i + len(parts)] == parts for i in range(len(name) - len(parts) + 1))


def rank_by_words(located: Sequence[Located], nodeids: Sequence[str]) -> tuple[Located, ...]:
    """``located`` with the definitions the failing tests' ids name ranked up by
    WORD_BONUS, never to the top score (the launched kernels keep it). A word that names
    more than MAX_NAMED of them (``chunk`` of ``test_x[chunk-...]`` in a library of
    ``chunk_*`` functions) tells them apart no more than it ranks them: it counts for
    none."""
    if not located:
        return ()
    words = set().union(*(id_words(nodeid) for nodeid in nodeids[:64]))
    words = {word for word in words
             if sum(_named(word, item.qualname) for item in located) <= MAX_NAMED}
    top = max(item.score for item in located)
    ranked = []
    for item in located:
        if item.score < top and any(_named(word, item.qualname) for word in words):
            item = replace(item, score=min(item.score + WORD_BONUS, top - 0.5),
                           why=f"{item.why}; named by the test id")
        ranked.append(item)
    ranked.sort(key=lambda item: item.order)
    return tuple(ranked)


def nodeid_qualname(nodeid: str) -> str:
    """``Class.test`` of ``path::Class::test[param]``."""
    parts = nodeid.split("::")[1:]
    if not parts:
        return ""
    parts[-1] = parts[-1].split("[")[0]
    return ".".join(parts)


def split_need(item: str) -> tuple[str, str, str]:
    """A model's request, as (kind, path, symbol-or-text): ``search``, ``symbol`` or ``file``.

    ``"search: BLOCK_SIZE_N"`` searches text; ``"ops/act.py:silu"`` (or ``ops/act.py::silu``)
    names a definition in a file; ``"ops/act.py"`` a file; ``"silu"`` a definition anywhere.
    """
    text = item.strip()
    lowered = text.lower()
    for prefix in ("search:", "grep:", "text:"):
        if lowered.startswith(prefix):
            return "search", "", text[len(prefix):].strip()
    path, sep, symbol = text.partition("::") if "::" in text else text.rpartition(":")
    if sep and path.endswith(".py"):
        return "symbol", path.strip(), symbol.strip()
    if text.endswith(".py"):
        return "file", text, ""
    return "symbol", "", text


def is_posix_relative(path: str) -> bool:
    pure = PurePosixPath(path.replace("\\", "/"))
    return not pure.is_absolute() and ".." not in pure.parts
