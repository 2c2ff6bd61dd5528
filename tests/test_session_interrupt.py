"""A bad day: Ctrl-C or SIGTERM (what CI cancellation sends) while a session heals.

Nothing finished is lost: the bugs healed before the interrupt keep their patches (and,
with ``--kernelfix-apply``, only those are written), the report is written and marked
interrupted, and no ``kernelfix-*`` temporary directory or rerun server is left.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from fake_llm import FakeLLM, Reply
from hostile.project import BUG, FIX, fix_answer, report, write_project

BASE = ("-p", "no:randomly", "-p", "no:cacheprovider", "--kernelfix-model=openai/fake-model",
        "--kernelfix-llm-retries=0", "--kernelfix-rounds=1", "--kernelfix-workers=1")

#: Ctrl-C while the model is asked about k2 (a hook runs where the model would answer).
CTRL_C_AT_K2 = """
def pytest_kernelfix_propose(request, config):
    if any(view.path == "kernels/k2.py" for view in request.context.editable):
        raise KeyboardInterrupt  # what Ctrl-C raises while the fixer waits for a model
    return None  # k1: the configured model answers
"""

#: k2's test, rerun in the sandbox, is where CI cancels the job: it sends the session a
#: SIGTERM and waits to be stopped.
SIGTERM_FROM_K2 = """
import os
import signal
import time

import pytest

from kernels.k2 import k2


@pytest.mark.kernel
def test_k2() -> None:
    if os.environ.get("KERNELFIX_RERUN_PLAN"):
        os.kill(int(os.environ["KFX_SESSION_PID"]), signal.SIGTERM)
        time.sleep(60)
    import torch
    x = torch.arange(300, dtype=torch.float32)
    torch.testing.assert_close(k2(x, 2.0), x * 2.0)
"""

#: The session's pid, for the rerun of test_k2 (children inherit it; they keep the first).
SESSION_PID = """
import os

os.environ.setdefault("KFX_SESSION_PID", str(os.getpid()))
if os.environ["KFX_SESSION_PID"] == str(os.getpid()):
    open("session.pid", "w").write(str(os.getpid()))
"""


def test_ctrl_c_in_apply_mode_keeps_and_writes_only_what_was_healed(
    pytester: pytest.Pytester, fake_llm: FakeLLM
) -> None:
    write_project(pytester.path, "k1", "k2")
    pytester.makeconftest(CTRL_C_AT_K2)
    pytester.makefile(".py", unconfigure_marker=(
        "def pytest_unconfigure(config):\n"
        "    open(str(config.rootpath / 'unconfigured'), 'w').close()\n"))
    older = pytester.path / ".kernelfix" / "report.json"
    older.parent.mkdir()
    older.write_text('{"from": "an earlier session"}')
    fake_llm.script(Reply(fix_answer("k1")))
    result = pytester.runpytest_subprocess(*BASE, "--kernelfix-apply", f"--kernelfix-api-base="
                                           f"{fake_llm.url}", "-p", "unconfigure_marker",
                                           timeout=300)
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the tests' verdict, not a crash
    result.assert_outcomes(failed=2, passed=1)
    result.stdout.fnmatch_lines([
        "unhealed  k2_kernel-*: interrupted in round 1: nothing more was tried (Ctrl-C)",
        "note: the session was interrupted (Ctrl-C): 1 bug(s) healed before it keep their "
        "patches; 1 bug(s) were stopped or not started"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert (pytester.path / "unconfigured").exists()  # every plugin still cleaned up
    bugs = report(pytester.path)
    data = json.loads(older.read_text())
    assert data["interrupted"] is True and data["totals"]["calls"] == 1
    assert bugs["k1"]["status"] == "healed" and bugs["k1"]["applied"] == ["kernels/k1.py"]
    assert (pytester.path / ".kernelfix" / bugs["k1"]["patch"]).is_file()
    assert bugs["k2"]["status"] == "unhealed" and bugs["k2"]["applied"] == []
    assert FIX in (pytester.path / "kernels" / "k1.py").read_text()
    assert BUG in (pytester.path / "kernels" / "k2.py").read_text()
    assert "**Interrupted**" in (pytester.path / ".kernelfix" / "report.md").read_text()


def test_sigterm_while_healing_writes_the_report_and_leaves_no_temp_dir(
    pytester: pytest.Pytester, fake_llm: FakeLLM, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI cancels the job while k2's baseline reruns (k1 is healed by then): the rerun
    is stopped, k1 keeps its patch, the report says SIGTERM, and the sandbox copy, the
    rerun and server directories and the rerun server itself are gone."""
    write_project(pytester.path, "k1", "k2")
    (pytester.path / "tests" / "test_k2.py").write_text(SIGTERM_FROM_K2)
    pytester.makeconftest(SESSION_PID)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    fake_llm.script(Reply(fix_answer("k1")))
    result = pytester.runpytest_subprocess(*BASE, "--kernelfix",
                                           f"--kernelfix-api-base={fake_llm.url}", timeout=300)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    bugs = report(pytester.path)
    data = json.loads((pytester.path / ".kernelfix" / "report.json").read_text())
    assert data["interrupted"] is True
    assert "the session was interrupted (SIGTERM)" in data["notes"][-1]
    assert bugs["k1"]["status"] == "healed"
    assert (pytester.path / ".kernelfix" / bugs["k1"]["patch"]).is_file()
    assert (bugs["k2"]["status"], bugs["k2"]["reason"]) == (
        "skipped", "interrupted (SIGTERM) before it was healed")
    assert sorted(path.name for path in temp.glob("kernelfix-*")) == []
    session = (pytester.path / "session.pid").read_text()
    assert left_behind(f"KFX_SESSION_PID={session}") == []


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_sigterm_during_the_test_run_still_reports_the_failures_seen(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overlap: str,
) -> None:
    """CI cancels the job while the tests run (the warm rerun server already started at
    the first failure, or the healing helper with the session): pytest stops as on
    Ctrl-C, the failure seen so far is reported (not healed, or as far as its heal came
    while the tests ran), the report says SIGTERM, and the server, the helper and their
    directories are gone."""
    write_project(pytester.path, "k1", passing=False)
    (pytester.path / "tests" / "test_later.py").write_text(
        "import os\nimport signal\n\n\ndef test_cancelled() -> None:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n\n\ndef test_never_run() -> None:\n"
        "    pass\n")
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    result = pytester.runpytest_subprocess("-p", "no:randomly", "-p", "no:cacheprovider",
                                           "--kernelfix", f"--kernelfix-overlap={overlap}",
                                           timeout=300)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert "test_never_run" not in result.stdout.str()
    data = json.loads((pytester.path / ".kernelfix" / "report.json").read_text())
    assert data["interrupted"] is True
    (bug,) = data["bugs"]
    not_started = "not healed: the session was interrupted (SIGTERM) before its turn"
    no_recipe = "round 1: no recipe for AssertionError"  # what its heal found before
    assert bug["reason"] == not_started or (overlap == "on" and bug["reason"].startswith(
        no_recipe)), bug["reason"]
    assert sorted(path.name for path in temp.glob("kernelfix-*")) == []
    assert working_in(temp) == []  # the rerun server (its cwd is its directory) is gone


def working_in(folder: Path) -> list[int]:
    """Processes whose working directory is in ``folder``."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if Path(os.readlink(entry / "cwd")).is_relative_to(folder):
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def left_behind(marker: str, wait: float = 10.0) -> list[int]:
    """Processes whose environment holds ``marker`` (a killed process may take a moment
    to go)."""
    deadline = time.monotonic() + wait
    while True:
        found = []
        for entry in Path("/proc").glob("[0-9]*"):
            try:
                environ = (entry / "environ").read_bytes() + b"\0"
                state = (entry / "stat").read_text().split(")")[-1].split()[0]
                if marker.encode() + b"\0" in environ and state != "Z":
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
        found = [pid for pid in found if pid != os.getpid()]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)
