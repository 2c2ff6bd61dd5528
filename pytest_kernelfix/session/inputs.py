"""What a healing session is given: the failures and passes the test run left, how
reruns are made (:class:`SessionInputs`), and the parts a caller may swap
(:class:`Stages`: the fixer, the guard, the rerun runner, the progress lines, the stop
request), so that a whole session runs in a unit test with a fake runner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_kernelfix.capture.records import Failure, PassedTest, Unselected
from pytest_kernelfix.config import Settings
from pytest_kernelfix.locate.base import Changes
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun.launcher import RerunSetup
from pytest_kernelfix.rerun.runner import run_tests
from pytest_kernelfix.session.interrupt import Cancel

if TYPE_CHECKING:  # the controller builds these at start-up, before anything heals
    from pytest_kernelfix.fixers.base import Fixer
    from pytest_kernelfix.heal.outcomes import Guard
    from pytest_kernelfix.verify.verifier import Runner

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SessionInputs:
    """What the test run left for healing, and how reruns must be made.

    ``notes`` are the session's own remarks, written into ``report.json`` and
    ``report.md`` as well as shown on the terminal. ``changes``: the change since the
    base each failing test is compared with (:mod:`pytest_kernelfix.locate.base`), read
    once when the session started.
    """

    failures: tuple[Failure, ...]
    passed: tuple[PassedTest, ...]
    settings: Settings
    setup: RerunSetup
    project: Project
    notes: tuple[str, ...] = field(default_factory=tuple)
    unselected: tuple[Unselected, ...] = ()
    changes: Changes = field(default_factory=Changes)

    @property
    def device(self) -> str:
        """The resolved device, ``cuda`` or ``interpret`` (decided once, in the setup)."""
        return self.setup.device.mode


@dataclass(frozen=True)
class Stages:
    """The parts of a session a caller chooses: who proposes, what is refused statically,
    how tests are rerun, where progress lines go, and the stop request a Ctrl-C or
    SIGTERM sets (:class:`~pytest_kernelfix.session.interrupt.Cancel`): every healing
    thread stops at its next step, and the report keeps what was finished."""

    fixer: Fixer
    guard: Guard | None = None
    runner: Runner = run_tests
    progress: Progress = lambda line: None
    cancel: Cancel = field(default_factory=Cancel)


def sandbox_exclude(settings: Settings, project: Project) -> list[str]:
    """What a sandbox copy leaves out: the configured globs, the report and cache dirs."""
    exclude = list(settings.sandbox_exclude)
    for folder in (settings.report_dir, settings.cache_root):
        if folder.is_relative_to(project.root):
            exclude.append(folder.relative_to(project.root).as_posix())
    return exclude
