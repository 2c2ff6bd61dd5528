"""The rerun child: map imports onto the sandbox, run pytest, write outcomes as they come.

:func:`main` is what ``python -c`` runs (see :data:`pytest_kernelfix.rerun.launcher.BOOTSTRAP`):
before pytest starts it points every import location under the original root at the
sandbox, so an editable install (a setuptools finder, a ``.pth`` path entry) or an
absolute ``PYTHONPATH`` entry cannot bring in the unpatched files. The module is also
the pytest plugin (``-p pytest_kernelfix.rerun.child.agent``) that records each test's
outcome, error and kernel launches to the results file as each test finishes, so a
crash mid-run leaves the finished tests readable. Around each test's call phase it runs
the integrity check (:mod:`pytest_kernelfix.rerun.probes.integrity`) and, in a sensitivity rerun,
poisons project kernels' outputs and watches the test's checks
(:mod:`pytest_kernelfix.rerun.probes.poison`).

PYTEST_DONT_REWRITE: :func:`main` imports this module before pytest starts.

The same :func:`main` runs in a child forked from the warm rerun server
(:mod:`pytest_kernelfix.rerun.server`): whatever this plugin does in a rerun works the
same in both.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Generator, Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import (
    ExtensionFileLoader,
    ModuleSpec,
    SourceFileLoader,
    SourcelessFileLoader,
)
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pytest_kernelfix.capture.errors import ErrorInfo, describe_exception
from pytest_kernelfix.capture.launches import KernelLaunch, LaunchRecorder
from pytest_kernelfix.rerun.launcher import Probe, TestOutcome
from pytest_kernelfix.rerun.plan import LAUNCHED_ENV, RerunPlan, load_plan
from pytest_kernelfix.rerun.probes.integrity import CodeSites, IntegrityCheck
from pytest_kernelfix.rerun.probes.poison import Poisoner, make_observer, remove_mode

#: Loaders rebuilt on the twin path as they are; other loaders are chosen by suffix.
_FILE_LOADERS = (SourceFileLoader, SourcelessFileLoader, ExtensionFileLoader)

#: Longest longrepr kept per test (head and tail), so the results file stays small.
_MAX_LONGREPR = 40_000

#: Seconds from the launch to each phase of this child (``RerunResult.extra["phases"]``).
_phases: dict[str, float] = {}


def mark_phase(name: str) -> None:
    """Note when this child reached ``name``: where a rerun's time goes, for benchmarks."""
    with contextlib.suppress(KeyError, ValueError):
        _phases[name] = round(time.time() - float(os.environ[LAUNCHED_ENV]), 4)


# -- import mapping ----------------------------------------------------------------------


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


def main(*, forked: bool = False) -> None:
    """Entry point of the rerun child: ``python -c BOOTSTRAP pytest-args...``, or a child
    the rerun server forked (``forked``), with the same ``sys.argv``."""
    mark_phase("main")
    prepare_child(load_plan(), forked=forked)
    raise SystemExit(pytest.console_main())


def prepare_child(plan: RerunPlan | None, *, forked: bool = False) -> None:
    """The set-up before pytest starts, the same in a fresh and in a forked child.

    A fresh child drops the plugin's modules it imported: pytest marks its plugins'
    packages for assertion rewriting and would find them imported already. A forked
    child keeps what the server imported through the rewriter
    (:func:`pytest_kernelfix.rerun.server.warm_up`).
    """
    if plan is not None:
        install_import_mapping(plan.original_root, plan.sandbox_root, plan.alias_dir or None,
                               drop_loaded=not forked)
    if sys.path and sys.path[0] == "":
        sys.path[0] = os.getcwd()  # what ``python -m pytest`` puts there
    if forked:
        sys.path_importer_cache.clear()  # the server's finders saw its own directory
        return
    for name in [n for n in sys.modules if n == "pytest_kernelfix" or
                 n.startswith("pytest_kernelfix.")]:
        del sys.modules[name]


# -- the pytest plugin -------------------------------------------------------------------


class RerunAgent:
    """Collects outcomes in the child and appends each as one line to the results file.

    One JSON object per line, written with a single ``write`` on an append-only file:
    a crash loses at most the test that was running, and a long rerun costs no more
    than a short one per test.
    """

    def __init__(self, config: pytest.Config, plan: RerunPlan,
                 integrity: IntegrityCheck | None = None) -> None:
        self.config = config
        self.plan = plan
        self.output = Path(plan.output)
        self.integrity = integrity
        sites = integrity.sites if integrity is not None else CodeSites(plan.sandbox_root)
        self.poisoner = Poisoner(plan.poison, sites) if plan.poison else None
        self.observer: Any = None
        # Each launch is written as it first happens: a kernel that crashes the process
        # has already said what it launched, and from where.
        self.recorder = LaunchRecorder(
            config.rootpath, on_new=self._launched, on_launch=self.poisoner
        )
        self._running = ""
        self.kernels: dict[KernelLaunch, object] = {}  # every launch of the run, for the gate
        self.compiles = CompileCounter()
        self._reports: dict[str, list[pytest.TestReport]] = {}
        self._errors: dict[tuple[str, str], ErrorInfo] = {}
        self._findings: dict[str, set[str]] = {}
        self._probes: dict[str, Probe] = {}
        self._fd = os.open(self.output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(self, event: str, **data: Any) -> None:
        line = json.dumps({"event": event, **data}, default=repr) + "\n"
        os.write(self._fd, line.encode("utf-8"))

    def _launched(self, launch: KernelLaunch) -> None:
        self.emit("launch", nodeid=self._running, launch=launch.to_json())

    def set_extra(self, key: str, value: Any) -> None:
        """Hand JSON-able data back to the parent (``RerunResult.extra[key]``, last wins)."""
        self.emit("extra", key=key, value=value)

    def start(self) -> None:
        mark_phase("configured")
        try:
            self.recorder.install()
            self.set_extra("launch_recording", True)
        except Exception as exc:  # no triton here: count nothing rather than fail the run
            self.set_extra("launch_recording", False)
            self.set_extra("launch_recording_error", f"{type(exc).__name__}: {exc}")
        if self.plan.device.interpret:
            from pytest_kernelfix import shim

            self.set_extra("bf16_exact", shim.bf16_exact())  # for the session's triage
        else:
            self.compiles.install()
        self._report_imports()

    def stop(self) -> None:
        self.recorder.uninstall()
        self.compiles.uninstall()
        self._report_imports()
        if self.poisoner is not None and self.poisoner.errors:
            self.set_extra("poison_errors", sorted(set(self.poisoner.errors))[:20])
        if self.integrity is not None:
            self.integrity.close()
        mark_phase("end")
        self.set_extra("phases", dict(_phases))
        os.close(self._fd)

    def _report_imports(self) -> None:
        finder = installed_finder()
        if finder is not None:
            self.set_extra("import_mapping", {
                "sys_path": list(finder.mapped_paths),
                "redirected": sorted(set(finder.redirected)),
            })

    # hooks

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.recorder.reset()
        self._reports[nodeid] = []
        self._running = nodeid
        self.emit("start", nodeid=nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        """Integrity before and after the test body; poison and watch in between."""
        found = set(self.integrity.findings()) if self.integrity is not None else set()
        observer = self._start_watching()
        try:
            return (yield)
        finally:
            if observer is not None:
                remove_mode(observer)
                found |= observer.foreign
            if self.poisoner is not None:
                self.poisoner.active = False
                self._probes[item.nodeid] = Probe(
                    self.poisoner.launches, self.poisoner.poisoned,
                    observer.checks if observer is not None else 0,
                    observer.taint if observer is not None else "")
            if self.integrity is not None:
                found |= set(self.integrity.findings())
            self._findings[item.nodeid] = found

    def _start_watching(self) -> Any:
        """Arm the poisoner and push the observer (sensitivity reruns only)."""
        if self.poisoner is None:
            return None
        self.poisoner.reset()
        self.poisoner.active = True
        if self.observer is None:
            self.observer = make_observer(self.poisoner.sites, taint=self.plan.poison == "nan")
            if self.integrity is not None:
                self.integrity.allow(self.observer)
        self.observer.reset()
        self.observer.__enter__()
        return self.observer

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.failed and call.excinfo is not None:
            with contextlib.suppress(Exception):  # describing must never break the run
                self._errors[(item.nodeid, call.when)] = describe_exception(call.excinfo.value)
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._reports.setdefault(report.nodeid, []).append(report)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        reports = self._reports.pop(nodeid, [])
        outcome, phase, report = decide_outcome(reports)
        result = TestOutcome(
            nodeid=nodeid,
            outcome=outcome,  # type: ignore[arg-type]
            phase=phase,
            longrepr="" if report is None else _longrepr(report),
            error=self._errors.get((nodeid, phase)),
            launch_count=self.recorder.count,
            launches=self.recorder.launches(),
            duration=sum(r.duration for r in reports),
            integrity=tuple(sorted(self._findings.pop(nodeid, ()))),
            probe=self._probes.pop(nodeid, None),
        )
        self._errors = {key: value for key, value in self._errors.items() if key[0] != nodeid}
        self.kernels.update(self.recorder.kernels)
        self.emit("test", **result.to_json())

    def pytest_collection_finish(self) -> None:
        mark_phase("collected")

    def pytest_sessionfinish(self) -> None:
        mark_phase("tests")
        if self.plan.device.gate:
            self.set_extra("gate", self._gate(self.plan.device.gate_target))
            mark_phase("gate")
        if self.compiles.installed:
            self.set_extra("compile_cache", self.compiles.counts())

    def _gate(self, target: str) -> list[dict[str, Any]]:
        """Compile every project kernel the rerun launched for a real GPU target."""
        from pytest_kernelfix.rerun.probes.gate import GateResult, compile_launch, parse_target

        root = str(self.config.rootpath) + os.sep
        cache_dir = self.plan.device.cache_dir
        results = []
        for launch, kernel in self.kernels.items():
            if not launch.file.startswith(root):
                continue  # installed packages' kernels are not the project's to fix
            try:
                result = compile_launch(kernel, launch, parse_target(target),
                                        cache_dir=cache_dir or None, root=root)
            except Exception as exc:  # the gate must never cost the rerun its outcomes
                note = f"gate skipped {launch.name}: {type(exc).__name__}: {exc}"
                result = GateResult(launch.name, launch.file, launch.line, True, note, 0, 0.0,
                                    False)
            results.append(result.to_json())
        return results

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            text = report.longreprtext
            nodeid = report.nodeid or "<session>"
            self.emit("collection_error", text=f"{nodeid}: {_headline(text)}\n{_truncate(text)}")

    @pytest.hookimpl(wrapper=True)
    def pytest_collection(self, session: pytest.Session) -> Generator[None, object, object]:
        try:
            return (yield)
        except pytest.UsageError as exc:  # "not found: <nodeid>" for a nodeid that is gone
            for message in exc.args:
                self.emit("collection_error", text=_relative_nodeids(str(message), session))
            raise


class CompileCounter:
    """Counts Triton compiles on a GPU: how many came from the cache directory the
    session's reruns share (``TRITON_CACHE_DIR``), how many were compiled anew.

    Uses Triton's compilation listener (``knobs.compilation.listener``), chained to any
    listener already set; counts nothing where this Triton has none.
    """

    def __init__(self) -> None:
        self.hits = 0
        self.misses = 0
        self.installed = False
        self._previous: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("cache_hit"):
            self.hits += 1
        else:
            self.misses += 1
        if self._previous is not None:
            self._previous(*args, **kwargs)

    def install(self) -> None:
        try:
            from triton import knobs

            self._previous = knobs.compilation.listener
            knobs.compilation.listener = self
        except Exception:  # an older Triton, or none: nothing to count
            return
        self.installed = True

    def uninstall(self) -> None:
        if not self.installed:
            return
        from triton import knobs

        knobs.compilation.listener = self._previous
        self.installed = False

    def counts(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses}


def decide_outcome(
    reports: Sequence[pytest.TestReport],
) -> tuple[str, str, pytest.TestReport | None]:
    """(outcome, phase, the report that decided it) from one test's phase reports.

    A failing setup or teardown is an ``error``, unless the call itself failed.
    """
    outcome, phase, decisive = "error", "setup", None  # no report at all: never ran
    for report in reports:
        xfail = hasattr(report, "wasxfail")
        if report.when == "call":
            if report.passed:
                outcome = "xpassed" if xfail else "passed"
            elif report.skipped:
                outcome = "xfailed" if xfail else "skipped"
            else:
                outcome = "failed"
            phase, decisive = "call", report
        elif report.failed and outcome != "failed":
            outcome, phase, decisive = "error", report.when, report
        elif report.skipped and report.when == "setup":
            outcome, phase, decisive = ("xfailed" if xfail else "skipped"), "setup", report
        elif report.when == "setup":
            outcome, phase = "passed", "setup"  # until the call says otherwise
    return outcome, phase, decisive


def _longrepr(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        return str(longrepr[2])
    return _truncate(report.longreprtext)


def _truncate(text: str) -> str:
    if len(text) <= _MAX_LONGREPR:
        return text
    half = _MAX_LONGREPR // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters left out] ...\n{text[-half:]}"


def _headline(text: str) -> str:
    """The ``E   ...`` line pytest shows for an error, else the last non-empty line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    marked = [line[1:].strip() for line in lines if line.startswith("E ")]
    if marked:
        return marked[-1]
    return lines[-1] if lines else "collection failed"


def _relative_nodeids(message: str, session: pytest.Session) -> str:
    """pytest names a missing nodeid by its absolute path; use the rootdir-relative id."""
    root = str(session.config.rootpath) + os.sep
    return message.replace(root, "")


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Know the plugin's hooks, which the suite's conftest files may implement."""
    from pytest_kernelfix import hookspecs

    with contextlib.suppress(ValueError):  # the plugin itself is loaded after all
        pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Know the plugin's ini keys, which the suite's ini may set (``--strict-config``)."""
    from pytest_kernelfix.config import add_ini_keys

    with contextlib.suppress(ValueError):  # the plugin itself is loaded after all
        add_ini_keys(parser)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config) -> None:
    """Prepare the device as the session did, then take the integrity snapshot: both
    before conftest files import kernels (or anything else of the project)."""
    plan = load_plan()
    if plan is None:
        return
    if plan.device.interpret:
        from pytest_kernelfix.device import prepare

        prepare("interpret", cuda_shim=plan.device.cuda_shim, capability=plan.device.capability)
    mark_phase("device")
    try:
        patterns = tuple(early_config.getini("python_files"))
    except (ValueError, KeyError):
        patterns = ()
    try:
        early_config.stash[integrity_key] = IntegrityCheck.start(plan.sandbox_root, patterns)
    except Exception as error:  # reported, and the session refuses the candidate for it
        early_config.stash[integrity_error_key] = f"{type(error).__name__}: {error}"


def pytest_configure(config: pytest.Config) -> None:
    plan = load_plan()
    if plan is None or hasattr(config, "workerinput"):
        return
    agent = RerunAgent(config, plan, config.stash.get(integrity_key, None))
    config.stash[agent_key] = agent
    config.pluginmanager.register(agent, "kernelfix-rerun-agent")
    agent.start()
    failed = config.stash.get(integrity_error_key, "")
    if failed:
        agent.set_extra("integrity_error", failed)


def pytest_unconfigure(config: pytest.Config) -> None:
    agent = config.stash.get(agent_key, None)
    if agent is not None:
        agent.stop()
        config.pluginmanager.unregister(agent)
        del config.stash[agent_key]


agent_key = pytest.StashKey[RerunAgent]()
integrity_key = pytest.StashKey[IntegrityCheck]()
integrity_error_key = pytest.StashKey[str]()


def agent_of(config: pytest.Config) -> RerunAgent | None:
    """The agent of this rerun (its ``plan`` is the parent's), or None."""
    return config.stash.get(agent_key, None)
