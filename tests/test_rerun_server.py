"""Forked reruns: fresh code and state every time, the server outlives its children,
and a fresh subprocess wherever forking cannot be had."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest
from rerun_helpers import make_sandbox, spec_for

from pytest_kernelfix.rerun.runner import Reruns
from pytest_kernelfix.rerun.sandbox import Sandbox
from pytest_kernelfix.rerun.server import unavailable_reason
from pytest_kernelfix.rerun.server.fork import exit_code
from pytest_kernelfix.rerun.server.server import fork_hazard
from pytest_kernelfix.rerun.server.warm import RewriteCache, forget_project

pytestmark = pytest.mark.skipif(bool(unavailable_reason("fork")), reason="no fork here")

KERNEL = """
    import torch
    import triton
    import triton.language as tl

    VALUE = "{value}"


    @triton.jit
    def shift_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + {shift}, mask=mask)


    def shift(x):
        out = torch.empty_like(x)
        shift_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
        return out
"""

CANDIDATE_TESTS = """
    import os
    import torch
    from kernels import shift

    def test_shifts_by_two():
        x = torch.arange(100.0)
        torch.testing.assert_close(shift.shift(x), x + 2)

    def test_value_is_two():
        assert shift.VALUE == "two"

    def test_parent():
        with open("parents.txt", "a") as out:
            out.write(f"{os.getppid()}\\n")
"""


def test_a_forked_rerun_imports_the_candidate_not_a_module_the_server_saw(
    sandboxed: tuple[Path, list[Sandbox]], reruns: Reruns,
) -> None:
    """Two candidates of the same size written within a second: no stale module or
    kernel comes back, and one server serves both reruns."""
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {
        "kernels/__init__.py": "",
        "kernels/shift.py": KERNEL.format(value="one", shift=1),
        "tests/test_shift.py": CANDIDATE_TESTS,
    })
    nodeids = ["tests/test_shift.py::test_shifts_by_two", "tests/test_shift.py::test_value_is_two",
               "tests/test_shift.py::test_parent"]
    before = reruns(spec_for(sandbox, *nodeids, mode="fork"))
    sandbox.write("kernels/shift.py", (sandbox.root / "kernels/shift.py").read_text()
                  .replace('"one"', '"two"').replace("+ 1, mask", "+ 2, mask"))
    after = reruns(spec_for(sandbox, *nodeids, mode="fork"))

    assert before.mode == after.mode == "fork"
    assert [o.outcome for o in before.outcomes] == ["failed", "failed", "passed"]
    assert [o.outcome for o in after.outcomes] == ["passed", "passed", "passed"], after.output
    assert after.outcomes[0].launch_count == 1  # the kernel ran, anew
    first, second = (sandbox.root / "parents.txt").read_text().split()
    assert first == second and first != str(os.getpid())  # forked by one server


LEAKS = """
    import os
    import sys
    import torch
    from kernels import state

    def test_starts_fresh():
        assert state.COUNT == 0
        state.COUNT += 1
        assert torch.add(torch.ones(1), torch.ones(1)).item() == 2.0
        torch.add = lambda *args, **kwargs: "patched"
        assert "KFX_LEAKED" not in os.environ
        os.environ["KFX_LEAKED"] = "1"
        assert "kfx_leaked_module" not in sys.modules
        sys.modules["kfx_leaked_module"] = sys
        assert "/kfx/leaked" not in sys.path
        sys.path.append("/kfx/leaked")
        assert os.path.basename(os.getcwd()) == "proj"
        os.chdir("/")
"""


def test_consecutive_forked_reruns_share_no_state(
    sandboxed: tuple[Path, list[Sandbox]], reruns: Reruns,
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {
        "kernels/__init__.py": "",
        "kernels/state.py": "COUNT = 0\n",
        "tests/test_leaks.py": LEAKS,
    })
    for _ in range(3):
        result = reruns(spec_for(sandbox, "tests/test_leaks.py::test_starts_fresh",
                                    mode="fork"))
        assert result.mode == "fork"
        assert result.passed(["tests/test_leaks.py::test_starts_fresh"]), result.output
    assert "KFX_LEAKED" not in os.environ  # nor into the session


HANGS_AND_CRASHES = """
    import ctypes, os, subprocess, sys, time

    def test_hangs():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        with open(os.environ["KFX_PIDS"], "a") as out:
            out.write(f"{os.getppid()} {child.pid}\\n")
        time.sleep(300)

    def test_crashes():
        with open(os.environ["KFX_PIDS"], "a") as out:
            out.write(f"{os.getppid()} 0\\n")
        ctypes.string_at(0)

    def test_passes():
        with open(os.environ["KFX_PIDS"], "a") as out:
            out.write(f"{os.getppid()} 0\\n")
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_hang_and_a_crash_end_the_child_only(
    sandboxed: tuple[Path, list[Sandbox]], tmp_path: Path, reruns: Reruns
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {"test_bad.py": HANGS_AND_CRASHES})
    pids = tmp_path / "pids"
    env = {"KFX_PIDS": str(pids)}
    hung = reruns(spec_for(sandbox, "test_bad.py::test_hangs", timeout=5.0, mode="fork",
                              env=env))
    crashed = reruns(spec_for(sandbox, "test_bad.py::test_crashes", mode="fork", env=env))
    passed = reruns(spec_for(sandbox, "test_bad.py::test_passes", mode="fork", env=env))

    assert hung.mode == crashed.mode == passed.mode == "fork"
    assert hung.timed_out and hung.running == "test_bad.py::test_hangs"
    assert crashed.signal == "SIGSEGV" and "test_crashes" in crashed.crash_reason
    assert passed.passed(["test_bad.py::test_passes"])
    rows = [line.split() for line in pids.read_text().splitlines()]
    servers = {row[0] for row in rows}
    assert len(servers) == 1  # the same server forked all three: it survived
    server = int(servers.pop())
    assert _alive(server)
    grandchild = int(rows[0][1])
    assert not _alive(grandchild)  # the hung child's whole group was killed


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


GPU_LIST = """
    import os

    def test_sees_its_gpu():
        with open("visible.txt", "a") as out:
            out.write(os.environ.get("CUDA_VISIBLE_DEVICES", "-") + f" {os.getppid()}\\n")
"""


def test_one_server_serves_workers_pinned_to_different_gpus(
    sandboxed: tuple[Path, list[Sandbox]], reruns: Reruns,
) -> None:
    """``CUDA_VISIBLE_DEVICES`` is read when CUDA initialises, which the server never does:
    each child gets its worker's list from the same server."""
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {"test_gpu.py": GPU_LIST})
    for gpu in ("0", "1"):
        result = reruns(spec_for(sandbox, "test_gpu.py::test_sees_its_gpu", mode="fork",
                                    env={"CUDA_VISIBLE_DEVICES": gpu}))
        assert result.mode == "fork" and result.passed(["test_gpu.py::test_sees_its_gpu"])
    (first, server), (second, again) = (
        line.split() for line in (sandbox.root / "visible.txt").read_text().splitlines())
    assert (first, second) == ("0", "1") and server == again


def test_stop_early_ends_the_rerun_at_the_first_failure(
    sandboxed: tuple[Path, list[Sandbox]], reruns: Reruns,
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {"test_three.py": """
        def test_a():
            pass

        def test_b():
            assert False

        def test_c():
            pass
    """})
    nodeids = ["test_three.py::test_a", "test_three.py::test_b", "test_three.py::test_c"]
    spec = spec_for(sandbox, *nodeids, mode="fork")
    stopped = reruns(type(spec)(spec.setup, spec.sandbox_root, spec.nodeids, stop_early=True))
    assert [o.outcome for o in stopped.outcomes] == ["passed", "failed"]
    assert stopped.missing(nodeids) == ("test_three.py::test_c",)
    assert len(reruns(spec).outcomes) == 3


def test_a_server_that_cannot_start_leaves_reruns_to_fresh_subprocesses(
    sandboxed: tuple[Path, list[Sandbox]], tmp_path: Path
) -> None:
    root, sandboxes = sandboxed
    sandbox = make_sandbox(root, sandboxes, {"test_ok.py": "def test_ok():\n    pass\n"})
    python = tmp_path / "python"  # an interpreter whose rerun server dies at once
    python.write_text("#!/bin/sh\n"
                      'case "$*" in *rerun.server*) echo "no server today" >&2; exit 3;; esac\n'
                      f'exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    with Reruns(python=str(python)) as runner:
        result = runner(spec_for(sandbox, "test_ok.py::test_ok", mode="auto"))
    assert result.passed(["test_ok.py::test_ok"])
    assert result.mode == "subprocess"
    assert result.fallback.startswith("the rerun server could not start: exited with status 3")
    assert "no server today" in result.fallback


def test_a_subprocess_is_chosen_when_asked_for_or_where_fork_is_not_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert unavailable_reason("subprocess") == "--kernelfix-rerun subprocess"
    assert unavailable_reason("auto") == unavailable_reason("fork") == ""
    monkeypatch.setattr(sys, "platform", "darwin")
    assert "Linux only" in unavailable_reason("auto")
    assert unavailable_reason("fork") == ""  # asked for explicitly


def test_fork_hazards_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    # The server has only the threads it starts; this test process may hold threads of
    # other tests (HTTP servers, litellm's logger), so only the ones started here count.
    started: list[threading.Thread] = []
    monkeypatch.setattr(threading, "enumerate", lambda: [threading.main_thread(), *started])
    assert fork_hazard() == ""
    torch = pytest.importorskip("torch")
    with monkeypatch.context() as patched:
        patched.setattr(torch.cuda, "is_initialized", lambda: True)
        assert fork_hazard() == "CUDA is initialised in the rerun server; forking it is unsafe"
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="busy")
    started.append(thread)
    thread.start()
    try:
        assert fork_hazard().startswith("the rerun server runs other threads (busy)")
    finally:
        release.set()
        thread.join()


def test_exit_codes_follow_the_interpreter() -> None:
    assert [exit_code(code) for code in (None, 0, 1, 4, 256 + 3)] == [0, 0, 1, 4, 3]
    assert exit_code("message") == 1


def test_the_rewrite_cache_reuses_code_only_for_unchanged_sources(tmp_path: Path) -> None:
    calls: list[str] = []

    def rewrite(fn: Path, config: object) -> tuple[bytes, object]:
        import importlib.util

        calls.append(fn.read_text())
        source = fn.read_bytes()
        return importlib.util.source_hash(source), compile(source, str(fn), "exec")

    class Config:
        def __init__(self, pass_hook: bool) -> None:
            self.pass_hook = pass_hook

        def getini(self, name: str) -> bool:
            assert name == "enable_assertion_pass_hook"
            return self.pass_hook

    cache = RewriteCache(rewrite, tmp_path / "cache")
    (tmp_path / "cache").mkdir()
    module = tmp_path / "test_mod.py"
    module.write_text("X = 1\n")
    first = cache(module, Config(False))
    again = cache(module, Config(False))
    assert calls == ["X = 1\n"] and first[0] == again[0]
    namespace: dict[str, object] = {}
    exec(again[1], namespace)
    assert namespace["X"] == 1
    module.write_text("X = 2\n")  # same size, same second: the hash tells
    changed = cache(module, Config(False))
    exec(changed[1], namespace)
    assert namespace["X"] == 2 and len(calls) == 2
    cache(module, Config(True))  # the pass hook changes the rewrite: never from the cache
    assert len(calls) == 3


def test_modules_of_the_project_are_dropped_after_the_warm_up(tmp_path: Path) -> None:
    (tmp_path / "kfx_warm_probe.py").write_text("VALUE = 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import kfx_warm_probe  # noqa: F401

        assert "kfx_warm_probe" in sys.modules
        forget_project(str(tmp_path))
        assert "kfx_warm_probe" not in sys.modules
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("kfx_warm_probe", None)
