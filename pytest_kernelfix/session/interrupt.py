"""The first Ctrl-C or SIGTERM: stop healing, keep what is finished, write the report.

CI cancellation sends SIGTERM (GitHub Actions sends SIGINT, then SIGTERM, then
SIGKILL), which by default ends Python at once: no report, the sandbox copy, the rerun
and server directories left in the temp dir. While a session heals, the first SIGTERM is
turned into ``KeyboardInterrupt`` in the main thread (:func:`install_sigterm`), as Ctrl-C
is, so pytest ends the session the way it ends an interrupted one: ``pytest_sessionfinish``
runs, ``finally`` blocks and ``atexit`` handlers remove the temporary directories. A
second SIGTERM ends the process at once, as the first would have.

Healing may run in a thread other than the one a signal lands in. The session's
:class:`Cancel` is set by whoever catches the interrupt; every healing thread checks it at
its next step (before a bug, a rerun, a fixer call) and a rerun under way is stopped, so
the bugs healed before it keep their patches. Writing the report and, in apply mode, the
healed files is :func:`shielded`: an interrupt that arrives then is noted, not raised, and
only a second one stops the writing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

#: What a SIGTERM is called in the report.
SIGTERM = "SIGTERM"
#: What a Ctrl-C is called in the report.
CTRL_C = "Ctrl-C"


class Cancel:
    """A session's stop request, shared by every thread that heals.

    ``why`` says what asked for it (``Ctrl-C``, ``SIGTERM``); ``event`` is what reruns
    watch to stop their children.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self.why = ""

    def set(self, why: str = CTRL_C) -> None:
        if not self.event.is_set():
            self.why = why
            self.event.set()

    def is_set(self) -> bool:
        return self.event.is_set()

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` in this thread once the session was interrupted."""
        if self.event.is_set():
            raise KeyboardInterrupt(self.why)


def interrupt_name(error: BaseException, default: str = CTRL_C) -> str:
    """What a ``KeyboardInterrupt`` stands for: the signal it was raised for, else Ctrl-C."""
    return str(error.args[0]) if error.args and isinstance(error.args[0], str) else default


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def install_sigterm(cancel: Cancel) -> Callable[[], None]:
    """Turn the first SIGTERM into ``KeyboardInterrupt`` (and ``cancel``); returns what
    undoes it. Nothing is installed outside the main thread or where a SIGTERM handler is
    already set (the caller's own, say a CI harness's): that one keeps its job."""
    if not _main_thread() or signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):
        return lambda: None
    fired = threading.Event()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if fired.is_set():  # the second one: what SIGTERM always does
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        fired.set()
        cancel.set(SIGTERM)
        raise KeyboardInterrupt(SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)

    def uninstall() -> None:
        if _main_thread() and signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    return uninstall


@contextlib.contextmanager
def shielded(cancel: Cancel) -> Iterator[None]:
    """Finish a write that must not stop half-way: the first Ctrl-C or SIGTERM inside is
    noted on ``cancel`` (the report says it was interrupted), a second one is raised as
    ``KeyboardInterrupt``. Outside the main thread signals never arrive: nothing to do."""
    if not _main_thread():
        yield
        return
    caught: list[str] = []
    names = {signal.SIGINT: CTRL_C, signal.SIGTERM: SIGTERM}
    previous = {number: signal.getsignal(number) for number in names}

    def restore() -> None:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)

    def hold(signum: int, frame: FrameType | None) -> None:
        caught.append(names.get(signal.Signals(signum), CTRL_C))
        cancel.set(caught[0])
        if len(caught) > 1:  # asked twice: stop now
            restore()
            raise KeyboardInterrupt(caught[-1])

    for number in names:
        signal.signal(number, hold)
    try:
        yield
    finally:
        restore()
