"""Whole pytest sessions with --kernelfix on a real Triton project (real reruns).

Each test runs pytest in a subprocess on the project of ``kernel_project.py``, with a
replay cassette or litellm talking HTTP to the fake server, and checks what a user
sees: outcomes, the summary, the report files, and the patches.
"""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import pytest
from fake_llm import Delay, Reply, Status
from kernel_project import (
    BUGS,
    GOOD_LINE,
    KERNEL,
    TESTS,
    answer,
    git_apply_check,
    git_init,
    git_status,
    make_project,
    report_of,
    write_cassette,
)

from pytest_kernelfix.report.folder import GITIGNORE

FIX = answer(BUGS["offset"], GOOD_LINE, reason="scale, not offset")
INI_NO_TRITON = "[pytest]\npythonpath = .\nmarkers =\n    kernel: launches a Triton kernel\n"
SCHEMA = json.loads(resources.files("pytest_kernelfix").joinpath("report.schema.json").read_text())


def heal(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kernelfix", *args)


def test_healed_in_one_round(pytester: pytest.Pytester) -> None:
    kernel = make_project(pytester)
    before = kernel.read_bytes()
    git_init(pytester.path)
    tape = write_cassette(pytester.path / "tape.jsonl", [FIX], group="scale_kernel-*")
    result = heal(pytester, f"--kernelfix-model=replay:{tape}")

    result.assert_outcomes(failed=4, passed=1)  # the failures stay failures
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "project root" not in result.stdout.str()  # the rootdir is the project
    result.stdout.fnmatch_lines([
        "*kernelfix: healing scale_kernel-assertionerror-* (4 test(s); kernels/ops.py)",
        "*= kernelfix =*",
        "healed    scale_kernel-assertionerror-*: 1 round(s), 4 test(s), kernels/ops.py (exact)",
        "*git apply .kernelfix/scale_kernel-assertionerror-*.patch",
    ])
    assert kernel.read_bytes() == before  # report mode never touches the tree
    report = report_of(pytester.path)
    jsonschema.validate(report, SCHEMA)
    (bug,) = report["bugs"]
    assert bug["status"] == "healed" and bug["rounds"] == 1 and bug["levels"] == [["exact"]]
    assert len(bug["nodeids"]) == 4 and bug["calls"] == 1 and bug["prompt_tokens"] == 100
    patch = pytester.path / ".kernelfix" / bug["patch"]
    assert git_apply_check(pytester.path, patch).returncode == 0
    assert "-    y = x + factor\n+    y = x * factor" in patch.read_text()
    markdown = (pytester.path / ".kernelfix" / "report.md").read_text()
    assert "| `scale_kernel-assertionerror-" in markdown and "```diff" in markdown
    # the report dir's own .gitignore keeps it out of git status
    assert (pytester.path / ".kernelfix" / ".gitignore").read_text() == GITIGNORE
    assert ".kernelfix" not in git_status(pytester.path)


@pytest.mark.slow
def test_healed_in_two_rounds_through_feedback(pytester: pytest.Pytester) -> None:
    make_project(pytester)
    almost = answer(BUGS["offset"], "    y = x * factor + 1.0", reason="first guess")
    better = answer("    y = x * factor + 1.0", GOOD_LINE, reason="drop the offset")
    tape = write_cassette(pytester.path / "tape.jsonl", [almost, better])
    result = heal(pytester, f"--kernelfix-model=replay:{tape}")
    result.assert_outcomes(failed=4, passed=1)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed" and bug["rounds"] == 2
    first = bug["round_details"][0]["outcome"]
    # the rerun stops at the first failing test that still fails, and says so
    assert first.startswith("1 of 4 failing tests still fail (3 not run: the rerun stops "
                            "at the first that still fails): AssertionError")
    patch = (pytester.path / ".kernelfix" / bug["patch"]).read_text()
    assert "+    y = x * factor\n" in patch and "+ 1.0" not in patch


@pytest.mark.slow
def test_unhealable_after_n_rounds_with_the_reason(pytester: pytest.Pytester) -> None:
    make_project(pytester)
    wrong = [answer(BUGS["offset"], "    y = x - factor"),
             answer("    y = x - factor", "    y = x / factor")]
    tape = write_cassette(pytester.path / "tape.jsonl", wrong)
    result = heal(pytester, f"--kernelfix-model=replay:{tape}", "--kernelfix-rounds=2")
    result.assert_outcomes(failed=4, passed=1)
    result.stdout.fnmatch_lines(["unhealed  scale_kernel-*: not healed after 2 round(s); last:*"])
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "unhealed" and bug["rounds"] == 2 and bug["patch"] is None
    assert "still fail" in bug["reason"]
    assert not list((pytester.path / ".kernelfix").glob("*.patch"))


@pytest.mark.slow
def test_cassette_running_out_is_a_reason_not_a_crash(pytester: pytest.Pytester) -> None:
    make_project(pytester)
    tape = write_cassette(pytester.path / "tape.jsonl", [answer(BUGS["offset"], "    y = x")])
    result = heal(pytester, f"--kernelfix-model=replay:{tape}")
    result.assert_outcomes(failed=4, passed=1)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "unhealed"
    assert "no answer left" in bug["reason"] and "round 2" in bug["reason"]


@pytest.mark.slow
def test_edits_that_do_not_match_are_fed_back(pytester: pytest.Pytester) -> None:
    make_project(pytester)
    missing = answer("    result = compute(x, factor)", GOOD_LINE)
    tape = write_cassette(pytester.path / "tape.jsonl", [missing, FIX])
    result = heal(pytester, f"--kernelfix-model=replay:{tape}")
    result.assert_outcomes(failed=4, passed=1)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed" and bug["levels"] == [["none"], ["exact"]]
    error = bug["round_details"][0]["edits"][0]["error"]
    assert "levels tried: exact, trimmed, whitespace, fuzzy" in error
    assert "The most similar fragment is at line 16" in error  # a real line of the file
    assert "def scale(x, factor):" in error


def test_kernel_error_is_surfaced_and_healed_by_recipe(pytester: pytest.Pytester) -> None:
    """``tl.tanh`` fails inside the kernel; the recipes fixer needs no model. Its
    candidate is verified in stages that say when they start and end. A numerics bug
    beside it, for which no recipe exists, costs no rerun at all."""
    make_project(pytester, bug="tanh")
    shift = KERNEL.format(line=BUGS["offset"]).replace("scale", "shift")
    (pytester.path / "kernels" / "shift.py").write_text(shift)
    (pytester.path / "tests" / "test_shift.py").write_text(
        TESTS.split("\n\n\n@pytest.mark.kernel\ndef test_scale_zeros")[0].replace(
            "scale", "shift").replace("kernels.ops", "kernels.shift"))
    result = heal(pytester)  # default fixer: recipes
    result.assert_outcomes(failed=9)
    bugs = {bug["kernel"]: bug for bug in report_of(pytester.path)["bugs"]}
    bug = bugs["scale_kernel"]
    assert bug["error"] == "AttributeError: module 'triton.language' has no attribute 'tanh'"
    assert bug["status"] == "healed", bug["reason"]
    assert bug["round_details"][0]["source"].startswith("recipe")
    ran = {phase["name"]: len(phase["tests"]) for phase in bug["round_details"][0]["phases"]}
    assert ran["representative"] == 1 and ran["failing tests"] == 4  # of the 5 failing
    assert [phase["name"] for phase in bug["triage"]] == ["baseline"]
    assert len(bug["triage"][0]["tests"]) == 1  # reproduced on the representative alone
    result.stdout.fnmatch_lines([
        "*baseline: running 1 test(s)", "*baseline: 1 failed (* s)",
        "*representative: running 1 test(s)", "*representative: 1 passed (* s)",
        "*failing tests: running 4 test(s)", "*failing tests: 4 passed (* s)",
    ])

    bug = bugs["shift_kernel"]  # no recipe: no triage, no rerun
    assert bug["status"] == "unhealed" and "no recipe" in bug["reason"], bug["reason"]
    assert bug["reruns"]["count"] == 0 and bug["triage"] == []


@pytest.mark.slow
def test_a_plugin_loaded_by_module_name_heals_and_its_reruns_do_not_load_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not installed (entry points off): ``-p pytest_kernelfix.plugin`` loads it. Reruns
    must not carry that option along: their agent stands in for the plugin."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    make_project(pytester, bug="tanh")
    result = heal(pytester, "-p", "pytest_kernelfix.plugin")
    result.assert_outcomes(failed=5)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed", bug["reason"]


def test_non_kernel_failures_and_passing_tests_are_left_alone(pytester: pytest.Pytester) -> None:
    make_project(pytester)
    (pytester.path / "kernels" / "ops.py").write_text(
        (pytester.path / "kernels" / "ops.py").read_text().replace(BUGS["offset"], GOOD_LINE))
    pytester.makepyfile(test_plain="def test_plain():\n    assert 1 == 2\n")
    result = heal(pytester)
    result.assert_outcomes(failed=1, passed=5)
    assert "kernelfix: healing" not in result.stdout.str()
    assert report_of(pytester.path)["bugs"] == []  # a report that says why nothing healed
    result.stdout.fnmatch_lines([  # left alone, not forgotten: the summary counts it
        "1 failing test(s) not selected for healing (not marked kernel; kernelfix_select = "
        "kernel), first test_plain.py::test_plain",
    ])


@pytest.mark.slow
def test_litellm_over_http_with_a_500_and_a_timeout(pytester: pytest.Pytester, fake_llm) -> None:
    make_project(pytester)
    fake_llm.script(Status(500), Delay(5.0, Reply(FIX)), Reply(FIX))
    result = heal(pytester, "--kernelfix-model=openai/fake-model",
                  f"--kernelfix-api-base={fake_llm.url}", "--kernelfix-llm-timeout=1",
                  "--kernelfix-llm-retries=2")
    result.assert_outcomes(failed=4, passed=1)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed", bug["reason"]
    assert bug["calls"] == 1 and bug["prompt_tokens"] > 0
    assert len(fake_llm.requests) == 3  # 500, timed out, answered
    prompt = json.dumps(fake_llm.requests[-1]["messages"])
    assert "def scale_kernel" in prompt and "Tensor-likes are not close" in prompt
    assert "tests/test_ops.py" in prompt  # the test source as read-only context


@pytest.mark.slow
def test_apply_mode_leaves_a_tree_that_passes(pytester: pytest.Pytester,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = make_project(pytester)
    mode = kernel.stat().st_mode
    tape = write_cassette(pytester.path / "tape.jsonl", [FIX])
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kernelfix-apply",
                                           f"--kernelfix-model=replay:{tape}")
    result.assert_outcomes(failed=4, passed=1)  # this run's outcomes are not rewritten
    result.stdout.fnmatch_lines(["written to the working tree: kernels/ops.py"])
    assert GOOD_LINE + "\n" in kernel.read_text()
    assert kernel.stat().st_mode == mode
    (bug,) = report_of(pytester.path)["bugs"]
    saved = pytester.path / ".kernelfix" / "backup" / bug["id"] / "kernels" / "ops.py"
    assert BUGS["offset"] in saved.read_text()  # the original is kept for undo
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # a plain run on this CPU-only machine
    plain = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:kernelfix")
    plain.assert_outcomes(passed=5)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [("-n", "2"), ("--junitxml=junit.xml",)],
                         ids=["xdist", "junitxml"])
def test_same_heal_under_xdist_and_junitxml(pytester: pytest.Pytester,
                                            extra: tuple[str, ...]) -> None:
    make_project(pytester)
    tape = write_cassette(pytester.path / "tape.jsonl", [FIX])
    result = heal(pytester, f"--kernelfix-model=replay:{tape}", *extra)
    result.assert_outcomes(failed=4, passed=1)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed" and len(bug["nodeids"]) == 4
    if "--junitxml=junit.xml" in extra:
        junit = (pytester.path / "junit.xml").read_text()
        assert junit.count("<failure") == 4  # healing is reported beside, never instead


@pytest.mark.slow
def test_conftest_hook_supplies_the_edits(pytester: pytest.Pytester) -> None:
    """``pytest_kernelfix_propose`` answers before the fixer; reruns know the hook too."""
    make_project(pytester)
    pytester.makeconftest(
        """
        from pytest_kernelfix import Modification, Proposal, ProposalRequest

        def pytest_kernelfix_propose(request: ProposalRequest, config) -> Proposal | None:
            assert request.context.editable[0].path == "kernels/ops.py"
            edit = Modification("    y = x + factor", "    y = x * factor",
                                file="kernels/ops.py")
            return Proposal((edit,), analysis="scale, not offset")
        """
    )
    result = heal(pytester)  # the configured fixer (recipes) is never asked
    result.assert_outcomes(failed=4, passed=1)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed", bug["reason"]
    assert bug["round_details"][0]["source"] == "hook"


def test_failure_outside_project_code_is_skipped_with_the_reason(
    pytester: pytest.Pytester,
) -> None:
    """A kernel test that fails in the test itself has nothing a fix may edit."""
    make_project(pytester)
    (pytester.path / "kernels" / "ops.py").write_text(
        (pytester.path / "kernels" / "ops.py").read_text().replace(BUGS["offset"], GOOD_LINE))
    pytester.makepyfile(test_setup="""
        import pytest

        @pytest.mark.kernel
        def test_wrong_expectation():
            assert {"shape": (2, 3)} == {"shape": (3, 2)}
        """)
    result = heal(pytester)
    result.assert_outcomes(failed=1, passed=5)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "skipped" and bug["reason"].startswith("no editable source")
    assert bug["rounds"] == 0 and bug["files"] == []


def test_session_notes_reach_the_terminal_and_report_json(pytester: pytest.Pytester) -> None:
    """A note the session makes (here: launches cannot be recorded) is in report.json too."""
    pytester.makeini(INI_NO_TRITON)
    pytester.makeconftest("import sys\n\nsys.modules['triton.runtime.jit'] = None\n")
    pytester.mkpydir("pyops").joinpath("ops.py").write_text(
        "def double(x):\n    return x + 2\n")
    pytester.makepyfile(test_pyops=(
        "import pytest\n\nfrom pyops.ops import double\n\n\n@pytest.mark.kernel\n"
        "def test_double():\n    assert double(3) == 6\n"))
    result = heal(pytester, "--kernelfix-device", "interpret", "--kernelfix-base", "none")
    result.assert_outcomes(failed=1)
    note = "kernel launches are not recorded"
    result.stdout.fnmatch_lines([f"note: {note}*"])
    assert result.stdout.str().count(f"note: {note}") == 1  # once, not from two places
    (recorded,) = report_of(pytester.path)["notes"]
    assert recorded.startswith(note)


def test_capture_runs_where_tests_run_and_healing_where_reports_arrive(
    pytester: pytest.Pytester,
) -> None:
    """One object per role, held under StashKeys: xdist workers capture, the controller heals."""
    pytester.makeini(INI_NO_TRITON)
    pytester.makeconftest(
        """
        import json, os
        from pytest_kernelfix.plugin import capture_key, controller_key

        def pytest_sessionfinish(session):
            config = session.config
            role = "worker" if hasattr(config, "workerinput") else "main"
            names = sorted(name for name, _ in config.pluginmanager.list_name_plugin()
                           if str(name).startswith("kernelfix-"))
            seen = {"capture": capture_key in config.stash,
                    "controller": controller_key in config.stash, "names": names}
            with open(f"role-{role}-{os.getpid()}.json", "w") as handle:
                json.dump(seen, handle)
        """
    )
    pytester.makepyfile(test_a="def test_a():\n    pass\n\n\ndef test_b():\n    pass\n")

    def roles(*args: str) -> list[tuple[str, dict[str, object]]]:
        for old in pytester.path.glob("role-*.json"):
            old.unlink()
        heal(pytester, *args).assert_outcomes(passed=2)
        return sorted((path.name.split("-")[1], json.loads(path.read_text()))
                      for path in pytester.path.glob("role-*.json"))

    both = {"capture": True, "controller": True,
            "names": ["kernelfix-capture", "kernelfix-controller"]}
    assert roles() == [("main", both)]
    controller = {"capture": False, "controller": True, "names": ["kernelfix-controller"]}
    worker = {"capture": True, "controller": False, "names": ["kernelfix-capture"]}
    assert roles("-n", "2") == [("main", controller), ("worker", worker), ("worker", worker)]


def test_the_projects_own_options_reach_the_reruns(pytester: pytest.Pytester) -> None:
    """A conftest option picks what a node id runs (``--shapes quick``): the sandbox
    reruns get it too, or the failure would not reproduce there."""
    make_project(pytester)
    pytester.makeconftest(
        "def pytest_addoption(parser):\n"
        "    parser.addoption('--shapes', default='all')\n")
    (pytester.path / "tests" / "test_ops.py").write_text(
        "import pytest\nimport torch\n\nfrom kernels.ops import scale\n\n\n"
        "@pytest.mark.kernel\ndef test_scale_quick(request):\n"
        "    if request.config.getoption('--shapes') != 'quick':\n"
        "        pytest.skip('the full shapes need a GPU')\n"
        "    x = torch.arange(100, dtype=torch.float32)\n"
        "    torch.testing.assert_close(scale(x, 2.0), x * 2.0)\n")
    tape = write_cassette(pytester.path / "tape.jsonl", [FIX], group="scale_kernel-*")
    result = heal(pytester, "tests", "--shapes", "quick", f"--kernelfix-model=replay:{tape}")
    result.assert_outcomes(failed=1)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed", bug
