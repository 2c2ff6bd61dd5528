"""A forked rerun child: become what a fresh ``python -c`` child is, run the agent, exit.

What a fresh interpreter would not have is put right before the agent runs: its own
session and process group, fds 0-2 on ``/dev/null`` and the log, the request's working
directory, environment and ``sys.argv``, the signal dispositions of a new interpreter,
NumPy's global random state drawn anew (``random`` reseeds itself after a fork), and
none of the server's sockets. The agent's set-up then maps imports onto the sandbox as in
any child (:func:`pytest_kernelfix.rerun.child.bootstrap.main`). The child leaves like an
interpreter (threads joined, ``atexit`` handlers run, streams flushed) but through
``os._exit``: control never returns to the server's loop.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pytest_kernelfix.rerun.server.wire import PROFILE_ENV


def child_main(argv: list[str], cwd: str, env: dict[str, str], log: str,
               server_fds: Sequence[int], nice: int = 0) -> None:
    """Become a fresh rerun child (its priority lowered by ``nice``) and run the agent;
    never returns."""
    code = 1
    try:
        os.setsid()
        if nice:
            with contextlib.suppress(OSError):
                os.nice(nice)
        for fd in server_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        _reset_signals()
        _redirect(log)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = ["-c", *argv]
        _reseed()
        code = _run_agent()
    except BaseException:  # whatever happens here, the child must not return
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        _exit(code)


def _run_agent() -> int:
    from pytest_kernelfix.rerun.child.bootstrap import main

    profile = os.environ.get(PROFILE_ENV)
    profiler: Any = None
    if profile:  # where a forked rerun spends its time (benchmarks, diagnosis)
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    try:
        main(forked=True)
    except SystemExit as exit:
        return exit_code(exit.code)
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{profile}.{os.getpid()}")
    return 0


def exit_code(code: object) -> int:
    """The exit status an interpreter makes of ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _reset_signals() -> None:
    """The dispositions a new interpreter starts with."""
    for number in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        with contextlib.suppress(OSError, ValueError):
            signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


def _redirect(log: str) -> None:
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)


def _reseed() -> None:
    """NumPy's global generator is seeded from the OS at import in a fresh interpreter."""
    numpy = sys.modules.get("numpy")
    with contextlib.suppress(Exception):
        if numpy is not None:
            numpy.random.seed()


def _exit(code: int) -> None:
    """Leave like an interpreter does, without tearing down the server's modules."""
    for step in _exit_steps():
        with contextlib.suppress(BaseException):
            step()
    os._exit(code)


def _exit_steps() -> Iterator[Callable[[], Any]]:
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        yield shutdown  # non-daemon threads are joined, as at interpreter exit
    yield atexit._run_exitfuncs
    yield sys.stdout.flush
    yield sys.stderr.flush
