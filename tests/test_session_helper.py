"""The healing helper process (``session/helper.py``): what it leaves when it ends."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from pytest_kernelfix.config import load_settings
from pytest_kernelfix.session import helper
from pytest_kernelfix.session.controller import rerun_setup, session_project


def test_a_helper_killed_for_not_stopping_leaves_no_temporary_directory(
        pytester: pytest.Pytester, own_temp_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under load a helper may not stop within its wait and is killed: the rerun server
    it had started must not leave its folder in the session's temporary directory."""
    config = pytester.parseconfig()  # with --kernelfix, pytest would start a helper itself
    settings = load_settings(config)
    start = helper.Start(settings, session_project(config, settings),
                         rerun_setup(config, settings, "interpret"))
    monkeypatch.setattr(helper, "STOP_WAIT", 1.0)
    before = set(own_temp_dir.glob("kernelfix-*"))
    started = helper.Helper(start)
    try:
        deadline = time.monotonic() + 60
        while not list(own_temp_dir.rglob("kernelfix-server-*")):  # its warm server began
            assert time.monotonic() < deadline, "the helper never started its rerun server"
            time.sleep(0.05)
        os.killpg(started.process.pid, signal.SIGSTOP)  # it cannot answer "stop" now
    finally:
        started.close()
    assert started.process.returncode == -signal.SIGKILL
    assert not started.work.exists()
    assert set(own_temp_dir.glob("kernelfix-*")) == before
