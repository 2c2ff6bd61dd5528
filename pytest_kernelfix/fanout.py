"""Work run at the same time: the one way the package does it.

Every place that runs work in parallel (one rerun split across children, a verifier's
reruns of the same code, the culprit search's halves, a session's heal workers) calls
:func:`fan_out`: threads run ``work`` on each item while the caller's thread waits, so
the caller's thread is the one a Ctrl-C lands in. What it guarantees:

- The results come back in the order of the items; an item that never started (the
  fan-out stopped first) gets None.
- Stopping early: once a result satisfies ``stop_when``, a task raised, ``cancel`` was
  set or the caller was interrupted, ``stop`` is set. No further item starts, and work
  that watches ``stop`` (a rerun child does) ends at once.
- The first error a task raised is raised in the caller once every thread has stopped.
- A ``KeyboardInterrupt`` in the caller's thread while it waits (Ctrl-C, or SIGTERM
  turned into one) calls ``on_interrupt`` and sets ``stop``, then is raised: once the
  threads have stopped when the work can be told to (the caller gave ``stop`` or
  ``on_interrupt``), else at once (the threads are daemons; whoever catches the
  interrupt stops their work). A second one while they stop is raised at once.

Standard library only.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Longest wait of the caller's thread between two looks at ``cancel`` (and signals).
POLL = 0.1


def fan_out(
    work: Callable[[T], R],
    items: Iterable[T],
    *,
    workers: int = 0,
    stop: threading.Event | None = None,
    stop_when: Callable[[R], bool] | None = None,
    cancel: threading.Event | None = None,
    on_interrupt: Callable[[KeyboardInterrupt], None] | None = None,
    every: float = 0.0,
    tick: Callable[[], None] | None = None,
    name: str = "kernelfix-fan-out",
) -> list[R | None]:
    """``work(item)`` for every item, on up to ``workers`` threads (0: one per item).

    ``stop`` is the event set to stop early, which the work watches (a fresh one when
    not given). ``tick`` is called every ``every`` seconds from the caller's thread while
    the work runs (a progress line).
    """
    todo = list(items)
    results: list[R | None] = [None] * len(todo)
    told = stop is not None or on_interrupt is not None  # the work can be told to stop
    stop = stop if stop is not None else threading.Event()
    errors: list[BaseException] = []
    taken = iter(range(len(todo)))
    lock = threading.Lock()
    finished: queue.SimpleQueue[int] = queue.SimpleQueue()

    def next_index() -> int | None:
        with lock:
            if stop.is_set():
                return None
            return next(taken, None)

    def run(thread: int) -> None:
        try:
            while (index := next_index()) is not None:
                results[index] = result = work(todo[index])
                if stop_when is not None and stop_when(result):
                    stop.set()
        except BaseException as error:  # raised in the caller's thread once all stopped
            with lock:
                errors.append(error)
            stop.set()
        finally:
            finished.put(thread)

    count = min(workers or len(todo), len(todo))
    threads = [threading.Thread(target=run, args=(thread,), name=f"{name}-{thread}",
                                daemon=True) for thread in range(count)]
    for thread in threads:
        thread.start()
    try:
        _wait(count, finished, stop, cancel, every, tick)
    except KeyboardInterrupt as interrupt:  # stop the work, wait for it, then raise
        if on_interrupt is not None:
            on_interrupt(interrupt)
        stop.set()
        for thread in threads if told else ():
            thread.join()
        raise
    if errors:
        raise errors[0]
    return results


def _wait(count: int, finished: queue.SimpleQueue[int], stop: threading.Event,
          cancel: threading.Event | None, every: float, tick: Callable[[], None] | None
          ) -> None:
    """Until ``count`` threads finished: ``tick`` every ``every`` seconds, ``stop`` set
    once ``cancel`` is. Never blocked for longer than :data:`POLL`, so a signal caught by
    another thread is handled in this one soon."""
    next_tick = time.monotonic() + every if tick is not None and every > 0 else None
    while count:
        if cancel is not None and cancel.is_set():
            stop.set()
        timeout = POLL if next_tick is None else min(POLL, max(0.0, next_tick - time.monotonic()))
        try:
            finished.get(timeout=timeout)
            count -= 1
        except queue.Empty:  # a tick's time, or a look at the cancel event
            pass
        if next_tick is not None and tick is not None and time.monotonic() >= next_tick:
            tick()
            next_tick = time.monotonic() + every
