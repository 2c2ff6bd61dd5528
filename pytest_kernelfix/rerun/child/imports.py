"""Point every import location under the original root at the sandbox.

Before pytest starts, the rerun child makes sure an editable install (a setuptools
finder, a ``.pth`` path entry) or an absolute ``PYTHONPATH`` entry cannot bring in the
unpatched files: ``sys.path`` entries become their sandbox twins, and
:class:`SandboxFinder`, first on ``sys.meta_path``, rebuilds any spec whose file lies
under the original root on its twin.

PYTEST_DONT_REWRITE: imported before pytest starts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import (
    ExtensionFileLoader,
    ModuleSpec,
    SourceFileLoader,
    SourcelessFileLoader,
)
from types import ModuleType
from typing import Any

#: Loaders rebuilt on the twin path as they are; other loaders are chosen by suffix.
_FILE_LOADERS = (SourceFileLoader, SourcelessFileLoader, ExtensionFileLoader)


class RootMap:
    """Maps paths under the original root to their sandbox twins, where the twin exists.

    A location is mapped only if its directory was copied: a virtualenv inside the
    project (left out of the sandbox) keeps being imported from where it is.
    """

    def __init__(self, original: str, sandbox: str) -> None:
        self.sandbox = os.path.abspath(sandbox)
        self.roots = tuple(dict.fromkeys([os.path.abspath(original), os.path.realpath(original)]))
        self._dirs: dict[str, bool] = {}

    def twin(self, path: str) -> str | None:
        """The sandbox path of ``path`` if it lies under the original root, else None."""
        for candidate in (os.path.abspath(path), os.path.realpath(path)):
            for root in self.roots:
                if candidate == root or candidate.startswith(root + os.sep):
                    return self.sandbox + candidate[len(root) :]
        return None

    def _copied(self, directory: str) -> bool:
        if directory not in self._dirs:
            self._dirs[directory] = os.path.isdir(directory)
        return self._dirs[directory]

    def file_twin(self, path: str) -> str | None:
        """The twin of a module file whose directory exists in the sandbox."""
        twin = self.twin(path)
        return twin if twin is not None and self._copied(os.path.dirname(twin)) else None

    def entry_twin(self, entry: str) -> str | None:
        """The twin of a ``sys.path`` entry (a directory or an archive) that was copied."""
        if not entry or not os.path.isabs(entry):
            return None
        twin = self.twin(entry)
        return twin if twin is not None and os.path.exists(twin) else None

    def path_list(self, entries: Sequence[str]) -> list[str]:
        return [self.entry_twin(entry) or entry for entry in entries]


class SandboxFinder(MetaPathFinder):
    """First on ``sys.meta_path``: asks the finders after it, then moves the answer.

    Any spec whose file or package directories lie under the original root is rebuilt
    on the sandbox twin; that covers editable finders of any build backend, since they
    all end in a spec with an ``origin``. A top-level module moved this way also gets a
    symlink in ``alias_dir`` (on ``PYTHONPATH`` and ``sys.path``), so that grandchildren
    (``subprocess``, multiprocessing spawn), which start without this finder, import
    the sandbox copy too.
    """

    #: How the agent finds the finder again after ``main`` dropped this module.
    kernelfix_sandbox_finder = True

    def __init__(
        self, roots: RootMap, mapped_paths: Sequence[str] = (), alias_dir: str | None = None
    ) -> None:
        self.roots = roots
        #: The original ``sys.path`` entries now pointing at their twins.
        self.mapped_paths = list(mapped_paths)
        self.alias_dir = alias_dir
        self.redirected: list[str] = []

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        spec = self._next_spec(fullname, path, target)
        if spec is None:
            return None
        moved = self._move(spec)
        if moved is None:
            return spec
        self.redirected.append(fullname)
        if "." not in fullname and moved.origin and self.alias_dir:
            _alias(self.alias_dir, fullname, moved)
        return moved

    def _next_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None
    ) -> ModuleSpec | None:
        finders = sys.meta_path
        start = finders.index(self) + 1 if self in finders else 0
        for finder in list(finders[start:]):
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec: ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def _move(self, spec: ModuleSpec) -> ModuleSpec | None:
        """The spec rebuilt on the sandbox, or None when nothing of it is under the root."""
        locations = spec.submodule_search_locations
        moved_locations = None if locations is None else self.roots.path_list(list(locations))
        if spec.origin and spec.has_location:
            origin = self.roots.file_twin(spec.origin)
            if origin is None:
                return None
            new_loader = None
            for kind in _FILE_LOADERS:
                if type(spec.loader) is kind:
                    new_loader = kind(spec.name, origin)
            return importlib.util.spec_from_file_location(
                spec.name, origin, loader=new_loader, submodule_search_locations=moved_locations
            )
        if locations is not None and moved_locations != list(locations):  # namespace package
            namespace = ModuleSpec(spec.name, None, is_package=True)
            namespace.submodule_search_locations = moved_locations
            return namespace
        return None


def _alias(alias_dir: str, name: str, spec: ModuleSpec) -> None:
    """``alias_dir/name`` -> the sandbox package (or ``name.<suffix>`` -> the module)."""
    assert spec.origin is not None
    if spec.submodule_search_locations is not None:
        link, target = os.path.join(alias_dir, name), os.path.dirname(spec.origin)
    else:
        suffix = os.path.basename(spec.origin).partition(".")[2]
        link, target = os.path.join(alias_dir, f"{name}.{suffix}"), spec.origin
    with contextlib.suppress(OSError):
        os.symlink(target, link)


def installed_finder() -> Any:
    """The :class:`SandboxFinder` on ``sys.meta_path`` (possibly from an earlier copy of
    this module), or None."""
    return next((f for f in sys.meta_path if getattr(f, "kernelfix_sandbox_finder", False)),
                None)


def install_import_mapping(
    original: str, sandbox: str, alias_dir: str | None = None, *, drop_loaded: bool = True
) -> SandboxFinder:
    """Point ``sys.path``, ``PYTHONPATH`` and every finder at the sandbox, first.

    ``sys.path`` entries under the original root (from ``PYTHONPATH`` or a ``.pth``
    file) become their twins, and the twins go on ``PYTHONPATH`` for grandchildren.
    Modules already imported from the original tree (by a ``.pth`` file at start-up)
    are dropped from ``sys.modules`` so that the next import reads the sandbox copy
    (``drop_loaded``; a forked child skips the scan: its server dropped them already).
    """
    roots = RootMap(original, sandbox)
    twins = {entry: twin for entry in sys.path if (twin := roots.entry_twin(entry))}
    sys.path[:] = [twins.get(entry, entry) for entry in sys.path]
    environ = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    exported = roots.path_list(environ)
    exported += [twin for twin in twins.values() if twin not in exported]
    if alias_dir:
        os.makedirs(alias_dir, exist_ok=True)
        sys.path.append(alias_dir)
        exported.append(alias_dir)
    if exported:
        os.environ["PYTHONPATH"] = os.pathsep.join(exported)
    for name, module in list(sys.modules.items()) if drop_loaded else ():
        filename = getattr(module, "__file__", None)
        if (isinstance(filename, str) and not name.startswith("pytest_kernelfix")
                and roots.file_twin(filename)):
            del sys.modules[name]
    finder = SandboxFinder(roots, list(twins), alias_dir)
    sys.meta_path.insert(0, finder)
    sys.path_importer_cache.clear()
    return finder
