"""Whole sessions: bugs healed in parallel give the patches of a sequential session.

Four bugs in four kernel files, answered by a conftest hook (which the controller calls
from its worker threads), healed with one worker and with two: the same patches, the
same report order, forked reruns, and progress lines that name their bug.
"""

from __future__ import annotations

import json

import pytest
from hostile.project import BUG, FIX, write_project

HOOK = f"""
from pytest_kernelfix import Modification


def pytest_kernelfix_propose(request, config):
    name = request.context.group_id.split("_kernel")[0]
    return [Modification({BUG!r}, {FIX!r}, file=f"kernels/{{name}}.py")]
"""


def session(pytester: pytest.Pytester, workers: int) -> tuple[dict, str]:  # type: ignore[type-arg]
    report_dir = f"report{workers}"
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--kernelfix",
        f"--kernelfix-workers={workers}", f"--kernelfix-report-dir={report_dir}", timeout=600)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(failed=4, passed=1)
    report = json.loads((pytester.path / report_dir / "report.json").read_text())
    patches = "".join((pytester.path / report_dir / bug["patch"]).read_text()
                      for bug in report["bugs"])
    return report, patches + result.stdout.str()


@pytest.mark.slow
def test_parallel_workers_heal_like_one(pytester: pytest.Pytester) -> None:
    write_project(pytester.path, "k1", "k2", "k3", "k4")
    pytester.makeconftest(HOOK)
    one, one_text = session(pytester, 1)
    two, two_text = session(pytester, 2)

    assert [bug["id"] for bug in two["bugs"]] == [bug["id"] for bug in one["bugs"]]
    assert [bug["status"] for bug in two["bugs"]] == ["healed"] * 4
    patches = [text.split("=" * 10)[0] for text in (one_text, two_text)]
    assert patches[0].count("+    tl.store(out_ptr + offsets, x * factor") == 4
    assert patches[0] == patches[1]  # the same patches, in the same order
    assert one["reruns"]["workers"] == 1 and two["reruns"]["workers"] == 2
    for report in (one, two):
        assert report["reruns"]["mode"] == "fork", report["reruns"]["fallbacks"]
        # the baseline, the fix, then its sensitivity reruns (NaN, then scrambled outputs)
        assert [bug["reruns"]["count"] for bug in report["bugs"]] == [4] * 4
    ids = [bug["id"] for bug in two["bugs"]]
    rounds = [line for line in two_text.splitlines() if "round 1 (" in line]
    assert sorted(line.split(": ")[1] for line in rounds) == sorted(ids)  # named bugs
