"""The plugin object registered where reports arrive: a plain session or the xdist
controller, never a worker.

It collects the failed tests that ``kernelfix_select`` chooses (the ``kernel`` marker
by default), the failed ones it leaves out (counted, with the reason, in the summary and
the reports) and the passing ones from the reports' records, heals after the run
(:func:`pytest_kernelfix.session.pipeline.run_healing`), publishes the report once to
every output the session asked for (:func:`pytest_kernelfix.report.publish.publish`), and
prints the summary. It owns the session's reruns and their warm server (started at the
first failure, ended with the session). A test that crashes an xdist worker is a failure
to heal too (rerun alone in the sandbox first). It never changes a test outcome or the
exit status.

With ``--kernelfix-overlap`` (on by default) healing begins while the tests run, in a
helper process started with the session (:mod:`pytest_kernelfix.session.helper`, which
runs :mod:`pytest_kernelfix.session.overlap`): each selected failure and each passing
test is handed over as it arrives, the helper's progress lines are printed between test
results by the main thread (queued until then), and at the end the helper heals the
session and hands back its report.

From the session's start to its end the first SIGTERM is a ``KeyboardInterrupt``, as
Ctrl-C is (:mod:`pytest_kernelfix.session.interrupt`): an interrupted session, during the
test run or while healing, still writes its report, marked ``interrupted``, with every bug
healed before the interrupt, and removes its temporary directories.
"""

from __future__ import annotations

import functools
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kernelfix.capture.plugin import WORKER_NOTES
from pytest_kernelfix.capture.records import (
    REPORT_ATTR,
    Failure,
    PassedTest,
    Selection,
    Unselected,
    crash_failure,
    reached_project_kernel,
    read_record,
)
from pytest_kernelfix.config import Settings
from pytest_kernelfix.device import is_xdist_controller
from pytest_kernelfix.locate.base import Changes, resolve_changes
from pytest_kernelfix.locate.green import GreenStore
from pytest_kernelfix.redact import redact
from pytest_kernelfix.rerun.launcher import RerunSetup
from pytest_kernelfix.rerun.runner import Reruns
from pytest_kernelfix.session.helper import Helper, Session, Start
from pytest_kernelfix.session.inputs import SessionInputs, Stages
from pytest_kernelfix.session.interrupt import CTRL_C, Cancel, install_sigterm, shielded
from pytest_kernelfix.session.start import configured_fixer, rerun_setup, session_project

if TYPE_CHECKING:
    from pytest_kernelfix.fixers.base import Fixer
    from pytest_kernelfix.report.model import SessionReport
    from pytest_kernelfix.report.publish import Sink


def hook_asker(config: pytest.Config) -> Callable[[Any], Any]:
    """A call of the ``pytest_kernelfix_propose`` hook, one at a time."""
    lock = threading.Lock()

    def ask(request: Any) -> Any:
        with lock:  # bugs heal in threads; a conftest hook need not be thread-safe
            return config.hook.pytest_kernelfix_propose(request=request, config=config)

    return ask


def hooked(config: pytest.Config) -> bool:
    """Whether a conftest file or plugin implements ``pytest_kernelfix_propose``."""
    return bool(config.pluginmanager.hook.pytest_kernelfix_propose.get_hookimpls())


def session_fixer(config: pytest.Config, settings: Settings) -> Fixer:
    """The configured fixer behind the ``pytest_kernelfix_propose`` hook."""
    from pytest_kernelfix.fixers.hook import HookFixer  # start-up: only a session that heals

    return HookFixer(hook_asker(config), configured_fixer(settings), hooked=hooked(config))


def test_processes(config: pytest.Config) -> int:
    """Processes that run the tests: xdist's workers, else this one."""
    if is_xdist_controller(config):
        return max(1, len(getattr(config.option, "tx", None) or ()))
    return 1


#: Shown when healing runs without xdist, where a crashing kernel ends the session.
CRASH_HINT = (
    "kernelfix: a kernel that crashes the test process (a segfault) ends this session "
    "before it can be healed; run under pytest-xdist (-n 1, or -p xdist -n 1) to heal "
    "crashes too"
)


class HealingController:
    """Collects failures and passes, heals once the run is over, prints the summary."""

    def __init__(self, config: pytest.Config, settings: Settings, device: str,
                 notes: list[str] | None = None, *, early: Helper | None = None) -> None:
        self.config = config
        self.settings = settings
        self.device = device
        self.failures: list[Failure] = []
        self.unselected: list[Unselected] = []
        self.passed: list[PassedTest] = []
        self.notes: list[str] = notes if notes is not None else []
        self.report: SessionReport | None = None
        self.error = ""
        self._progress_shown = False
        self.selection = Selection.of(settings.select)
        self.project = session_project(config, settings)
        self.marked: set[str] = set()
        self.annotations: list[str] = []  # GitHub workflow commands, printed in the summary
        self.ci_notes: list[str] = []  # about the outputs, written after the report
        self.sinks: tuple[Sink, ...] = ()  # besides the report files and GitHub's outputs
        self._reruns: Reruns | None = None
        self._early = early  # the helper started before the conftests, if one was
        self._helper: Helper | None = None
        self._lines: queue.SimpleQueue[str] = queue.SimpleQueue()  # said while tests run
        self._running = True  # the test run goes on: lines wait for the main thread
        self._write_lock = threading.Lock()
        self.cancel = Cancel()  # set by the first Ctrl-C or SIGTERM
        self.changes = Changes()  # the change since the base, read at the session's start
        self._uninstall: Callable[[], None] = lambda: None

    @functools.cached_property  # a helper started early sets it to its own
    def setup(self) -> RerunSetup:
        """How this session reruns tests: built once, for the early server start and for
        healing alike (with the environment as it is then: what a test sets later does
        not reach the reruns)."""
        return rerun_setup(self.config, self.settings, self.device)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """From here on the first SIGTERM (CI cancelling the job) ends the session as
        Ctrl-C does: the report is written and the temporary directories go. The change
        since the base is read here, once per session. With overlap on, the healing
        helper (started before the conftest files where it could be, else now, with its
        warm server) learns what the session knows now, so that the first failure's heal
        waits for no import."""
        self._uninstall = install_sigterm(self.cancel)
        self.changes = self._read_changes()
        if not self.settings.overlap or self._bisect_first():
            return
        try:
            started = self._early
            if started is None:
                started = Helper(Start(self.settings, self.project, self.setup))
            else:
                self.setup = started.start.setup  # the environment its server started with
            started.begin(Session(test_processes(self.config), hooked(self.config),
                                  self.changes),
                          ask=hook_asker(self.config), progress=self._progress)
            self._helper = started
        except Exception as error:  # the end of the session heals in this process
            self.notes.append(f"healing could not begin while the tests ran: "
                              f"{type(error).__name__}: {error}")

    def _read_changes(self) -> Changes:
        """The change since the base (``--kernelfix-base``): git is read here only."""
        try:
            return resolve_changes(self.settings.base, self.project, os.environ,
                                   green=self.green,
                                   skip=(self.settings.report_dir, self.settings.cache_root))
        except Exception as error:  # healing goes on without a base, and says why
            return Changes(notes=(f"the change since the base could not be read: "
                                  f"{type(error).__name__}: {error}; healing goes on "
                                  "without a base",))

    def _bisect_first(self) -> bool:
        """With a change since a base, healing waits for the end of the run: the
        experiment that finds the change's culprit lines runs before the fixer is asked,
        and an early heal would go without it."""
        try:
            base = self.changes.waits(self.project)
        except Exception:  # no base to tell: heal while the tests run
            return False
        if base:
            self.notes.append(f"healing begins after the tests: the change since {base} is "
                              "bisected first (--kernelfix-base none heals while they run)")
        return bool(base)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = getattr(report, REPORT_ATTR, None)
        if not isinstance(record, dict):
            return
        if report.when == "setup":
            if record.get("kernel"):
                self.marked.add(report.nodeid)
            return
        if report.when != "call":
            return
        captured = read_record(report.nodeid, record, report.longreprtext)
        if isinstance(captured, Failure):
            captured = replace(captured, duration=report.duration)
            if not report.failed:
                return
            why = self.selection.why_not(captured.nodeid, captured.marked, captured.launches,
                                         self.project, captured.error.frames)
            if why:
                self.unselected.append(Unselected(captured.nodeid, why, reached_project_kernel(
                    captured.launches, captured.error.frames, self.project)))
                return
            self.failures.append(captured)
            if self._helper is not None:
                self._helper.failed(captured)
            elif len(self.failures) == 1:
                self._warm_reruns()
        elif report.passed:
            self.passed.append(captured)
            if self._helper is not None:
                self._helper.passed(captured)

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self) -> None:
        """Between two tests (after the terminal reporter wrote the result): the heal's
        lines said since."""
        self._flush()

    @property
    def reruns(self) -> Reruns:
        """The session's runner, made on first use; it owns the warm servers."""
        if self._reruns is None:
            self._reruns = Reruns()
        return self._reruns

    def _warm_reruns(self) -> None:
        """Start the rerun server at the first failure: its imports overlap the rest of
        the test run instead of delaying the first rerun."""
        try:
            self.reruns.prestart(self.setup)
        except Exception:  # the first rerun starts the server (or a subprocess) itself
            return

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: Any, sched: Any) -> None:
        """An xdist worker died running ``crashitem`` (a segfault in a kernel): heal it.

        Returns None, so xdist and other plugins still decide what to do with the report.
        """
        marked = crashitem in self.marked
        if self.selection.may_select_crash(crashitem, marked):
            message = str(getattr(report, "longreprtext", "") or report.longrepr or "")
            self.failures.append(crash_failure(crashitem, self.settings.rootdir,
                                               message or f"{crashitem} crashed its worker",
                                               marked=marked))
        else:  # what it launched is unknown: only the marker and the globs speak
            self.unselected.append(Unselected(
                crashitem, self.selection.why_not(crashitem, marked, (), self.project)))

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        """Without xdist a crash ends the session; say how to heal crashes."""
        if is_xdist_controller(config):  # the rule that placed the capture plugin
            return []
        return [CRASH_HINT]

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: Any) -> None:
        """An xdist worker finished: keep its notes (once each)."""
        for note in getattr(node, "workeroutput", {}).get(WORKER_NOTES, ()):
            if note not in self.notes:
                self.notes.append(str(note))

    @functools.cached_property
    def green(self) -> Path | None:
        """The folder of the last-green record in pytest's cache (None without one:
        ``-p no:cacheprovider``)."""
        cache = getattr(self.config, "cache", None)
        if cache is None:
            return None
        try:
            return Path(cache.mkdir("kernelfix-green"))
        except OSError:
            return None

    def record_green(self) -> None:
        """Record the project's files as the state the selected kernel tests that passed
        passed at (the last green state a later failure is compared with)."""
        passed = [test.nodeid for test in self.passed if self.selection.selects(
            test.nodeid, test.nodeid in self.marked, test.launches, self.project)]
        if not passed or self.green is None:
            return
        try:
            GreenStore(self.green).record(self.project, passed, skip=(
                self.settings.report_dir, self.settings.cache_root))
        except Exception as error:  # a read-only cache: no record, nothing else lost
            self.notes.append(f"the last-green record was not written: {error}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self._flush()
        self._running = False
        try:
            if exitstatus != pytest.ExitCode.INTERRUPTED:
                self.record_green()
            self._heal_at_end(exitstatus)
        finally:
            try:
                if self._helper is not None:
                    with shielded(self.cancel):  # its servers and directories go whole
                        self._helper.close()
                if self._reruns is not None:
                    with shielded(self.cancel):  # the servers and their directories go whole
                        self._reruns.close()
            finally:
                self._uninstall()

    def _heal_at_end(self, exitstatus: int) -> None:
        # failures left unselected alone still get a report: it says how to select them
        if not (self.failures or self.unselected):
            return
        if exitstatus == pytest.ExitCode.INTERRUPTED:  # the report says so; nothing heals
            self.cancel.set(self.cancel.why or CTRL_C)
        try:
            self.report = self.heal()
            with shielded(self.cancel):  # the first interrupt now is noted, not raised
                self.publish()
        except KeyboardInterrupt:  # a second Ctrl-C or SIGTERM: stop writing, end the session
            self.notes.append("healing was interrupted twice: the report may be incomplete "
                              "or missing")
        except Exception as error:  # the session must never crash because of a heal
            self.report = None  # nothing was written: the summary names no report
            self.error = redact(
                f"healing stopped by an internal error: {type(error).__name__}: {error}")

    def publish(self) -> None:
        """Every output of the session, once: the report files, GitHub's step summary and
        annotations, then the other sinks (JUnit)."""
        # start-up: the reports' writers load only for a session that has one
        from pytest_kernelfix.report.publish import GitHubActions, ReportFiles, publish

        if self.report is None:
            return
        done = publish(self.report, (ReportFiles(), GitHubActions(os.environ), *self.sinks))
        self.annotations.extend(done.lines)
        self.ci_notes.extend(done.notes)

    def inputs(self) -> SessionInputs:
        """The session's failures, passes and notes, and how reruns are made."""
        return SessionInputs(
            failures=tuple(self.failures),
            passed=tuple(self.passed),
            settings=self.settings,
            setup=self.setup,
            project=self.project,
            notes=tuple(self.notes),
            unselected=tuple(self.unselected),
            changes=self.changes,
        )

    def heal(self) -> SessionReport:
        # start-up: what heals after the run loads only when something is left to heal
        from pytest_kernelfix.heal.guards import build_guard
        from pytest_kernelfix.session.pipeline import run_healing

        inputs = self.inputs()
        if self._helper is not None:
            report = self._helper.finish(inputs, self.cancel)
            if report is not None:
                return replace(report, save_prompts=self.settings.save_prompts)
            self.notes.append(f"{self._helper.error}: healing ran after the tests")
            inputs = self.inputs()
        if self.cancel.is_set():  # the test run was interrupted: nothing will be asked
            from pytest_kernelfix.fixers.hook import UnavailableFixer  # start-up, as above

            fixer: Fixer = UnavailableFixer(f"the session was interrupted ({self.cancel.why})")
        else:
            fixer = session_fixer(self.config, self.settings)
        stages = Stages(fixer=fixer,
                        guard=build_guard(inputs.project), runner=self.reruns,
                        progress=self._progress, cancel=self.cancel)
        return replace(run_healing(inputs, stages), save_prompts=self.settings.save_prompts)

    def _progress(self, line: str) -> None:
        """A progress line: written now once the tests have run (lines come one at a
        time), queued for the main thread while they run."""
        if self._running:
            self._lines.put(line)
            return
        with self._write_lock:
            self._write(line)

    def _flush(self) -> None:
        """Write the queued lines (the main thread, between test results)."""
        while True:
            try:
                line = self._lines.get_nowait()
            except queue.Empty:
                return
            with self._write_lock:
                self._write(line)

    def _write(self, line: str) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        if not self._progress_shown:
            self._progress_shown = True
            reporter.write_line("")  # end the line of progress dots, even under -q
            title = "kernelfix: healing" + (" while the tests run" if self._running else "")
            reporter.write_sep("-", title)
        elif getattr(reporter, "_width_of_current_line", 0) and not reporter.currentfspath:
            reporter.write("\n")  # after dots of -q, which leaves no path to end the line
        reporter.write_line(f"kernelfix: {line}")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        # start-up: the summary's writers load only for a session that has one to print
        from pytest_kernelfix.report.terminal import summary_lines
        from pytest_kernelfix.report.unselected import unselected_lines

        if not (self.failures or self.unselected or self.error or self.notes):
            if self.config.get_verbosity() > 0:
                terminalreporter.write_sep("-", "kernelfix: no failing kernel tests")
            return
        terminalreporter.section("kernelfix")
        if self.report is not None:
            json_path = self.settings.report_dir / "report.json"
            for line in summary_lines(self.report, json_path):
                terminalreporter.write_line(line)
        else:
            for line in unselected_lines(self.unselected, self.settings.select):
                terminalreporter.write_line(line)
            for note in self.notes:
                terminalreporter.write_line(f"note: {note}")
        if self.error:
            terminalreporter.write_line(self.error, red=True)
        for note in self.ci_notes:
            terminalreporter.write_line(f"note: {note}")
        for line in self.annotations:  # GitHub reads workflow commands from the log
            terminalreporter.write_line(line)
