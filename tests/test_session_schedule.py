"""Which bugs heal together and on how many workers."""

from __future__ import annotations

import pytest

from pytest_kernelfix.capture.errors import ErrorInfo
from pytest_kernelfix.capture.records import Failure
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.session.schedule import (
    chains,
    cpu_count,
    rerun_jobs,
    visible_gpus,
    worker_count,
    worker_env,
)


def group(name: str, *files: str) -> BugGroup:
    failure = Failure(f"t.py::{name}", "t.py", ErrorInfo("E", "m"), "")
    return BugGroup(name, name, "sig", files, (failure,))


def test_bugs_that_share_a_file_even_through_another_bug_form_one_chain() -> None:
    groups = [group("a", "k/a.py"), group("b", "k/b.py"), group("c", "k/c.py", "k/a.py"),
              group("d", "k/d.py", "k/c.py"), group("e"), group("f", "k/f.py")]
    assert chains(groups) == [[0, 2, 3], [1], [4], [5]]
    assert chains([]) == []


def test_worker_count_defaults_to_one_per_gpu_or_one_per_core() -> None:
    assert worker_count(3, "interpret") == 3 and worker_count(3, "cuda", ("0",)) == 3
    assert worker_count(0, "cuda", ("0", "1", "2")) == 3
    assert worker_count(0, "cuda", ()) == 1
    assert worker_count(0, "interpret") == cpu_count()


def test_a_rerun_uses_the_cores_left_to_its_worker_and_few_children_on_a_gpu() -> None:
    assert rerun_jobs(3, 4, "interpret", 2) == 3  # as asked, whatever the machine
    assert rerun_jobs(0, 1, "interpret", 2) == 2
    assert rerun_jobs(0, 2, "interpret", 16) == 8
    assert rerun_jobs(0, 3, "interpret", 2) == 1  # more workers than cores: one child each
    assert rerun_jobs(0, 1, "cuda", 16) == 2 and rerun_jobs(0, 8, "cuda", 8) == 1
    assert rerun_jobs(5, 1, "cuda", 2) == 5


def test_visible_gpus_come_from_the_environment_first(monkeypatch: pytest.MonkeyPatch) -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2, 3,"}) == ("2", "3")
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-1a2b"}) == ("GPU-1a2b",)
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == ()
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert visible_gpus({}) == ("0", "1")


def test_each_worker_is_pinned_to_its_own_gpu_only_when_several_share_them() -> None:
    gpus = ("3", "5")
    assert [worker_env(w, gpus, 2) for w in range(2)] == [
        {"CUDA_VISIBLE_DEVICES": "3"}, {"CUDA_VISIBLE_DEVICES": "5"}]
    assert worker_env(2, gpus, 3) == {"CUDA_VISIBLE_DEVICES": "3"}  # more workers than GPUs
    assert worker_env(0, gpus, 1) == {} and worker_env(0, (), 2) == {}
