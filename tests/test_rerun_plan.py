"""The typed rerun contract: one default target, one place deciding the gate, a versioned plan."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_kernelfix.rerun.args import carried_args
from pytest_kernelfix.rerun.plan import (
    PLAN_ENV,
    PLAN_VERSION,
    DevicePlan,
    PhaseCommand,
    PlanError,
    ProbePlan,
    RerunPlan,
    device_plan,
    load_plan,
    phase_results,
)
from pytest_kernelfix.target import DEFAULT_CAPABILITY, DEFAULT_TARGET, capability_of, gate_enabled


def plan(**device: object) -> RerunPlan:
    return RerunPlan("/proj", "/tmp/box/proj", "/tmp/w/results.jsonl", "/tmp/w/imports",
                     ("tests/test_a.py::test_a",), DevicePlan(**device))  # type: ignore[arg-type]


def test_one_default_target_names_the_default_capability() -> None:
    assert capability_of(DEFAULT_TARGET) == DEFAULT_CAPABILITY
    assert capability_of("cuda:80") == (8, 0)
    assert capability_of("cuda:sm_89") == (8, 9)
    assert capability_of("cuda:100") == (10, 0)
    assert capability_of("hip:gfx942") == DEFAULT_CAPABILITY  # the shim still answers as a GPU
    assert not gate_enabled("off") and not gate_enabled(" None ") and gate_enabled("cuda:80")


@pytest.mark.parametrize(
    ("device", "target", "gate"),
    [("interpret", "cuda:80", "cuda:80"), ("interpret", "off", ""), ("cuda", "cuda:80", "")],
)
def test_the_gate_is_decided_in_one_place(device: str, target: str, gate: str) -> None:
    decided = device_plan(device=device, cuda_shim=False, target=target, cache_dir=Path("/c"))
    assert decided.gate_target == gate and decided.gate == bool(gate)
    assert decided.interpret == (device == "interpret") and decided.mode == device
    assert decided.cuda_shim is False and decided.cache_dir == "/c"


def test_a_plan_survives_json_whole(tmp_path: Path) -> None:
    original = plan(interpret=True, cuda_shim=False, capability=(8, 6), gate_target="cuda:86",
                    cache_dir="/cache")
    path = tmp_path / "plan.json"
    original.write(path)
    assert json.loads(path.read_text())["version"] == PLAN_VERSION
    assert load_plan({PLAN_ENV: str(path)}) == original
    assert load_plan({}) is None  # outside a rerun


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"version": PLAN_VERSION + 1}, "different plugin versions"),
        ({"version": None}, "different plugin versions"),
        ({"device": {"interpret": True}}, "incomplete or malformed"),
        ({"nodeids": None}, "incomplete or malformed"),
        ({"device": {**plan().to_json()["device"], "interpret": "yes"}}, "incomplete"),
    ],
)
def test_a_plan_of_another_version_or_shape_is_refused(change: dict[str, object],
                                                       problem: str) -> None:
    data = {**plan().to_json(), **change}
    with pytest.raises(PlanError, match=problem):
        RerunPlan.from_json(data)


def test_a_probing_rerun_names_what_it_probes_in_the_plan(tmp_path: Path) -> None:
    probe = ProbePlan(poison="scramble", kernels=("kernels/ops.py::scale_kernel",),
                      reach=True, fingerprint=True)
    poisoned = RerunPlan("/proj", "/tmp/box/proj", "/tmp/w/results.jsonl", "/tmp/w/imports",
                         ("tests/test_a.py::test_a",), DevicePlan(), probe)
    path = tmp_path / "plan.json"
    poisoned.write(path)
    assert load_plan({PLAN_ENV: str(path)}) == poisoned
    assert not plan().probe.active  # a plain rerun probes nothing
    data = poisoned.to_json()
    with pytest.raises(PlanError, match="incomplete or malformed"):
        RerunPlan.from_json({**data, "probe": {**data["probe"], "poison": "zeros"}})
    with pytest.raises(PlanError, match="incomplete or malformed"):
        RerunPlan.from_json({**data, "probe": {**data["probe"], "reach": "yes"}})
    with pytest.raises(PlanError, match=f"version 2 is not {PLAN_VERSION}"):  # an old plan
        RerunPlan.from_json({**{k: v for k, v in data.items() if k != "probe"},
                             "poison": "nan", "version": 2})
    with pytest.raises(PlanError, match="incomplete or malformed"):  # version 3: no control
        RerunPlan.from_json({k: v for k, v in data.items() if k != "control"})


def test_a_phased_child_reads_its_phases_as_typed_commands(tmp_path: Path) -> None:
    phased = replace(plan(), control=str(tmp_path / "commands.jsonl"))
    phased.write(tmp_path / "plan.json")
    assert load_plan({PLAN_ENV: str(tmp_path / "plan.json")}) == phased
    command = PhaseCommand(3, "sensitivity (nan)", (("a", "b"), ("c",)),
                           ProbePlan(poison="nan", kernels=("k.py::k",), reach=True),
                           stop_early=True, timeout=60.0)
    assert PhaseCommand.from_json(json.loads(json.dumps(command.to_json()))) == command
    with pytest.raises(PlanError, match="another plugin version"):
        PhaseCommand.from_json({**command.to_json(), "version": PLAN_VERSION - 1})
    with pytest.raises(PlanError, match="malformed"):
        PhaseCommand.from_json({**command.to_json(), "stop_early": "yes"})
    assert phase_results("/w/results.jsonl", 3, 1) == Path("/w/results-3-1.jsonl")


def test_an_unreadable_plan_file_is_a_plan_error(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text("{not json")
    with pytest.raises(PlanError, match="cannot be read"):
        load_plan({PLAN_ENV: str(tmp_path / "plan.json")})


def test_carried_args_keep_the_projects_options_and_drop_what_breaks_a_rerun() -> None:
    args = ["tests/", "-k", "gelu", "-p", "xdist", "-pno:randomly", "-W", "error",
            "--import-mode=importlib", "-o", "addopts=-x", "-o", "xfail_strict=true",
            "--strict-markers", "-p", "kernelfix", "--junitxml", "out.xml", "-x",
            "-p", "pytest_kernelfix.plugin", "-ppytest_kernelfix.plugin",
            "--mode", "quick", "--gpu-shapes=small", "-n", "2", "--kernelfix-rounds", "3",
            "--override-ini=addopts=-q", "-oaddopts=-v", "tests/test_k.py::test_a", "-v",
            "--co"]
    assert carried_args(args, ["tests/", "tests/test_k.py::test_a"]) == (
        "-p", "xdist", "-pno:randomly", "-W", "error", "--import-mode=importlib",
        "-oxfail_strict=true", "--strict-markers", "--mode", "quick", "--gpu-shapes=small",
        "-v",
    )
