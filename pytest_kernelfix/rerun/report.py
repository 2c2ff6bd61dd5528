"""The contract back from a rerun child: typed outcomes and one versioned child report.

The plan goes in typed (:mod:`pytest_kernelfix.rerun.plan`); this is what comes back.
The child's agent appends one JSON line per event to its results file as they happen
(a test started, a test finished, a kernel launched, a collection error, and the child's
report each time it changes), so a crash mid-run leaves what finished readable.
:func:`read_child_output` folds those lines into a :class:`ChildOutput`;
:class:`ChildReport` is strict like the plan: another version, an unknown key or a
value of the wrong type is a :class:`ReportError`, never a silently missing field. Every
event is read as strictly (:func:`pytest_kernelfix.fields.read`): one that cannot be read
is the rerun's ``report_error``, never an exception.

Import-light (the standard library and the plugin's own data types): the child imports
it before pytest collects.

PYTEST_DONT_REWRITE
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from pytest_kernelfix.capture.errors import ErrorInfo
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.fields import FieldError, read

#: Bumped whenever a field of :class:`ChildReport` changes meaning.
REPORT_VERSION = 1

Outcome = Literal["passed", "failed", "error", "skipped", "xfailed", "xpassed"]

_CRASH_SIGNALS = ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE")
_Read = TypeVar("_Read")


class ReportError(ValueError):
    """A child report that this version of the plugin cannot read."""


@dataclass(frozen=True)
class CheckSite:
    """What happened at one check site of a test: the line of the test function's own
    statement that led to the checks (:mod:`pytest_kernelfix.rerun.probes.checks`).

    ``reads`` counts the value reads made there (comparisons, conversions to Python or
    NumPy) on non-empty tensors, ``taint`` the most poison they saw (NaN runs: see
    :class:`Probe`); ``runs`` and ``failures`` count the guarded check statements run
    and failed there, ``outcomes`` says how each run ended, in order (``P``/``F``; reach
    mode only), ``taints`` the poison each run's reads saw, in the same order (``F``
    full, ``P`` partial, ``C`` clean, ``-`` no read; NaN runs in reach mode only).
    """

    line: int
    reads: int = 0
    taint: str = ""
    runs: int = 0
    failures: int = 0
    outcomes: str = ""
    taints: str = ""

    def to_json(self) -> list[Any]:
        return [self.line, self.reads, self.taint, self.runs, self.failures, self.outcomes,
                self.taints]

    @classmethod
    def from_json(cls, data: Any) -> CheckSite:
        return read(cls, data)

    def tainted(self, run: int) -> bool:
        """Run ``run`` of this check read poison (in part or whole)."""
        return run < len(self.taints) and self.taints[run] in "FP"


@dataclass(frozen=True)
class Fingerprint:
    """One launch of a project kernel: ``kernel`` (``relpath::name``), a hash of what it
    read (the bytes of the tensors it did not write, and its scalar arguments) and a
    hash of what it wrote, taken before any poison."""

    kernel: str
    inputs: str
    outputs: str


@dataclass(frozen=True)
class Probe:
    """What a probing rerun saw in one test's call phase.

    ``project_launches`` counts launches of kernels defined in the project (not in test
    files or installed packages); ``poisoned`` the buffers those launches wrote and the
    agent then poisoned; ``checks`` the value checks the test's own code made on
    non-empty tensors (comparisons, conversions to Python or NumPy); ``taint`` how much
    poison the checked tensors carried in a NaN run: "partial" when some checked tensor
    held poison in part only (values put in place after the launch), else "full" when
    some held it throughout, "clean" when none held any, "" when not measured.
    ``sites`` says the same per check site; ``reach`` whether the test's check
    statements were guarded (their failures recorded in ``sites``, not raised);
    ``fingerprints`` the project launches, in order, when asked for; ``blind`` how many
    of the ``checks`` could not tell scrambled values from right ones (NaN and infinity
    checks, and their boolean results read back).
    """

    project_launches: int = 0
    poisoned: int = 0
    checks: int = 0
    taint: str = ""
    sites: tuple[CheckSite, ...] = ()
    reach: bool = False
    fingerprints: tuple[Fingerprint, ...] = ()
    blind: int = 0

    def site(self, line: int) -> CheckSite | None:
        return next((site for site in self.sites if site.line == line), None)

    @property
    def check_failed(self) -> bool:
        """A guarded check failed (reach mode: the test would have failed there)."""
        return any(site.failures for site in self.sites)

    def to_json(self) -> dict[str, Any]:
        return {"project_launches": self.project_launches, "poisoned": self.poisoned,
                "checks": self.checks, "taint": self.taint,
                "sites": [site.to_json() for site in self.sites], "reach": self.reach,
                "fingerprints": [[f.kernel, f.inputs, f.outputs] for f in self.fingerprints],
                "blind": self.blind}

    @classmethod
    def from_json(cls, data: Any) -> Probe:
        return read(cls, data)


@dataclass(frozen=True)
class TestOutcome:
    """One test as the rerun saw it; ``error`` describes a failed call (or setup).

    ``integrity`` lists what the run-time integrity check found changed while the test
    ran (a replaced assertion helper, a foreign torch mode, ...); ``probe`` is set in a
    sensitivity rerun.
    """

    __test__ = False  # not a pytest test class

    nodeid: str
    outcome: Outcome
    phase: str
    longrepr: str = ""
    error: ErrorInfo | None = None
    launch_count: int = 0
    launches: tuple[KernelLaunch, ...] = ()
    duration: float = 0.0
    integrity: tuple[str, ...] = ()
    probe: Probe | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "nodeid": self.nodeid,
            "outcome": self.outcome,
            "phase": self.phase,
            "longrepr": self.longrepr,
            "error": None if self.error is None else self.error.to_json(),
            "launch_count": self.launch_count,
            "launches": [launch.to_json() for launch in self.launches],
            "duration": self.duration,
            "integrity": list(self.integrity),
            "probe": None if self.probe is None else self.probe.to_json(),
        }


@dataclass(frozen=True)
class GateResult:
    """The compile gate's verdict on one launch; ``error`` is empty when ok, or a note
    (starting "gate skipped") when the launch could not be compiled at all."""

    kernel: str
    file: str
    line: int
    ok: bool
    error: str
    shared: int
    seconds: float
    cached: bool

    @property
    def skipped(self) -> bool:
        return self.error.startswith("gate skipped")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> GateResult:
        return read(cls, data)


@dataclass(frozen=True)
class CompileCounts:
    """Triton compiles in a GPU rerun: loaded from the shared cache, or compiled anew."""

    hits: int = 0
    misses: int = 0


@dataclass(frozen=True)
class ImportMapping:
    """How the child pointed imports at the sandbox: the ``sys.path`` entries it moved
    and the modules whose specs it rebuilt on their sandbox twins."""

    sys_path: tuple[str, ...] = ()
    redirected: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChildReport:
    """What a rerun child says about the run besides its test outcomes.

    ``launch_recording`` is False (with ``launch_recording_error``) where the agent
    could not watch launches; ``bf16_exact`` (interpreter only, else None) whether the
    shim computes bfloat16 exactly; ``integrity_error`` why the integrity check could not
    start; ``gate`` the compile gate's verdicts (None when the gate did not run);
    ``compile_cache`` the GPU compile counts (None off the GPU); ``phases`` seconds from
    the launch to each phase of the child; ``poison_errors`` what the poisoner could not
    do; ``import_mapping`` how imports were pointed at the sandbox.
    """

    launch_recording: bool = False
    launch_recording_error: str = ""
    bf16_exact: bool | None = None
    integrity_error: str = ""
    gate: tuple[GateResult, ...] | None = None
    compile_cache: CompileCounts | None = None
    phases: Mapping[str, float] = field(default_factory=dict)
    poison_errors: tuple[str, ...] = ()
    import_mapping: ImportMapping | None = None
    version: int = REPORT_VERSION

    @property
    def gate_results(self) -> tuple[GateResult, ...]:
        return self.gate or ()

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["phases"] = dict(self.phases)
        return data

    @classmethod
    def from_json(cls, data: Any) -> ChildReport:
        """Read a report strictly: the version, every key and every type are checked."""
        if not isinstance(data, Mapping):
            raise ReportError("a rerun child's report must be a JSON object")
        version = data.get("version")
        if version != REPORT_VERSION:
            raise ReportError(f"rerun child report version {version!r} is not "
                              f"{REPORT_VERSION}: the session and its child run different "
                              "plugin versions")
        try:
            return read(cls, data)
        except FieldError as error:
            raise ReportError(f"rerun child report is malformed: {error}") from None

    def merged(self, other: ChildReport) -> ChildReport:
        """Two reruns' reports as one: the gate verdicts of both, the rest of ``other``
        where it says anything (its phases, its import mapping)."""
        gate = None if self.gate is None and other.gate is None else (
            self.gate_results + other.gate_results)
        counts = self.compile_cache
        if other.compile_cache is not None:
            counts = other.compile_cache if counts is None else CompileCounts(
                counts.hits + other.compile_cache.hits,
                counts.misses + other.compile_cache.misses)
        return replace(
            other, gate=gate, compile_cache=counts,
            integrity_error=other.integrity_error or self.integrity_error,
            bf16_exact=other.bf16_exact if other.bf16_exact is not None else self.bf16_exact,
            poison_errors=tuple(dict.fromkeys(self.poison_errors + other.poison_errors)),
        )


@dataclass(frozen=True)
class ChildOutput:
    """A results file, folded: finished tests in the order they finished, collection
    errors, the child's last report, the test that had started and not finished
    (``running``, "" when none) and the kernels it had launched by then.
    ``report_error`` says why the child's report could not be read ("" when it could)."""

    tests: tuple[TestOutcome, ...] = ()
    collection_errors: tuple[str, ...] = ()
    report: ChildReport = field(default_factory=ChildReport)
    running: str = ""
    running_launches: tuple[KernelLaunch, ...] = ()
    report_error: str = ""


def read_events(path: Path) -> list[dict[str, Any]]:
    """The results file's JSON objects, in order; a line cut short by a crash is skipped."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return _parsed(lines)


def _parsed(lines: Iterable[str]) -> list[dict[str, Any]]:
    events = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


class EventTail:
    """The events a growing results file gained since the last :meth:`new`: only whole
    lines are read, so a line being written is read next time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:  # not written yet
            return []
        whole = data[:data.rfind(b"\n") + 1]
        self._offset += len(whole)
        return _parsed(whole.decode("utf-8", errors="replace").splitlines())


class FinishedTests:
    """How many tests a growing results file says finished: each :meth:`count` reads
    only the whole lines written since the last, so a long rerun is cheap to follow."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tail = EventTail(path)
        self._finished: set[str] = set()

    def count(self) -> int:
        for event in self._tail.new():
            if event.get("event") == "test":
                self._finished.add(str(event.get("nodeid")))
        return len(self._finished)


def fold_events(events: Iterable[Mapping[str, Any]]) -> ChildOutput:
    """Fold event objects (see the module docstring) into a :class:`ChildOutput`."""
    tests: dict[str, Mapping[str, Any]] = {}
    errors: list[str] = []
    launched: dict[str, list[Any]] = {}
    report: Any = None
    running = ""
    for event in events:
        kind = event.get("event")
        if kind == "start":
            running = str(event.get("nodeid", ""))
        elif kind == "test":
            tests[str(event.get("nodeid"))] = event
            running = ""
        elif kind == "collection_error":
            errors.append(str(event.get("text", "")))
        elif kind == "report":
            report = event.get("report")
        elif kind == "launch" and isinstance(event.get("launch"), dict):
            launched.setdefault(str(event.get("nodeid", "")), []).append(event["launch"])
    child, problems = ChildReport(), []
    if report is not None:
        try:
            child = ChildReport.from_json(report)
        except ReportError as error:
            problems.append(str(error))
    outcomes = [_readable(TestOutcome, item, f"the test event of {nodeid}", problems)
                for nodeid, item in tests.items()]
    running_launches = [_readable(KernelLaunch, item, f"a launch event of {running}", problems)
                        for item in launched.get(running, [])] if running else []
    return ChildOutput(
        tests=tuple(outcome for outcome in outcomes if outcome is not None),
        collection_errors=tuple(errors),
        report=child,
        running=running,
        running_launches=tuple(launch for launch in running_launches if launch is not None),
        report_error="; ".join(problems),
    )


def _readable(cls: type[_Read], data: Mapping[str, Any], what: str, problems: list[str]
              ) -> _Read | None:
    """``data`` read as ``cls`` (an event's name aside), or None with the problem noted: a
    malformed event is the rerun's error, never an exception."""
    try:
        return read(cls, data, ignore=("event",))
    except FieldError as error:
        problems.append(f"{what} is malformed: {error}")
        return None


def read_child_output(path: Path) -> ChildOutput:
    return fold_events(read_events(path))


@dataclass(frozen=True)
class RerunResult:
    """Outcomes of one rerun, and how the child process ended.

    Paths under the sandbox are reported as the original paths, so errors, frames and
    launches compare directly with the failing run's. ``running`` is the test that had
    started but not finished when the process stopped ("" when none), and
    ``running_launches`` the kernels it had launched by then. ``report`` is what the
    child said about the run (``report_error`` why it could not be read). ``mode`` is
    how the child started (``fork`` or ``subprocess``) and ``fallback`` why it was not
    forked when forking was asked for. ``started`` counts the child processes the rerun
    started (0 for a phase of a phased child started earlier).
    """

    outcomes: tuple[TestOutcome, ...]
    returncode: int
    timed_out: bool = False
    signal: str = ""
    output: str = ""
    seconds: float = 0.0
    collection_errors: tuple[str, ...] = ()
    running: str = ""
    report: ChildReport = field(default_factory=ChildReport)
    running_launches: tuple[KernelLaunch, ...] = ()
    mode: str = "subprocess"
    fallback: str = ""
    report_error: str = ""
    started: int = 1

    def outcome(self, nodeid: str) -> TestOutcome | None:
        return next((o for o in self.outcomes if o.nodeid == nodeid), None)

    def missing(self, nodeids: Iterable[str]) -> tuple[str, ...]:
        """The given nodeids with no outcome: never collected, or the process died first."""
        reported = {o.nodeid for o in self.outcomes}
        return tuple(nodeid for nodeid in nodeids if nodeid not in reported)

    def passed(self, nodeids: Iterable[str]) -> bool:
        """All given tests ran and passed (an empty selection is not a pass).

        Per test: a process that crashed after a test passed still reports it as passed,
        so a verdict must look at ``timed_out`` and ``crash_reason`` too (memory
        corrupted by an unmasked store often only aborts the interpreter later).
        """
        wanted = list(nodeids)
        return bool(wanted) and all(
            (o := self.outcome(n)) is not None and o.outcome == "passed" for n in wanted
        )

    @property
    def compile_cache(self) -> tuple[int, int]:
        """(hits, lookups) of the compile caches this rerun used.

        On a GPU, every kernel Triton compiled or loaded from the shared cache directory;
        on the interpreter, every launch the compile gate judged (its verdicts are cached
        by kernel source).
        """
        counts = self.report.compile_cache
        if counts is not None:
            return counts.hits, counts.hits + counts.misses
        judged = [gate for gate in self.report.gate_results if not gate.skipped]
        return sum(1 for gate in judged if gate.cached), len(judged)

    @property
    def crash_reason(self) -> str:
        """A sentence for a process killed by a signal (not our timeout), else ""."""
        if self.timed_out or not self.signal:
            return ""
        where = f" while running {self.running}" if self.running else ""
        if self.signal in ("SIGABRT", "SIGSEGV", "SIGBUS"):
            hint = (
                " Under the Triton interpreter this usually means an out-of-bounds memory "
                "access from an unmasked tl.load/tl.store: mask every load and store "
                "(mask=offs < n)."
            )
        else:
            hint = " The process was killed from outside or by the system (out of memory?)."
        return f"The test process died with {self.signal} (exit {self.returncode}){where}.{hint}"


def merge_results(first: RerunResult, second: RerunResult) -> RerunResult:
    """Two reruns as one result to judge: the outcomes of both in order, the gate
    verdicts of both, how the second ended."""
    return replace(second, outcomes=first.outcomes + second.outcomes,
                   output=second.output or first.output, seconds=first.seconds + second.seconds,
                   report=first.report.merged(second.report),
                   report_error=second.report_error or first.report_error,
                   started=first.started + second.started)


def signal_name(returncode: int) -> str:
    """The signal that ended a process: -N from Popen, or 128+N (a crash signal) from a
    shell in between."""
    if returncode < 0:
        return _signal_name(-returncode)
    if returncode > 128 and _signal_name(returncode - 128) in _CRASH_SIGNALS:
        return _signal_name(returncode - 128)
    return ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
