"""Rerun a few nodeids in a sandbox, in a child process, and read back what happened.

A candidate kernel can hang, abort or segfault the interpreter (an unmasked
``tl.load`` corrupts the heap), so tests run in a child process in its own process
group, under a timeout, and the child's agent (:mod:`pytest_kernelfix.rerun.child.agent`)
writes each finished test to a JSON file as it goes: what finished before a crash is
still known (:mod:`pytest_kernelfix.rerun.report`). The options of the suite that
would break a rerun of a few nodeids are left out (:mod:`pytest_kernelfix.rerun.args`).

:class:`Reruns` is the session's runner and the one owner of its warm servers
(:mod:`pytest_kernelfix.rerun.server`): a child is forked from one where it can be
(``RerunSetup.mode``: ``auto``, ``fork``), else it is a fresh ``python -c`` subprocess;
the result says which. :func:`run_tests` runs one rerun.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kernelfix.rerun.args import filter_addopts, map_root_paths
from pytest_kernelfix.rerun.plan import LAUNCHED_ENV, PLAN_ENV, DevicePlan, ProbePlan, RerunPlan
from pytest_kernelfix.rerun.report import RerunResult, fold_events, read_events, signal_name
from pytest_kernelfix.rerun.server import (
    ForkUnavailable,
    RerunServer,
    ServerPool,
    unavailable_reason,
)
from pytest_kernelfix.rerun.server.wire import exited, kill_group

#: How much of the child's merged stdout/stderr a result keeps.
OUTPUT_TAIL = 8 * 1024

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

    ``probe`` says what the child measures besides the outcomes: poisoned kernel outputs
    (a sensitivity rerun), guarded checks, launch fingerprints
    (:class:`~pytest_kernelfix.rerun.plan.ProbePlan`). ``stop_early`` ends the run at
    the first test that fails (``--exitfirst``): the
    tests after it get no outcome.
    """

    setup: RerunSetup
    sandbox_root: Path
    nodeids: tuple[str, ...]
    probe: ProbePlan = field(default_factory=ProbePlan)
    stop_early: bool = False

    @property
    def original_root(self) -> Path:
        return self.setup.original_root


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
        probe=spec.probe,
    )


# -- running ---------------------------------------------------------------------------


def run_tests(spec: RerunSpec, *, python: str = sys.executable,
              pool: ServerPool | None = None) -> RerunResult:
    """Run ``spec.nodeids`` in the sandbox; never raises for what happens in the child.

    The child is forked from ``pool``'s warm server where the setup allows it; without a
    pool (or where forking is refused) it is a fresh subprocess.
    """
    work = Path(tempfile.mkdtemp(prefix="kernelfix-rerun-"))
    try:
        plan_file = work / "plan.json"
        log = work / "output.log"
        plan = rerun_plan(spec, work)
        plan.write(plan_file)
        start = time.monotonic()
        mode, fallback, returncode, timed_out = _launch(
            spec, build_command(spec, python), child_env(os.environ, spec.setup, plan_file), log,
            python, pool)
        seconds = time.monotonic() - start
        events = read_events(Path(plan.output))
        output = _tail(log, OUTPUT_TAIL)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    unsandbox = _path_mapper(Path(spec.sandbox_root), Path(spec.original_root))
    child = fold_events(unsandbox(events))
    return RerunResult(
        outcomes=child.tests,
        returncode=returncode,
        timed_out=timed_out,
        signal="" if timed_out else signal_name(returncode),
        output=unsandbox(output),
        seconds=seconds,
        collection_errors=child.collection_errors,
        running=child.running,
        report=child.report,
        running_launches=child.running_launches,
        mode=mode,
        fallback=fallback,
        report_error=child.report_error,
    )


def _launch(spec: RerunSpec, command: list[str], env: Mapping[str, str], log: Path,
            python: str, pool: ServerPool | None) -> tuple[str, str, int, bool]:
    """Start the child the setup's way: (mode, why not forked, returncode, timed out)."""
    cwd = Path(spec.sandbox_root)
    env = {**env, LAUNCHED_ENV: repr(time.time())}  # the child's phase timings start here
    server, why = _server(spec.setup, env, python, pool)
    if server is not None:
        try:
            done = server.run(command[3:], cwd=cwd, env=env, log=log,
                              timeout=spec.setup.timeout)
            return "fork", "", done.returncode, done.timed_out
        except ForkUnavailable as error:
            why = str(error)
    returncode, timed_out = _run_group(command, cwd=cwd, env=env, timeout=spec.setup.timeout,
                                       log=log)
    return "subprocess", "" if spec.setup.mode == "subprocess" else why, returncode, timed_out


def _server(setup: RerunSetup, env: Mapping[str, str], python: str,
            pool: ServerPool | None) -> tuple[RerunServer | None, str]:
    """The rerun server for these reruns, or None and why they will not fork."""
    why = unavailable_reason(setup.mode) or ("" if pool is not None else "no warm server "
                                             "was given for this rerun")
    if why or pool is None:
        return None, why
    try:
        return pool.server_for(python, env, Path(setup.original_root)), ""
    except ForkUnavailable as error:
        return None, str(error)


class Reruns:
    """How a session reruns tests, and the one owner of its warm servers.

    Call it with a :class:`RerunSpec` (it is a runner); :meth:`prestart` starts the
    server early so its imports overlap other work; :meth:`close` ends every server it
    started (use it as a context manager).
    """

    def __init__(self, *, python: str = sys.executable) -> None:
        self.python = python
        self.pool = ServerPool()

    def __call__(self, spec: RerunSpec) -> RerunResult:
        return run_tests(spec, python=self.python, pool=self.pool)

    def prestart(self, setup: RerunSetup) -> None:
        """Start the server for ``setup`` now (one that cannot start is found again, and
        reported, by the first rerun)."""
        _server(setup, child_env(os.environ, setup, Path(os.devnull)), self.python,
                self.pool)

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> Reruns:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


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
