"""The server process: warm up, then fork one child per request and watch it.

Single-threaded: one ``select`` loop accepts requests, forks, and notices each child's
end (a pidfd where Linux has one, else a short poll), so the process that forks never
runs a second thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelfix.fields import read
from pytest_kernelfix.rerun.server.fork import child_main
from pytest_kernelfix.rerun.server.warm import warm_up
from pytest_kernelfix.rerun.server.wire import (
    CONTROL_ENV,
    ROOT_ENV,
    ForkRequest,
    ForkResult,
    Started,
    exited,
    kill_group,
    send_line,
)

#: How often a child's end is polled where pidfds are not available.
POLL = 0.01


def serve() -> None:
    """The server's main (``python -c SERVER_BOOTSTRAP``): warm up, report readiness on
    the control socket, serve until the session closes it, kill what still runs."""
    control = socket.socket(fileno=int(os.environ.pop(CONTROL_ENV)))
    root = os.environ.pop(ROOT_ENV, "")
    started = time.monotonic()
    try:
        warmed = warm_up(root)
    except BaseException as error:  # said on the socket: the session runs subprocesses
        send_line(control, {"ready": False,
                            "reason": f"warm-up failed: {type(error).__name__}: {error}"})
        raise
    send_line(control, {"ready": True, "pid": os.getpid(), "modules": len(sys.modules),
                        "warm": warmed, "seconds": round(time.monotonic() - started, 3)})
    _Loop(control).run()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(0)  # no teardown of torch and friends: nothing is left to save


def fork_hazard() -> str:
    """Why forking this process now would be unsafe ("" when it is safe).

    Native threads of libraries that handle fork themselves (OpenBLAS registers
    ``pthread_atfork`` handlers) are no hazard; a Python thread, CUDA initialised by
    torch or by anything else (the driver itself is asked), or an initialised Triton
    driver is.
    """
    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:
        return f"the rerun server runs other threads ({', '.join(others)}); forking is unsafe"
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    with contextlib.suppress(Exception):
        if cuda is not None and cuda.is_initialized():
            return "CUDA is initialised in the rerun server; forking it is unsafe"
    if cuda_driver_initialised():
        return "the CUDA driver is initialised in the rerun server; forking it is unsafe"
    holder = getattr(sys.modules.get("triton.runtime.driver"), "driver", None)
    if holder is not None and getattr(holder, "_active", None) is not None:
        return "the Triton driver is initialised in the rerun server; forking it is unsafe"
    return ""


#: What ``cuDeviceGetCount`` answers before ``cuInit`` (CUDA_ERROR_NOT_INITIALIZED).
_CUDA_NOT_INITIALIZED = 3


def cuda_driver_initialised() -> bool:
    """Whether this process called ``cuInit``, asked without initialising anything.

    Importing torch may load ``libcuda`` without initialising it; only a loaded driver is
    asked (``RTLD_NOLOAD``), and ``cuDeviceGetCount`` fails with "not initialised"
    until ``cuInit`` ran.
    """
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    loaded = next((line.split()[-1] for line in maps.splitlines()
                   if "/libcuda.so" in line), "")
    if not loaded:
        return False
    import ctypes

    try:
        driver = ctypes.CDLL(loaded, mode=os.RTLD_NOLOAD | os.RTLD_NOW)
    except OSError:
        return False
    count = ctypes.c_int(0)
    return int(driver.cuDeviceGetCount(ctypes.byref(count))) != _CUDA_NOT_INITIALIZED


@dataclass
class _Child:
    pid: int
    conn: socket.socket
    deadline: float
    pidfd: int = -1


@dataclass
class _Pending:
    conn: socket.socket
    data: bytearray = field(default_factory=bytearray)


class _Loop:
    """Accepts requests, forks, watches children, answers."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.pending: dict[int, _Pending] = {}
        self.children: dict[int, _Child] = {}

    def run(self) -> None:
        try:
            while self._step():
                pass
        finally:
            for child in list(self.children.values()):
                self._finish(child, timed_out=False)

    def _step(self) -> bool:
        import select

        watched: list[Any] = [self.control, *(p.conn for p in self.pending.values())]
        watched += [c.conn for c in self.children.values()]
        watched += [c.pidfd for c in self.children.values() if c.pidfd >= 0]
        readable, _, _ = select.select(watched, [], [], self._timeout())
        for item in readable:
            if item is self.control:
                if not self._accept():
                    return False
            elif isinstance(item, socket.socket) and item.fileno() in self.pending:
                self._read(self.pending[item.fileno()])
            elif isinstance(item, socket.socket):  # the session's end closed mid-run
                self._abandoned(item)
        self._check_children()
        return True

    def _timeout(self) -> float | None:
        if not self.children:
            return None
        nearest = min(c.deadline for c in self.children.values()) - time.monotonic()
        if any(c.pidfd < 0 for c in self.children.values()):
            nearest = min(nearest, POLL)
        return max(0.0, nearest)

    def _accept(self) -> bool:
        try:
            message, fds, _, _ = socket.recv_fds(self.control, 1, 4)
        except OSError:
            return False
        if not message:
            return False  # the session closed the control socket (or died): the end
        for fd in fds:
            conn = socket.socket(fileno=fd)
            self.pending[conn.fileno()] = _Pending(conn)
        return True

    def _read(self, pending: _Pending) -> None:
        try:
            chunk = pending.conn.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            del self.pending[pending.conn.fileno()]
            pending.conn.close()
            return
        pending.data += chunk
        if b"\n" in pending.data:
            del self.pending[pending.conn.fileno()]
            self._start(pending.conn, bytes(pending.data).partition(b"\n")[0])

    def _start(self, conn: socket.socket, line: bytes) -> None:
        try:
            request = read(ForkRequest, json.loads(line))
        except ValueError as error:  # not JSON, or not a request (a FieldError)
            send_line(conn, {"event": "refused", "reason": f"bad request: {error}"})
            conn.close()
            return
        hazard = fork_hazard()
        if hazard:
            send_line(conn, {"event": "refused", "reason": hazard})
            conn.close()
            return
        ours = [self.control.fileno(), conn.fileno()]
        ours += [p.conn.fileno() for p in self.pending.values()]
        ours += [c.conn.fileno() for c in self.children.values()]
        ours += [c.pidfd for c in self.children.values() if c.pidfd >= 0]
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        pid = os.fork()
        if pid == 0:
            child_main(list(request.argv), request.cwd, dict(request.env), request.log, ours,
                       request.nice)  # never returns
        pidfd = -1
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                pidfd = os.pidfd_open(pid)
        self.children[pid] = _Child(pid, conn, time.monotonic() + request.timeout, pidfd)
        send_line(conn, {"event": "started", **asdict(Started(pid))})

    def _check_children(self) -> None:
        now = time.monotonic()
        for child in list(self.children.values()):
            if exited(child.pid):
                self._finish(child, timed_out=False)
            elif now >= child.deadline:
                self._finish(child, timed_out=True)

    def _abandoned(self, conn: socket.socket) -> None:
        """The session stopped a rerun (it shut its end for writing) or gave up on it
        (or died): end its child now, unless it has already ended by itself."""
        for child in list(self.children.values()):
            if child.conn is conn:
                self._finish(child, timed_out=False, stopped=not exited(child.pid))

    def _finish(self, child: _Child, *, timed_out: bool, stopped: bool = False) -> None:
        """Kill the child's group (all of it at the deadline or when stopped, what it
        left behind otherwise), reap it, report, forget it."""
        kill_group(child.pid)  # the leader is a zombie at most: the group id is still ours
        _, status = os.waitpid(child.pid, 0)
        self.children.pop(child.pid, None)
        if child.pidfd >= 0:
            os.close(child.pidfd)
        ended = ForkResult(os.waitstatus_to_exitcode(status), timed_out, stopped)
        send_line(child.conn, {"event": "exited", **asdict(ended)})
        child.conn.close()
