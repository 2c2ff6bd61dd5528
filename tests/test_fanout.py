"""The one fan-out helper: results in order, the first error once all stopped, stopping
early, a cancel, and a Ctrl-C in the caller's thread while the workers run."""

from __future__ import annotations

import _thread
import threading
import time

import pytest

from pytest_kernelfix.fanout import fan_out


def test_results_come_back_in_the_order_of_the_items() -> None:
    def slow_first(n: int) -> int:
        time.sleep(0.05 * (3 - n))
        return n * n

    assert fan_out(slow_first, range(4)) == [0, 1, 4, 9]
    assert fan_out(slow_first, []) == []


def test_at_most_workers_run_at_once() -> None:
    running, most = 0, 0
    lock = threading.Lock()

    def work(n: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.02)
        with lock:
            running -= 1
        return n

    assert fan_out(work, range(8), workers=2) == list(range(8))
    assert most == 2


def test_the_first_error_is_raised_once_every_thread_has_stopped() -> None:
    stop = threading.Event()
    ended: list[int] = []

    def work(n: int) -> int:
        if n == 1:
            raise ValueError("first")
        if n == 2:
            time.sleep(0.1)
            raise KeyError("later")
        stop.wait(5)  # a worker that watches stop ends early
        ended.append(n)
        return n

    started = time.monotonic()
    with pytest.raises(ValueError, match="first"):
        fan_out(work, range(3), stop=stop)
    assert stop.is_set() and ended == [0]  # raised only after the others ended
    assert time.monotonic() - started < 4


def test_an_error_starts_no_further_item() -> None:
    ran: list[int] = []

    def work(n: int) -> int:
        ran.append(n)
        if n == 0:
            raise RuntimeError("stop here")
        return n

    with pytest.raises(RuntimeError):
        fan_out(work, range(5), workers=1)
    assert ran == [0]


def test_stop_when_stops_early_and_the_items_not_started_get_none() -> None:
    stop = threading.Event()

    def work(n: int) -> int:
        if n == 3:
            stop.wait(5)
        return n

    results = fan_out(work, range(8), workers=2, stop=stop, stop_when=lambda n: n == 1)
    assert results[:2] == [0, 1] and stop.is_set()
    assert results[4:] == [None] * 4  # never started


def test_a_cancel_stops_the_work_at_once() -> None:
    cancel = threading.Event()
    stop = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    started = time.monotonic()
    results = fan_out(lambda n: stop.wait(30), range(3), stop=stop, cancel=cancel)
    assert results == [True, True, True]
    assert time.monotonic() - started < 5


def test_ticks_come_from_the_callers_thread_while_the_work_runs() -> None:
    ticks: list[threading.Thread] = []
    fan_out(lambda n: time.sleep(0.35), range(2), every=0.1,
            tick=lambda: ticks.append(threading.current_thread()))
    assert len(ticks) >= 2 and set(ticks) == {threading.current_thread()}


def test_ctrl_c_in_the_callers_thread_stops_the_workers_then_is_raised() -> None:
    stop = threading.Event()
    told: list[KeyboardInterrupt] = []
    ended: list[int] = []

    def work(n: int) -> int:
        stop.wait(30)
        ended.append(n)
        return n

    threading.Timer(0.2, _thread.interrupt_main).start()  # Ctrl-C while the caller waits
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        fan_out(work, range(3), stop=stop, on_interrupt=told.append)
    assert time.monotonic() - started < 5
    assert len(told) == 1 and stop.is_set()
    assert sorted(ended) == [0, 1, 2]  # every worker had stopped when it was raised


def test_a_keyboard_interrupt_in_a_worker_is_its_error() -> None:
    def work(n: int) -> int:
        if n == 1:
            raise KeyboardInterrupt("SIGTERM")
        return n

    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        fan_out(work, range(3))


def test_ctrl_c_is_raised_at_once_when_the_work_cannot_be_told_to_stop() -> None:
    """Work that watches nothing (a rerun through the session's runner, which the caller
    stops once it catches the interrupt) is not waited for."""
    release = threading.Event()
    threading.Timer(0.2, _thread.interrupt_main).start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            fan_out(lambda n: release.wait(30), range(2))
        assert time.monotonic() - started < 5
    finally:
        release.set()
