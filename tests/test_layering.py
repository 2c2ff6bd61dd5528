"""The package's stages import each other in one direction only.

Read from the source (imports inside functions included), so a lazy import that breaks
the layering is caught too. The rules, lowest first: the edit engine knows nothing of
the rest; ``capture`` (the test side) only the small shared modules; ``heal`` (the round
loop) neither reruns nor verification; ``rerun`` (the child and its probes) no
verification, so the two never import each other; only ``session`` sees everything.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import pytest_kernelfix

PACKAGE = Path(pytest_kernelfix.__file__).parent
#: Small modules every stage may use: settings, the target, the project's boundaries and
#: root, redaction, atomic writes, code fences, device set-up, which functions are Triton
#: kernels, the hook spec, the package itself.
SHARED = frozenset({"", "config", "target", "project", "root", "redact", "atomic", "device",
                    "kernels", "hookspecs", "markdown", "__version__"})
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
}
#: The shared modules are leaves: they may use the engine (file resolution) and the shim
#: (device set-up), nothing that heals.
SHARED_MAY_USE = frozenset({"engine", "shim"})
#: The public faces: the package (its lazy exports for hook authors), the hook spec and
#: the pytest hooks, which place each stage; they may name any of them.
FACES = frozenset({"", "hookspecs", "plugin", "session"})


def stage_of(module: str) -> str:
    """``pytest_kernelfix.heal.loop`` -> ``heal``; the package itself -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imported(source: str) -> Iterator[str]:
    """Every ``pytest_kernelfix`` module (or name) a module's code imports, anywhere."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def violations(modules: Mapping[str, str]) -> list[str]:
    """``importer -> imported`` for each import the rules forbid."""
    found = []
    for name, source in modules.items():
        stage = stage_of(name)
        for target in imported(source):
            if not target.startswith("pytest_kernelfix."):
                continue
            other = stage_of(target)
            if stage in FACES or other == stage or (other in SHARED and stage != "engine"):
                continue
            allowed = SHARED_MAY_USE if stage in SHARED else ALLOWED.get(stage)
            if allowed is not None and other not in allowed:
                found.append(f"{name} -> {target}")
    return found


def package_sources() -> dict[str, str]:
    sources = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[name] = path.read_text(encoding="utf-8")
    return sources


def test_every_stage_imports_only_what_its_layer_may() -> None:
    assert violations(package_sources()) == []


@pytest.mark.parametrize(
    ("module", "line"),
    [
        ("pytest_kernelfix.engine.match", "from pytest_kernelfix.project import Project"),
        ("pytest_kernelfix.heal.loop", "from pytest_kernelfix.rerun.launcher import run_tests"),
        ("pytest_kernelfix.heal.guards", "import pytest_kernelfix.verify.judge"),
        ("pytest_kernelfix.rerun.probes.poison",
         "def f():\n    from pytest_kernelfix.verify import sensitivity"),
        ("pytest_kernelfix.capture.records", "from pytest_kernelfix.session import pipeline"),
    ],
)
def test_a_forbidden_import_is_found(module: str, line: str) -> None:
    sources = package_sources()
    sources[module] += "\n" + line + "\n"
    assert {found.partition(" -> ")[0] for found in violations(sources)} == {module}


def test_every_stage_has_rules() -> None:
    stages = {path.name for path in PACKAGE.iterdir()
              if path.is_dir() and (path / "__init__.py").exists()}
    assert stages - {"session"} <= set(ALLOWED) | {"prompts"}



def circles(modules: Mapping[str, str]) -> list[list[str]]:
    """The package's import circles (imports inside functions included): each the sorted
    modules that import one another, directly or through others."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, source in modules.items():
        for target in imported(source):
            while target and target not in modules:  # a name imported from a module
                target = target.rpartition(".")[0]
            if target and target != name:
                graph[name].add(target)
    reach = {name: reached(graph, name) for name in graph}
    found = {tuple(sorted(other for other in reach[name] if name in reach[other]))
             for name in graph}
    return sorted(list(circle) for circle in found if len(circle) > 1)


def reached(graph: Mapping[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others, and itself."""
    seen = {start}
    frontier = [start]
    while frontier:
        for target in graph[frontier.pop()] - seen:
            seen.add(target)
            frontier.append(target)
    return seen


def test_the_session_and_the_plugin_import_in_one_direction() -> None:
    """No circle goes through ``session`` or the entry point: the helper the plugin starts
    early and the controller share what both build (``session/start.py``) instead of
    importing each other."""
    faces = ("pytest_kernelfix.plugin", "pytest_kernelfix.session")
    assert [circle for circle in circles(package_sources())
            if any(name.startswith(faces) for name in circle)] == []


def test_a_circle_is_found() -> None:
    sources = package_sources()
    sources["pytest_kernelfix.session.start"] += (
        "\ndef f():\n    from pytest_kernelfix.session import controller\n")
    assert any({"pytest_kernelfix.session.controller", "pytest_kernelfix.session.start"}
               <= set(circle) for circle in circles(sources))
