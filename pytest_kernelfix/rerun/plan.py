"""The contract between a session and its rerun child: one typed, versioned plan.

The session writes the plan as JSON beside each rerun and names the file in
:data:`PLAN_ENV`; the child's agent reads it before pytest starts. Both sides build and
read it through these classes only (:func:`pytest_kernelfix.fields.read`), so a renamed
field or a changed default cannot silently turn off the interpreter, the CPU shim or the
compile gate in the child: a plan of another version, with a missing or unknown field or a
value of the wrong type, is refused with a :class:`PlanError`.

Every child is *phased*: it collects its nodeids once, says so (:class:`Ready`), then
runs what each :class:`PhaseCommand` appended to the plan's ``control`` file asks, one
phase after another, and says how each ended (:class:`PhaseEnd`)
(:mod:`pytest_kernelfix.rerun.child.phases`).

Import-light (standard library only): the child reads it before anything else.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelfix.fields import FieldError, read
from pytest_kernelfix.target import DEFAULT_CAPABILITY, capability_of, gate_enabled

#: Bumped whenever a field changes meaning; a child refuses any other version.
PLAN_VERSION = 5
#: How a sensitivity rerun replaces what each project kernel wrote, right after each
#: launch: NaN (floats) or a sentinel (integers; booleans are flipped), or the written
#: values scrambled into other finite values. "" runs the tests as they are.
POISON_MODES = ("nan", "scramble")
#: Names the plan file in a rerun child; its presence also keeps the plugin out of it.
PLAN_ENV = "KERNELFIX_RERUN_PLAN"
#: The session's wall clock (``time.time()``) when it launched a rerun child: the child
#: reports its phases as seconds since then (``RerunResult.report.phases``).
LAUNCHED_ENV = "KERNELFIX_RERUN_LAUNCHED"


class PlanError(ValueError):
    """A plan file that this version of the plugin cannot read."""


@dataclass(frozen=True)
class DevicePlan:
    """How a rerun child prepares its device before conftest files import kernels.

    ``interpret`` runs kernels on the Triton interpreter with the CPU shim; ``cuda_shim``
    maps ``device="cuda"`` to the CPU there; ``capability`` is what the shim's
    ``torch.cuda`` answers; ``gate_target`` is the GPU the compile gate builds every
    launched kernel for ("" when the gate is off); ``cache_dir`` holds the gate's cache.
    """

    interpret: bool = False
    cuda_shim: bool = True
    capability: tuple[int, int] = DEFAULT_CAPABILITY
    gate_target: str = ""
    cache_dir: str = ""

    @property
    def gate(self) -> bool:
        return bool(self.gate_target)

    @property
    def mode(self) -> str:
        return "interpret" if self.interpret else "cuda"


def device_plan(*, device: str, cuda_shim: bool, target: str, cache_dir: Path) -> DevicePlan:
    """The one place that decides what a rerun child runs on, and whether the gate runs.

    ``device`` is the resolved device (``cuda`` or ``interpret``). The gate runs only on
    the interpreter: on a GPU the real compiler already ran.
    """
    interpret = device == "interpret"
    return DevicePlan(
        interpret=interpret,
        cuda_shim=cuda_shim,
        capability=capability_of(target),
        gate_target=target.strip() if interpret and gate_enabled(target) else "",
        cache_dir=str(cache_dir),
    )


@dataclass(frozen=True)
class ProbePlan:
    """What a rerun measures besides the outcomes (all off: a plain rerun).

    ``poison`` replaces what project kernels write, right after each launch (one of
    :data:`POISON_MODES`); ``kernels`` limits that to these kernels (``relpath::name``;
    empty: every project kernel); ``reach`` guards the tests' check statements so that
    every check runs and is recorded (:mod:`pytest_kernelfix.rerun.probes.checks`);
    ``fingerprint`` records what each project launch read and wrote.
    """

    poison: str = ""
    kernels: tuple[str, ...] = ()
    reach: bool = False
    fingerprint: bool = False

    def __post_init__(self) -> None:
        if self.poison and self.poison not in POISON_MODES:
            raise PlanError(f"unknown poison mode {self.poison!r}: not one of {POISON_MODES}")

    @property
    def active(self) -> bool:
        return bool(self.poison or self.reach or self.fingerprint)


@dataclass(frozen=True)
class RerunPlan:
    """Everything the child's agent needs: roots to map imports between, where to write
    outcomes, which tests, the device, and what to probe (:class:`ProbePlan`).

    ``control`` is the commands file: the child collects ``nodeids`` with what ``probe``
    installs (reach mode guards every check, switched on per phase), then runs the phases
    appended there (:class:`PhaseCommand`), each probed as it says.
    """

    original_root: str
    sandbox_root: str
    output: str
    alias_dir: str
    nodeids: tuple[str, ...]
    device: DevicePlan = field(default_factory=DevicePlan)
    probe: ProbePlan = field(default_factory=lambda: ProbePlan())
    control: str = ""
    version: int = PLAN_VERSION

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["nodeids"] = list(self.nodeids)
        data["device"]["capability"] = list(self.device.capability)
        data["probe"]["kernels"] = list(self.probe.kernels)
        return data

    @classmethod
    def from_json(cls, data: Any) -> RerunPlan:
        """Read a plan strictly: its version first, then every field, all of them written."""
        if not isinstance(data, Mapping):
            raise PlanError("a rerun plan must be a JSON object")
        version = data.get("version")
        if version != PLAN_VERSION:
            raise PlanError(f"rerun plan version {version!r} is not {PLAN_VERSION}: the "
                            "session and its rerun child run different plugin versions")
        try:
            return read(cls, data, complete=True)
        except FieldError as error:
            raise PlanError(f"rerun plan is incomplete or malformed: {error}") from None

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json()), encoding="utf-8")


@dataclass(frozen=True)
class PhaseCommand:
    """One phase of a rerun child: run these tests, probed so, and say how it ended.

    ``slices`` are consecutive runs of the phase's tests, each run by its own process
    forked from the child (at the same time); ``stop_early`` ends a slice at its first
    failing test and, once one has, the other slices; ``timeout`` bounds the whole phase.
    Each slice writes its events to its own results file (:func:`phase_results`); the
    output of every slice goes to the child's log. ``end`` makes it the child's last
    phase: it runs in the child itself, which then ends (with no tests, it only ends).
    """

    index: int
    name: str = ""
    slices: tuple[tuple[str, ...], ...] = ()
    probe: ProbePlan = field(default_factory=ProbePlan)
    stop_early: bool = False
    timeout: float = 0.0
    end: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name,
                "slices": [list(part) for part in self.slices],
                "probe": {**asdict(self.probe), "kernels": list(self.probe.kernels)},
                "stop_early": self.stop_early, "timeout": self.timeout, "end": self.end,
                "version": PLAN_VERSION}

    @classmethod
    def from_json(cls, data: Any) -> PhaseCommand:
        if not isinstance(data, Mapping) or data.get("version") != PLAN_VERSION:
            raise PlanError("a phase command of another plugin version")
        try:
            return read(cls, data, complete=True, ignore=("version",))
        except FieldError as error:
            raise PlanError(f"phase command is malformed: {error}") from None


@dataclass(frozen=True)
class Ready:
    """A phased child's first event: the tests it collected, and whether it can fork its
    phases (``why`` not, when it cannot)."""

    nodeids: tuple[str, ...]
    fork: bool
    why: str = ""

    @classmethod
    def from_json(cls, event: Any) -> Ready:
        return read(cls, event, ignore=("event",))


@dataclass(frozen=True)
class SliceEnd:
    """How one slice of a phase ended: its exit status, and whether the phase's timeout
    (``timed_out``) or another slice's failure (``stopped``) ended it."""

    returncode: int
    timed_out: bool = False
    stopped: bool = False


@dataclass(frozen=True)
class PhaseEnd:
    """A phased child's event at the end of phase ``index``: how each slice ended, in
    order."""

    index: int
    slices: tuple[SliceEnd, ...]

    @classmethod
    def from_json(cls, event: Any) -> PhaseEnd:
        return read(cls, event, ignore=("event",))


def phase_results(output: str | Path, index: int, part: int) -> Path:
    """The results file of slice ``part`` of phase ``index`` of a phased child whose own
    results file is ``output``."""
    return Path(output).parent / f"results-{index}-{part}.jsonl"


def load_plan(environ: Mapping[str, str] = os.environ) -> RerunPlan | None:
    """The plan of this rerun child, or None outside a rerun."""
    path = environ.get(PLAN_ENV)
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise PlanError(f"rerun plan {path} cannot be read: {error}") from None
    return RerunPlan.from_json(data)
