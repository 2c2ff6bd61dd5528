"""A warm rerun server: import pytest, torch and triton once, fork a child per rerun.

A fresh ``python -c ... pytest`` child pays for the torch and triton imports, pytest's
start-up and interpreter shutdown before a 10 ms test runs: seconds per candidate. The
server is started once per session (and environment) with the environment every rerun
child gets (:func:`pytest_kernelfix.rerun.launcher.child_env`), imports what each child would
import before its conftest files (:mod:`.warm`: pytest and its plugins, the plugin's
agent and shim modules, torch, triton, numpy) and nothing of the project, then waits.
Each rerun is a child forked from it (:mod:`.child`): it starts its own session (its pid
is its process group id), points fds 0-2 at the log, takes the request's working
directory, environment and ``sys.argv``, and runs
:func:`pytest_kernelfix.rerun.child.bootstrap.main`, exactly what a fresh child runs, then leaves
with ``os._exit`` after the ``atexit`` handlers: nothing comes back into the server.

The server (:mod:`.server`), not the session, owns each child: it waits for it without
reaping it (``WNOWAIT``), kills its process group (at the deadline, and in any case once
the child has exited, for what it left behind), then reaps it and reports the status.
The group id cannot be reused before the kill, and nobody else signals it. A crash or a
hang ends the child only; the server serves the next rerun.

Where fork is unavailable or unsafe (not Linux unless asked for, CUDA or the Triton
driver initialised in the server, another Python thread in it, a server that died or
refused), :meth:`RerunServer.run` raises :class:`ForkUnavailable` with the reason and the
caller runs a fresh subprocess (:func:`pytest_kernelfix.rerun.launcher.launch`).

This package imports only the standard library until the server warms up.
"""

from __future__ import annotations

from pytest_kernelfix.rerun.server.client import (
    LATE_ENV,
    ForkResult,
    ForkUnavailable,
    RerunServer,
    ServerPool,
    unavailable_reason,
)
from pytest_kernelfix.rerun.server.wire import PROFILE_ENV

__all__ = [
    "LATE_ENV",
    "PROFILE_ENV",
    "ForkResult",
    "ForkUnavailable",
    "RerunServer",
    "ServerPool",
    "unavailable_reason",
]
