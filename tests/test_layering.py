"""The package's stages import each other in one direction only, at every depth.

Read from the source (imports inside functions included), so a lazy import that breaks
the layering is caught too. The rules, lowest first: the edit engine knows nothing of
the rest; ``capture`` (the test side) only the small shared modules; ``heal`` (the round
loop) neither reruns nor verification; ``rerun`` (the child and its probes) no
verification, so the two never import each other; ``session`` everything but the pytest
hooks that start it.

One step is not enough: ``verify`` may import ``heal``, which may import ``fixers``, which
``verify`` may not. So the imports are followed to the end (:func:`reaches`): what a
module's imports can load, at any depth, must be of a stage its layer may use. A shared
module answers for its own imports (they are checked from it). Imports made only for type
checking load nothing; they are checked one step, and they count in an import circle
(:func:`circles`): two modules that need each other, for types or at run time, cannot be
read, moved or tested one before the other.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import pytest_kernelfix

PACKAGE = Path(pytest_kernelfix.__file__).parent
#: Small modules every stage may use: settings, the target, the project's boundaries and
#: root, redaction, atomic writes, code fences, device set-up, which functions are Triton
#: kernels, the hook spec, the shared words, the strict JSON reader, the fan-out of work to
#: threads, the package itself.
SHARED = frozenset({"", "config", "target", "project", "root", "redact", "atomic", "device",
                    "kernels", "hookspecs", "markdown", "vocabulary", "fields", "fanout",
                    "__version__"})
#: Shared leaves that import the standard library only: the rerun child reads its plan
#: with some of them before anything else is imported.
STDLIB_ONLY = frozenset({"vocabulary", "fields", "kernels", "fanout"})
#: What each stage may import besides the shared modules and itself.
ALLOWED: Mapping[str, frozenset[str]] = {
    "engine": frozenset(),
    "capture": frozenset(),
    "shim": frozenset({"capture"}),
    "locate": frozenset({"capture"}),
    "fixers": frozenset({"capture", "engine", "locate"}),
    "heal": frozenset({"capture", "engine", "fixers", "locate"}),
    "rerun": frozenset({"capture", "locate", "shim"}),
    "verify": frozenset({"capture", "heal", "locate", "rerun", "shim"}),
    "report": frozenset({"capture", "engine", "fixers", "heal", "locate", "rerun"}),
    "session": frozenset({"capture", "engine", "fixers", "heal", "locate", "report",
                          "rerun", "shim", "verify"}),
}
#: The shared modules are leaves: they may use the engine (file resolution) and the shim
#: (device set-up), nothing that heals.
SHARED_MAY_USE = frozenset({"engine", "shim"})
#: The public faces: the package (its lazy exports for hook authors), the hook spec and
#: the pytest hooks, which place each stage; they may name any of them.
FACES = frozenset({"", "hookspecs", "plugin"})

def stage_of(module: str) -> str:
    """``pytest_kernelfix.heal.loop`` -> ``heal``; the package itself -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imported(source: str) -> Iterator[str]:
    """Every ``pytest_kernelfix`` module (or name) a module's code imports, anywhere."""
    return _names(ast.parse(source))


def _names(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


@functools.cache
def imports(source: str) -> tuple[frozenset[str], frozenset[str]]:
    """What a module imports (:func:`imported`), and what of it only under ``if
    TYPE_CHECKING:`` (nothing it loads)."""
    tree = ast.parse(source)
    everything = frozenset(_names(tree))
    blocks = [node for node in ast.walk(tree) if isinstance(node, ast.If)
              and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")]
    guarded = {name for block in blocks for name in _names(ast.Module(block.body, []))}
    for block in blocks:
        block.body = [ast.Pass()]
    return everything, frozenset(guarded - set(_names(tree)))


def allowed(stage: str, other: str) -> bool:
    """Whether a module of ``stage`` may use a module of ``other``."""
    if other == stage or (other in SHARED and stage != "engine"):
        return True
    return other in (SHARED_MAY_USE if stage in SHARED else ALLOWED.get(stage, frozenset()))


#: Each module's package modules, each with whether it is imported for types only.
Graph = Mapping[str, Mapping[str, bool]]


def graph(modules: Mapping[str, str]) -> Graph:
    """The imports between the package's modules (``from pytest_kernelfix.verify import
    judge`` names ``verify.judge``; ``from pytest_kernelfix import __version__`` the
    package). A module's own packages are left out: Python loads them before it, whatever
    it imports."""
    edges: dict[str, dict[str, bool]] = {}
    for name, source in modules.items():
        names, only_types = imports(source)
        edges[name] = {}
        for target in names:
            module = target if target in modules else target.rpartition(".")[0]
            if module in modules and not name.startswith(f"{module}.") and module != name:
                edges[name][module] = edges[name].get(module, True) and target in only_types
    return edges


def violations(modules: Mapping[str, str]) -> list[str]:
    """``importer -> imported`` for each import the rules forbid (one step: imports for
    types only too)."""
    return [f"{name} -> {target}" for name, targets in graph(modules).items()
            for target in targets
            if stage_of(name) not in FACES and not allowed(stage_of(name), stage_of(target))]


def walked(came_from: Mapping[str, str], end: str) -> str:
    """``a -> b -> end``: the way a walk that began at ``a`` came to ``end``."""
    path = [end]
    while came_from[path[-1]]:
        path.append(came_from[path[-1]])
    return " -> ".join(reversed(path))


def reaches(modules: Mapping[str, str]) -> list[str]:
    """``module -> ... -> reached`` for each module whose imports can load, at any depth, a
    module of a stage its layer may not use (the shortest such path, one per stage)."""
    edges = graph(modules)
    found = []
    for name in modules:
        stage = stage_of(name)
        if stage in FACES:
            continue
        came_from: dict[str, str] = {name: ""}
        queue = deque([name])
        bad: dict[str, str] = {}
        while queue:
            current = queue.popleft()
            if current != name and stage_of(current) in SHARED:
                continue  # a shared module answers for its own imports
            for target, types_only in sorted(edges[current].items()):
                if types_only or target in came_from:
                    continue
                came_from[target] = current
                queue.append(target)
                other = stage_of(target)
                if not allowed(stage, other) and other not in bad:
                    bad[other] = walked(came_from, target)
        found.extend(bad.values())
    return found


def circles(modules: Mapping[str, str]) -> list[str]:
    """Each import circle once, as ``a -> b -> a`` (imports for types only count)."""
    edges = graph(modules)
    found: dict[frozenset[str], str] = {}
    for start in sorted(edges):
        came_from: dict[str, str] = {start: ""}
        queue = deque([start])
        while queue:
            current = queue.popleft()
            for target in sorted(edges[current]):
                if target == start:
                    path = walked(came_from, current)
                    found.setdefault(frozenset(path.split(" -> ")), f"{path} -> {start}")
                elif target not in came_from:
                    came_from[target] = current
                    queue.append(target)
    return sorted(found.values())


@functools.cache
def _package_sources() -> Mapping[str, str]:
    sources = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[name] = path.read_text(encoding="utf-8")
    return sources


def package_sources() -> dict[str, str]:
    return dict(_package_sources())


def test_every_stage_imports_only_what_its_layer_may() -> None:
    assert violations(package_sources()) == []


def test_what_every_module_loads_at_any_depth_is_what_its_layer_may_use() -> None:
    assert reaches(package_sources()) == []


def test_no_two_modules_import_each_other_at_any_depth() -> None:
    assert circles(package_sources()) == []


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("pytest_kernelfix.engine.match", "from pytest_kernelfix.project import Project"),
        ("pytest_kernelfix.heal.loop", "from pytest_kernelfix.rerun.launcher import run_tests"),
        ("pytest_kernelfix.heal.guards", "import pytest_kernelfix.verify.judge"),
        ("pytest_kernelfix.rerun.probes.poison",
         "def f():\n    from pytest_kernelfix.verify import sensitivity"),
        ("pytest_kernelfix.capture.records", "from pytest_kernelfix.session import pipeline"),
        ("pytest_kernelfix.session.schedule", "from pytest_kernelfix.plugin import helper_key"),
    ],
)
def test_a_forbidden_import_is_found(module: str, line: str) -> None:
    sources = package_sources()
    sources[module] += "\n" + line + "\n"
    assert {found.partition(" -> ")[0] for found in violations(sources)} == {module}


@pytest.mark.parametrize(
    ("module", "line", "path"),
    [
        # two steps: verify may import heal, heal may import fixers; verify may not
        ("pytest_kernelfix.verify.judge",
         "from pytest_kernelfix.heal.outcomes import HealResult",
         "pytest_kernelfix.verify.judge -> pytest_kernelfix.heal.outcomes -> "
         "pytest_kernelfix.fixers.base"),
        # lazily: report may import rerun, the rerun child the shim; report may not
        ("pytest_kernelfix.report.junit",
         "def f():\n    from pytest_kernelfix.rerun.child.agent import RerunAgent",
         "pytest_kernelfix.report.junit -> pytest_kernelfix.rerun.child.agent -> "
         "pytest_kernelfix.shim"),
    ],
)
def test_a_forbidden_path_deeper_than_one_import_is_found(module: str, line: str,
                                                          path: str) -> None:
    sources = package_sources()
    sources[module] += "\n" + line + "\n"
    assert violations(sources) == []  # each step alone is allowed
    assert path in reaches(sources)


def test_an_import_for_types_only_loads_nothing_but_closes_a_circle() -> None:
    sources = package_sources()
    sources["pytest_kernelfix.capture.errors"] += (
        "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from pytest_kernelfix.capture.records import Failure\n")
    assert reaches(sources) == []
    assert circles(sources) == ["pytest_kernelfix.capture.errors -> "
                                "pytest_kernelfix.capture.records -> "
                                "pytest_kernelfix.capture.errors"]


@pytest.mark.parametrize(
    ("module", "line", "circle"),
    [
        # the helper the plugin starts early and the controller share session/start.py
        ("pytest_kernelfix.session.start",
         "def f():\n    from pytest_kernelfix.session import controller",
         "pytest_kernelfix.session.controller -> pytest_kernelfix.session.start -> "
         "pytest_kernelfix.session.controller"),
        # the runner uses the launcher and the phased child, never the other way round
        ("pytest_kernelfix.rerun.launcher",
         "def f():\n    from pytest_kernelfix.rerun.runner import Reruns",
         "pytest_kernelfix.rerun.launcher -> pytest_kernelfix.rerun.runner -> "
         "pytest_kernelfix.rerun.launcher"),
    ],
)
def test_a_lazy_import_that_closes_a_circle_is_found(module: str, line: str,
                                                     circle: str) -> None:
    sources = package_sources()
    sources[module] += "\n" + line + "\n"
    assert violations(sources) == []  # the import alone is allowed
    assert circle in circles(sources)


def test_the_standard_library_leaves_import_nothing_else() -> None:
    sources = package_sources()
    for name in STDLIB_ONLY:
        tree = ast.parse(sources[f"pytest_kernelfix.{name}"])
        modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for alias in node.names}
        modules |= {node.module for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module}
        assert {module.partition(".")[0] for module in modules} <= (
            sys.stdlib_module_names | {"__future__"}), name


def test_every_stage_has_rules() -> None:
    stages = {path.name for path in PACKAGE.iterdir()
              if path.is_dir() and (path / "__init__.py").exists()}
    assert stages - {"session"} <= set(ALLOWED) | {"prompts"}
    assert stages <= set(ALLOWED) | {"prompts"}  # session too
