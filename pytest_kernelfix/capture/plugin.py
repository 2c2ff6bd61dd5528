"""The plugin object registered wherever tests run: a plain session or an xdist worker.

It records the Triton kernels each test launches and attaches a JSON-primitive record
of the call phase to its report (xdist serialises it as is), and nothing else: it never
collects, heals or prints. Its own remarks (launches that cannot be recorded) reach the
controller directly in a plain session, and through ``workeroutput`` from a worker.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path

import pytest

from pytest_kernelfix.capture.errors import describe_exception
from pytest_kernelfix.capture.launches import KernelLaunch, LaunchRecorder
from pytest_kernelfix.capture.records import REPORT_ATTR, report_record

#: Where a worker leaves its notes for the controller (``node.workeroutput``).
WORKER_NOTES = "kernelfix_notes"

launches_key = pytest.StashKey[tuple[KernelLaunch, ...]]()


class CapturePlugin:
    """Records launches per test and puts the record on each call-phase report."""

    def __init__(self, config: pytest.Config, root: Path) -> None:
        self.config = config
        self.root = root
        self.notes: list[str] = []
        self.recorder = LaunchRecorder(root)
        try:
            self.recorder.install()
        except ImportError as error:  # no triton: heal from tracebacks alone
            self.notes.append(f"kernel launches are not recorded: {error}")

    def close(self) -> None:
        self.recorder.uninstall()

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
        if report.when == "setup":  # the controller learns the marker before a crash can hit
            setattr(report, REPORT_ATTR,
                    {"kernel": item.get_closest_marker("kernel") is not None, "phase": "setup"})
        elif report.when == "call":
            error = None
            if report.failed and call.excinfo is not None and not hasattr(report, "wasxfail"):
                error = describe_exception(call.excinfo.value)
            record = report_record(
                kernel=item.get_closest_marker("kernel") is not None,
                test_path=str(item.path),
                launches=item.stash.get(launches_key, ()),
                error=error,
                root=self.root,
            )
            setattr(report, REPORT_ATTR, record)
        return report

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None and self.notes:
            workeroutput[WORKER_NOTES] = list(self.notes)
