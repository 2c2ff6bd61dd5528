"""What the session and its rerun server share: names, lines on a socket, group kills.

The session holds one end of a stream socketpair (the control socket); each rerun makes
a new socketpair and passes one end to the server over the control socket
(``SCM_RIGHTS``), then writes the request (:class:`ForkRequest`) as one JSON line on its
own end and reads the server's ``started`` (:class:`Started`) and ``exited`` lines, each
read strictly (:func:`pytest_kernelfix.fields.read`). Nothing is reachable from outside
the two processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: What the server process runs (``python -c``, like the rerun child it stands in for).
SERVER_BOOTSTRAP = "from pytest_kernelfix.rerun.server.server import serve; serve()"
#: Names the control socket's file descriptor in the server's environment.
CONTROL_ENV = "KERNELFIX_RERUN_SERVER_FD"
#: The project root the server must import nothing from.
ROOT_ENV = "KERNELFIX_RERUN_SERVER_ROOT"
#: A path prefix: each forked child writes its cProfile statistics to ``PREFIX.<pid>``.
PROFILE_ENV = "KERNELFIX_RERUN_PROFILE"


@dataclass(frozen=True)
class ForkRequest:
    """One rerun child the session asks the server for: its ``sys.argv[1:]``, where it
    runs, its environment and log, its time limit and how much lower its priority is."""

    argv: tuple[str, ...]
    cwd: str
    log: str
    timeout: float
    env: Mapping[str, str] = field(default_factory=dict)
    nice: int = 0


@dataclass(frozen=True)
class ForkResult:
    """How a rerun child ended: ``returncode`` as ``Popen`` gives it (``-N`` for signal N);
    ``stopped`` when it was killed because its caller asked (not at its timeout)."""

    returncode: int
    timed_out: bool
    stopped: bool = False


@dataclass(frozen=True)
class Started:
    """The server forked the child: its process id, which is its process group's too."""

    pid: int


def send_line(sock: socket.socket, data: Mapping[str, Any]) -> bool:
    """Write one JSON line; False when the other end is gone."""
    try:
        sock.sendall(json.dumps(data).encode() + b"\n")
    except OSError:
        return False
    return True


def read_line(sock: socket.socket, deadline: float) -> str:
    """One line from ``sock``, read byte by byte so that nothing after it is consumed;
    "" at EOF or at the deadline (``time.monotonic()``)."""
    data = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return ""
        ready, _, _ = select.select([sock], [], [], remaining)
        if not ready:
            return ""
        try:
            byte = sock.recv(1)
        except OSError:
            return ""
        if not byte:
            return ""
        if byte == b"\n":
            return data.decode("utf-8", "replace")
        data += byte


def read_event(sock: socket.socket, deadline: float) -> dict[str, Any]:
    """One JSON object line; {} at EOF, at the deadline or for anything else."""
    line = read_line(sock, deadline)
    try:
        event = json.loads(line) if line else {}
    except ValueError:
        event = {}
    return event if isinstance(event, dict) else {}


def kill_group(pgid: int) -> None:
    """SIGKILL a process group; nothing when it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def exited(pid: int) -> bool:
    """Whether our child ``pid`` has ended, without reaping it (its group id stays
    reserved for :func:`kill_group`)."""
    try:
        state = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return state is not None
