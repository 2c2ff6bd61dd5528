"""How the fixer of one bug is asked, and what it is shown.

:class:`Shown` builds the bug's context once for each set of failing tests the bug is
known by (those of a bug healed while the tests run grow), with the notes its heal adds
(:func:`test_own_failure`: a check that compares no tensor value), and the checks every
candidate goes through in words (:func:`checks_for`). :class:`AnnouncedFixer` says each
question and answer, with a line while a model thinks; :func:`answer_first` asks a fixer
that costs nothing before any rerun.
"""

from __future__ import annotations

import linecache
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from pytest_kernelfix.fixers.base import Fixer, FixerError, Proposal, ProposalRequest, is_free
from pytest_kernelfix.locate.context import BugContext
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.redact import redact
from pytest_kernelfix.rerun.plan import DevicePlan
from pytest_kernelfix.session.inputs import Progress
from pytest_kernelfix.session.interrupt import Cancel
from pytest_kernelfix.verify.verifier import Verifier


class Shown:
    """What the fixer is shown of one bug: its context, built once for each set of
    failing tests the bug is known by (those of a bug healed while the tests run grow),
    from the files its heal began with, with the notes its heal added."""

    def __init__(self, group: BugGroup, build: Callable[[BugGroup], BugContext],
                 latest: Callable[[], BugGroup] | None = None) -> None:
        self.group = group
        self.build = build
        self.latest = latest
        self.notes: tuple[str, ...] = ()
        self._built: tuple[tuple[str, ...], BugContext] | None = None

    def tests(self) -> BugGroup:
        """The bug with the failing tests known now, its files as when its heal began."""
        grown = self.latest() if self.latest is not None else self.group
        if grown.nodeids == self.group.nodeids:
            return self.group
        return replace(self.group, failures=grown.failures, located=grown.located)

    def rebuild(self, build: Callable[[BugGroup], BugContext]) -> None:
        """Build the context this way from now on (after the experiment on a change)."""
        self.build = build
        self._built = None

    def note(self, note: str) -> None:
        if not note:
            return
        self.notes += (note,)
        if self._built is not None:
            nodeids, context = self._built
            self._built = (nodeids, replace(context, notes=(*context.notes, note)))

    def __call__(self) -> BugContext:
        group = self.tests()
        if self._built is None or self._built[0] != group.nodeids:
            context = self.build(group)
            self._built = (group.nodeids, replace(context, notes=(*context.notes,
                                                                  *self.notes)))
        return self._built[1]


#: What every candidate that passes its rerun goes through, whatever the device.
INTEGRITY_CHECKS = (
    "The assertion helpers, torch, numpy and the names the tests imported must be the "
    "originals while the tests run (no patching, torch modes, Tensor subclasses or "
    "torch.library overrides).",
    "The failing tests are then rerun with every project kernel's output replaced (by NaN, "
    "then by scrambled values) right after each launch: they must fail, which proves that "
    "the result comes from the kernel.",
)


def checks_for(device: DevicePlan) -> tuple[str, ...]:
    """How candidates are verified, in words a prompt can pass on to the model."""
    if not device.interpret:
        return ("The failing tests and the tests that passed before are rerun on a CUDA GPU.",
                *INTEGRITY_CHECKS)
    checks = [
        "The failing tests and the tests that passed before are rerun on the Triton "
        "interpreter (TRITON_INTERPRET=1) on CPU; it cannot see GPU-only problems such as "
        "races, shared-memory limits, tl.dot shape limits or unsupported constructs."
    ]
    if device.gate:
        checks.append("Each launched kernel is then compiled for a real GPU target; "
                      "compile errors reject the fix.")
    return (*checks, *INTEGRITY_CHECKS)


def test_own_failure(verifier: Verifier) -> str:
    """A failure raised in the test's own code by a check that compared no tensor value
    (a shape, a dtype, a length): the test's expectation may be what is wrong."""
    failure = next((f for f in verifier.group.failures if f.nodeid == verifier.first), None)
    base = verifier.base
    line = verifier.sites.get(verifier.first, 0)
    if failure is None or base is None or not line or not failure.error.frames:
        return ""
    if os.path.abspath(failure.error.frames[-1].path) != failure.test_path:
        return ""  # raised in project or library code
    outcome = base.outcome(verifier.first)
    probe = outcome.probe if outcome is not None else None
    site = probe.site(line) if probe is not None else None
    if probe is None or (site is not None and site.reads):
        return ""
    path = failure.test_path
    text = failure.error.frames[-1].line or linecache.getline(path, line).strip()
    return (f"The failing check is the test's own code ({os.path.basename(path)}:{line}: "
            f"`{text}`) and compares no tensor values (a shape, a dtype, a length or a Python "
            "value): the test's expectation may be what is wrong. If the kernel and its "
            "launch code are right, answer with not_a_kernel_bug and say why.")


#: Seconds between "still waiting" lines while a fixer thinks.
HEARTBEAT = 20.0


class AnnouncedFixer:
    """A fixer whose every answer is announced, with a line every :data:`HEARTBEAT`
    seconds while it is awaited: a model can take minutes."""

    def __init__(self, fixer: Fixer, progress: Progress, cancel: Cancel | None = None) -> None:
        self.fixer = fixer
        self.progress = progress
        self.cancel = cancel if cancel is not None else Cancel()
        self.name = fixer.name
        self.free = is_free(fixer)

    def propose(self, request: ProposalRequest) -> Proposal:
        self.cancel.check()  # an interrupted session asks no more
        where = f"  round {request.round}"
        self.progress(f"{where}: asking {self.name}")
        started = time.monotonic()
        answered = threading.Event()

        def beat() -> None:
            while not answered.wait(HEARTBEAT):
                self.progress(f"{where}: still waiting for {self.name} "
                              f"({time.monotonic() - started:.0f} s)")

        heart = threading.Thread(target=beat, name="kernelfix-heartbeat", daemon=True)
        heart.start()
        try:
            proposal = self.fixer.propose(request)
        finally:
            answered.set()
            heart.join()
        seconds = time.monotonic() - started
        self.progress(f"{where}: answered from the answer cache, no call ({seconds:.1f} s)"
                      if proposal.usage.cache_hits else f"{where}: answered in {seconds:.1f} s")
        return proposal


def answer_first(fixer: Fixer, context: BugContext, files: Mapping[str, str]) -> (
    tuple[Proposal | None, str]
):
    """Round 1's answer from a fixer that costs nothing (recipes, a cassette, a hook),
    before any rerun: a bug it cannot answer ends here, with no rerun at all."""
    request = ProposalRequest(context=context, round=1, files=tuple(
        context.view(path, redact(text)) for path, text in files.items()))
    try:
        return fixer.propose(request), ""
    except Exception as error:  # the loop would end the bug the same way
        why = str(error) if isinstance(error, FixerError) else (
            f"the fixer failed: {type(error).__name__}: {error}")
        return None, f"round 1: {why}"
