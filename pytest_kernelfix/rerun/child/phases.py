"""The runtest loop of every rerun child: collect once, run each phase asked for.

A candidate's verification runs in phases (the representative, the other failing tests
and the regression set, the poisoned runs), each only when the ones before it passed. A
child per phase pays pytest's start, the conftest files and the sandbox's imports every
time: most of a second for tests that take milliseconds. So a rerun child collects once:
pytest collects every test the plan names, then this loop waits for the session to append
a :class:`~pytest_kernelfix.rerun.plan.PhaseCommand` to the plan's control file and runs
it. A one-shot rerun is a child whose one phase is its last (``end``).

**Every phase starts from the state right after collection.** A phase with more to come
does not run in this process: each slice of it runs in a process forked from it, which
writes its events to its own results file and exits, so nothing a test leaves behind
(module globals, caches, torch's settings, environment variables, a candidate that
counts its calls, fixtures of any scope) reaches the next phase: each starts as a fresh
child would after collecting the same tests. Slices of one phase run at the same time;
with ``stop_early`` the first that fails stops the others. The loop enforces the
phase's timeout (the slices still running are killed) and a slice that crashes ends
alone, so the next phase still runs. The last phase runs in this process: nothing comes
after it.

Where forking this process is unsafe (CUDA or a GPU driver initialised at collection,
another Python thread running), the loop runs the first phase itself and ends: the
session runs the next phases in children of their own
(:mod:`pytest_kernelfix.rerun.phased`).

PYTEST_DONT_REWRITE: imported by the rerun agent before pytest collects.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest

from pytest_kernelfix.rerun.plan import PhaseCommand, PlanError, ProbePlan, RerunPlan, phase_results
from pytest_kernelfix.rerun.server.server import cuda_driver_initialised, fork_hazard

#: Longest pause between two looks at the control file while the child waits.
IDLE_POLL = 0.02
#: Pause between two looks at the slices of a running phase.
SLICE_POLL = 0.005


def phase_hazard(interpret: bool) -> str:
    """Why forking this collected child would be unsafe ("" when it is safe): the rerun
    server's own check; on the interpreter, where the CPU shim answers ``torch.cuda``
    and installs a Triton driver of its own (no device behind either), only another
    Python thread or a real CUDA driver that was initialised count."""

    if not interpret:
        return fork_hazard()
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:
        return f"the rerun child runs other threads ({', '.join(others)}); forking is unsafe"
    if cuda_driver_initialised():
        return "the CUDA driver is initialised in the rerun child; forking it is unsafe"
    return ""


class Agent(Protocol):
    """What the loop needs of the child's agent
    (:class:`~pytest_kernelfix.rerun.child.agent.RerunAgent`)."""

    plan: RerunPlan
    last_outcome: str

    def use_phase(self, probe: ProbePlan, output: Path) -> None: ...

    def finish_phase(self) -> None: ...


class PhaseServer:
    """The loop (a pytest plugin of the rerun child, beside its agent). Its own events
    (``ready``, ``phase_end``) go to the child's results file, whatever file the agent
    writes a phase's events to."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.plan = agent.plan
        self.frozen = False

    def emit(self, event: str, **data: Any) -> None:
        line = json.dumps({"event": event, **data}) + "\n"
        fd = os.open(self.plan.output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool:
        items: dict[str, pytest.Item] = {}
        for item in session.items:
            items.setdefault(item.nodeid, item)
        hazard = phase_hazard(self.plan.device.interpret)
        self.emit("ready", nodeids=list(items), fork=not hazard, why=hazard)
        for command in self._commands(os.getppid()):
            if command.slices and (command.end or hazard):  # no phase after it here
                self._inline(session, items, command)
            elif command.slices:
                self._forked(session, items, command)
            if command.end or hazard:  # with a hazard, the next phases run elsewhere
                break
        return True

    def _commands(self, parent: int) -> Iterator[PhaseCommand]:
        """Commands as the session appends them; ends when this child is orphaned."""
        path = self.plan.control
        offset = 0
        delay = 0.001
        while True:
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    data = handle.read()
            except OSError:
                data = b""
            whole = data[:data.rfind(b"\n") + 1]
            offset += len(whole)
            for line in whole.decode("utf-8", "replace").splitlines():
                try:
                    yield PhaseCommand.from_json(json.loads(line))
                except (ValueError, PlanError):
                    continue
                delay = 0.001
            if os.getppid() != parent:
                return
            time.sleep(delay)
            delay = min(delay * 2, IDLE_POLL)

    # -- running a phase ------------------------------------------------------------------

    def _inline(self, session: pytest.Session, items: Mapping[str, pytest.Item],
                command: PhaseCommand) -> None:
        nodeids = tuple(n for part in command.slices for n in part)
        code = self._slice(session, items, nodeids, command, 0)
        self.emit("phase_end", index=command.index, slices=[
            {"returncode": code, "timed_out": False, "stopped": False}])

    def _forked(self, session: pytest.Session, items: Mapping[str, pytest.Item],
                command: PhaseCommand) -> None:
        """Each slice in a process forked from this one; wait for them, within the
        phase's timeout; say how each ended."""
        if not self.frozen:
            gc.collect()
            gc.freeze()  # the forks' collections skip what collection made: fewer copies
            self.frozen = True
        running: dict[int, int] = {}
        ended: dict[int, dict[str, Any]] = {}
        for part, nodeids in enumerate(command.slices):
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = self._slice(session, items, nodeids, command, part)
                except BaseException:
                    with contextlib.suppress(BaseException):
                        traceback.print_exc()
                finally:
                    _exit(code)
            running[pid] = part
        deadline = time.monotonic() + command.timeout if command.timeout > 0 else None
        while running:
            for pid, part in list(running.items()):
                done, status = os.waitpid(pid, os.WNOHANG)
                if not done:
                    continue
                del running[pid]
                code = os.waitstatus_to_exitcode(status)
                ended[part] = {"returncode": code, "timed_out": False, "stopped": False}
                if command.stop_early and code != 0:  # a test failed, or the slice died
                    for other, which in list(running.items()):
                        ended[which] = {**_kill(other), "stopped": True}
                        del running[other]
            if running and deadline is not None and time.monotonic() >= deadline:
                for other, which in list(running.items()):
                    ended[which] = {**_kill(other), "timed_out": True}
                    del running[other]
            if running:
                time.sleep(SLICE_POLL)
        self.emit("phase_end", index=command.index,
                  slices=[ended[part] for part in range(len(command.slices))])

    def _slice(self, session: pytest.Session, items: Mapping[str, pytest.Item],
               nodeids: Sequence[str], command: PhaseCommand, part: int) -> int:
        """Run these tests as the phase asks (in the process that runs the slice): 0 when
        every one passed, 1 when one failed (with ``stop_early``, the last one run)."""
        self.agent.use_phase(command.probe, phase_results(self.plan.output, command.index,
                                                          part))
        chosen = [items[n] for n in nodeids if n in items]
        failed = False
        for index, item in enumerate(chosen):
            following = chosen[index + 1] if index + 1 < len(chosen) else None
            item.config.hook.pytest_runtest_protocol(item=item, nextitem=following)
            if self.agent.last_outcome in ("failed", "error"):
                failed = True
                if command.stop_early:
                    break
            if session.shouldstop or session.shouldfail:
                break
        session._setupstate.teardown_exact(None)  # what pytest's sessionfinish does
        self.agent.finish_phase()
        return int(failed)


def _kill(pid: int) -> dict[str, Any]:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return {"returncode": os.waitstatus_to_exitcode(status), "timed_out": False,
            "stopped": False}


def _exit(code: int) -> None:
    """Leave the slice's process like an interpreter (threads joined, streams flushed),
    through ``os._exit``: nothing returns into the collected child's loop. The
    ``atexit`` handlers are the collected child's, run once when it ends."""
    with contextlib.suppress(BaseException):
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)
