"""What a rerun is, what reruns cost, and how one rerun child process starts and ends.

A candidate kernel can hang, abort or segfault the interpreter (an unmasked
``tl.load`` corrupts the heap), so tests run in a child process in its own process
group, under a timeout, and the child's agent (:mod:`pytest_kernelfix.rerun.child.agent`)
writes each finished test to a JSON file as it goes: what finished before a crash is
still known (:mod:`pytest_kernelfix.rerun.report`). The options of the suite that
would break a rerun of a few nodeids are left out (:mod:`pytest_kernelfix.rerun.args`).

:func:`launch` starts a child the setup's way (``RerunSetup.mode``): forked from a warm
server of the session's pool (:mod:`pytest_kernelfix.rerun.server`) where it can be,
else a fresh ``python -c`` subprocess; it says which, and how the child ended. Every
child is a phased child (:mod:`pytest_kernelfix.rerun.phased`); the session's runner is
:class:`pytest_kernelfix.rerun.runner.Reruns`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelfix.project import is_within
from pytest_kernelfix.rerun.args import filter_addopts, map_root_paths
from pytest_kernelfix.rerun.plan import LAUNCHED_ENV, PLAN_ENV, DevicePlan, ProbePlan, RerunPlan
from pytest_kernelfix.rerun.report import RerunResult
from pytest_kernelfix.rerun.server import (
    ForkResult,
    ForkUnavailable,
    RerunServer,
    ServerPool,
    unavailable_reason,
)
from pytest_kernelfix.rerun.server.wire import exited, kill_group

#: How much of the child's merged stdout/stderr a result keeps (of all its children's).
OUTPUT_TAIL = 8 * 1024
#: Seconds between two calls of a rerun's progress callback (none for a shorter rerun).
PROGRESS_EVERY = 10.0

#: Called while a rerun runs: (tests finished, tests in the rerun, seconds since it began).
RerunProgress = Callable[[int, int, float], None]

#: Run by ``python -c``: the agent maps imports onto the sandbox, then starts pytest.
BOOTSTRAP = "from pytest_kernelfix.rerun.child.bootstrap import main; main()"

@dataclass(frozen=True)
class RerunSetup:
    """What every rerun of one session shares: the suite's configuration and the device.

    ``addopts`` are the suite's ini ``addopts`` (they replace the ini value in the child,
    after :func:`filter_addopts`); ``extra_args`` are the session's own options a rerun
    keeps (plugins, import mode); ``device`` goes to the child's agent in the plan;
    ``env`` is added to the child's environment; ``mode`` is how children start: forked
    from the warm server where it is safe (``auto``), forked wherever fork exists
    (``fork``), or a fresh interpreter each time (``subprocess``); ``jobs`` is how many
    children one rerun may split its tests across (``timeout`` holds for each child);
    ``nice`` lowers the children's priority by that much (reruns made while the tests
    still run take only the cores the test run leaves); ``base_env`` is the environment
    children start from (the session's when the setup was made; None: the current one).

    ``original_root`` is the project root, which the sandbox copies; ``rootdir`` (pytest's,
    inside it; None: the same folder), ``inifile`` and ``invocation_dir`` (where pytest
    ran) are the session's: a rerun runs pytest with their twins in the sandbox, so that it
    reads the same config, names its tests with the same node ids and imports from the same
    working directory (the rootdir's twin when pytest ran outside the project).
    """

    original_root: Path
    timeout: float
    device: DevicePlan = field(default_factory=DevicePlan)
    addopts: tuple[str, ...] = ()
    inifile: Path | None = None
    rootdir: Path | None = None
    invocation_dir: Path | None = None
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    mode: str = "auto"
    jobs: int = 1
    nice: int = 0
    base_env: Mapping[str, str] | None = field(default=None, repr=False, compare=False)


@dataclass(frozen=True)
class RerunSpec:
    """One rerun: these tests, in this sandbox copy, the session's way.

    ``probe`` says what the child measures besides the outcomes: poisoned kernel outputs
    (a sensitivity rerun), guarded checks, launch fingerprints
    (:class:`~pytest_kernelfix.rerun.plan.ProbePlan`). ``stop_early`` ends the run at the
    first test that fails (with several children, the others are stopped): the tests not
    finished by then get no outcome. ``progress`` is called every
    :data:`PROGRESS_EVERY` seconds while the rerun runs, from the caller's thread. Once
    ``cancel`` is set (the session was interrupted) the children are stopped, as at a
    ``stop_early`` stop; the caller knows its result is of no use.
    """

    setup: RerunSetup
    sandbox_root: Path
    nodeids: tuple[str, ...]
    probe: ProbePlan = field(default_factory=ProbePlan)
    stop_early: bool = False
    progress: RerunProgress | None = field(default=None, compare=False)
    cancel: threading.Event | None = field(default=None, compare=False)

    @property
    def original_root(self) -> Path:
        return self.setup.original_root


# -- the child's command line and environment ---------------------------------------------

_DROPPED_ENV = frozenset({"PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", PLAN_ENV})
_DROPPED_ENV_PREFIXES = ("PYTEST_XDIST_", "COV_CORE_")


def child_env(base: Mapping[str, str], setup: RerunSetup, plan_file: Path) -> dict[str, str]:
    """The parent's environment (``setup.base_env`` when the setup fixed one) without what
    would reconfigure or leak out of the child."""
    if setup.base_env is not None:
        base = setup.base_env
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


def child_dirs(setup: RerunSetup, sandbox_root: Path) -> tuple[Path, Path]:
    """The child's rootdir and working directory: the sandbox twins of pytest's rootdir
    and of where pytest ran (of the rootdir, when pytest ran outside the project)."""
    sandbox, original = Path(sandbox_root), Path(setup.original_root)

    def twin(path: Path | None) -> Path | None:
        if path is None or not is_within(path, original):
            return None
        return sandbox / Path(os.path.abspath(path)).relative_to(os.path.abspath(original))

    rootdir = twin(setup.rootdir) or sandbox
    return rootdir, twin(setup.invocation_dir) or rootdir


def _from(cwd: Path, rootdir: Path, nodeid: str) -> str:
    """A rootdir-relative node id as pytest's argument in ``cwd``."""
    if cwd == rootdir:
        return nodeid
    path, sep, rest = nodeid.partition("::")
    return Path(os.path.relpath(rootdir / path, cwd)).as_posix() + sep + rest


def build_command(spec: RerunSpec, python: str = sys.executable) -> list[str]:
    """``python -c BOOTSTRAP NODEIDS ...``: pytest with the agent, in the sandbox."""
    sandbox = Path(spec.sandbox_root)
    original = Path(spec.original_root)
    setup = spec.setup
    rootdir, cwd = child_dirs(setup, sandbox)
    addopts = map_root_paths(filter_addopts(setup.addopts), original, sandbox)
    command = [
        python, "-c", BOOTSTRAP, *(_from(cwd, rootdir, nodeid) for nodeid in spec.nodeids),
        "-p", "no:kernelfix",
        "-p", "pytest_kernelfix.rerun.child.agent",
        "-p", "no:cacheprovider",
        "--rootdir", str(rootdir),
    ]
    if setup.inifile is not None:
        command += ["-c", map_root_paths([str(setup.inifile)], original, sandbox)[0]]
    command += [
        "-o", "addopts=" + shlex.join(addopts),
        "--continue-on-collection-errors",
        *map_root_paths(setup.extra_args, original, sandbox),
    ]
    return command


def rerun_plan(spec: RerunSpec, work: Path) -> RerunPlan:
    """What the agent reads: the roots to map imports between, where to write, the
    device, what to install before collection, and the file its phases come in."""
    return RerunPlan(
        original_root=str(spec.original_root),
        sandbox_root=str(spec.sandbox_root),
        output=str(work / "results.jsonl"),
        alias_dir=str(work / "imports"),
        nodeids=spec.nodeids,
        device=spec.setup.device,
        probe=spec.probe,
        control=str(work / "commands.jsonl"),
    )


# -- starting and ending a child --------------------------------------------------------


def launch(setup: RerunSetup, sandbox_root: Path, command: list[str], env: Mapping[str, str],
           log: Path, *, timeout: float, python: str, pool: ServerPool | None,
           stop: threading.Event) -> tuple[str, str, ForkResult]:
    """Run a child to its end (its exit, ``timeout``, or ``stop``) the setup's way:
    (mode, why it was not forked, how it ended)."""
    cwd = child_dirs(setup, sandbox_root)[1]
    env = {**env, LAUNCHED_ENV: repr(time.time())}  # the child's phase timings start here
    server, why = server_for(setup, env, python, pool)
    if server is not None:
        try:
            return "fork", "", server.run(command[3:], cwd=cwd, env=env, log=log,
                                          timeout=timeout, stop=stop, nice=setup.nice)
        except ForkUnavailable as error:
            why = str(error)
    ended = run_group(command, cwd=cwd, env=env, timeout=timeout, log=log,
                      stop=stop, nice=setup.nice)
    return "subprocess", "" if setup.mode == "subprocess" else why, ended


def server_for(setup: RerunSetup, env: Mapping[str, str], python: str,
               pool: ServerPool | None) -> tuple[RerunServer | None, str]:
    """The rerun server for these reruns (started if need be), or None and why they will
    not fork."""
    why = unavailable_reason(setup.mode) or ("" if pool is not None else "no warm server "
                                             "was given for this rerun")
    if why or pool is None:
        return None, why
    try:
        return pool.server_for(python, env, Path(setup.original_root)), ""
    except ForkUnavailable as error:
        return None, str(error)


@dataclass(frozen=True)
class RerunStats:
    """What a bug's (or a session's) reruns cost and how they ran: ``count`` reruns
    (phases of a phased child each count), ``children`` the processes they started.

    ``seconds`` sums every rerun's own time; ``spans`` are the (start, end) monotonic
    times of the reruns that were timed by their caller, so :attr:`wall` counts reruns
    that ran at the same time (parallel bugs, poisoned reruns together) once. A rerun
    its caller timed adds its span to ``seconds`` too: one clock for both, so the wall
    time never exceeds the sum.
    """

    count: int = 0
    seconds: float = 0.0
    forked: int = 0
    fallbacks: tuple[str, ...] = ()
    cache_hits: int = 0
    cache_lookups: int = 0
    spans: tuple[tuple[float, float], ...] = ()
    children: int = 0

    @property
    def wall(self) -> float:
        """Seconds during which at least one rerun ran (the sum when none was timed)."""
        if not self.spans:
            return self.seconds
        total, end = 0.0, float("-inf")
        for start, stop in sorted(self.spans):
            if stop > end:
                total += stop - max(start, end)
                end = stop
        return total

    @property
    def mode(self) -> str:
        """``fork``, ``subprocess``, ``mixed`` (some of each), or ``none``."""
        if not self.count:
            return "none"
        if self.forked == self.count:
            return "fork"
        return "subprocess" if not self.forked else "mixed"

    def add(self, result: RerunResult, span: tuple[float, float] | None = None) -> RerunStats:
        hits, lookups = result.compile_cache
        seconds = result.seconds if span is None else span[1] - span[0]
        return self + RerunStats(1, seconds, int(result.mode == "fork"),
                                 (result.fallback,) if result.fallback else (), hits, lookups,
                                 (span,) if span is not None else (), result.started)

    def __add__(self, other: RerunStats) -> RerunStats:
        fallbacks = self.fallbacks + tuple(f for f in other.fallbacks if f not in self.fallbacks)
        return RerunStats(self.count + other.count, self.seconds + other.seconds,
                          self.forked + other.forked, fallbacks,
                          self.cache_hits + other.cache_hits,
                          self.cache_lookups + other.cache_lookups, self.spans + other.spans,
                          self.children + other.children)


def run_group(
    command: list[str], *, cwd: Path, env: Mapping[str, str], timeout: float, log: Path,
    stop: threading.Event | None = None, nice: int = 0,
) -> ForkResult:
    """Run in a new session until it exits, times out or ``stop`` is set; then (in any
    case) kill the group.

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
    if nice:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, process.pid,
                           os.getpriority(os.PRIO_PROCESS, 0) + nice)
    ended = "timeout"
    try:
        ended = _wait_exited(process, timeout, stop)
    finally:
        kill_group(process.pid)
        returncode = process.wait()
    return ForkResult(returncode, ended == "timeout", ended == "stopped")


def _wait_exited(process: subprocess.Popen[bytes], timeout: float,
                 stop: threading.Event | None) -> str:
    """``exited``, ``timeout`` or ``stopped``, whichever comes first."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while not _has_exited(process):
        if stop is not None and stop.is_set():
            return "stopped"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timeout"
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.05)
    return "exited"


def _has_exited(process: subprocess.Popen[bytes]) -> bool:
    if not hasattr(os, "waitid"):  # pragma: no cover - not Linux: reaps, as wait() would
        return process.poll() is not None
    return exited(process.pid)


def read_tail(path: Path, size: int, offset: int = 0) -> str:
    """The last ``size`` bytes of ``path`` written after ``offset``, as text."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(offset, handle.tell() - size))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def path_mapper(sandbox: Path, original: Path) -> Callable[[Any], Any]:
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
