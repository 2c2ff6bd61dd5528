"""Find the lines of a change that broke a test, by experiment: delta debugging over hunks.

The representative failing test fails on the current code (the baseline said so). Each
*trial* reverts some hunks of the change (:mod:`pytest_kernelfix.locate.change`) in a
sandbox copy and reruns that test alone, through the session's runner
(:func:`~pytest_kernelfix.rerun.runner.run_tests`), like every other rerun:

1. every hunk of the project's non-test files reverted. The test still fails: the failure
   is not a regression of this change. When the change also edited test files, one more
   trial reverts those too: if the test passes only then, the test changed, and there is
   nothing to heal in the kernel;
2. it passes: halve the hunks and revert each half (both at once in two sandboxes where
   the session's rerun jobs allow); a half that passes alone holds the culprit. A single
   culprit hunk among ``n`` takes at most 2·⌈log2 n⌉ + 1 trials;
3. when neither half passes alone, the culprit is several hunks that interact across the
   halves: each half's share is searched the same way with the other half reverted (the
   divide and conquer of Zeller's dd and of QuickXplain), trials cached, up to
   :func:`trial_cap` trials in all; at the cap, the smallest set seen passing is the
   answer, marked not minimal.

Test files are never reverted to find a culprit. The sandboxes get the current bytes
back when the search ends.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pytest_kernelfix.fanout import fan_out
from pytest_kernelfix.locate.change import (
    NOT_REGRESSION,
    REGRESSION,
    TEST_CHANGED,
    Change,
    Hunk,
    Regression,
    Trial,
)
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun.launcher import RerunSpec
from pytest_kernelfix.rerun.report import RerunResult
from pytest_kernelfix.rerun.sandbox import DEFAULT_EXCLUDES, Sandbox, SandboxError, is_excluded
from pytest_kernelfix.verify.verifier import Runner, Say, tally

#: Trials beyond the single-culprit bound that interacting hunks may take.
EXTRA_TRIALS = 8
#: Trials of one search at most, whatever the number of hunks.
MAX_TRIALS = 40
#: A trial's timeout: this many times the baseline's seconds, at least MIN_TIMEOUT (and
#: never over the session's rerun timeout). A revert that hangs is a failure.
TIMEOUT_FACTOR = 5.0
MIN_TIMEOUT = 60.0


def single_bound(hunks: int) -> int:
    """The trials a single culprit among ``hunks`` takes at most: 2·⌈log2 n⌉ + 2."""
    return 2 * math.ceil(math.log2(max(hunks, 1))) + 2


def trial_cap(hunks: int) -> int:
    """The trials one search may take: the single-culprit bound plus
    :data:`EXTRA_TRIALS` for interacting hunks, at most :data:`MAX_TRIALS`."""
    return min(single_bound(hunks) + EXTRA_TRIALS, MAX_TRIALS)


@dataclass
class _Slot:
    """A sandbox trials run in, and the files a trial left changed there."""

    sandbox: Sandbox
    dirty: set[str] = field(default_factory=set)
    own: bool = False


class CapReached(Exception):
    """The search used every trial :func:`trial_cap` allows."""


class Experiment:
    """Trials of one change on one test: which hunks' revert makes it pass."""

    def __init__(self, change: Change, test: str, sandbox: Sandbox, spec: RerunSpec, *,
                 runner: Runner, say: Say = lambda line: None, jobs: int = 1,
                 extra: Callable[[], Sandbox] | None = None, cap: int = 0,
                 total: int = 0) -> None:
        self.change = change
        self.test = test
        self.spec = spec
        self.runner = runner
        self.say = say
        self.slots = [_Slot(sandbox)]
        self.jobs = max(1, jobs)
        self.extra = extra
        self.cap = cap
        self.trials: list[Trial] = []
        #: What each (test, reverted hunks) gave.
        self.cache: dict[tuple[str, frozenset[Hunk]], bool] = {}
        self.lock = threading.Lock()
        self.total = total

    # -- running trials --------------------------------------------------------------

    def _slot(self, index: int) -> _Slot:
        while len(self.slots) <= index:
            if self.extra is None:
                return self.slots[0]
            self.slots.append(_Slot(self.extra(), own=True))
        return self.slots[index]

    def _write(self, slot: _Slot, hunks: frozenset[Hunk]) -> None:
        texts = self.change.reverted(hunks)
        for path in slot.dirty - set(texts):
            slot.sandbox.reset(path)
        for path, text in texts.items():
            if text is None:
                slot.sandbox.path(path).unlink(missing_ok=True)
            else:
                slot.sandbox.path(path).parent.mkdir(parents=True, exist_ok=True)
                slot.sandbox.write(path, text)
        slot.dirty = set(texts)

    def _run(self, slot: _Slot, hunks: frozenset[Hunk], total: int,
             tests: tuple[str, ...] = ()) -> RerunResult:
        """One trial: ``hunks`` reverted in ``slot``, ``tests`` (the test under study)
        rerun, stopping at the first that fails."""
        tests = tests or (self.test,)
        self._write(slot, hunks)
        started = time.monotonic()
        result = self.runner(replace(self.spec, sandbox_root=slot.sandbox.root,
                                     nodeids=tests))
        seconds = time.monotonic() - started
        what = (f"{len(hunks)} of {total} changed hunk(s)" if len(hunks) != 1
                else next(iter(hunks)).label)
        who = tests[0] if len(tests) == 1 else f"{len(tests)} failing tests"
        self.say(f"culprit search: {who} with {what} reverted: "
                 f"{tally(result, tests)} ({seconds:.1f} s)")
        with self.lock:
            self.trials.append(Trial(tuple(h.label for h in _ordered(hunks)),
                                     all(passes(result, test) for test in tests),
                                     round(seconds, 3), tally(result, tests), tests))
        return result

    def _passes(self, slot: _Slot, hunks: frozenset[Hunk], total: int) -> bool:
        return passes(self._run(slot, hunks, total), self.test)

    def still_failing(self, hunks: frozenset[Hunk], tests: Sequence[str]) -> str:
        """The first of ``tests`` that still fails with ``hunks`` reverted ("" when they
        all pass), in one rerun."""
        if self.cap and len(self.trials) >= self.cap:
            raise CapReached
        result = self._run(self._slot(0), hunks, self.total, tuple(tests))
        return next((test for test in tests if not passes(result, test)), "")

    def passes(self, *sets: frozenset[Hunk]) -> list[bool]:
        """Whether the test passes with each set of hunks reverted; the sets not tried
        yet run at the same time, one sandbox each, up to the rerun jobs."""
        todo = list(dict.fromkeys(s for s in sets if (self.test, s) not in self.cache))
        if len(self.trials) + len(todo) > self.cap and self.cap:
            todo = todo[:max(0, self.cap - len(self.trials))]
            if not todo:
                raise CapReached
        for start in range(0, len(todo), self.jobs):
            batch = todo[start:start + self.jobs]
            if len(batch) == 1 or self.extra is None:
                for hunks in batch:
                    self.cache[self.test, hunks] = self._passes(self._slot(0), hunks,
                                                                self.total)
                continue
            slots = [self._slot(i) for i in range(len(batch))]
            results = fan_out(lambda trial: self._passes(*trial, self.total),
                              list(zip(slots, batch, strict=True)), name="kernelfix-culprit")
            self.cache.update(((self.test, hunks), ok) for hunks, ok
                              in zip(batch, results, strict=True) if ok is not None)
        missing = [s for s in sets if (self.test, s) not in self.cache]
        if missing:
            raise CapReached
        return [self.cache[self.test, s] for s in sets]

    def close(self) -> None:
        """The current bytes back in every sandbox; the extra sandboxes removed."""
        for slot in self.slots:
            if slot.own:
                slot.sandbox.close()
                continue
            for path in slot.dirty:
                slot.sandbox.reset(path)
            slot.dirty = set()

    # -- the search ------------------------------------------------------------------

    def search(self, hunks: Iterable[Hunk], fixed: frozenset[Hunk] = frozenset()
               ) -> tuple[frozenset[Hunk], bool]:
        """A set of ``hunks`` whose revert, with ``fixed`` reverted too, makes the test
        pass (all of them do), and whether it is minimal; at the cap, the smallest set
        seen passing."""
        try:
            return self._find(frozenset(hunks), fixed), True
        except CapReached:
            passing = [found - fixed for (test, found), ok in self.cache.items()
                       if ok and test == self.test and fixed <= found]
            return min(passing, key=len, default=frozenset(hunks)), False

    def _find(self, hunks: frozenset[Hunk], fixed: frozenset[Hunk]) -> frozenset[Hunk]:
        """The fewest of ``hunks`` whose revert, with ``fixed`` reverted too, makes the
        test pass (known to pass with all of them): a half that passes alone holds them;
        when neither does, the culprits interact across the halves, and each half's share
        is found with the other's reverted."""
        if len(hunks) == 1:
            return hunks
        first, second = _halves(hunks)
        if self.jobs > 1 and self.extra is not None:
            left, right = self.passes(first | fixed, second | fixed)
        else:
            left, = self.passes(first | fixed)
            right = False if left else self.passes(second | fixed)[0]
        if left:
            return self._find(first, fixed)
        if right:
            return self._find(second, fixed)
        mine = self._find(first, fixed | second)
        return mine | self._find(second, fixed | mine)


def _ordered(hunks: frozenset[Hunk]) -> list[Hunk]:
    return sorted(hunks, key=lambda h: (h.path, h.start, h.base_start))


def _halves(hunks: frozenset[Hunk]) -> tuple[frozenset[Hunk], frozenset[Hunk]]:
    """``hunks`` in file order, cut in two (the first half the larger)."""
    ordered = _ordered(hunks)
    middle = (len(ordered) + 1) // 2
    return frozenset(ordered[:middle]), frozenset(ordered[middle:])


def passes(result: RerunResult, test: str) -> bool:
    """The test ran and passed, and the run ended cleanly."""
    return result.passed([test]) and not result.timed_out and not result.crash_reason


#: Other failing tests whose own share of the culprit is searched, at most.
MORE_TESTS = 2


def _more_tests(experiment: Experiment, everything: frozenset[Hunk],
                culprits: frozenset[Hunk], minimal: bool, explained: tuple[str, ...],
                others: Sequence[str]) -> tuple[frozenset[Hunk], bool, tuple[str, ...]]:
    """The culprit grown by what other failing tests need besides it: one rerun of
    ``others`` with the culprit reverted; the first that still fails, if it passes with
    the whole change reverted, gets its share searched with the culprit reverted."""
    rest = [other for other in others if other not in explained]
    try:
        while rest and len(explained) <= MORE_TESTS:
            failing = experiment.still_failing(culprits, rest)
            if not failing:
                return culprits, minimal, (*explained, *rest)
            experiment.test = failing
            if not experiment.passes(everything)[0]:
                break  # it fails on the base too: not this change's doing
            more, complete = experiment.search(everything - culprits, culprits)
            culprits, minimal = culprits | more, minimal and complete
            explained += (failing,)
            rest.remove(failing)
    except CapReached:
        pass
    return culprits, minimal, explained


def revertable(change: Change, exclude: Sequence[str] = ()) -> tuple[Hunk, ...]:
    """The source hunks a sandbox can revert: in files the sandbox copy holds (none that
    ``exclude`` or the sandbox's own defaults leave out)."""
    patterns = (*DEFAULT_EXCLUDES, *exclude)
    return tuple(hunk for hunk in change.source_hunks if not is_excluded(hunk.path, patterns)
                 and not any(is_excluded(part, patterns)
                             for part in Path(hunk.path).parent.parts))


def find_culprits(change: Change, test: str, sandbox: Sandbox, spec: RerunSpec, *,
                  runner: Runner, project: Project, exclude: Sequence[str] = (),
                  say: Say = lambda line: None, jobs: int = 1,
                  baseline_seconds: float = 0.0, others: Sequence[str] = ()
                  ) -> Regression | None:
    """What reverting parts of ``change`` does to ``test`` (which fails now), or None
    when the change has no hunk to revert. After a regression, ``others`` (a few more
    failing tests of the bug) are rerun with the culprit reverted: one that still fails
    and passes with the whole change reverted has its own share searched the same way,
    the culprit reverted throughout (:data:`MORE_TESTS` of them at most, within the
    cap)."""
    hunks = revertable(change, exclude)
    test_hunks = tuple(h for h in change.test_hunks if h not in hunks and not is_excluded(
        h.path, (*DEFAULT_EXCLUDES, *exclude)))
    if not hunks and not test_hunks:
        return None
    timeout = min(spec.setup.timeout, max(MIN_TIMEOUT, TIMEOUT_FACTOR * baseline_seconds))
    spec = replace(spec, nodeids=(test,), stop_early=True,
                   setup=replace(spec.setup, timeout=timeout))
    extra = None
    if jobs > 1:
        def extra() -> Sandbox:
            return Sandbox.create(project.root, exclude=exclude)

    experiment = Experiment(change, test, sandbox, spec, runner=runner, say=say,
                            jobs=min(jobs, 2), extra=extra,
                            cap=trial_cap(max(len(hunks), 1)) + (1 if test_hunks else 0),
                            total=len(hunks))
    base = change.base
    say(f"culprit search: {len(hunks)} changed hunk(s) since {base}"
        + (f", {len(test_hunks)} in test files (never reverted to find a culprit)"
           if test_hunks else ""))
    try:
        everything = frozenset(hunks)
        if hunks and experiment.passes(everything)[0]:
            culprits, minimal = experiment.search(hunks)
            explained: tuple[str, ...] = (test,)
            culprits, minimal, explained = _more_tests(experiment, everything, culprits,
                                                       minimal, explained, others)
            return Regression(base, REGRESSION, test, tuple(_ordered(culprits)),
                              tuple(experiment.trials), len(hunks), minimal, explained[1:])
        if test_hunks and experiment.passes(everything | frozenset(test_hunks))[0]:
            return Regression(base, TEST_CHANGED, test, test_hunks, tuple(experiment.trials),
                              len(hunks))
        return Regression(base, NOT_REGRESSION, test, (), tuple(experiment.trials), len(hunks))
    except (CapReached, SandboxError, OSError) as error:
        say(f"culprit search stopped: {error}")
        return None
    finally:
        experiment.close()
