"""The plugin object registered while healing is on.

Where tests run (a plain session or an xdist worker) it records kernel launches and
attaches a JSON-primitive record to each call-phase report. Where reports arrive (the
plain session or the xdist controller) it collects failures and passes, heals after the
run, and prints the summary. It never changes a test outcome or the exit status.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kernelfix.capture import REPORT_ATTR, Failure, PassedTest, read_record, report_record
from pytest_kernelfix.config import Settings, target_capability
from pytest_kernelfix.device import runs_tests
from pytest_kernelfix.failure import describe_exception
from pytest_kernelfix.fixers.base import Fixer
from pytest_kernelfix.fixers.hook import HookFixer, UnavailableFixer
from pytest_kernelfix.launches import KernelLaunch, LaunchRecorder

if TYPE_CHECKING:
    from pytest_kernelfix.report import SessionReport

launches_key = pytest.StashKey[tuple[KernelLaunch, ...]]()

#: Command-line options of the session that reruns must keep (plugins, import mode).
_CARRIED_WITH_VALUE = ("-p", "-W", "--pythonwarnings", "--import-mode", "-o", "--override-ini")
_CARRIED_FLAGS = ("--strict-markers", "--strict-config", "--strict")


def carried_args(args: Sequence[str]) -> tuple[str, ...]:
    """The session's own options a rerun of a few nodeids needs too.

    Paths, selections and report options stay behind; so do ``-o addopts=...`` (the
    rerun sets its own filtered ``addopts``) and ``-p kernelfix``.
    """
    kept: list[str] = []
    remaining = iter(args)
    for arg in remaining:
        if arg in _CARRIED_FLAGS:
            kept.append(arg)
            continue
        if arg.startswith("--"):
            name, _, value = arg.partition("=")
        else:
            name, value = arg[:2], arg[2:]
        if name not in _CARRIED_WITH_VALUE:
            continue
        value = value or next(remaining, "")
        dropped = (name in ("-o", "--override-ini") and value.startswith("addopts=")) or (
            name == "-p" and value in ("kernelfix", "no:kernelfix")
        )
        if value and not dropped:
            kept += [name, value]
    return tuple(kept)


class KernelfixSession:
    """State of one session with ``--kernelfix`` or ``--kernelfix-apply``."""

    def __init__(self, config: pytest.Config, settings: Settings, device: str) -> None:
        self.config = config
        self.settings = settings
        self.device = device
        self.is_worker = hasattr(config, "workerinput")
        self.failures: list[Failure] = []
        self.passed: list[PassedTest] = []
        self.report: SessionReport | None = None
        self.error = ""
        self.notes: list[str] = []
        self._progress_shown = False
        self.recorder = LaunchRecorder()
        try:
            if runs_tests(config):  # an xdist controller records nothing: no triton import
                self.recorder.install()
        except ImportError as error:  # no triton: heal from tracebacks alone
            self.notes.append(f"kernel launches are not recorded: {error}")

    def close(self) -> None:
        self.recorder.uninstall()

    # -- where tests run -------------------------------------------------------------

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        self.recorder.reset()
        try:
            return (yield)
        finally:
            item.stash[launches_key] = self.recorder.launches()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.when == "call":
            error = None
            if report.failed and call.excinfo is not None and not hasattr(report, "wasxfail"):
                error = describe_exception(call.excinfo.value)
            record = report_record(
                kernel=item.get_closest_marker("kernel") is not None,
                test_path=str(item.path),
                launches=item.stash.get(launches_key, ()),
                error=error,
                root=self.settings.rootdir,
            )
            setattr(report, REPORT_ATTR, record)
        return report

    # -- where reports arrive --------------------------------------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = getattr(report, REPORT_ATTR, None)
        if self.is_worker or report.when != "call" or not isinstance(record, dict):
            return
        captured = read_record(report.nodeid, record, report.longreprtext)
        if isinstance(captured, Failure):
            if record.get("kernel") and report.failed:
                self.failures.append(captured)
        elif report.passed:
            self.passed.append(captured)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.is_worker or not self.failures:
            return
        if exitstatus == pytest.ExitCode.INTERRUPTED:
            self.notes.append("the session was interrupted: nothing was healed")
            return
        try:
            self.report = self._heal()
        except KeyboardInterrupt:  # Ctrl-C while healing: stop here, end the session as usual
            self.notes.append("healing was interrupted: nothing more was healed or written")
        except Exception as error:  # the session must never crash because of a heal
            from pytest_kernelfix.redact import redact

            self.error = redact(
                f"healing stopped by an internal error: {type(error).__name__}: {error}")

    def _heal(self) -> SessionReport:
        from pytest_kernelfix.guards import build_guard
        from pytest_kernelfix.rerun import RerunSpec
        from pytest_kernelfix.workflow import SessionInputs, run_healing

        settings = self.settings
        interpret = self.device == "interpret"
        rerun = RerunSpec(  # a template: the verifier fills in the sandbox and the tests
            sandbox_root=settings.rootdir,
            original_root=settings.rootdir,
            nodeids=(),
            timeout=settings.timeout,
            interpret=interpret,
            addopts=tuple(self.config.getini("addopts")),
            inifile=self.config.inipath,
            extra_args=carried_args(self.config.invocation_params.args),
            plan={
                "shim": interpret,
                "cuda_shim": settings.cuda_shim,
                "capability": list(target_capability(settings.target)),
                "gate_target": settings.target if interpret and settings.gate_enabled else None,
                "cache_dir": str(settings.report_dir / "cache"),
            },
        )
        inputs = SessionInputs(
            failures=tuple(self.failures),
            passed=tuple(self.passed),
            settings=settings,
            device=self.device,
            rerun=rerun,
            test_patterns=tuple(self.config.getini("python_files")),
        )
        guard = build_guard(test_patterns=inputs.test_patterns)
        return run_healing(inputs, self._fixer(), guard=guard, progress=self._progress)

    def _fixer(self) -> Fixer:
        from pytest_kernelfix.fixers.base import FixerError

        settings = self.settings
        try:
            from pytest_kernelfix.fixers.factory import build_fixer

            configured: Fixer = build_fixer(
                settings.model,
                api_base=settings.api_base or None,
                timeout=settings.llm_timeout,
                num_retries=settings.llm_retries,
                prompts_dir=settings.prompts_dir,
                record=settings.record,
            )
        except (ValueError, OSError, FixerError) as error:
            configured = UnavailableFixer(f"fixer {settings.model!r} unavailable: {error}")

        def ask(request: Any) -> Any:
            return self.config.hook.pytest_kernelfix_propose(request=request, config=self.config)

        return HookFixer(ask, configured)

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
        if self.is_worker:
            return
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
        for note in self.notes:
            terminalreporter.write_line(f"note: {note}")
        if self.error:
            terminalreporter.write_line(self.error, red=True)
