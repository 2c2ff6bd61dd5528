"""Rerun a few nodeids in a sandbox, in a child process, and read back what happened.

A candidate kernel can hang, abort or segfault the interpreter (an unmasked
``tl.load`` corrupts the heap), so tests run in a child process in its own process
group, under a timeout, and the child's agent (:mod:`pytest_kernelfix.rerun.child.agent`)
writes each finished test to a JSON file as it goes: what finished before a crash is
still known. Everything the suite's configuration would add that breaks a rerun of a
few nodeids (xdist, ``-x``, coverage, report files, ``-k``/``-m``) is left out.

:func:`run_tests` is the one entry point. The child is forked from a warm rerun server
(:mod:`pytest_kernelfix.rerun.server`) where it can be (``RerunSetup.mode``: ``auto``,
``fork``), else it is a fresh ``python -c`` subprocess; the result says which.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pytest_kernelfix.capture.errors import ErrorInfo
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.rerun import server as rerun_server
from pytest_kernelfix.rerun.plan import LAUNCHED_ENV, PLAN_ENV, DevicePlan, RerunPlan
from pytest_kernelfix.rerun.server.wire import exited, kill_group

#: How much of the child's merged stdout/stderr a result keeps.
OUTPUT_TAIL = 8 * 1024

#: Run by ``python -c``: the agent maps imports onto the sandbox, then starts pytest.
BOOTSTRAP = "from pytest_kernelfix.rerun.child.agent import main; main()"

Outcome = Literal["passed", "failed", "error", "skipped", "xfailed", "xpassed"]


@dataclass(frozen=True)
class RerunSetup:
    """What every rerun of one session shares: the suite's configuration and the device.

    ``addopts`` are the suite's ini ``addopts`` (they replace the ini value in the child,
    after :func:`filter_addopts`); ``extra_args`` are the session's own options a rerun
    keeps (plugins, import mode); ``device`` goes to the child's agent in the plan;
    ``env`` is added to the child's environment; ``mode`` is how children start: forked
    from the warm server where it is safe (``auto``), forked wherever fork exists
    (``fork``), or a fresh interpreter each time (``subprocess``).
    """

    original_root: Path
    timeout: float
    device: DevicePlan = field(default_factory=DevicePlan)
    addopts: tuple[str, ...] = ()
    inifile: Path | None = None
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    mode: str = "auto"


@dataclass(frozen=True)
class RerunSpec:
    """One rerun: these tests, in this sandbox copy, the session's way.

    ``poison`` makes it a sensitivity rerun: every project kernel's output is replaced
    right after each launch (one of :data:`~pytest_kernelfix.rerun.plan.POISON_MODES`).
    ``stop_early`` ends the run at the first test that fails (``--exitfirst``): the
    tests after it get no outcome.
    """

    setup: RerunSetup
    sandbox_root: Path
    nodeids: tuple[str, ...]
    poison: str = ""
    stop_early: bool = False

    @property
    def original_root(self) -> Path:
        return self.setup.original_root


@dataclass(frozen=True)
class Probe:
    """What a sensitivity rerun saw in one test's call phase.

    ``project_launches`` counts launches of kernels defined in the project (not in test
    files or installed packages); ``poisoned`` the buffers those launches wrote and the
    agent then poisoned; ``checks`` the value checks the test's own code made on
    non-empty tensors (comparisons, conversions to Python or NumPy); ``taint`` how much
    poison the checked tensors carried in a NaN run: "partial" when some checked tensor
    held poison in part only (values put in place after the launch), else "full" when
    some held it throughout, "clean" when none held any, "" when not measured.
    """

    project_launches: int = 0
    poisoned: int = 0
    checks: int = 0
    taint: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"project_launches": self.project_launches, "poisoned": self.poisoned,
                "checks": self.checks, "taint": self.taint}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Probe:
        return cls(int(data.get("project_launches", 0)), int(data.get("poisoned", 0)),
                   int(data.get("checks", 0)), str(data.get("taint", "")))


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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TestOutcome:
        error = data.get("error")
        probe = data.get("probe")
        return cls(
            nodeid=str(data["nodeid"]),
            outcome=data["outcome"],
            phase=str(data.get("phase", "")),
            longrepr=str(data.get("longrepr", "")),
            error=None if error is None else ErrorInfo.from_json(error),
            launch_count=int(data.get("launch_count", 0)),
            launches=tuple(KernelLaunch.from_json(item) for item in data.get("launches", ())),
            duration=float(data.get("duration", 0.0)),
            integrity=tuple(str(item) for item in data.get("integrity", ())),
            probe=None if probe is None else Probe.from_json(probe),
        )


_CRASH_SIGNALS = ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE")


@dataclass(frozen=True)
class RerunResult:
    """Outcomes of one rerun, and how the child process ended.

    Paths under the sandbox are reported as the original paths, so errors, frames and
    launches compare directly with the failing run's. ``running`` is the test that had
    started but not finished when the process stopped ("" when none), and
    ``running_launches`` the kernels it had launched by then. ``mode`` is how the child
    started (``fork`` or ``subprocess``) and ``fallback`` why it was not forked when
    forking was asked for.
    """

    outcomes: tuple[TestOutcome, ...]
    returncode: int
    timed_out: bool = False
    signal: str = ""
    output: str = ""
    seconds: float = 0.0
    collection_errors: tuple[str, ...] = ()
    running: str = ""
    extra: Mapping[str, object] = field(default_factory=dict)
    running_launches: tuple[KernelLaunch, ...] = ()
    mode: str = "subprocess"
    fallback: str = ""

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

        On a GPU, every kernel Triton compiled or loaded from the shared cache directory
        (``compile_cache`` from the agent); on the interpreter, every launch the compile
        gate judged (its verdicts are cached by kernel source).
        """
        counts = self.extra.get("compile_cache")
        if isinstance(counts, Mapping):
            hits, misses = int(counts.get("hits", 0)), int(counts.get("misses", 0))
            return hits, hits + misses
        gates = self.extra.get("gate")
        if not isinstance(gates, list):
            return 0, 0
        judged = [g for g in gates if isinstance(g, Mapping)
                  and not str(g.get("error", "")).startswith("gate skipped")]
        return sum(1 for g in judged if g.get("cached")), len(judged)

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


# -- addopts --------------------------------------------------------------------------


class _Arity(Enum):
    NONE = "none"  # a flag
    ONE = "one"  # exactly one value: --opt=V or --opt V
    OPTIONAL = "optional"  # --opt, --opt=V, or --opt V when V does not look like an option
    MANY = "many"  # every following token that does not look like an option


_N, _1, _OPT, _MANY = _Arity.NONE, _Arity.ONE, _Arity.OPTIONAL, _Arity.MANY

#: Long options a rerun of a few nodeids must not inherit, with how many values they take.
_DROPPED_LONG: dict[str, _Arity] = {
    # xdist: the child runs a handful of tests in one process
    "--numprocesses": _1, "--maxprocesses": _1, "--dist": _1, "--tx": _1, "--px": _1,
    "--max-worker-restart": _1, "--maxschedchunk": _1, "--rsyncdir": _1,
    "--rsyncignore": _1, "--looponfail": _N, "--testrunuid": _1,
    "--loadscope-reorder": _N, "--no-loadscope-reorder": _N,
    # stopping early would hide the outcome of the other nodeids
    "--exitfirst": _N, "--maxfail": _1,
    # coverage and report files would overwrite the real run's artifacts
    "--cov": _OPT, "--cov-report": _1, "--cov-config": _1, "--cov-fail-under": _1,
    "--cov-append": _N, "--cov-branch": _N, "--cov-context": _1, "--cov-precision": _1,
    "--cov-reset": _N, "--no-cov": _N, "--no-cov-on-fail": _N,
    "--junitxml": _1, "--junit-xml": _1, "--junitprefix": _1, "--junit-prefix": _1,
    "--html": _1, "--self-contained-html": _N, "--css": _1,
    "--json-report": _N, "--json-report-file": _1, "--json-report-summary": _N,
    "--json-report-omit": _MANY, "--json-report-indent": _1, "--json-report-verbosity": _1,
    "--report-log": _1, "--result-log": _1, "--resultlog": _1, "--alluredir": _1,
    "--basetemp": _1,
    # cacheprovider and stepwise are off in the child
    "--lf": _N, "--last-failed": _N, "--ff": _N, "--failed-first": _N, "--nf": _N,
    "--new-first": _N, "--lfnf": _1, "--last-failed-no-failures": _1, "--cache-clear": _N,
    "--cache-show": _OPT, "--sw": _N, "--stepwise": _N, "--sw-skip": _N,
    "--stepwise-skip": _N, "--sw-reset": _N, "--stepwise-reset": _N,
    # repeating or re-running multiplies the cost of every candidate
    "--count": _1, "--repeat-scope": _1, "--reruns": _1, "--reruns-delay": _1,
    "--only-rerun": _1,
    # selection and debuggers: the nodeids are the selection; nobody is at the terminal
    "--deselect": _1, "--pdb": _N, "--pdbcls": _1, "--trace": _N,
    # set by the rerun itself
    "--rootdir": _1, "--config-file": _1, "--inifile": _1,
}

#: Option families dropped whatever follows the prefix.
_DROPPED_PREFIXES = ("--kernelfix", "--cov-", "--json-report-")

#: Short options that are dropped: flags, and options that take a value.
_DROPPED_SHORT_FLAGS = frozenset("xfd")
_DROPPED_SHORT_VALUES = frozenset("nkmc")
#: Short options (pytest's and xdist's) whose value is the rest of the cluster or the
#: next token.
_SHORT_VALUES = frozenset("nkmcpoWr")


def _long_arity(name: str) -> _Arity | None:
    """How many values a dropped long option takes; None when it is kept."""
    if name in _DROPPED_LONG:
        return _DROPPED_LONG[name]
    if name.startswith(_DROPPED_PREFIXES):
        return _Arity.OPTIONAL  # unknown arity: take a value only if one follows
    return None


def _looks_like_option(token: str) -> bool:
    return token.startswith("-") and token != "-"


def _drop_plugin(value: str) -> bool:
    """``-p kernelfix`` or ``-p pytest_kernelfix.plugin`` would load the healer in reruns."""
    return "kernelfix" in value and not value.startswith("no:")


def _skip_values(tokens: Sequence[str], i: int, arity: _Arity) -> int:
    """The index after the separate values of a dropped long option at ``i - 1``."""
    if arity is _Arity.ONE:
        return i + 1
    while arity is not _Arity.NONE and i < len(tokens) and not _looks_like_option(tokens[i]):
        i += 1
        if arity is _Arity.OPTIONAL:
            break
    return i


def filter_addopts(args: Sequence[str]) -> tuple[str, ...]:
    """Drop the options that would break or leak out of a rerun of a few nodeids.

    Handles ``--opt=value`` and ``--opt value``, short clusters (``-xvs`` keeps
    ``-vs``; ``-rxX`` is ``-r`` with the value ``xX``) and attached values (``-n2``).
    """
    tokens = list(args)
    kept: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token.startswith("--"):
            name, has_value, _ = token.partition("=")
            arity = _long_arity(name)
            if arity is None:
                kept.append(token)
            elif not has_value:
                i = _skip_values(tokens, i, arity)
        elif _looks_like_option(token):
            following = tokens[i] if i < len(tokens) else None
            short, consumed = _filter_cluster(token, following)
            kept.extend(short)
            i += consumed
        else:
            kept.append(token)
    return tuple(kept)


def _filter_cluster(token: str, following: str | None) -> tuple[list[str], int]:
    """Filter one short-option cluster; returns the tokens to keep and how many of the
    following tokens it consumed (a value given separately)."""
    letters = token[1:]
    flags = ""
    for index, letter in enumerate(letters):
        if letter not in _SHORT_VALUES:
            if letter not in _DROPPED_SHORT_FLAGS:
                flags += letter
            continue
        attached = letters[index + 1 :]
        value, consumed = (attached, 0) if attached or following is None else (following, 1)
        dropped = letter in _DROPPED_SHORT_VALUES or (
            letter == "p" and _drop_plugin(value.lstrip("="))
        )
        if dropped:
            return ([f"-{flags}"] if flags else []), consumed
        if flags == letters[:index]:  # nothing before the value was dropped
            return [token, *([value] if consumed else [])], consumed
        return [f"-{flags}{letter}{attached}", *([value] if consumed else [])], consumed
    if flags == letters:
        return [token], 0
    return ([f"-{flags}"] if flags else []), 0


def map_root_paths(args: Sequence[str], source: Path, target: Path) -> tuple[str, ...]:
    """Point absolute paths under ``source`` (alone or after ``--opt=``) at ``target``.

    An ini value such as ``--confcutdir=/project/tests`` would otherwise make the rerun
    ignore the sandbox's conftest files.
    """
    roots = {str(source)}
    roots.add(os.path.realpath(source))

    def rewrite(text: str) -> str:
        for root in roots:
            if text == root or text.startswith(root + os.sep):
                return str(target) + text[len(root) :]
        return text

    mapped = []
    for arg in args:
        prefix, eq, value = arg.partition("=")
        if eq and arg.startswith("-"):
            mapped.append(prefix + eq + rewrite(value))
        else:
            mapped.append(rewrite(arg))
    return tuple(mapped)


#: Command-line options of the session that reruns must keep (plugins, import mode).
_CARRIED_WITH_VALUE = ("-p", "-W", "--pythonwarnings", "--import-mode", "-o", "--override-ini")
_CARRIED_FLAGS = ("--strict-markers", "--strict-config", "--strict")


def carried_args(args: Sequence[str]) -> tuple[str, ...]:
    """The session's own options a rerun of a few nodeids needs too.

    Paths, selections and report options stay behind; so do ``-o addopts=...`` (the
    rerun sets its own filtered ``addopts``) and ``-p kernelfix`` by any name
    (``-p pytest_kernelfix.plugin`` too: the rerun's agent stands in for it).
    """
    kept: list[str] = []
    remaining = iter(args)
    for arg in remaining:
        if arg in _CARRIED_FLAGS:
            kept.append(arg)
            continue
        if arg.startswith("--"):
            name, _, value = arg.partition("=")
        else:
            name, value = arg[:2], arg[2:]
        if name not in _CARRIED_WITH_VALUE:
            continue
        value = value or next(remaining, "")
        dropped = (name in ("-o", "--override-ini") and value.startswith("addopts=")) or (
            name == "-p" and (value == "no:kernelfix" or _drop_plugin(value))
        )
        if value and not dropped:
            kept += [name, value]
    return tuple(kept)


# -- the child's command line and environment ---------------------------------------------

_DROPPED_ENV = frozenset({"PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", PLAN_ENV})
_DROPPED_ENV_PREFIXES = ("PYTEST_XDIST_", "COV_CORE_")


def child_env(base: Mapping[str, str], setup: RerunSetup, plan_file: Path) -> dict[str, str]:
    """The parent's environment without what would reconfigure or leak out of the child."""
    env = {
        key: value
        for key, value in base.items()
        if key not in _DROPPED_ENV and not key.startswith(_DROPPED_ENV_PREFIXES)
    }
    plugins = [name for name in env.get("PYTEST_PLUGINS", "").split(",")
               if name.strip() and "kernelfix" not in name]
    if "PYTEST_PLUGINS" in env:  # loading the healer by module name would bypass -p no:
        env["PYTEST_PLUGINS"] = ",".join(plugins)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if setup.device.interpret:
        env["TRITON_INTERPRET"] = "1"
    env.update(setup.env)
    env[PLAN_ENV] = str(plan_file)
    return env


def build_command(spec: RerunSpec, python: str = sys.executable) -> list[str]:
    """``python -c BOOTSTRAP NODEIDS ...``: pytest with the agent, in the sandbox."""
    sandbox = Path(spec.sandbox_root)
    original = Path(spec.original_root)
    setup = spec.setup
    addopts = map_root_paths(filter_addopts(setup.addopts), original, sandbox)
    command = [
        python, "-c", BOOTSTRAP, *spec.nodeids,
        "-p", "no:kernelfix",
        "-p", "pytest_kernelfix.rerun.child.agent",
        "-p", "no:cacheprovider",
        "--rootdir", str(sandbox),
    ]
    if setup.inifile is not None:
        command += ["-c", map_root_paths([str(setup.inifile)], original, sandbox)[0]]
    command += [
        "-o", "addopts=" + shlex.join(addopts),
        "--continue-on-collection-errors",
        *map_root_paths(setup.extra_args, original, sandbox),
    ]
    if spec.stop_early:
        command.append("--exitfirst")
    return command


def rerun_plan(spec: RerunSpec, work: Path) -> RerunPlan:
    """What the agent reads: the roots to map imports between, where to write, the device."""
    return RerunPlan(
        original_root=str(spec.original_root),
        sandbox_root=str(spec.sandbox_root),
        output=str(work / "results.jsonl"),
        alias_dir=str(work / "imports"),
        nodeids=spec.nodeids,
        device=spec.setup.device,
        poison=spec.poison,
    )


# -- running ---------------------------------------------------------------------------


def run_tests(spec: RerunSpec, *, python: str = sys.executable) -> RerunResult:
    """Run ``spec.nodeids`` in the sandbox; never raises for what happens in the child."""
    work = Path(tempfile.mkdtemp(prefix="kernelfix-rerun-"))
    try:
        plan_file = work / "plan.json"
        log = work / "output.log"
        plan = rerun_plan(spec, work)
        plan.write(plan_file)
        start = time.monotonic()
        mode, fallback, returncode, timed_out = _launch(
            spec, build_command(spec, python), child_env(os.environ, spec.setup, plan_file), log,
            python)
        seconds = time.monotonic() - start
        data = read_results(Path(plan.output))
        output = _tail(log, OUTPUT_TAIL)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    unsandbox = _path_mapper(Path(spec.sandbox_root), Path(spec.original_root))
    data = unsandbox(data)
    return RerunResult(
        outcomes=tuple(TestOutcome.from_json(item) for item in data.get("tests", ())),
        returncode=returncode,
        timed_out=timed_out,
        signal="" if timed_out else signal_name(returncode),
        output=unsandbox(output),
        seconds=seconds,
        collection_errors=tuple(str(text) for text in data.get("collection_errors", ())),
        running=str(data.get("running") or ""),
        extra=dict(data.get("extra", {})),
        running_launches=tuple(KernelLaunch.from_json(item)
                               for item in data.get("running_launches", ())),
        mode=mode,
        fallback=fallback,
    )


def _launch(spec: RerunSpec, command: list[str], env: Mapping[str, str], log: Path,
            python: str) -> tuple[str, str, int, bool]:
    """Start the child the setup's way: (mode, why not forked, returncode, timed out)."""
    cwd = Path(spec.sandbox_root)
    env = {**env, LAUNCHED_ENV: repr(time.time())}  # the child's phase timings start here
    server, why = _server(spec.setup, env, python)
    if server is not None:
        try:
            done = server.run(command[3:], cwd=cwd, env=env, log=log,
                              timeout=spec.setup.timeout)
            return "fork", "", done.returncode, done.timed_out
        except rerun_server.ForkUnavailable as error:
            why = str(error)
    returncode, timed_out = _run_group(command, cwd=cwd, env=env, timeout=spec.setup.timeout,
                                       log=log)
    return "subprocess", "" if spec.setup.mode == "subprocess" else why, returncode, timed_out


def _server(setup: RerunSetup, env: Mapping[str, str],
            python: str) -> tuple[rerun_server.RerunServer | None, str]:
    """The rerun server for these reruns, or None and why they will not fork."""
    why = rerun_server.unavailable_reason(setup.mode)
    if why:
        return None, why
    try:
        return rerun_server.server_for(python, env, Path(setup.original_root)), ""
    except rerun_server.ForkUnavailable as error:
        return None, str(error)


def prestart(setup: RerunSetup, *, python: str = sys.executable) -> None:
    """Start the session's rerun server now, so its imports overlap other work (a server
    that cannot start is found again, and reported, by the first rerun)."""
    _server(setup, child_env(os.environ, setup, Path(os.devnull)), python)  # plan: per rerun


def close_servers() -> None:
    """End the rerun servers this process started (the end of a healing session)."""
    rerun_server.close_servers()


@dataclass(frozen=True)
class RerunStats:
    """What a bug's (or a session's) reruns cost and how they ran."""

    count: int = 0
    seconds: float = 0.0
    forked: int = 0
    fallbacks: tuple[str, ...] = ()
    cache_hits: int = 0
    cache_lookups: int = 0

    @property
    def mode(self) -> str:
        """``fork``, ``subprocess``, ``mixed`` (some of each), or ``none``."""
        if not self.count:
            return "none"
        if self.forked == self.count:
            return "fork"
        return "subprocess" if not self.forked else "mixed"

    def add(self, result: RerunResult) -> RerunStats:
        hits, lookups = result.compile_cache
        return self + RerunStats(1, result.seconds, int(result.mode == "fork"),
                                 (result.fallback,) if result.fallback else (), hits, lookups)

    def __add__(self, other: RerunStats) -> RerunStats:
        fallbacks = self.fallbacks + tuple(f for f in other.fallbacks if f not in self.fallbacks)
        return RerunStats(self.count + other.count, self.seconds + other.seconds,
                          self.forked + other.forked, fallbacks,
                          self.cache_hits + other.cache_hits,
                          self.cache_lookups + other.cache_lookups)


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


def _run_group(
    command: list[str], *, cwd: Path, env: Mapping[str, str], timeout: float, log: Path
) -> tuple[int, bool]:
    """Run in a new session; on timeout, and in any case at the end, kill the group.

    The leader is waited for without being reaped (``WNOWAIT``), so its process group
    id cannot be reused before the group is killed: grandchildren do not outlive us.
    """
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    timed_out = True
    try:
        timed_out = not _wait_exited(process, timeout)
    finally:
        kill_group(process.pid)
        returncode = process.wait()
    return returncode, timed_out


def _wait_exited(process: subprocess.Popen[bytes], timeout: float) -> bool:
    if not hasattr(os, "waitid"):  # pragma: no cover - not Linux
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = time.monotonic() + timeout
    delay = 0.005
    while not exited(process.pid):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)
    return True


def read_results(path: Path) -> dict[str, Any]:
    """Fold the agent's event lines into tests, collection errors, extra, ``running``
    and the launches ``running`` made.

    A line cut short by a crash is skipped; a test that started and never finished is
    the one ``running`` names.
    """
    tests: dict[str, Any] = {}
    errors: list[str] = []
    extra: dict[str, Any] = {}
    launched: dict[str, list[Any]] = {}
    running = ""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        kind = event.pop("event", None) if isinstance(event, dict) else None
        if kind == "start":
            running = str(event.get("nodeid", ""))
        elif kind == "test":
            tests[str(event.get("nodeid"))] = event
            running = ""
        elif kind == "collection_error":
            errors.append(str(event.get("text", "")))
        elif kind == "extra":
            extra[str(event.get("key"))] = event.get("value")
        elif kind == "launch" and isinstance(event.get("launch"), dict):
            launched.setdefault(str(event.get("nodeid", "")), []).append(event["launch"])
    return {"tests": list(tests.values()), "collection_errors": errors, "extra": extra,
            "running": running, "running_launches": launched.get(running, []) if running
            else []}


def _tail(path: Path, size: int) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - size))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _path_mapper(sandbox: Path, original: Path) -> Callable[[Any], Any]:
    """A function that rewrites sandbox paths to original ones in text and JSON data."""
    pairs = [(str(sandbox), str(original))]
    real = os.path.realpath(sandbox)
    if real != str(sandbox):
        pairs.append((real, str(original)))

    def mapped(value: Any) -> Any:
        if isinstance(value, str):
            for old, new in pairs:
                value = value.replace(old, new)
            return value
        if isinstance(value, list):
            return [mapped(item) for item in value]
        if isinstance(value, dict):
            return {key: mapped(item) for key, item in value.items()}
        return value

    return mapped
