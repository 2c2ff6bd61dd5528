"""Under xdist the shim is installed where tests run, not in the controller."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest
from kernel_project import make_project, report_of

from pytest_kernelfix.device import runs_tests


def config_with(**options: object) -> pytest.Config:
    defaults: dict[str, object] = {"numprocesses": None, "tx": [], "dist": "no", "usepdb": False}
    return SimpleNamespace(known_args_namespace=SimpleNamespace(**{**defaults, **options}))  # type: ignore[return-value]


@pytest.mark.parametrize(("options", "expected"), [
    ({}, True),  # no xdist options: tests run here
    ({"numprocesses": 0}, True),
    ({"numprocesses": 2}, False),
    ({"numprocesses": "auto"}, False),
    ({"numprocesses": "logical", "usepdb": True}, True),  # xdist runs in-process then
    ({"tx": ["popen"], "dist": "load"}, False),
    ({"tx": ["popen"], "dist": "no"}, True),
])
def test_runs_tests_follows_xdist(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, object], expected: bool
) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    assert runs_tests(config_with(**options)) is expected


def test_a_worker_always_runs_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert runs_tests(config_with(numprocesses=2))


CONFTEST = """
    import os
    import sys


    def pytest_sessionstart(session):
        config = session.config
        role = os.environ.get("PYTEST_XDIST_WORKER", "controller")
        loaded = sorted(name for name in ("torch", "triton") if name in sys.modules)
        with open(os.path.join(str(config.rootpath), role + ".txt"), "w") as out:
            out.write(" ".join(loaded) + "|" + os.environ.get("TRITON_INTERPRET", ""))
"""

SUITE = """
    import torch

    def test_cuda_on_the_cpu():
        assert torch.cuda.is_available() and torch.ones(2, device="cuda").is_cuda
"""


@pytest.fixture(autouse=True)
def outside_any_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the inner sessions as a user would: not from inside an xdist worker, whose
    marker variable a child process inherits (and would take for its own)."""
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


def test_the_controller_imports_neither_torch_nor_triton(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(textwrap.dedent(CONFTEST))
    pytester.makepyfile(test_cuda=textwrap.dedent(SUITE))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2",
                                           "--kernelfix-device=interpret")
    result.assert_outcomes(passed=1)  # the worker that ran it had the shim
    assert (pytester.path / "controller.txt").read_text() == "|1"
    workers = [path.read_text() for path in pytester.path.glob("gw*.txt")]
    assert workers and all(text == "torch triton|1" for text in workers)


@pytest.mark.slow
def test_a_healing_controller_still_imports_neither(pytester: pytest.Pytester) -> None:
    """Workers record the launches; the controller heals from their reports."""
    make_project(pytester, bug="tanh")
    pytester.makeconftest(textwrap.dedent(CONFTEST))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--kernelfix",
                                           "--kernelfix-device=interpret")
    result.assert_outcomes(failed=5)
    assert (pytester.path / "controller.txt").read_text() == "|1"
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed", bug["reason"]


def test_a_configured_session_knows_an_xdist_controller(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once configured, a worker is known by workerinput, whatever the environment says."""
    from pytest_kernelfix.device import is_xdist_controller

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")  # inherited by a pytest started in a worker

    class Configured:
        def __init__(self, worker: bool, **options: object) -> None:
            self.option = SimpleNamespace(**{"numprocesses": None, "dist": "no", "tx": None,
                                             "usepdb": False, **options})
            if worker:
                self.workerinput: dict[str, object] = {}

    assert is_xdist_controller(Configured(False, numprocesses=2, dist="load"))  # type: ignore[arg-type]
    assert not is_xdist_controller(Configured(True, numprocesses=2, dist="load"))  # type: ignore[arg-type]
    assert not is_xdist_controller(Configured(False))  # type: ignore[arg-type]
