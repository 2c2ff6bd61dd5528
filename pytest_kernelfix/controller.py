"""The plugin object registered where reports arrive: a plain session or the xdist
controller, never a worker.

It collects the failed kernel tests and the passing ones from the reports' records,
heals after the run (:func:`pytest_kernelfix.workflow.run_healing`), and prints the
summary. It never changes a test outcome or the exit status.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kernelfix.capture import REPORT_ATTR, Failure, PassedTest, read_record
from pytest_kernelfix.capturing import WORKER_NOTES
from pytest_kernelfix.config import Settings
from pytest_kernelfix.project import Project

if TYPE_CHECKING:
    from pytest_kernelfix.fixers.base import Fixer
    from pytest_kernelfix.report import SessionReport
    from pytest_kernelfix.rerun import RerunSetup
    from pytest_kernelfix.workflow import SessionInputs


def session_project(config: pytest.Config, settings: Settings) -> Project:
    """The project as this session's configuration defines it."""
    return Project(settings.rootdir, tuple(config.getini("python_files")), settings.paths)


def rerun_setup(config: pytest.Config, settings: Settings, device: str) -> RerunSetup:
    """What every rerun of this session shares (built once per session)."""
    from pytest_kernelfix.rerun import RerunSetup, carried_args
    from pytest_kernelfix.rerun_plan import device_plan

    return RerunSetup(
        original_root=settings.rootdir,
        timeout=settings.timeout,
        device=device_plan(device=device, cuda_shim=settings.cuda_shim,
                           target=settings.target, cache_dir=settings.cache_root),
        addopts=tuple(config.getini("addopts")),
        inifile=config.inipath,
        extra_args=carried_args(config.invocation_params.args),
    )


def session_fixer(config: pytest.Config, settings: Settings) -> Fixer:
    """The configured fixer behind the ``pytest_kernelfix_propose`` hook."""
    from pytest_kernelfix.fixers.base import FixerError
    from pytest_kernelfix.fixers.hook import HookFixer, UnavailableFixer

    try:
        from pytest_kernelfix.fixers.factory import build_fixer

        configured: Fixer = build_fixer(
            settings.model,
            api_base=settings.api_base or None,
            timeout=settings.llm_timeout,
            num_retries=settings.llm_retries,
            prompts_dir=settings.prompts_dir,
            record=settings.record,
            cache_dir=None if settings.no_cache else settings.cache_root,
        )
    except (ValueError, OSError, FixerError) as error:
        configured = UnavailableFixer(f"fixer {settings.model!r} unavailable: {error}")

    def ask(request: Any) -> Any:
        return config.hook.pytest_kernelfix_propose(request=request, config=config)

    return HookFixer(ask, configured)


class HealingController:
    """Collects failures and passes, heals once the run is over, prints the summary."""

    def __init__(self, config: pytest.Config, settings: Settings, device: str,
                 notes: list[str] | None = None) -> None:
        self.config = config
        self.settings = settings
        self.device = device
        self.failures: list[Failure] = []
        self.passed: list[PassedTest] = []
        self.notes: list[str] = notes if notes is not None else []
        self.report: SessionReport | None = None
        self.error = ""
        self._progress_shown = False
        self.annotations: list[str] = []  # GitHub workflow commands, printed in the summary
        self.ci_notes: list[str] = []  # about the CI outputs, written after the report
        xmlpath = getattr(config.option, "xmlpath", None)
        if xmlpath:
            from pytest_kernelfix.junit import JUnitProperties

            config.pluginmanager.register(JUnitProperties(
                xmlpath, str(getattr(config.option, "junitprefix", None) or ""),
                lambda: self.report, self.ci_notes.append), "kernelfix-junit")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = getattr(report, REPORT_ATTR, None)
        if report.when != "call" or not isinstance(record, dict):
            return
        captured = read_record(report.nodeid, record, report.longreprtext)
        if isinstance(captured, Failure):
            if record.get("kernel") and report.failed:
                self.failures.append(captured)
        elif report.passed:
            self.passed.append(captured)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """An xdist worker finished: keep its notes (once each)."""
        for note in getattr(node, "workeroutput", {}).get(WORKER_NOTES, ()):
            if note not in self.notes:
                self.notes.append(str(note))

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.failures:
            return
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            self.notes.append("the session was interrupted: nothing was healed")
            return
        try:
            self.report = self.heal()
        except Exception as error:  # the session must never crash because of a heal
            from pytest_kernelfix.redact import redact

            self.error = redact(
                f"healing stopped by an internal error: {type(error).__name__}: {error}")
            return
        self.publish_to_github()

    def publish_to_github(self) -> None:
        """In GitHub Actions: the step summary now, the annotations with the summary."""
        from pytest_kernelfix.github import publish

        if self.report is None:
            return
        try:
            self.annotations, notes = publish(self.report, os.environ)
        except Exception as error:  # like healing, never a crash at session end
            notes = [f"GitHub outputs not written: {type(error).__name__}: {error}"]
        self.ci_notes.extend(notes)

    def inputs(self) -> SessionInputs:
        """The session's failures, passes and notes, and how reruns are made."""
        from pytest_kernelfix.workflow import SessionInputs

        return SessionInputs(
            failures=tuple(self.failures),
            passed=tuple(self.passed),
            settings=self.settings,
            setup=rerun_setup(self.config, self.settings, self.device),
            project=session_project(self.config, self.settings),
            notes=tuple(self.notes),
        )

    def heal(self) -> SessionReport:
        from pytest_kernelfix.guards import build_guard
        from pytest_kernelfix.workflow import Stages, run_healing

        inputs = self.inputs()
        stages = Stages(fixer=session_fixer(self.config, self.settings),
                        guard=build_guard(inputs.project), progress=self._progress)
        return run_healing(inputs, stages)

    def _progress(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        if not self._progress_shown:
            self._progress_shown = True
            reporter.write_line("")  # end the line of progress dots, even under -q
            reporter.write_sep("-", "kernelfix: healing")
        reporter.write_line(f"kernelfix: {line}")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from pytest_kernelfix.report import summary_lines

        if not (self.failures or self.error or self.notes):
            if self.config.get_verbosity() > 0:
                terminalreporter.write_sep("-", "kernelfix: no failing kernel tests")
            return
        terminalreporter.section("kernelfix")
        if self.report is not None:
            json_path = self.settings.report_dir / "report.json"
            for line in summary_lines(self.report, json_path):
                terminalreporter.write_line(line)
        else:
            for note in self.notes:
                terminalreporter.write_line(f"note: {note}")
        if self.error:
            terminalreporter.write_line(self.error, red=True)
        for note in self.ci_notes:
            terminalreporter.write_line(f"note: {note}")
        for line in self.annotations:  # GitHub reads workflow commands from the log
            terminalreporter.write_line(line)
