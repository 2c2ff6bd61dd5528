"""Reruns in a real child process: outcomes, crashes, timeouts, and sandbox-only imports."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import sysconfig
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest
from rerun_helpers import MODES, alive, make_sandbox, spec_for, write_files

from pytest_kernelfix.rerun.args import filter_addopts, map_root_paths
from pytest_kernelfix.rerun.launcher import (
    RerunSetup,
    RerunSpec,
    RerunStats,
    build_command,
    child_dirs,
    child_env,
)
from pytest_kernelfix.rerun.plan import PLAN_ENV, DevicePlan, RerunPlan
from pytest_kernelfix.rerun.report import (
    REPORT_VERSION,
    ChildReport,
    CompileCounts,
    GateResult,
    ImportMapping,
    ReportError,
    RerunResult,
    TestOutcome,
    read_child_output,
    signal_name,
)
from pytest_kernelfix.rerun.runner import Reruns
from pytest_kernelfix.rerun.sandbox import Sandbox

# -- pure functions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("addopts", "kept"),
    [
        ("-n 2 -x --cov", ""),
        ("-n2 -v --numprocesses=auto --dist loadscope --maxprocesses 4", "-v"),
        ("-xvs", "-vs"),
        ("-rxX --tb=short", "-rxX --tb=short"),
        ("-vn 2 -q", "-v -q"),
        ("--cov=src --cov-report term-missing --no-cov --strict-markers", "--strict-markers"),
        ("--cov src --import-mode=importlib", "--import-mode=importlib"),
        ("-m 'not slow' -k foo -W error -p xdist", "-W error -p xdist"),
        ("--maxfail=2 --maxfail 3 --exitfirst -ra", "-ra"),
        ("--junitxml=out.xml --junit-xml out.xml --html=r.html -p no:cov", "-p no:cov"),
        ("--json-report --json-report-file=r.json --lf --ff --sw --stepwise-skip", ""),
        ("--count 3 --kernelfix --kernelfix-rounds 3 --kernelfix-apply -l", "-l"),
        ("-p kernelfix -p pytest_kernelfix.plugin -pno:kernelfix", "-pno:kernelfix"),
        ("-xp xdist --basetemp=/tmp/b --pdb", "-p xdist"),
        ("-c other.ini -o console_output_style=classic", "-o console_output_style=classic"),
    ],
)
def test_filter_addopts(addopts: str, kept: str) -> None:
    assert filter_addopts(shlex.split(addopts)) == tuple(shlex.split(kept))


def test_map_root_paths_points_absolute_paths_at_the_sandbox(tmp_path: Path) -> None:
    original, sandbox = tmp_path / "proj", tmp_path / "box/proj"
    args = [f"--confcutdir={original}/tests", str(original), f"{original}x", "-v", "rel/p"]
    assert map_root_paths(args, original, sandbox) == (
        f"--confcutdir={sandbox}/tests", str(sandbox), f"{original}x", "-v", "rel/p",
    )


def test_child_env_drops_the_parents_pytest_state(tmp_path: Path) -> None:
    setup = RerunSetup(tmp_path, 10.0, DevicePlan(interpret=True), env={"EXTRA": "1"})
    parent = {
        "PATH": "/bin", "PYTEST_ADDOPTS": "-x", "PYTEST_XDIST_WORKER": "gw1",
        "PYTEST_XDIST_TESTRUNUID": "u", "PYTEST_XDIST_WORKER_COUNT": "2",
        "PYTEST_CURRENT_TEST": "t.py::a (call)", "COV_CORE_SOURCE": "src", PLAN_ENV: "old",
        "PYTEST_PLUGINS": "myplugin,pytest_kernelfix.plugin",
    }
    env = child_env(parent, setup, tmp_path / "plan.json")
    assert env == {
        "PATH": "/bin", "PYTHONDONTWRITEBYTECODE": "1", "TRITON_INTERPRET": "1", "EXTRA": "1",
        PLAN_ENV: str(tmp_path / "plan.json"), "PYTEST_PLUGINS": "myplugin",
    }
    on_gpu = RerunSetup(tmp_path, 1.0, DevicePlan(interpret=False))
    assert "TRITON_INTERPRET" not in child_env({}, on_gpu, tmp_path / "p")


def test_build_command_runs_pytest_with_the_agent_in_the_sandbox(tmp_path: Path) -> None:
    original, sandbox = tmp_path / "proj", tmp_path / "box/proj"
    setup = RerunSetup(original, 10.0, DevicePlan(interpret=True),
                       addopts=("-x", "-p", "xdist", f"--confcutdir={original}"),
                       inifile=original / "pytest.ini", extra_args=("-q",))
    spec = RerunSpec(setup, sandbox, ("tests/t.py::a",))
    command = build_command(spec, python="py")
    assert command[:2] == ["py", "-c"]
    assert command[3] == "tests/t.py::a"
    joined = shlex.join(command)
    for part in ("-p no:kernelfix", "-p pytest_kernelfix.rerun.child.agent", "-p no:cacheprovider",
                 f"--rootdir {sandbox}", f"-c {sandbox}/pytest.ini"):
        assert part in joined
    assert f"addopts=-p xdist --confcutdir={sandbox}" in command
    assert command[-1] == "-q"


def test_a_rerun_takes_the_twins_of_the_users_rootdir_config_and_directory(
    tmp_path: Path,
) -> None:
    """The project root holds a test folder that is pytest's rootdir (its own config
    file): the rerun's rootdir, config and working directory are their twins in the copy
    of the project, and node ids stay relative to the rootdir's twin."""
    original, sandbox = tmp_path / "proj", tmp_path / "box/proj"
    tests = original / "tests"
    setup = RerunSetup(original, 10.0, inifile=tests / "pyproject.toml", rootdir=tests,
                       invocation_dir=original)
    spec = RerunSpec(setup, sandbox, ("test_t.py::a[x/y::z]", "test_t.py"))
    command = build_command(spec, python="py")
    assert command[3:5] == ["tests/test_t.py::a[x/y::z]", "tests/test_t.py"]
    joined = shlex.join(command)
    assert f"--rootdir {sandbox}/tests" in joined and f"-c {sandbox}/tests/pyproject.toml" in joined
    assert child_dirs(setup, sandbox) == (sandbox / "tests", sandbox)
    # pytest ran inside the test folder: from there, ids as they are
    inside = RerunSpec(replace(setup, invocation_dir=tests), sandbox, ("test_t.py::a",))
    assert child_dirs(inside.setup, sandbox) == (sandbox / "tests",) * 2
    assert build_command(inside, python="py")[3] == "test_t.py::a"
    # pytest ran outside the project: from the rootdir's twin
    outside = RerunSpec(replace(setup, invocation_dir=tmp_path), sandbox, ("test_t.py::a",))
    assert child_dirs(outside.setup, sandbox) == (sandbox / "tests",) * 2


@pytest.mark.parametrize(
    ("returncode", "name"),
    [(-6, "SIGABRT"), (-11, "SIGSEGV"), (134, "SIGABRT"), (139, "SIGSEGV"), (-9, "SIGKILL"),
     (1, ""), (0, ""), (137, "")],
)
def test_signal_name(returncode: int, name: str) -> None:
    assert signal_name(returncode) == name


def test_the_wall_time_of_reruns_never_exceeds_their_sum() -> None:
    """A caller's span includes the child's start, which the child's own time does not:
    both are read on the caller's clock, so reruns that ran together count once."""
    result = RerunResult((), returncode=0, seconds=0.5)
    stats = RerunStats().add(result, (10.0, 11.0)).add(result, (10.5, 12.0))
    assert stats.wall == 2.0 and stats.seconds == 2.5 and stats.count == 2
    untimed = RerunStats().add(result).add(result)
    assert untimed.wall == untimed.seconds == 1.0


def test_result_helpers() -> None:
    ok = TestOutcome("t.py::a", "passed", "call")
    bad = TestOutcome("t.py::b", "failed", "call")
    result = RerunResult((ok, bad), returncode=1)
    assert result.passed(["t.py::a"]) and not result.passed(["t.py::a", "t.py::b"])
    assert not result.passed([])  # nothing verified is not a pass
    assert result.outcome("t.py::b") == bad and result.outcome("t.py::zzz") is None
    assert result.missing(["t.py::a", "t.py::c"]) == ("t.py::c",)
    assert result.crash_reason == ""
    crashed = RerunResult((ok,), returncode=-6, signal="SIGABRT", running="t.py::b")
    assert crashed.passed(["t.py::a"]) and not crashed.passed(["t.py::b"])
    assert "SIGABRT" in crashed.crash_reason and "t.py::b" in crashed.crash_reason
    assert "unmasked tl.load/tl.store" in crashed.crash_reason
    timed_out = RerunResult((), returncode=-9, timed_out=True)
    assert timed_out.crash_reason == "" and not timed_out.passed(["t.py::a"])


def test_read_results_survives_a_line_cut_short_by_a_crash(tmp_path: Path) -> None:
    lines = [
        {"event": "report", "report": ChildReport(bf16_exact=False).to_json()},
        {"event": "start", "nodeid": "t.py::a"},
        {"event": "test", **TestOutcome("t.py::a", "passed", "call").to_json()},
        {"event": "collection_error", "text": "t2.py: ImportError: x"},
        {"event": "report", "report": ChildReport(bf16_exact=True).to_json()},
        {"event": "start", "nodeid": "t.py::b"},
    ]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"event": "te')
    data = read_child_output(path)
    assert [t.nodeid for t in data.tests] == ["t.py::a"]
    assert data.running == "t.py::b"
    assert data.report.bf16_exact is True  # the last report wins
    assert data.collection_errors == ("t2.py: ImportError: x",)
    assert read_child_output(tmp_path / "missing.jsonl").tests == ()


def test_a_child_report_round_trips_and_is_read_strictly() -> None:
    report = ChildReport(
        launch_recording=True, bf16_exact=False, integrity_error="",
        gate=(GateResult("k", "/x/k.py", 3, False, "boom", 1024, 0.25, True),),
        compile_cache=CompileCounts(2, 1), phases={"main": 0.1, "end": 1.5},
        poison_errors=("snapshot failed",), import_mapping=ImportMapping(("/s",), ("ops",)))
    assert ChildReport.from_json(json.loads(json.dumps(report.to_json()))) == report
    wrong = {**report.to_json(), "version": REPORT_VERSION + 1}
    with pytest.raises(ReportError, match="different plugin versions"):
        ChildReport.from_json(wrong)
    with pytest.raises(ReportError, match="unknown keys: extra"):
        ChildReport.from_json({**report.to_json(), "extra": 1})
    with pytest.raises(ReportError, match="malformed"):
        ChildReport.from_json({**report.to_json(), "launch_recording": "yes"})


def test_an_unreadable_child_report_is_said_not_guessed(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"event": "report", "report": {"version": 0}}) + "\n")
    data = read_child_output(path)
    assert data.report == ChildReport() and "version 0" in data.report_error


# -- real reruns -------------------------------------------------------------------------

OUTCOMES = """
    import pytest

    def test_pass():
        pass

    def test_fail():
        values = [1, 2]
        assert values == [1, 3]

    @pytest.fixture
    def broken():
        raise RuntimeError("fixture exploded")

    def test_error(broken):
        pass

    @pytest.fixture
    def bad_teardown():
        yield
        raise ValueError("teardown exploded")

    def test_teardown_error(bad_teardown):
        pass

    def test_skip():
        pytest.skip("not today")

    @pytest.mark.xfail(reason="known")
    def test_xfail():
        assert 0

    @pytest.mark.xfail(reason="known")
    def test_xpass():
        pass
"""


@pytest.mark.parametrize("mode", MODES)
def test_outcomes_of_every_kind_are_read_back(
    sandboxed: tuple[Path, list[Sandbox]], mode: str, reruns: Reruns
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {"tests/test_kinds.py": OUTCOMES})
    names = ["pass", "fail", "error", "teardown_error", "skip", "xfail", "xpass"]
    nodeids = [f"tests/test_kinds.py::test_{name}" for name in names]
    result = reruns(spec_for(sandbox, *nodeids, mode=mode))
    assert result.mode == mode and result.fallback == ""
    got = {o.nodeid.rpartition("::test_")[2]: (o.outcome, o.phase) for o in result.outcomes}
    assert got == {
        "pass": ("passed", "call"), "fail": ("failed", "call"), "error": ("error", "setup"),
        "teardown_error": ("error", "teardown"), "skip": ("skipped", "call"),
        "xfail": ("xfailed", "call"), "xpass": ("xpassed", "call"),
    }
    assert result.returncode == 1 and not result.timed_out and result.signal == ""
    assert result.passed([nodeids[0]]) and not result.passed(nodeids[:2])
    failed = result.outcome(nodeids[1])
    assert failed is not None and failed.error is not None
    assert failed.error.type == "AssertionError"
    assert "assert [1, 2] == [1, 3]" in failed.error.message
    frame = failed.error.frames[-1]
    assert frame.path == str(root / "tests/test_kinds.py")  # reported as the original path
    assert frame.line == "assert values == [1, 3]"
    assert str(sandbox.root) not in failed.longrepr and "values == [1, 3]" in failed.longrepr
    errored = result.outcome(nodeids[2])
    assert errored is not None and errored.error is not None
    assert errored.error.headline == "RuntimeError: fixture exploded"
    skipped = result.outcome(nodeids[4])
    assert skipped is not None and "not today" in skipped.longrepr
    assert result.collection_errors == () and result.running == ""
    assert result.missing(nodeids) == ()


def test_collection_errors_are_reported(
    sandboxed: tuple[Path, list[Sandbox]], reruns: Reruns
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {
        "test_ok.py": "def test_ok():\n    pass\n",
        "test_broken.py": "import no_such_module_kfx\n\ndef test_a():\n    pass\n",
    })
    result = reruns(spec_for(sandbox, "test_ok.py::test_ok", "test_broken.py::test_a"))
    assert result.returncode == 4  # pytest gives up on the whole selection
    imported, gone = result.collection_errors
    assert imported.startswith(
        "test_broken.py: ModuleNotFoundError: No module named 'no_such_module_kfx'")
    assert gone == "found no collectors for test_broken.py::test_a"
    assert result.missing(["test_ok.py::test_ok"]) == ("test_ok.py::test_ok",)

    missing = reruns(spec_for(sandbox, "test_ok.py::test_ok", "test_ok.py::test_gone"))
    assert missing.returncode == 4
    assert missing.collection_errors[0].startswith("not found: test_ok.py::test_gone")


SPAWNS = """
    import os, subprocess, sys, time

    def test_spawns():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        with open(os.environ["KFX_PIDS"], "w") as handle:
            handle.write(f"{os.getpid()} {child.pid}")
        time.sleep(float(os.environ["KFX_HANG"]))
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("hang", [300, 0], ids=["timeout", "finished"])
def test_no_process_of_the_rerun_outlives_it(
    sandboxed: tuple[Path, list[Sandbox]], tmp_path: Path, hang: int, mode: str, reruns: Reruns
) -> None:
    """On timeout the whole group is killed; after a normal exit, what it left behind."""
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {"test_spawn.py": SPAWNS})
    pids_file = tmp_path / "pids"
    start = time.monotonic()
    result = reruns(spec_for(sandbox, "test_spawn.py::test_spawns",
                                timeout=8.0 if hang else 60.0, mode=mode,
                                env={"KFX_PIDS": str(pids_file), "KFX_HANG": str(hang)}))
    assert result.mode == mode
    assert time.monotonic() - start < 30
    if hang:
        assert result.timed_out and result.crash_reason == "" and result.signal == ""
        assert result.running == "test_spawn.py::test_spawns"
        assert not result.passed(["test_spawn.py::test_spawns"])
    else:
        assert not result.timed_out and result.passed(["test_spawn.py::test_spawns"])
    pids = [int(pid) for pid in pids_file.read_text().split()]
    assert len(pids) == 2
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("body", "signame"),
    [("os.abort()", "SIGABRT"), ("ctypes.string_at(0)", "SIGSEGV")],
)
def test_a_crashing_test_gives_a_crash_reason(
    sandboxed: tuple[Path, list[Sandbox]], body: str, signame: str, mode: str, reruns: Reruns
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {"test_crash.py": f"""
        import ctypes, os

        def test_before():
            pass

        def test_crash():
            {body}

        def test_after():
            pass
    """})
    nodeids = ["test_crash.py::test_before", "test_crash.py::test_crash",
               "test_crash.py::test_after"]
    result = reruns(spec_for(sandbox, *nodeids, mode=mode))
    assert result.mode == mode
    assert result.returncode == -getattr(signal, signame)
    assert result.signal == signame and not result.timed_out
    assert result.running == "test_crash.py::test_crash"
    assert "test_crash.py::test_crash" in result.crash_reason
    assert "unmasked tl.load/tl.store" in result.crash_reason
    assert [o.nodeid for o in result.outcomes] == ["test_crash.py::test_before"]  # incremental
    assert result.missing(nodeids) == tuple(nodeids[1:])
    assert "test_crash" in result.output  # faulthandler's traceback
    again = reruns(spec_for(sandbox, "test_crash.py::test_after", mode=mode))
    assert again.passed(["test_crash.py::test_after"]) and again.mode == mode  # it goes on


@pytest.mark.parametrize("mode", MODES)
def test_parent_environment_does_not_configure_the_child(
    sandboxed: tuple[Path, list[Sandbox]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    mode: str, reruns: Reruns,
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {"test_env.py": """
        import os

        def test_fails_first():
            assert False

        def test_env_is_clean():
            for name in ("PYTEST_ADDOPTS", "PYTEST_XDIST_WORKER", "COV_CORE_SOURCE"):
                assert name not in os.environ, name
            assert os.environ["PYTHONDONTWRITEBYTECODE"] == "1"
            assert os.environ["TRITON_INTERPRET"] == "1"
    """})
    junit = tmp_path / "junit.xml"
    monkeypatch.setenv("PYTEST_ADDOPTS", f"-x --junitxml={junit}")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    monkeypatch.setenv("COV_CORE_SOURCE", "src")
    result = reruns(spec_for(sandbox, "test_env.py::test_fails_first",
                                "test_env.py::test_env_is_clean", mode=mode))
    assert result.mode == mode
    assert [o.outcome for o in result.outcomes] == ["failed", "passed"]  # no -x
    assert not junit.exists()
    assert not list(sandbox.root.rglob("__pycache__"))


def test_ini_addopts_that_break_reruns_are_neutralised(
    sandboxed: tuple[Path, list[Sandbox]], reruns: Reruns,
) -> None:
    addopts = "-n 2 -x --cov -m 'not slow' --strict-markers -p no:randomly"
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {
        "pytest.ini": f"""
            [pytest]
            addopts = {addopts}
            markers = slow: a slow test
            filterwarnings = error
        """,
        "test_ini.py": """
            import pytest

            def test_fails():
                assert False

            @pytest.mark.slow
            def test_slow():
                pass

            def test_passes():
                pass
        """,
    })
    nodeids = ["test_ini.py::test_fails", "test_ini.py::test_slow", "test_ini.py::test_passes"]
    result = reruns(spec_for(sandbox, *nodeids, addopts=tuple(shlex.split(addopts)),
                                inifile=root / "pytest.ini"))
    assert [o.outcome for o in result.outcomes] == ["failed", "passed", "passed"], result.output
    assert "workers" not in result.output  # xdist did not start
    assert result.returncode == 1


def test_plan_reaches_the_agent_and_its_report_comes_back(
    sandboxed: tuple[Path, list[Sandbox]], tmp_path: Path, reruns: Reruns,
) -> None:
    root, sandboxes = sandboxed
    echo = tmp_path / "plan.json"
    sandbox = make_sandbox(root, sandboxes, {
        "conftest.py": f"""
            import json
            from pytest_kernelfix.rerun.child.agent import agent_of

            def pytest_sessionstart(session):
                agent = agent_of(session.config)
                with open({str(echo)!r}, "w") as out:
                    json.dump(agent.plan.to_json(), out)
        """,
        "test_plan.py": "def test_ok():\n    pass\n",
    })
    device = DevicePlan(interpret=True, cuda_shim=False, capability=(8, 0),
                        gate_target="cuda:80", cache_dir=str(root / "cache"))
    result = reruns(spec_for(sandbox, "test_plan.py::test_ok", device=device))
    assert result.passed(["test_plan.py::test_ok"])
    echoed = RerunPlan.from_json(json.loads(echo.read_text()))
    assert echoed.device == device  # the typed plan arrives whole
    assert echoed.nodeids == ("test_plan.py::test_ok",)
    assert echoed.original_root == str(sandbox.source)
    assert result.report.launch_recording is True and result.report_error == ""


ADD_KERNEL = """
    import torch
    import triton
    import triton.language as tl


    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        y = tl.load(y_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, x + y, mask=mask)


    def add(x, y):
        out = torch.empty_like(x)
        add_kernel[(triton.cdiv(x.numel(), 64),)](x, y, out, x.numel(), BLOCK=64)
        return out
"""


def add_project(tests: str) -> dict[str, str]:
    """A package with ``add_kernel`` and a test module using it."""
    return {"kernels/__init__.py": "", "kernels/add.py": ADD_KERNEL, "tests/test_add.py": tests}


def test_kernel_launches_are_counted_per_test(
    sandboxed: tuple[Path, list[Sandbox]], reruns: Reruns
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, add_project("""
            import torch
            from kernels.add import add

            def test_add_twice():
                x, y = torch.arange(100.0), torch.ones(100)
                assert torch.equal(add(x, y), x + 1)
                assert torch.equal(add(x, y), x + 1)

            def test_no_kernel():
                assert torch.equal(torch.ones(2) + 1, torch.full((2,), 2.0))
        """))
    result = reruns(spec_for(sandbox, "tests/test_add.py::test_add_twice",
                                "tests/test_add.py::test_no_kernel"))
    twice, none = result.outcomes
    assert twice.outcome == "passed", twice.longrepr
    assert twice.launch_count == 2
    (launch,) = twice.launches
    assert launch.name == "add_kernel"
    assert launch.file == str(root / "kernels/add.py")
    lines = (root / "kernels/add.py").read_text().splitlines()
    assert launch.line == 1 + next(i for i, t in enumerate(lines) if t.startswith("def add_"))
    assert dict(launch.constexprs) == {"BLOCK": 64}
    assert none.outcome == "passed" and none.launch_count == 0 and none.launches == ()


# -- imports come from the sandbox -------------------------------------------------------

VALUE_TESTS = """
    import subprocess, sys
    import {module}

    def test_child_imports_the_sandbox():
        assert {module}.VALUE == "sandbox", {module}.__file__

    def test_grandchild_imports_the_sandbox():
        code = "import {module}; print({module}.VALUE, {module}.__file__)"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd="/")
        assert done.stdout.split()[:1] == ["sandbox"], done.stdout + done.stderr
"""

PYPROJECT = """
    [build-system]
    requires = ["setuptools"]
    build-backend = "setuptools.build_meta"

    [project]
    name = "{name}"
    version = "0.1"
"""


@pytest.fixture(scope="module")
def editable_venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A throwaway venv that sees our packages, with two projects installed editable.

    ``kfx_src_pkg`` is a plain ``src/`` layout (setuptools writes a ``.pth`` path entry);
    ``kfx_mapped_pkg`` lives in ``code/`` (setuptools installs a MAPPING finder).
    """
    base = tmp_path_factory.mktemp("editable")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]  # pytest, triton, pytest_kernelfix (editable)
    Path(purelib, "kfx_parent.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    src = write_files(base / "srcproj", {
        "pyproject.toml": PYPROJECT.format(name="kfx-src-pkg"),
        "src/kfx_src_pkg/__init__.py": 'VALUE = "original"\n',
        "tests/test_value.py": VALUE_TESTS.format(module="kfx_src_pkg"),
    })
    mapped = write_files(base / "mapproj", {
        "pyproject.toml": PYPROJECT.format(name="kfx-mapped-pkg") + textwrap.dedent("""
            [tool.setuptools]
            packages = ["kfx_mapped_pkg"]
            package-dir = {"kfx_mapped_pkg" = "code"}
        """),
        "code/__init__.py": 'VALUE = "original"\n',
        "tests/test_value.py": VALUE_TESTS.format(module="kfx_mapped_pkg"),
    })
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "-e", str(src), "-e", str(mapped)],
        check=True, capture_output=True,
    )
    return python, src, mapped


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("project", "module", "relpath"),
    [("src", "kfx_src_pkg", "src/kfx_src_pkg/__init__.py"),
     ("mapped", "kfx_mapped_pkg", "code/__init__.py")],
)
def test_an_editable_install_imports_the_sandbox_copy(
    editable_venv: tuple[Path, Path, Path], project: str, module: str, relpath: str, mode: str
) -> None:
    python, src, mapped = editable_venv
    root = src if project == "src" else mapped
    with Sandbox.create(root, exclude=["*.egg-info", "build"]) as sandbox:
        sandbox.write(relpath, 'VALUE = "sandbox"\n')
        unmapped = subprocess.run(  # the hazard: a plain child imports the original
            [str(python), "-c", f"import {module}; print({module}.VALUE)"],
            cwd=sandbox.root, capture_output=True, text=True, check=True,
        )
        assert unmapped.stdout.strip() == "original"
        nodeids = ["tests/test_value.py::test_child_imports_the_sandbox",
                   "tests/test_value.py::test_grandchild_imports_the_sandbox"]
        with Reruns(python=str(python)) as runner:
            result = runner(spec_for(sandbox, *nodeids, mode=mode))
        assert result.passed(nodeids), result.output
        assert result.mode == mode, result.fallback
        mapping = result.report.import_mapping
        assert mapping is not None
        if project == "mapped":
            assert module in mapping.redirected
        else:
            assert mapping.sys_path == (str(root / "src"),)  # the .pth entry, mapped
    assert (root / relpath).read_text() == 'VALUE = "original"\n'


@pytest.mark.parametrize("mode", MODES)
def test_an_absolute_pythonpath_entry_is_mapped_to_the_sandbox(
    sandboxed: tuple[Path, list[Sandbox]], monkeypatch: pytest.MonkeyPatch, mode: str,
    reruns: Reruns,
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {
        "lib/kfx_helper.py": 'VALUE = "original"\n',
        "tests/test_value.py": VALUE_TESTS.format(module="kfx_helper"),
    })
    sandbox.write("lib/kfx_helper.py", 'VALUE = "sandbox"\n')
    monkeypatch.setenv("PYTHONPATH", str(root / "lib"))
    nodeids = ["tests/test_value.py::test_child_imports_the_sandbox",
               "tests/test_value.py::test_grandchild_imports_the_sandbox"]
    result = reruns(spec_for(sandbox, *nodeids, mode=mode))
    assert result.passed(nodeids), result.output
    assert result.mode == mode
    assert (root / "lib/kfx_helper.py").read_text() == 'VALUE = "original"\n'


def test_gate_cache_hits_are_counted_across_sandboxes(
    sandboxed: tuple[Path, list[Sandbox]], reruns: Reruns,
) -> None:
    """Workers' sandboxes (and later sessions) share the gate's verdicts: the first rerun
    compiles the kernel, a rerun in another sandbox copy finds it in the cache."""
    root, sandboxes = sandboxed
    first = make_sandbox(root, sandboxes, add_project("""
            import torch
            from kernels.add import add

            def test_add():
                x, y = torch.arange(100.0), torch.ones(100)
                assert torch.equal(add(x, y), x + 1)
        """))
    second = Sandbox.create(root)
    sandboxes.append(second)
    device = DevicePlan(interpret=True, cuda_shim=False, capability=(9, 0),
                        gate_target="cuda:90", cache_dir=str(root.parent / "cache"))
    nodeid = "tests/test_add.py::test_add"
    cold, warm = (reruns(spec_for(sandbox, nodeid, device=device))
                  for sandbox in (first, second))
    for result in (cold, warm):
        assert result.passed([nodeid]), result.output
    assert cold.compile_cache == (0, 1)
    assert warm.compile_cache == (1, 1)
