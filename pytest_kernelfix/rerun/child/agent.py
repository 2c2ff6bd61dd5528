"""The pytest plugin of a rerun child: write each test's outcome as it finishes.

Loaded with ``-p pytest_kernelfix.rerun.child.agent`` in every rerun child (started by
:mod:`pytest_kernelfix.rerun.child.bootstrap`), it records each test's outcome, error and
kernel launches to the results file as each test finishes, so a crash mid-run leaves the
finished tests readable, and keeps the child's :class:`~pytest_kernelfix.rerun.report.ChildReport`
there, written again whenever it changes. Around each test's call phase it runs the
integrity check (:mod:`pytest_kernelfix.rerun.probes.integrity`) and, as the phase's
probe asks, poisons project kernels' outputs, fingerprints their launches and watches the
test's checks (:mod:`pytest_kernelfix.rerun.probes.poison`), with every check statement
guarded so that each one runs (:mod:`pytest_kernelfix.rerun.probes.checks`); after each
phase's tests, the compile gate (:mod:`pytest_kernelfix.rerun.probes.gate`). The phases
themselves are run by the loop beside it (:mod:`pytest_kernelfix.rerun.child.phases`).

PYTEST_DONT_REWRITE: the bootstrap imports the plugin's modules before pytest starts.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Generator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pytest_kernelfix.capture.errors import ErrorInfo, describe_exception
from pytest_kernelfix.capture.launches import KernelLaunch, LaunchRecorder
from pytest_kernelfix.rerun.child.bootstrap import mark_phase, phases
from pytest_kernelfix.rerun.child.imports import installed_finder
from pytest_kernelfix.rerun.child.phases import PhaseServer
from pytest_kernelfix.rerun.plan import ProbePlan, RerunPlan, load_plan
from pytest_kernelfix.rerun.probes.checks import ReachMode
from pytest_kernelfix.rerun.probes.compiles import CompileCounter
from pytest_kernelfix.rerun.probes.integrity import CodeSites, IntegrityCheck
from pytest_kernelfix.rerun.probes.poison import (
    TAINT_LETTERS,
    Poisoner,
    make_observer,
    remove_mode,
)
from pytest_kernelfix.rerun.report import (
    CheckSite,
    ChildReport,
    Fingerprint,
    GateResult,
    ImportMapping,
    Probe,
    TestOutcome,
)

#: Longest longrepr kept per test (head and tail), so the results file stays small.
_MAX_LONGREPR = 40_000


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
        self.sites = integrity.sites if integrity is not None else CodeSites(plan.sandbox_root)
        probe = plan.probe
        self.poisoner = self._poisoner(probe)
        self.observer: Any = None
        self.reach: ReachMode | None = None
        if probe.reach:  # a child opened for many phases guards checks for any of them
            self.reach = ReachMode(tuple(config.getini("python_files")), plan.sandbox_root)
        # Each launch is written as it first happens: a kernel that crashes the process
        # has already said what it launched, and from where.
        self.recorder = LaunchRecorder(  # the project's frames: under the sandbox root
            plan.sandbox_root, on_new=self._launched, on_launch=self.poisoner
        )
        self.last_outcome = ""
        self._running = ""
        self.kernels: dict[KernelLaunch, object] = {}  # every launch of the run, for the gate
        self.compiles = CompileCounter()
        self._reports: dict[str, list[pytest.TestReport]] = {}
        self._errors: dict[tuple[str, str], ErrorInfo] = {}
        self._findings: dict[str, set[str]] = {}
        self._probes: dict[str, Probe] = {}
        self.report = ChildReport()
        self._fd = os.open(self.output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def _poisoner(self, probe: ProbePlan) -> Poisoner | None:
        return Poisoner(probe.poison, self.sites, kernels=frozenset(probe.kernels),
                        fingerprint=probe.fingerprint) if probe.active else None

    def use_phase(self, probe: ProbePlan, output: Path) -> None:
        """Probe the next tests as ``probe`` says and write their events to ``output``
        (a phase, in the process that runs it); the report so far is written there
        first."""
        self.plan = replace(self.plan, probe=probe, output=str(output))
        self.poisoner = self._poisoner(probe)
        self.recorder.on_launch = self.poisoner
        self.recorder.reset()
        self.observer = None
        if self.reach is not None:
            self.reach.log.enabled = probe.reach
        self.kernels = {}
        os.close(self._fd)
        self.output = output
        self._fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.update()

    def finish_phase(self) -> None:
        """The end of a phase: the compile gate on the kernels the phase launched (not in
        poisoned phases: their outputs were replaced, and no verdict reads their gate),
        the compile counts and the last report."""
        mark_phase("tests")
        changes: dict[str, Any] = {}
        if self.plan.device.gate and not self.plan.probe.poison:
            changes["gate"] = self._gate(self.plan.device.gate_target)
            mark_phase("gate")
        if self.compiles.installed:
            changes["compile_cache"] = self.compiles.counts()
        if self.poisoner is not None and self.poisoner.errors:
            changes["poison_errors"] = tuple(sorted(set(self.poisoner.errors))[:20])
        mark_phase("end")
        self.update(**changes, import_mapping=self._import_mapping(), phases=phases())

    def emit(self, event: str, **data: Any) -> None:
        line = json.dumps({"event": event, **data}, default=repr) + "\n"
        os.write(self._fd, line.encode("utf-8"))

    def _launched(self, launch: KernelLaunch) -> None:
        self.emit("launch", nodeid=self._running, launch=launch.to_json())

    def update(self, **changes: Any) -> None:
        """Change the child's report and hand the whole of it to the parent again (the
        last one written wins), so a crash later loses none of it."""
        self.report = replace(self.report, **changes)
        self.emit("report", report=self.report.to_json())

    def start(self) -> None:
        mark_phase("configured")
        changes: dict[str, Any] = {}
        if self.reach is not None:
            self.reach.install()
        try:
            self.recorder.install()
            changes["launch_recording"] = True
        except Exception as exc:  # no triton here: count nothing rather than fail the run
            changes["launch_recording_error"] = f"{type(exc).__name__}: {exc}"
        if self.plan.device.interpret:
            from pytest_kernelfix import shim

            changes["bf16_exact"] = shim.bf16_exact()  # for the session's triage
        else:
            self.compiles.install()
        self.update(**changes, import_mapping=self._import_mapping())

    def stop(self) -> None:
        self.recorder.uninstall()
        if self.reach is not None:
            self.reach.uninstall()
        self.compiles.uninstall()
        changes: dict[str, Any] = {"import_mapping": self._import_mapping()}
        if self.poisoner is not None and self.poisoner.errors:
            changes["poison_errors"] = tuple(sorted(set(self.poisoner.errors))[:20])
        if self.integrity is not None:
            self.integrity.close()
        mark_phase("end")
        self.update(**changes, phases=phases())
        os.close(self._fd)

    @staticmethod
    def _import_mapping() -> ImportMapping | None:
        finder = installed_finder()
        if finder is None:
            return None
        return ImportMapping(tuple(finder.mapped_paths), tuple(sorted(set(finder.redirected))))

    # hooks

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, Any, str]) -> None:
        if self.reach is not None:  # fixtures in the test module are guarded too
            self.reach.log.start(str(self.config.rootpath / location[0]))
        self.recorder.reset()
        self._reports[nodeid] = []
        self._running = nodeid
        self.emit("start", nodeid=nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        """Integrity before and after the test body; poison and watch in between."""
        found = set(self.integrity.findings()) if self.integrity is not None else set()
        observer = self._start_watching(str(item.path))
        try:
            return (yield)
        finally:
            if observer is not None:
                remove_mode(observer)
                found |= observer.foreign
            if self.poisoner is not None:
                self.poisoner.active = False
                self._probes[item.nodeid] = self._probe(str(item.path), observer)
            if self.integrity is not None:
                found |= set(self.integrity.findings())
            self._findings[item.nodeid] = found

    def _start_watching(self, test_file: str) -> Any:
        """Arm the poisoner and push the observer (probing reruns only)."""
        if self.poisoner is None:
            return None
        self.poisoner.reset()
        self.poisoner.active = True
        if self.observer is None:
            self.observer = make_observer(
                self.poisoner.sites, taint=self.plan.probe.poison == "nan",
                runs=self.reach.log.run_index if self.reach is not None else None)
            if self.integrity is not None:
                self.integrity.allow(self.observer)
        self.observer.reset(test_file)
        self.observer.__enter__()
        return self.observer

    def _probe(self, test_file: str, observer: Any) -> Probe:
        """What the probes saw in this test, per check site too."""
        assert self.poisoner is not None
        read: dict[int, list[Any]] = observer.sites if observer is not None else {}
        on = self.reach is not None and self.reach.log.enabled
        ran = self.reach.log.sites if self.reach is not None and on else {}
        sites = []
        for line in sorted(set(read) | set(ran)):
            reads, taint, per_run = read.get(line, (0, "", {}))
            count = ran.get(line)
            per_run = dict(per_run)
            taints = "".join(TAINT_LETTERS[per_run.get(run, "")] for run in range(
                len(count.outcomes))) if count and per_run else ""
            sites.append(CheckSite(line, reads, taint, count.runs if count else 0,
                                   count.failures if count else 0,
                                   count.outcomes if count else "", taints))
        reached = (self.reach is not None and on
                   and os.path.abspath(test_file) in self.reach.transformed)
        return Probe(self.poisoner.launches, self.poisoner.poisoned,
                     observer.checks if observer is not None else 0,
                     observer.taint if observer is not None else "", tuple(sites), reached,
                     tuple(Fingerprint(*item) for item in self.poisoner.fingerprints),
                     observer.blind if observer is not None else 0)

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
        self.last_outcome = outcome
        self.emit("test", **result.to_json())

    def pytest_collection_finish(self) -> None:
        mark_phase("collected")

    def _gate(self, target: str) -> tuple[GateResult, ...]:
        """Compile every project kernel the rerun launched for a real GPU target."""
        from pytest_kernelfix.rerun.probes.gate import compile_launch, parse_target

        root = str(self.plan.sandbox_root) + os.sep
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
            results.append(result)
        return tuple(results)

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
    config.pluginmanager.register(PhaseServer(agent), "kernelfix-rerun-phases")
    agent.start()
    failed = config.stash.get(integrity_error_key, "")
    if failed:
        agent.update(integrity_error=failed)


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
