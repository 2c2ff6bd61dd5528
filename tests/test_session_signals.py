"""The first SIGTERM as Ctrl-C, and writes that a first interrupt does not cut short.

The handlers are called directly, as the interpreter would on the signal: a real SIGTERM
sent to the test process would end it where no handler is installed.
"""

from __future__ import annotations

import signal
import threading

import pytest

from pytest_kernelfix.session.interrupt import (
    Cancel,
    install_sigterm,
    interrupt_name,
    shielded,
)

pytestmark = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread()
    or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL,
    reason="signal handlers are installed from the main thread, over the default only")


def test_the_first_sigterm_is_a_keyboard_interrupt_and_sets_the_cancel() -> None:
    cancel = Cancel()
    uninstall = install_sigterm(cancel)
    try:
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)
        with pytest.raises(KeyboardInterrupt) as raised:
            handler(signal.SIGTERM, None)
        assert interrupt_name(raised.value) == "SIGTERM"
        assert cancel.is_set() and cancel.why == "SIGTERM"
        with pytest.raises(KeyboardInterrupt):
            cancel.check()  # every healing thread now stops at its next step
    finally:
        uninstall()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_handler_someone_else_installed_is_left_alone() -> None:
    def theirs(signum: int, frame: object) -> None:
        return None

    signal.signal(signal.SIGTERM, theirs)
    try:
        install_sigterm(Cancel())()
        assert signal.getsignal(signal.SIGTERM) is theirs
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_a_first_interrupt_while_writing_is_noted_a_second_one_raised() -> None:
    cancel = Cancel()
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), shielded(cancel):
        held = signal.getsignal(signal.SIGINT)
        assert callable(held)
        held(signal.SIGINT, None)  # noted: the write goes on
        assert cancel.why == "Ctrl-C"
        held(signal.SIGINT, None)  # asked twice: stop now
    assert signal.getsignal(signal.SIGINT) is before
