"""One rerun across several children: which tests each runs, and one result from theirs.

A rerun of many tests is split into consecutive slices of its nodeids (a test module's
tests mostly stay in one child, which imports only its own modules), one child per slice,
run at the same time (:func:`pytest_kernelfix.rerun.runner.run_tests`). Every child
pays for its own start: pytest's configuration, the agent, the collection and imports of
its test modules, the compile gate and its exit. For a child forked from the warm server
on the interpreter that is 0.7 to 1.7 s of a core, what six small kernel tests take; a
fresh interpreter first imports torch and triton, 15 to 20 times as long
(``benchmarks/rerun_jobs_bench.py``, docs/fast-loop.md). So a slice gets at least
:func:`min_tests_per_child` tests, and fewer tests run in one child.

:func:`merge_parts` gives the children's results back as the one result the judge reads,
as one child running every test in order would have reported it.

Pure functions: nothing here starts a process.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pytest_kernelfix.rerun.report import ChildReport, RerunResult

#: The fewest tests worth a forked child of their own: its tests must take about as long
#: as its start, or a second child costs the machine more than it saves the rerun.
#: Measured with two children on 2 busy cores against one child: 2 or 3 tests each 4 to
#: 22 % slower, 4 each from 5 % faster to 7 % slower, 6 each 10 % faster, 8 each 12 to
#: 31 % faster.
MIN_TESTS_PER_CHILD = 6
#: The same for a fresh interpreter (``--kernelfix-rerun subprocess``, or no warm
#: server): its start took 16 to 21 s against 0.2 s per small test, and 16 tests split
#: across two fresh children were 24 % slower than in one.
MIN_TESTS_PER_FRESH_CHILD = 80


def min_tests_per_child(*, fresh: bool) -> int:
    """The fewest tests a child of a split rerun gets: forked, or a ``fresh`` interpreter."""
    return MIN_TESTS_PER_FRESH_CHILD if fresh else MIN_TESTS_PER_CHILD


def split_nodeids(nodeids: Sequence[str], jobs: int,
                  per_child: int) -> tuple[tuple[str, ...], ...]:
    """Consecutive slices of ``nodeids`` (each once, in order): at most ``jobs``, each of
    at least ``per_child`` tests, sizes differing by one at most; one slice (all of
    them) when the tests are too few."""
    unique = tuple(dict.fromkeys(nodeids))
    count = max(1, min(jobs, len(unique) // max(1, per_child)))
    size, extra = divmod(len(unique), count)
    bounds = [index * size + min(index, extra) for index in range(count + 1)]
    return tuple(unique[start:end] for start, end in itertools.pairwise(bounds))


@dataclass(frozen=True)
class Part:
    """One child of a split rerun: its tests, what it reported, and whether it was
    ``stopped`` (killed because another child's test failed first, with ``stop_early``)."""

    nodeids: tuple[str, ...]
    result: RerunResult
    stopped: bool = False


def stops_early(result: RerunResult) -> bool:
    """Whether a child's result ends a ``stop_early`` rerun: a test failed (or errored),
    as ``--exitfirst`` sees it, or the child crashed or timed out."""
    return (result.timed_out or bool(result.signal)
            or any(o.outcome in ("failed", "error") for o in result.outcomes))


def merge_parts(parts: Sequence[Part], *, seconds: float, output_budget: int) -> RerunResult:
    """The children's results as one, judged as one child running the tests in order.

    Outcomes in test order (slices are consecutive, each child runs its own in order),
    the collection errors of all (each once) and their reports merged (the gate verdicts
    of all). How the rerun ended (``timed_out``, ``signal``, ``returncode``, ``running``,
    ``running_launches``, so ``crash_reason``) is said by the first child in test order
    that timed out or crashed: in one child its hang or crash would have come first. A
    stopped child says nothing of how it ended; the tests it did not finish have no
    outcome. ``seconds`` is the wall time of the whole rerun; ``mode`` is ``fork`` only
    when every child forked; ``output`` holds each child's tail, labelled, within
    ``output_budget`` characters.
    """
    if len(parts) == 1 and not parts[0].stopped:
        return replace(parts[0].result, seconds=seconds)
    results = [part.result for part in parts]
    ran = [part.result for part in parts if not part.stopped]
    ended = next((result for result in ran if result.timed_out or result.signal), None)
    return RerunResult(
        outcomes=tuple(outcome for result in results for outcome in result.outcomes),
        returncode=ended.returncode if ended else next(
            (result.returncode for result in ran if result.returncode), 0),
        timed_out=ended.timed_out if ended else False,
        signal=ended.signal if ended else "",
        output=labelled_tails(parts, output_budget),
        seconds=seconds,
        collection_errors=tuple(dict.fromkeys(
            error for result in results for error in result.collection_errors)),
        running=ended.running if ended else "",
        report=functools.reduce(ChildReport.merged, (result.report for result in results)),
        running_launches=ended.running_launches if ended else (),
        mode="fork" if all(result.mode == "fork" for result in results) else "subprocess",
        fallback=next((result.fallback for result in results if result.fallback), ""),
        report_error=next((result.report_error for result in results if result.report_error),
                          ""),
        started=sum(result.started for result in results),
    )


def labelled_tails(parts: Sequence[Part], budget: int) -> str:
    """Each child's output under a line naming it, ends kept, all within ``budget``
    characters: every child its fair share, what a short output leaves to the others."""
    labels = [_label(index, len(parts), part) for index, part in enumerate(parts)]
    texts = [part.result.output for part in parts]
    room = max(0, budget - sum(len(label) + 2 for label in labels))
    kept = fair_shares([len(text) for text in texts], room)
    return "\n".join(f"{label}\n{text[len(text) - size:]}"
                     for label, text, size in zip(labels, texts, kept, strict=True))


def fair_shares(sizes: Sequence[int], budget: int) -> list[int]:
    """How much of each size fits in ``budget``: each its equal share, and what a small
    one leaves over shared among the larger ones."""
    shares = [0] * len(sizes)
    left = budget
    order = sorted(range(len(sizes)), key=sizes.__getitem__)
    for rank, index in enumerate(order):
        shares[index] = min(sizes[index], left // (len(sizes) - rank))
        left -= shares[index]
    return shares


def _label(index: int, count: int, part: Part) -> str:
    how = part.result
    state = ("stopped: another child's test failed first" if part.stopped
             else "timed out" if how.timed_out
             else f"died with {how.signal}" if how.signal
             else f"exit status {how.returncode}")
    first = part.nodeids[0] if part.nodeids else "no test"
    return (f"=== rerun child {index + 1} of {count}: {len(part.nodeids)} test(s) from "
            f"{first}; {state} ===")
