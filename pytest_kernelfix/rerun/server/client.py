"""The session's side: start a server per environment, ask it for forked reruns."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pytest_kernelfix.fields import FieldError, read
from pytest_kernelfix.rerun.plan import LAUNCHED_ENV, PLAN_ENV
from pytest_kernelfix.rerun.server.wire import (
    CONTROL_ENV,
    ROOT_ENV,
    SERVER_BOOTSTRAP,
    ForkRequest,
    ForkResult,
    Started,
    kill_group,
    read_event,
)

#: Variables a child may have other values of than its server, because they are read
#: after the server's imports: the plan file and launch time by the agent, the GPU list
#: by the GPU driver when it initialises (which the server never does).
LATE_ENV = frozenset({PLAN_ENV, LAUNCHED_ENV, "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"})

#: Seconds to wait for a server's imports before giving up on it.
START_TIMEOUT = 180.0
#: Seconds beyond a rerun's own timeout before the session stops waiting for the server.
GRACE = 30.0
#: Seconds a server that closed its socket gets to finish exiting before it is described.
SETTLE = 2.0
#: Servers kept per process (one per distinct environment); the least recent is closed.
MAX_SERVERS = 4
#: A server that failed this many times is not started again in this process.
MAX_STARTS = 3
#: Seconds between two looks at a rerun's stop request while its child runs.
STOP_POLL = 0.05


class ForkUnavailable(Exception):
    """No forked rerun this time; the message says why (for the report)."""


def unavailable_reason(mode: str) -> str:
    """Why reruns do not fork in ``mode`` on this machine ("" when they try)."""
    if mode == "subprocess":
        return "--kernelfix-rerun subprocess"
    if not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
        return f"fork is not available on {sys.platform}"
    if mode == "auto" and not sys.platform.startswith("linux"):
        return (f"reruns fork on Linux only unless --kernelfix-rerun fork asks for it "
                f"(this is {sys.platform})")
    return ""


def server_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment a server starts with for children with environment ``env``."""
    return {key: value for key, value in env.items() if key not in LATE_ENV}


class RerunServer:
    """One server process and the session's end of its control socket; safe to use
    from several threads (one forked child per :meth:`run`)."""

    def __init__(self, python: str, env: Mapping[str, str], original_root: Path) -> None:
        self.python = python
        self.work = Path(tempfile.mkdtemp(prefix="kernelfix-server-"))
        self.log = self.work / "server.log"
        self.failure = ""
        self._send_lock = threading.Lock()
        self._ready_lock = threading.Lock()
        self._ready = False
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.control = ours
        started_env = server_env(env)
        started_env[CONTROL_ENV] = str(theirs.fileno())
        started_env[ROOT_ENV] = str(original_root)
        try:
            with open(self.log, "wb") as sink:
                self.process = subprocess.Popen(
                    [python, "-c", SERVER_BOOTSTRAP],
                    cwd=self.work,
                    env=started_env,
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,
                )
        except BaseException:  # OSError, or an interrupt: no directory left behind
            ours.close()
            shutil.rmtree(self.work, ignore_errors=True)
            raise
        finally:
            theirs.close()

    @property
    def alive(self) -> bool:
        return not self.failure and self.process.poll() is None

    def ready(self) -> None:
        """Wait for the server's imports (its readiness line); raises
        :class:`ForkUnavailable` when it never became ready."""
        with self._ready_lock:
            if self._ready:
                return
            if self.failure:
                raise ForkUnavailable(self.failure)
            info = read_event(self.control, time.monotonic() + START_TIMEOUT)
            if not info.get("ready"):
                why = info.get("reason") or self.state("during start-up")
                self._fail(f"the rerun server could not start: {why}")
                raise ForkUnavailable(self.failure)
            self._ready = True

    def run(self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], log: Path,
            timeout: float, stop: threading.Event | None = None, nice: int = 0) -> ForkResult:
        """Run one forked rerun child (``sys.argv[1:]`` = ``argv``, its priority lowered
        by ``nice``) to its end, or until ``stop`` is set (the server then kills its
        group); raises :class:`ForkUnavailable` when none was started."""
        self.ready()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            try:
                with self._send_lock:
                    socket.send_fds(self.control, [b"R"], [theirs.fileno()])
            except OSError as error:
                self._fail(f"the rerun server is gone: {error}")
                raise ForkUnavailable(self.failure) from None
            finally:
                theirs.close()
            request = ForkRequest(tuple(argv), str(cwd), str(log), timeout, dict(env), nice)
            mine.sendall(json.dumps(asdict(request)).encode() + b"\n")
            deadline = time.monotonic() + timeout + GRACE
            started = read_event(mine, deadline)
            if started.get("event") == "refused":
                raise ForkUnavailable(str(started.get("reason")))
            if started.get("event") != "started":
                self._fail(f"the rerun server stopped answering: {self.state('')}")
                raise ForkUnavailable(self.failure)
            try:
                pid = read(Started, started, ignore=("event",)).pid
            except FieldError as error:
                self._fail(f"the rerun server's started line is malformed: {error}")
                raise ForkUnavailable(self.failure) from None
            exited = _exit_event(mine, deadline, stop)
            try:
                if exited.get("event") == "exited":
                    return read(ForkResult, exited, ignore=("event",))
                why = f"the rerun server stopped during a rerun: {self.state('')}"
            except FieldError as error:
                why = f"the rerun server's exited line is malformed: {error}"
            # The server died, or hangs past the deadline, or speaks garbage, with our
            # child running: the child is ours to end now (its zombie keeps the group id
            # until init reaps).
            hung = time.monotonic() >= deadline
            kill_group(pid)
            self._fail(why)
            return ForkResult(-signal.SIGKILL, hung)
        finally:
            mine.close()

    def close(self, timeout: float = 10.0) -> None:
        """End the server (it kills what still runs) and remove its directory."""
        with contextlib.suppress(OSError):
            self.control.shutdown(socket.SHUT_RDWR)
        self.control.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_group(self.process.pid)
            self.process.wait()
        shutil.rmtree(self.work, ignore_errors=True)

    def state(self, when: str) -> str:
        """How the server process stands, with the end of its log. A server that closed
        its socket may still be exiting, so it gets a moment to finish before we look."""
        try:
            code: int | None = self.process.wait(SETTLE)
        except subprocess.TimeoutExpired:
            code = None
        tail = _tail(self.log)
        state = f"exited with status {code}" if code is not None else "still running"
        return f"{state}{(' ' + when) if when else ''}{': ' + tail if tail else ''}"

    def _fail(self, why: str) -> None:
        self.failure = self.failure or why


def _exit_event(sock: socket.socket, deadline: float, stop: threading.Event | None
                ) -> dict[str, Any]:
    """The server's ``exited`` line. Once ``stop`` is set, our end is shut for writing,
    which the server takes as "end this child now" (it answers ``stopped``)."""
    if stop is not None:
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or select.select([sock], [], [], min(STOP_POLL, remaining))[0]:
                break
        if stop.is_set():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
    return read_event(sock, deadline)


def _tail(path: Path, size: int = 1500) -> str:
    try:
        text = path.read_bytes()[-size:].decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-6:])


# -- the servers of one owner -------------------------------------------------------------


class ServerPool:
    """The rerun servers one owner (a session, a test) started, one per interpreter,
    environment and project, and closed together by :meth:`close`.

    A pool left open is closed when the process exits, but an owner closes its own: a
    server is a process and a temporary directory.
    """

    def __init__(self) -> None:
        self._servers: dict[tuple[Any, ...], RerunServer] = {}
        self._starts: dict[tuple[Any, ...], int] = {}
        self._failures: dict[tuple[Any, ...], str] = {}
        self._lock = threading.Lock()
        _open_pools.add(self)

    def server_for(self, python: str, env: Mapping[str, str], original_root: Path
                   ) -> RerunServer:
        """The running server for this interpreter, environment and project, started on
        first use (and again after it died, a few times). Raises :class:`ForkUnavailable`
        when none can be had."""
        key = (python, str(original_root), tuple(sorted(server_env(env).items())))
        with self._lock:
            server = self._servers.get(key)
            if server is not None and server.alive:
                self._servers[key] = self._servers.pop(key)  # most recently used last
                return server
            if server is not None:
                self._failures[key] = server.failure or server.state("")
                del self._servers[key]
                server.close()
            if self._starts.get(key, 0) >= MAX_STARTS:
                raise ForkUnavailable(f"the rerun server failed {MAX_STARTS} times; last: "
                                      f"{self._failures.get(key, 'unknown')}")
            while len(self._servers) >= MAX_SERVERS:
                self._servers.pop(next(iter(self._servers))).close()
            self._starts[key] = self._starts.get(key, 0) + 1
            try:
                server = RerunServer(python, env, original_root)
            except OSError as error:
                raise ForkUnavailable(
                    f"the rerun server could not be started: {error}") from None
            self._servers[key] = server
            return server

    @property
    def servers(self) -> tuple[RerunServer, ...]:
        with self._lock:
            return tuple(self._servers.values())

    def close(self) -> None:
        """End every server of this pool."""
        with self._lock:
            servers = list(self._servers.values())
            self._servers.clear()
            self._starts.clear()
            self._failures.clear()
        _open_pools.discard(self)
        for server in servers:
            server.close()


_open_pools: weakref.WeakSet[ServerPool] = weakref.WeakSet()


@atexit.register
def _close_open_pools() -> None:
    """The safety net: no server outlives the process that started it."""
    for pool in list(_open_pools):
        pool.close()
