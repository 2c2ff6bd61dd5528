"""Which of a bug's failing tests stand for the rest: pure choices from what the test
run recorded.

A parametrized bug fails the same way across shapes and dtypes. The *first*
representative is the cheapest informative test: the one that launched the fewest
kernels (a forward test before a forward-and-backward one: every failing test has the
bug, and one kernel needs no attribution), then the fastest to run (the test run's own
call duration), then the smallest shape. A candidate
runs it first; only when it passes do the other failing tests run. The *sensitivity*
representatives are few and diverse: each next one adds the most parameter values
(dtypes, shapes, flags) not yet covered, so that the poisoned reruns see every kind of
input the bug was seen with, without repeating one kind for each of its shapes.

What a sample cannot prove is said in docs/safety.md: a bypass that only some parameter
values take (a dtype branch) is seen only when a representative has that value; the
diversity rule is there to cover each value at least once, within :data:`SENSITIVITY_TESTS`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from pytest_kernelfix.locate.grouping import BugGroup

#: Failing tests the poisoned reruns use at most, per bug (staged verification).
SENSITIVITY_TESTS = 3

_NUMBER = re.compile(r"\d+")
#: A parameter that is a size or a shape (``1024``, ``4x128``, ``(2, 8)``), not a name
#: with digits in it (``float32``, ``bf16``).
_SHAPE = re.compile(r"^[\d\s_x*,()\[\]]+$")


def parameters(nodeid: str) -> tuple[str, ...]:
    """The parameter values in a nodeid's id (``test_x[float32-128-True]``), or ()."""
    start = nodeid.find("[")
    if start < 0 or not nodeid.endswith("]"):
        return ()
    return tuple(part for part in nodeid[start + 1:-1].split("-") if part)


def size(nodeid: str) -> int:
    """A proxy for the test's input size: the sum of the numbers in its size and shape
    parameters."""
    return sum(int(number) for part in parameters(nodeid) if _SHAPE.match(part)
               for number in _NUMBER.findall(part))


def first(nodeids: Sequence[str], durations: Mapping[str, float] | None = None,
          kernels: Mapping[str, int] | None = None) -> str:
    """The failing test to run first: the fewest kernels launched, then the fastest
    recorded, then the smallest, then the first in order."""
    if not nodeids:
        raise ValueError("no failing test to choose from")
    durations = durations or {}
    kernels = kernels or {}
    order = {nodeid: index for index, nodeid in enumerate(nodeids)}
    return min(nodeids, key=lambda n: (kernels.get(n, 0), durations.get(n, 0.0), size(n),
                                       order[n]))


def representative(group: BugGroup) -> str:
    """The bug's first representative, from what the test run recorded of its failures."""
    return first(group.nodeids, {f.nodeid: f.duration for f in group.failures},
                 {f.nodeid: len({(launch.file, launch.name) for launch in f.launches})
                  for f in group.failures})


def diverse(nodeids: Sequence[str], start: str, count: int = SENSITIVITY_TESTS) -> tuple[str, ...]:
    """``start`` and up to ``count - 1`` more tests, each adding the most parameter
    values not yet covered (the smallest such test first); stops when none adds any."""
    chosen = [start]
    covered = set(parameters(start))
    rest = [n for n in nodeids if n != start]
    while rest and len(chosen) < count:
        best = max(rest, key=lambda n: (len(set(parameters(n)) - covered), -size(n)))
        if not set(parameters(best)) - covered:
            break
        chosen.append(best)
        covered |= set(parameters(best))
        rest.remove(best)
    return tuple(chosen)
