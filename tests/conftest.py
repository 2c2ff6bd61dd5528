"""Shared test set-up, the fixtures every test module may use, and the split of the
suite into unit and session tests.

Kernels imported by tests in this process run on the Triton interpreter: the variable
must be set before any ``@triton.jit`` function is decorated.

Fixtures: ``fake_llm`` (an OpenAI-compatible server on 127.0.0.1), ``on_cpu`` (the CUDA
shim's CUDA piece as an sm_80 GPU, undone afterwards), ``sandboxed`` (a
project directory and the sandboxes to close), ``reruns`` (the runner of real reruns,
owning one warm server for the whole run of this process). Nothing a test starts may
outlive it: after every test, no rerun server but the shared one runs and no
``kernelfix-*`` temporary directory is left in this process's temporary directory.

A test is a *session* test when it starts pytest or a rerun in another process (seconds
each, where a unit test takes milliseconds). It is marked so automatically, by what its
code uses, the way pytest's own suite marks its ``pytester`` tests: the ``pytester``
fixture, or a name below in the test function, in a fixture of its module that it
requests, or in a helper of its module that either calls. ``make test-fast`` deselects
them. Session tests run first, whole sessions first of all (and the tests marked
``slow`` before them), so that under ``-n`` the longest tests do not form the tail of the
run. ``slow`` marks, by hand, the sessions that wait out timeouts (the hostile suite,
hung candidates) and those whose path a cheaper session or a unit test of the same code
also covers (the same heal under xdist, fault variants, feedback rounds, the demo that
``make demo`` runs, the wheel build): ``make test`` deselects them to stay under 15
minutes on a 2-core CI machine, ``make test-all`` runs everything.
"""

from __future__ import annotations

import os
import tempfile
import types
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

from fake_llm import FakeLLM

from pytest_kernelfix.rerun.runner import Reruns
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.rerun.server.wire import SERVER_BOOTSTRAP

#: Names that start another process: pytest in a subprocess, a rerun, a shell command.
SUBPROCESS_NAMES = frozenset({"runpytest_subprocess", "run_tests", "Reruns", "subprocess", "Popen"})
#: Names of a whole healing session in a subprocess: the longest tests.
WHOLE_SESSION_NAMES = frozenset({"runpytest_subprocess"})
_HELPER_DEPTH = 3


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "session: starts pytest or a rerun in a subprocess (marked automatically)")
    config.addinivalue_line(
        "markers", "slow: a session test that a cheaper one mostly covers, or that waits out "
        "timeouts; `make test` deselects it, `make test-all` runs it")


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for constant in code.co_consts:  # nested functions and lambdas
        if isinstance(constant, types.CodeType):
            yield from _names(constant)


def _function(value: object) -> types.FunctionType | None:
    """A plain function, or the one behind a ``@pytest.fixture`` definition."""
    value = getattr(value, "__wrapped__", value)
    return value if isinstance(value, types.FunctionType) else None


def used_names(function: types.FunctionType, fixtures: Iterable[str] = ()) -> frozenset[str]:
    """Names the test's code uses: its own, its module's fixtures it requests, and the
    module-level helpers these call."""
    module_globals = function.__globals__
    seen: set[str] = set()
    pending = [(function.__code__, 0)]
    for name in fixtures:
        fixture = _function(module_globals.get(name))
        if fixture is not None:
            pending.append((fixture.__code__, 1))
    while pending:
        code, depth = pending.pop()
        for name in _names(code):
            if name in seen:
                continue
            seen.add(name)
            helper = _function(module_globals.get(name))
            if depth < _HELPER_DEPTH and helper is not None:
                pending.append((helper.__code__, depth + 1))
    return frozenset(seen)


def cost_rank(item: pytest.Item) -> int:
    """-1: a slow test; 0: a whole session in a subprocess; 1: another session test; 2: a
    unit test."""
    if item.get_closest_marker("slow") is not None:
        return -1
    function = _function(getattr(item, "function", None))
    fixtures = tuple(getattr(item, "fixturenames", ()))
    names = used_names(function, fixtures) if function is not None else frozenset()
    if names & WHOLE_SESSION_NAMES:
        return 0
    if "pytester" in fixtures or "reruns" in fixtures or names & SUBPROCESS_NAMES:
        return 1
    return 2


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Generator[None, None, None]:
    ranks = {item: cost_rank(item) for item in items}
    for item, rank in ranks.items():
        if rank < 2:
            item.add_marker(pytest.mark.session)
    items.sort(key=ranks.__getitem__)  # stable: the order within a rank is kept
    return (yield)


# -- shared fixtures ---------------------------------------------------------------------


@pytest.fixture
def fake_llm() -> Iterator[FakeLLM]:
    """A started :class:`FakeLLM`, closed after the test."""
    with FakeLLM() as fake:
        yield fake


@pytest.fixture
def sandboxed(tmp_path: Path) -> Iterator[tuple[Path, list[Sandbox]]]:
    """A project directory and a list that sandboxes are closed from afterwards."""
    sandboxes: list[Sandbox] = []
    yield tmp_path / "proj", sandboxes
    for sandbox in sandboxes:
        sandbox.close()


@pytest.fixture
def on_cpu() -> Iterator[None]:
    """CUDA mapped to the CPU as an sm_80 GPU, with the interpreter's bf16 made exact (what
    the whole shim installs); session-wide pieces are put back afterwards."""
    from pytest_kernelfix.shim import bf16, cuda  # imports torch: only where a test asks

    held = cuda.capability()
    had_bf16 = bf16.installed()
    cuda.uninstall()
    bf16.install()
    assert cuda.install((8, 0))
    yield
    cuda.uninstall()
    if not had_bf16:
        bf16.uninstall()
    if held is not None:
        cuda.install(held)


#: The runners of the ``reruns`` fixture: their servers are meant to outlive a test.
SHARED: list[Reruns] = []


@pytest.fixture(scope="session")
def reruns() -> Iterator[Reruns]:
    """Real reruns, forked from warm servers this fixture owns and ends with the run."""
    with Reruns() as runner:
        SHARED.append(runner)
        yield runner
        SHARED.remove(runner)


# -- nothing outlives a test -------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def own_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This process's temporary directory (children inherit it), so that what the
    plugin leaves in it is this process's doing."""
    directory = tmp_path_factory.mktemp("tmp")
    saved = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"] = str(directory)
    tempfile.tempdir = None  # read TMPDIR again
    yield directory
    if saved[0] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = saved[0]
    tempfile.tempdir = saved[1]


def server_pids() -> set[int]:
    """Rerun servers that are children of this process."""
    pids = set()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if int((entry / "stat").read_text().split(")")[-1].split()[1]) != os.getpid():
                continue
            if SERVER_BOOTSTRAP.encode() in (entry / "cmdline").read_bytes():
                pids.add(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return pids


def shared_servers() -> tuple[set[int], set[str]]:
    """The pids and directories of the servers the shared ``reruns`` fixture owns."""
    servers = [server for runner in SHARED for server in runner.pool.servers]
    return ({server.process.pid for server in servers},
            {server.work.name for server in servers})


@pytest.fixture(autouse=True)
def nothing_outlives_the_test(own_temp_dir: Path) -> Iterator[None]:
    """After the test: no rerun server of its own still runs, no ``kernelfix-*`` temporary
    directory of its own is left."""
    before = {path.name for path in own_temp_dir.glob("kernelfix-*")}
    yield
    pids, dirs = shared_servers()
    left = sorted(path.name for path in own_temp_dir.glob("kernelfix-*")
                  if path.name not in before and path.name not in dirs)
    running = sorted(server_pids() - pids)
    assert not left and not running, (
        f"the test left rerun servers running (pids {running}) or temporary directories "
        f"behind ({left}): close what it starts (Reruns.close, Sandbox.close)")
