"""The test's checks intact at run time: what a rerun child verifies around every test.

A candidate that makes a test pass by changing what the test checks with (a replaced
``torch.testing.assert_close``, a patched ``Tensor.__eq__``, a torch function mode that
answers comparisons, a Tensor subclass, a ``torch.library`` kernel registered over an
aten op) is no fix, however it got there: an alias, a getattr chain, a decorator's side
effect or import-time code. So the child does not read the candidate's source; it
compares the live objects.

:meth:`IntegrityCheck.start` runs in the rerun child after the device is prepared and
before any conftest or project module is imported. It takes the identity of every
public callable of the namespaces a test checks with (:data:`WATCHED_MODULES`, the
Tensor classes, ``torch.nn`` module classes), the torch mode stacks, and starts
recording which code opens ``torch.library`` registrations. :meth:`IntegrityCheck.findings`
(called before and after each test's call phase) lists what differs, as stable
sentences without addresses or line numbers: the session compares them with the
unpatched code's (the baseline rerun), so only what a candidate changes counts.

PYTEST_DONT_REWRITE: imported by the rerun agent before pytest collects.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from pytest_kernelfix.kernels import bindings
from pytest_kernelfix.project import DEFAULT_TEST_PATTERNS, Project

#: Namespaces whose public callables a test checks with (or computes its reference
#: with); a candidate may change none of them.
WATCHED_MODULES = (
    "builtins", "math", "operator", "numpy", "numpy.testing", "torch", "torch.nn",
    "torch.nn.functional", "torch.testing", "torch.linalg", "torch.special", "torch.fft",
    "pytest",
)
#: Names looked up on every ``torch.nn`` module class, inherited or not.
_MODULE_CLASS_NAMES = ("__call__", "__init__", "forward", "_call_impl")
#: Aten ops a comparison reaches; a project kernel registered for one of them is listed.
COMPARISON_OPS = (
    "aten::isclose", "aten::allclose", "aten::equal", "aten::eq.Tensor", "aten::eq.Scalar",
    "aten::ne.Tensor", "aten::ne.Scalar", "aten::lt.Tensor", "aten::lt.Scalar",
    "aten::le.Tensor", "aten::le.Scalar", "aten::gt.Tensor", "aten::gt.Scalar",
    "aten::ge.Tensor", "aten::ge.Scalar", "aten::all", "aten::any", "aten::abs",
    "aten::sub.Tensor", "aten::isnan", "aten::isfinite", "aten::_local_scalar_dense",
    "aten::max", "aten::min", "aten::sum", "aten::mean",
)
#: Stands for an attribute that is not there (a class that inherits it, a removed name).
MISSING = object()


class CodeSites:
    """Tells project code from test code, and both from everything else, by file name.

    "test": test modules, conftest files and files under a tests directory (the user's
    ``python_files`` patterns apply); "project": every other Python file under the
    rerun's root that is not an installed package; "": the rest.
    """

    def __init__(self, root: str, test_patterns: Sequence[str] = DEFAULT_TEST_PATTERNS) -> None:
        self.project = Project(Path(root), tuple(test_patterns) or DEFAULT_TEST_PATTERNS)
        self.roots = self.project.roots
        self._kinds: dict[str, tuple[str, str]] = {}
        self._dirs: dict[str, str] = {}

    def site(self, filename: str | None) -> tuple[str, str]:
        """(kind, root-relative path) of a file; ("", "") outside the project."""
        if not filename:
            return "", ""
        known = self._kinds.get(filename)
        if known is None:
            known = self._classify(filename)
            self._kinds[filename] = known
        return known

    def kind(self, filename: str | None) -> str:
        return self.site(filename)[0]

    def _classify(self, filename: str) -> tuple[str, str]:
        if filename.startswith("<"):
            return "", ""
        absolute = os.path.abspath(filename)
        directory, name = os.path.split(absolute)
        for candidate in (absolute, os.path.join(self._real(directory), name)):
            for root in self.roots:
                if candidate.startswith(root + os.sep):
                    relative = Path(candidate[len(root) + 1:]).as_posix()
                    if self.project.in_environment(candidate):
                        return "", ""
                    return ("test" if self.project.is_test_file(relative) else "project",
                            relative)
        return "", ""

    def _real(self, directory: str) -> str:
        """``realpath`` of a directory, once per directory (a process imports from few)."""
        real = self._dirs.get(directory)
        if real is None:
            real = self._dirs[directory] = os.path.realpath(directory)
        return real

    def caller(self, frame: FrameType | None) -> tuple[str, str]:
        """The nearest frame, outward from ``frame``, that runs project or test code."""
        while frame is not None:
            found = self.site(frame.f_code.co_filename)
            if found[0]:
                return found
            frame = frame.f_back
        return "", ""

    def of_object(self, value: Any) -> tuple[str, str]:
        """Where a function, class or module was defined: (kind, relative path)."""
        target = getattr(value, "__func__", value)
        code = getattr(target, "__code__", None)
        if code is not None:
            return self.site(code.co_filename)
        module = sys.modules.get(getattr(target, "__module__", None) or "")
        return self.site(getattr(module, "__file__", None))


def describe(value: Any, sites: CodeSites) -> str:
    """A value as a finding names it: stable (no address), with its file when it is ours."""
    if value is MISSING:
        return "removed"
    kind, relative = sites.of_object(value)
    name = getattr(value, "__qualname__", None) or type(value).__qualname__
    if kind:
        return f"{name} from {relative}"
    module = getattr(value, "__module__", None) or type(value).__module__
    return f"{module}.{name}"


# -- the watched namespaces ---------------------------------------------------------------


def _watched(value: Any) -> bool:
    return callable(value) or isinstance(value, (ModuleType, property, staticmethod,
                                                 classmethod))


class Snapshot:
    """The identity of every watched callable, as it was before project code ran.

    Module attributes are looked up in the module's namespace; class attributes in the
    own namespace of every class along the MRO (below ``object``), absences included, so
    that a new entry shadowing an inherited one (``torch.Tensor.__eq__ = ...``) shows.
    """

    def __init__(self) -> None:
        self.modules: dict[str, ModuleType] = {}
        #: (qualified name, namespace owner, attribute, original object or MISSING)
        self.entries: list[tuple[str, Any, str, Any]] = []

    @classmethod
    def take(cls, names: Sequence[str] = WATCHED_MODULES) -> Snapshot:
        snapshot = cls()
        for name in names:
            try:
                module = importlib.import_module(name)
            except Exception:  # not installed here: nothing of it can be patched
                continue
            snapshot.modules[name] = module
            everything = module is builtins
            for attr, value in list(vars(module).items()):
                if (everything or not attr.startswith("_")) and _watched(value):
                    snapshot.entries.append((f"{name}.{attr}", module, attr, value))
        torch = snapshot.modules.get("torch")
        if torch is not None:
            for owner in (torch.Tensor, torch._C.TensorBase):
                snapshot._class(f"torch.{owner.__name__}", owner, dir(owner))
            nn = snapshot.modules.get("torch.nn")
            for attr, value in list(vars(nn).items()) if nn is not None else ():
                if isinstance(value, type) and issubclass(value, torch.nn.Module):
                    names_of = set(vars(value)) | set(_MODULE_CLASS_NAMES)
                    snapshot._class(f"torch.nn.{attr}", value, sorted(names_of))
        return snapshot

    def _class(self, label: str, owner: type, names: Sequence[str]) -> None:
        holders = [cls for cls in owner.__mro__ if cls is not object]
        for attr in names:
            if attr in ("__dict__", "__weakref__", "__doc__", "__annotations__"):
                continue
            resolved = inspect.getattr_static(owner, attr, MISSING)
            if resolved is MISSING or not _watched(resolved):
                continue
            for holder in holders:
                self.entries.append((f"{label}.{attr}", holder, attr,
                                     vars(holder).get(attr, MISSING)))

    def original(self, dotted: str) -> Any:
        """The object ``dotted`` named at snapshot time, or ``MISSING`` if not watched."""
        if dotted in self.modules:
            return self.modules[dotted]
        owner, _, attr = dotted.rpartition(".")
        module = self.modules.get(owner)
        if module is None:
            return MISSING
        for _, holder, name, value in self.entries:
            if holder is module and name == attr:
                return value
        return MISSING

    def changed(self, sites: CodeSites) -> Iterator[str]:
        for qualified, owner, attr, original in self.entries:
            current = vars(owner).get(attr, MISSING)
            if current is not original:
                shown = inspect.getattr_static(owner, attr, MISSING)
                yield f"{qualified} is replaced (now {describe(shown, sites)})"
        for name, module in self.modules.items():
            if sys.modules.get(name) is not module:
                yield f"sys.modules[{name!r}] is replaced"


# -- torch modes, Tensor subclasses, torch.library ---------------------------------------------


def _mode_stacks() -> list[tuple[str, list[Any]]]:
    stacks: list[tuple[str, list[Any]]] = []
    with contextlib.suppress(ImportError):
        from torch.overrides import _get_current_function_mode_stack

        stacks.append(("torch function mode", list(_get_current_function_mode_stack())))
    with contextlib.suppress(ImportError):
        from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

        stacks.append(("torch dispatch mode", list(_get_current_dispatch_mode_stack())))
    return stacks


def tensor_subclasses() -> Iterator[type]:
    """Every live subclass of ``torch.Tensor``, at any depth."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    seen: set[int] = set()
    stack: list[type] = list(type.__subclasses__(torch.Tensor))
    while stack:
        cls = stack.pop()
        if id(cls) in seen:
            continue
        seen.add(id(cls))
        yield cls
        stack.extend(type.__subclasses__(cls))


class LibraryWatch:
    """Records who opens a ``torch.library`` registration handle, from when it is installed.

    Every registration (``Library(...)``, ``torch.library.impl``, ``register_kernel``,
    ``custom_op``...) goes through ``torch._C._dispatch_library``; a handle opened by
    project code on a namespace that existed before the project ran (``aten``,
    ``prims``...) can replace what torch computes for every caller.
    """

    def __init__(self, sites: CodeSites) -> None:
        self.sites = sites
        self.records: list[tuple[str, str, str, str]] = []
        self.namespaces: frozenset[str] = frozenset()
        self._original: Callable[..., Any] | None = None

    def install(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None or self._original is not None:
            return
        names = torch._C._dispatch_get_all_op_names()
        self.namespaces = frozenset(name.split("::", 1)[0] for name in names)
        original = torch._C._dispatch_library
        watch = self

        def dispatch_library(kind: str, ns: str, key: str = "", *args: Any, **kwargs: Any) -> Any:
            where, relative = watch.sites.caller(sys._getframe(1))
            if where == "project":
                watch.records.append((str(kind), str(ns), str(key), relative))
            return original(kind, ns, key, *args, **kwargs)

        self._original = original
        torch._C._dispatch_library = dispatch_library

    def uninstall(self) -> None:
        torch = sys.modules.get("torch")
        if torch is not None and self._original is not None:
            torch._C._dispatch_library = self._original
        self._original = None

    def findings(self) -> Iterator[str]:
        for kind, ns, key, relative in self.records:
            if ns in self.namespaces:
                yield (f"torch.library: {relative} registers into torch's {ns!r} namespace "
                       f"({kind} library{', key ' + key if key else ''})")


def dispatcher_findings(sites: CodeSites, ops: Sequence[str] = COMPARISON_OPS) -> Iterator[str]:
    """Kernels that project files registered for the aten ops comparisons run on."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    for op in ops:
        try:
            dump = torch._C._dispatch_dump(op)
        except Exception:  # an op this torch does not have
            continue
        for line in dump.splitlines():
            _, found, rest = line.partition("registered at ")
            if not found:
                continue
            location = rest.split(" :: ", 1)[0].rsplit(":", 1)[0]
            kind, relative = sites.site(location)
            if kind == "project":
                yield f"torch.library: {relative} registers a kernel for {op}"


# -- names the test modules imported --------------------------------------------------------


def _imports(path: str) -> list[tuple[str, str]]:
    """(global name, dotted name it was imported as) for a module's top-level imports."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return []
    return [(local, imported.dotted) for node in tree.body
            for local, imported in bindings(node) if imported.absolute]


class ImportBindings:
    """Names a test module (or conftest, or test helper) imported from a watched namespace
    must still be the objects they were imported as."""

    def __init__(self, snapshot: Snapshot, sites: CodeSites) -> None:
        self.snapshot = snapshot
        self.sites = sites
        self._parsed: dict[str, list[tuple[str, str, Any]]] = {}

    def _bindings(self, path: str) -> list[tuple[str, str, Any]]:
        if path not in self._parsed:
            self._parsed[path] = [
                (name, dotted, original) for name, dotted in _imports(path)
                if (original := self.snapshot.original(dotted)) is not MISSING
            ]
        return self._parsed[path]

    def findings(self) -> Iterator[str]:
        for module in list(sys.modules.values()):
            path = getattr(module, "__file__", None)
            kind, relative = self.sites.site(path) if isinstance(path, str) else ("", "")
            if kind != "test":
                continue
            namespace = vars(module)
            for name, dotted, original in self._bindings(path):  # type: ignore[arg-type]
                current = namespace.get(name, MISSING)
                if current is not MISSING and current is not original:
                    yield (f"{relative}: the name {name!r} is no longer {dotted} "
                           f"(now {describe(current, self.sites)})")


# -- the whole check ----------------------------------------------------------------------


class IntegrityCheck:
    """Everything a candidate must leave as it was, checked around each test."""

    def __init__(self, sites: CodeSites, snapshot: Snapshot, library: LibraryWatch) -> None:
        self.sites = sites
        self.snapshot = snapshot
        self.library = library
        self.imports = ImportBindings(snapshot, sites)
        self.allowed_modes: set[int] = {id(mode) for _, stack in _mode_stacks()
                                        for mode in stack}
        self.baseline_dispatch = frozenset(dispatcher_findings(sites))

    @classmethod
    def start(cls, root: str, test_patterns: Sequence[str] = DEFAULT_TEST_PATTERNS
              ) -> IntegrityCheck:
        """Take the snapshot now: before conftest files and project modules import."""
        sites = CodeSites(root, test_patterns)
        library = LibraryWatch(sites)
        library.install()
        return cls(sites, Snapshot.take(), library)

    def allow(self, mode: Any) -> None:
        """A mode the agent itself pushes (the sensitivity observer)."""
        self.allowed_modes.add(id(mode))

    def findings(self) -> list[str]:
        found = list(self.snapshot.changed(self.sites))
        for label, stack in _mode_stacks():
            for mode in stack:
                if id(mode) not in self.allowed_modes:
                    found.append(f"a {label} is active: {describe(type(mode), self.sites)}")
        found += filter(None, (_subclass_finding(cls, self.sites) for cls in tensor_subclasses()))
        found += self.library.findings()
        found += [item for item in dispatcher_findings(self.sites)
                  if item not in self.baseline_dispatch]
        found += self.imports.findings()
        return sorted(set(found))

    def close(self) -> None:
        self.library.uninstall()


def project_subclass(value: Any, sites: CodeSites) -> str:
    """The finding for a project-defined Tensor subclass instance, or ""."""
    cls = type(value)
    return "" if cls.__module__.startswith("torch") else _subclass_finding(cls, sites)


def _subclass_finding(cls: type, sites: CodeSites) -> str:
    kind, relative = sites.of_object(cls)
    if kind != "project":
        return ""
    return f"a Tensor subclass is defined in {relative}: {cls.__qualname__}"

