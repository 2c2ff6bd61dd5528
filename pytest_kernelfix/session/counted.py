"""Counted reruns: what one bug's reruns cost and how they ran, and a stop at once when
the session is interrupted."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pytest_kernelfix.rerun.launcher import RerunSetup, RerunSpec, RerunStats
from pytest_kernelfix.rerun.report import RerunResult
from pytest_kernelfix.session.inputs import Progress
from pytest_kernelfix.session.interrupt import Cancel
from pytest_kernelfix.verify.verifier import Child, Opener, Runner


class CountedRunner:
    """A runner that keeps what one bug's reruns cost and how they ran, says how far a
    long rerun is, and stops (``KeyboardInterrupt``) once the session is interrupted: a
    rerun under way is cut short, its result is of no use. The phases of the phased
    children it opens count as reruns."""

    def __init__(self, runner: Runner, progress: Progress = lambda line: None,
                 cancel: Cancel | None = None) -> None:
        self.runner = runner
        self.progress = progress
        self.cancel = cancel if cancel is not None else Cancel()
        self.stats = RerunStats()
        self.lock = threading.Lock()  # a verifier may run reruns at the same time
        self.can_open = callable(getattr(runner, "open", None)) and bool(
            getattr(runner, "can_open", True))

    def prepare(self, spec: RerunSpec) -> RerunSpec:
        """``spec`` as this runner runs it: with its progress lines and the session's
        stop request."""
        self.cancel.check()
        if spec.progress is None:
            spec = replace(spec, progress=lambda done, total, seconds: self.progress(
                f"rerun: {done} of {total} test(s) finished after {seconds:.0f} s"))
        return replace(spec, cancel=self.cancel.event)

    def add(self, result: RerunResult, started: float) -> RerunResult:
        with self.lock:  # timed here: the wall time of reruns that overlap is counted once
            self.stats = self.stats.add(result, (started, time.monotonic()))
        self.cancel.check()
        return result

    def __call__(self, spec: RerunSpec) -> RerunResult:
        spec = self.prepare(spec)
        started = time.monotonic()
        return self.add(self.runner(spec), started)

    def open(self, setup: RerunSetup, sandbox_root: Path, nodeids: Sequence[str]
             ) -> CountedChild | None:
        opener: Opener = self.runner  # type: ignore[assignment]
        child = opener.open(setup, sandbox_root, nodeids) if self.can_open else None
        return None if child is None else CountedChild(child, self)


class CountedChild:
    """A phased child whose phases are counted by the runner that opened it."""

    def __init__(self, child: Child, counted: CountedRunner) -> None:
        self.child = child
        self.counted = counted

    def run(self, spec: RerunSpec, name: str = "") -> RerunResult | None:
        spec = self.counted.prepare(spec)
        started = time.monotonic()
        result = self.child.run(spec, name)
        return None if result is None else self.counted.add(result, started)

    def close(self) -> None:
        self.child.close()
