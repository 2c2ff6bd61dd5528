"""A whole healing session as plain stages: grouping, triage, rounds, reports.

The rerun runner is a fake that judges the sandbox's files as a rerun would (the bug is
fixed when the kernel file holds the fix), so these run in milliseconds; the real
subprocess reruns are proven in test_rerun_launcher.py and the session tests.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from factories import make_settings

from pytest_kernelfix.capture.errors import ErrorInfo, Frame
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.capture.records import Failure, PassedTest
from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.fixers.base import FixerError, Proposal, ProposalRequest, Usage
from pytest_kernelfix.fixers.prompting import render_messages
from pytest_kernelfix.heal.guards import build_guard
from pytest_kernelfix.locate.context import PROMPT_BUDGET
from pytest_kernelfix.project import Project
from pytest_kernelfix.report.github import annotation
from pytest_kernelfix.report.junit import bug_properties
from pytest_kernelfix.report.markdown_report import session_markdown
from pytest_kernelfix.report.model import SessionReport
from pytest_kernelfix.report.publish import ReportFiles, publish
from pytest_kernelfix.report.terminal import summary_lines
from pytest_kernelfix.rerun.launcher import RerunSetup, RerunSpec
from pytest_kernelfix.rerun.plan import DevicePlan
from pytest_kernelfix.rerun.report import RerunResult, TestOutcome
from pytest_kernelfix.session.inputs import SessionInputs, Stages
from pytest_kernelfix.session.interrupt import Cancel
from pytest_kernelfix.session.pipeline import run_healing

BUG, FIX = "    y = x + factor\n", "    y = x * factor\n"
KERNEL = f"def scale_kernel(x, factor):\n{BUG}    return y\n"
NODEIDS = ("tests/test_scale.py::test_scale[2]", "tests/test_scale.py::test_scale[3]")
REGRESSION = "tests/test_scale.py::test_scale_zero"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "ops.py").write_text(KERNEL)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_scale.py").write_text("def test_scale():\n    pass\n")
    return tmp_path


def failures(root: Path) -> tuple[Failure, ...]:
    kernel = str(root / "kernels" / "ops.py")
    test = str(root / "tests" / "test_scale.py")
    launch = KernelLaunch("scale_kernel", kernel, 1)
    frames = (Frame(test, 2, "test_scale", "assert_close(...)"),)
    return tuple(
        Failure(nodeid, test, ErrorInfo("AssertionError", f"Mismatched elements: {n} / 8",
                                        frames), "longrepr", (launch,))
        for n, nodeid in enumerate(NODEIDS, start=3)
    )


def inputs(root: Path, notes: tuple[str, ...] = (), **changes: object) -> SessionInputs:
    passed = (PassedTest(REGRESSION, (KernelLaunch("scale_kernel",
                                                   str(root / "kernels" / "ops.py"), 1),)),)
    return SessionInputs(
        failures=failures(root), passed=passed, settings=make_settings(root, **changes),
        setup=RerunSetup(root, 10.0, DevicePlan(interpret=True)), project=Project(root),
        notes=notes,
    )


class FakeRunner:
    """Reruns judged from the sandbox's kernel file: fixed means every test passes."""

    def __init__(self, *, reproduces: bool = True) -> None:
        self.reproduces = reproduces
        self.specs: list[RerunSpec] = []

    def __call__(self, spec: RerunSpec) -> RerunResult:
        self.specs.append(spec)
        fixed = FIX in (spec.sandbox_root / "kernels" / "ops.py").read_text()
        passing = fixed or not self.reproduces
        outcomes = tuple(
            TestOutcome(nodeid, "passed" if passing or nodeid == REGRESSION else "failed",
                        "call", launch_count=1)
            for nodeid in spec.nodeids
        )
        return RerunResult(outcomes, returncode=0 if passing else 1)


class Answers:
    """A scripted model: it renders the prompt as a live fixer would, then answers."""

    name = "scripted"

    def __init__(self, *proposals: Proposal) -> None:
        self.proposals = list(proposals)
        self.requests: list[ProposalRequest] = []

    def propose(self, request: ProposalRequest) -> Proposal:
        self.requests.append(request)
        proposal = self.proposals.pop(0)
        sent = sum(len(message["content"]) for message in render_messages(request))
        return replace(proposal, usage=replace(proposal.usage, prompt_chars=sent))


def heal_session(session: SessionInputs, stages: Stages) -> SessionReport:
    """What the controller does: heal, then publish the report files once."""
    report = run_healing(session, stages)
    publish(report, (ReportFiles(),))
    return report


def fix(old: str = BUG, new: str = FIX) -> Proposal:
    return Proposal((Modification(old, new, file="kernels/ops.py"),), source="scripted")


def test_a_session_heals_with_a_fake_runner_and_writes_its_artifacts(root: Path) -> None:
    runner = FakeRunner()
    fixer = Answers(fix("    y = x + factor\n", "    y = x - factor\n"), fix())
    report = heal_session(inputs(root), Stages(fixer=fixer, guard=build_guard(Project(root)),
                                              runner=runner))
    (bug,) = report.bugs
    assert bug.result.status == "healed", bug.result.reason
    assert len(bug.result.rounds) == 2  # round 1's change did not fix it; round 2 did
    assert bug.group.nodeids == NODEIDS  # one bug, two parametrized failures
    assert (root / ".kernelfix" / bug.patch_file).read_text().endswith(
        f"-{BUG}+{FIX}     return y\n")
    assert (root / "kernels" / "ops.py").read_text() == KERNEL  # report mode writes no tree
    # staged: the baseline reruns the representative (the smallest failing test) only;
    # each candidate runs it first, stopping there when it still fails; then the other
    # failing tests and the regression set in one rerun (failing tests first, stopping at
    # the first that fails), then the poisoned reruns on diverse failing tests, at the same
    # time (this fake poisons nothing, so the NaN run measures nothing and decides)
    first, other = NODEIDS
    steps = [(spec.nodeids, spec.stop_early, spec.probe.poison) for spec in runner.specs]
    assert steps[:4] == [
        ((first,), False, ""),  # baseline
        ((first,), True, ""),  # round 1: the representative still fails
        ((first,), True, ""), ((other, REGRESSION), True, ""),  # round 2
    ]
    assert sorted(steps[4:]) == [(NODEIDS, False, "nan"), (NODEIDS, False, "scramble")]
    assert [spec.probe.fingerprint for spec in runner.specs[:3]] == [True, True, True]
    assert all(spec.probe.reach for spec in runner.specs[4:])  # every check runs
    phases = [(p.name, p.nodeids) for p in bug.result.rounds[-1].phases]
    assert phases == [("representative", (first,)),
                      ("failing tests and regression", (other, REGRESSION)),
                      ("sensitivity (nan)", NODEIDS), ("sensitivity (scramble)", NODEIDS)]
    assert [p.name for p in bug.result.triage] == ["baseline"]
    assert "sensitivity not measured" in bug.result.rounds[-1].outcome
    assert f"{NODEIDS[0]}: failed" in fixer.requests[1].feedback  # round 2 saw round 1 fail


def test_the_report_says_what_the_model_was_shown_and_the_first_prompt_size(
    root: Path,
) -> None:
    from importlib import resources

    import jsonschema

    heal_session(inputs(root), Stages(fixer=Answers(fix()), runner=FakeRunner()))
    data = json.loads((root / ".kernelfix" / "report.json").read_text())
    schema = json.loads(resources.files("pytest_kernelfix").joinpath(
        "report.schema.json").read_text())
    jsonschema.validate(data, schema)
    (bug,) = data["bugs"]
    assert bug["shown"] == ["kernels/ops.py"]
    assert 3_000 < bug["first_prompt_chars"] <= PROMPT_BUDGET
    assert bug["first_prompt_tokens"] == math.ceil(bug["first_prompt_chars"] / 3.7)
    markdown = (root / ".kernelfix" / "report.md").read_text()
    assert f"~{bug['first_prompt_tokens']} tokens" in markdown
    assert "Shown to the model in round 1: `kernels/ops.py`" in markdown


def test_session_notes_reach_report_json_and_report_md(root: Path) -> None:
    note = "kernel launches are not recorded: No module named 'triton'"
    heal_session(inputs(root, notes=(note,)), Stages(fixer=Answers(fix()), runner=FakeRunner()))
    data = json.loads((root / ".kernelfix" / "report.json").read_text())
    assert data["notes"] == [note]
    assert f"> {note}" in (root / ".kernelfix" / "report.md").read_text()


def test_a_failure_that_does_not_reproduce_is_skipped_before_any_proposal(root: Path) -> None:
    fixer = Answers()
    report = heal_session(inputs(root), Stages(fixer=fixer, runner=FakeRunner(reproduces=False)))
    (bug,) = report.bugs
    assert bug.result.status == "skipped"
    assert "does not reproduce" in bug.result.reason
    assert fixer.requests == []


def test_with_the_cuda_shim_off_a_failure_the_shim_cures_is_not_healed(root: Path) -> None:
    def runner(spec: RerunSpec) -> RerunResult:
        passing = spec.setup.device.cuda_shim
        return RerunResult(tuple(TestOutcome(n, "passed" if passing else "failed", "call")
                                 for n in spec.nodeids), returncode=0)

    session = inputs(root)
    off = SessionInputs(session.failures, session.passed, session.settings,
                        RerunSetup(root, 10.0, DevicePlan(interpret=True, cuda_shim=False)),
                        session.project)
    fixer = Answers()
    (bug,) = heal_session(off, Stages(fixer=fixer, runner=runner)).bugs
    assert bug.result.status == "skipped"
    assert "kernelfix_cuda_shim is off" in bug.result.reason
    assert fixer.requests == []


def test_apply_mode_writes_the_winner_into_the_tree(root: Path) -> None:
    report = heal_session(inputs(root, apply=True), Stages(fixer=Answers(fix()),
                                                          runner=FakeRunner()))
    assert report.bugs[0].applied == ("kernels/ops.py",)
    assert (root / "kernels" / "ops.py").read_text() == KERNEL.replace(BUG, FIX)
    # the patch is in the tree already: no line tells anyone to apply it again
    lines = "\n".join(summary_lines(report, None))
    assert "git apply" not in lines and "written to the working tree: kernels/ops.py" in lines
    markdown = session_markdown(report)
    assert "git apply" not in markdown
    assert (f"Written to the working tree: kernels/ops.py (the originals are in "
            f"`.kernelfix/backup/{report.bugs[0].group.id}`)") in markdown


def test_progress_names_the_fixer_and_says_when_the_cache_answered(root: Path) -> None:
    from pytest_kernelfix.fixers.hook import HookFixer

    class Cached(Answers):
        name = "litellm:openai/m"

    cached = replace(fix(), usage=Usage(cache_hits=1))
    lines: list[str] = []
    unhooked = HookFixer(lambda request: None, Cached(cached), hooked=False)
    heal_session(inputs(root), Stages(fixer=unhooked, runner=FakeRunner(),
                                      progress=lines.append))
    said = [line.strip() for line in lines]
    assert "round 1: asking litellm:openai/m" in said
    assert any(line.startswith("round 1: answered from the answer cache, no call (")
               for line in said)
    hooked = HookFixer(lambda request: None, Cached(fix()), hooked=True)
    assert hooked.name == "the hook, then litellm:openai/m"


def test_a_fixer_that_loses_its_endpoint_stops_the_session_asking(root: Path) -> None:
    """The first bug pays its retries; the bugs after it are not asked, with one reason."""
    class Lost:
        name = "litellm:openai/m"

        def __init__(self) -> None:
            self.calls = 0

        def propose(self, request: ProposalRequest) -> Proposal:
            self.calls += 1
            raise FixerError("litellm:openai/m: connection failed after 3 attempts to "
                             "http://127.0.0.1:9/v1: Connection error.", ends_session=True)

    fixer = Lost()
    session = replace(inputs(root, workers=1), failures=two_error_types(root))
    first, second = heal_session(session, Stages(fixer=fixer, runner=FakeRunner())).bugs
    assert fixer.calls == 1
    assert first.result.status == "unhealed"
    assert first.result.reason == ("round 1: litellm:openai/m: connection failed after 3 "
                                   "attempts to http://127.0.0.1:9/v1: Connection error.")
    assert second.result.status == "skipped"
    assert second.result.reason == (
        f"not asked: the fixer stopped answering in {first.group.id}, round 1: "
        "litellm:openai/m: connection failed after 3 attempts to http://127.0.0.1:9/v1: "
        "Connection error.")


def two_error_types(root: Path) -> tuple[Failure, ...]:
    """One root cause, two error types: a helper bug seen as a mismatch and a bare assert."""
    (mismatch, _), test = failures(root), str(root / "tests" / "test_scale.py")
    launch = KernelLaunch("scale_kernel", str(root / "kernels" / "ops.py"), 1)
    frame = Frame(test, 5, "test_allclose", "assert torch.allclose(y, ref)")
    bare = Failure("tests/test_scale.py::test_allclose", test,
                   ErrorInfo("AssertionError", "assert False", (frame,)), "longrepr", (launch,))
    return mismatch, bare


def test_one_root_cause_heals_with_one_call_and_one_patch(root: Path) -> None:
    fixer = Answers(fix())
    runner = FakeRunner()
    session = replace(inputs(root), failures=two_error_types(root))
    report = heal_session(session, Stages(fixer=fixer, runner=runner))
    first, second = report.bugs
    assert first.group.id != second.group.id  # two bugs by their errors...
    assert first.result.status == second.result.status == "healed"
    assert len(fixer.requests) == 1  # ... and one call: the second is healed by the first
    assert second.result.healed_by == first.group.id and not second.patch_file
    assert second.result.rounds[0].source == "earlier patch"
    assert sorted(p.name for p in (root / ".kernelfix").glob("*.patch")) == [first.patch_file]
    lines = summary_lines(report, None)
    assert f"healed    {second.group.id}: healed by the patch of {first.group.id}" in "\n".join(
        lines)
    data = json.loads((root / ".kernelfix" / "report.json").read_text())
    assert data["bugs"][1]["healed_by"] == first.group.id and data["bugs"][1]["patch"] is None
    # CI shows it where the patch that heals it changes the file, and names that patch
    notice = annotation(second, report, root)
    line = next(i for i, text in enumerate(KERNEL.splitlines(), 1) if text == BUG.rstrip("\n"))
    assert notice.startswith(f"::notice file=kernels/ops.py,line={line},title=kernelfix healed "
                             f"{second.group.id}::")
    assert notice.endswith(f"%0APatch: .kernelfix/{first.patch_file}")
    patches = dict(bug_properties(report))[second.group.nodeids[0]]
    assert ("kernelfix_patch", f".kernelfix/{first.patch_file}") in patches


def test_in_apply_mode_a_bug_healed_by_an_earlier_patch_is_already_applied(root: Path) -> None:
    session = replace(inputs(root, apply=True), failures=two_error_types(root))
    first, second = heal_session(session, Stages(fixer=Answers(fix()),
                                                 runner=FakeRunner())).bugs
    assert first.applied == ("kernels/ops.py",)
    assert second.apply_error == f"already applied by {first.group.id}"
    assert "stale" not in second.apply_error


def test_a_second_bug_on_the_same_file_builds_its_patch_on_the_first(root: Path) -> None:
    """Two bugs in one file: the second heals from the text the first left, so the patches
    apply in the order printed."""
    two_bugs = KERNEL + "def other():\n    return 1\n"
    (root / "kernels" / "ops.py").write_text(two_bugs)

    class Runner(FakeRunner):
        def __call__(self, spec: RerunSpec) -> RerunResult:
            text = (spec.sandbox_root / "kernels" / "ops.py").read_text()
            self.specs.append(spec)
            passed = {NODEIDS[0]: FIX in text, NODEIDS[1]: FIX in text,
                      "tests/test_scale.py::test_allclose": "return 2" in text}
            return RerunResult(tuple(TestOutcome(n, "passed" if passed.get(n, True) else
                                                 "failed", "call", launch_count=1)
                                     for n in spec.nodeids), returncode=0)

    second_fix = Proposal((Modification("    return 1\n", "    return 2\n",
                                        file="kernels/ops.py"),), source="scripted")
    session = replace(inputs(root), failures=two_error_types(root))
    first, second = heal_session(session, Stages(fixer=Answers(fix(), second_fix),
                                                 runner=Runner())).bugs
    assert first.result.status == second.result.status == "healed"
    assert second.builds_on == (first.group.id,) and not second.result.healed_by
    patches = [(root / ".kernelfix" / bug.patch_file).read_text() for bug in (first, second)]
    assert f"-{BUG}" in patches[0] and f"-{BUG}" not in patches[1]  # the second starts after
    assert "+    return 2" in patches[1]


def test_a_free_fixer_without_an_answer_costs_no_rerun(root: Path) -> None:
    class NoRecipe:
        name = "recipes"
        free = True

        def propose(self, request: ProposalRequest) -> Proposal:
            raise FixerError("no recipe for AssertionError: Mismatched elements")

    runner = FakeRunner()
    (bug,) = heal_session(inputs(root), Stages(fixer=NoRecipe(), runner=runner)).bugs
    assert bug.result.status == "unhealed"
    assert bug.result.reason == "round 1: no recipe for AssertionError: Mismatched elements"
    assert runner.specs == []


def test_a_free_fixer_is_asked_before_the_baseline_and_once(root: Path) -> None:
    fixer = Answers(fix())
    fixer.free = True  # type: ignore[attr-defined]
    runner = FakeRunner()
    (bug,) = heal_session(inputs(root), Stages(fixer=fixer, runner=runner)).bugs
    assert bug.result.status == "healed" and len(fixer.requests) == 1
    assert bug.result.seconds >= sum(p.seconds for p in bug.result.triage)


# -- several bugs: parallel workers, chains of bugs that share a file ------------------------

LETTERS = ("a", "b", "c", "d")
#: Bug c launches kernels of a.py and c.py: it shares a.py with bug a, so a and c form one
#: chain, healed in order by one worker; b and d heal beside them.
LAUNCHED = {"a": ("a",), "b": ("b",), "c": ("a", "c"), "d": ("d",)}


def many_bugs(root: Path) -> tuple[Failure, ...]:
    (root / "kernels" / "ops.py").unlink()
    for letter in LETTERS:
        (root / "kernels" / f"{letter}.py").write_text(KERNEL.replace("scale_", f"{letter}_"))
    failures = []
    for letter in LETTERS:
        test = str(root / "tests" / f"test_{letter}.py")
        launches = tuple(KernelLaunch(f"{k}_kernel", str(root / "kernels" / f"{k}.py"), 1)
                         for k in LAUNCHED[letter])
        frames = (Frame(test, 2, f"test_{letter}", "assert_close(...)"),)
        error = ErrorInfo("AssertionError", f"Mismatched elements: 3 / 8 ({letter})", frames)
        failures.append(Failure(f"tests/test_{letter}.py::test_{letter}", test, error,
                                "longrepr", launches))
    return tuple(failures)


def letter_of(nodeid: str) -> str:
    return nodeid.rpartition("::test_")[2]


class ParallelRunner:
    """Judges each bug by its own kernel file, and records which reruns overlapped."""

    def __init__(self, parallel: bool) -> None:
        self.lock = threading.Lock()
        self.running: set[str] = set()
        self.overlaps: set[frozenset[str]] = set()
        self.log: list[tuple[str, str, Path]] = []  # (event, letter, sandbox)
        # the baselines of a and b wait for each other: only parallel workers get past
        self.barrier = threading.Barrier(2, timeout=20) if parallel else None

    def __call__(self, spec: RerunSpec) -> RerunResult:
        letter = letter_of(spec.nodeids[0])
        with self.lock:
            first = not any(e == "start" and x == letter for e, x, _ in self.log)
            self.log.append(("start", letter, spec.sandbox_root))
            self.running.add(letter)
            if len(self.running) > 1:
                self.overlaps.add(frozenset(self.running))
        if self.barrier is not None and first and letter in "ab":
            self.barrier.wait()
        time.sleep(0.02)
        fixed = FIX in (spec.sandbox_root / "kernels" / f"{letter}.py").read_text()
        with self.lock:
            self.running.discard(letter)
            self.log.append(("end", letter, spec.sandbox_root))
        return RerunResult(tuple(TestOutcome(n, "passed" if fixed else "failed", "call",
                                             launch_count=1) for n in spec.nodeids),
                           returncode=0 if fixed else 1)


class PerBugAnswers:
    """Round 1 misses, round 2 fixes the bug's own file; safe to call from threads."""

    name = "scripted"

    def propose(self, request: ProposalRequest) -> Proposal:
        letter = letter_of(request.context.nodeids[0])
        new = "    y = x - factor\n" if request.round == 1 else FIX
        old = BUG if request.round == 1 else "    y = x - factor\n"
        return Proposal((Modification(old, new, file=f"kernels/{letter}.py"),),
                        source="scripted")


def heal_many(root: Path, workers: int) -> tuple[SessionReport, ParallelRunner, list[str]]:
    session = inputs(root, workers=workers)
    session = replace(session, failures=many_bugs(root), passed=())
    runner = ParallelRunner(parallel=workers > 1)
    lines: list[str] = []
    report = heal_session(session, Stages(fixer=PerBugAnswers(), runner=runner,
                                         progress=lines.append))
    return report, runner, lines


def test_bugs_heal_in_parallel_with_the_patches_and_order_of_a_sequential_session(
    tmp_path: Path,
) -> None:
    roots = []
    for name in ("one", "two"):
        (tmp_path / name / "kernels").mkdir(parents=True)
        (tmp_path / name / "kernels" / "ops.py").write_text(KERNEL)
        (tmp_path / name / "tests").mkdir()
        roots.append(tmp_path / name)
    sequential, one, _ = heal_many(roots[0], workers=1)
    parallel, two, lines = heal_many(roots[1], workers=2)

    ids = [bug.group.id for bug in sequential.bugs]
    assert [bug.group.id for bug in parallel.bugs] == ids  # grouping order, both ways
    assert [letter_of(bug.group.nodeids[0]) for bug in parallel.bugs] == list(LETTERS)
    assert all(bug.result.status == "healed" for bug in parallel.bugs)
    for bug in sequential.bugs:
        assert (roots[0] / ".kernelfix" / bug.patch_file).read_text() == (
            roots[1] / ".kernelfix" / bug.patch_file).read_text()
    assert one.overlaps == set()  # one worker: one rerun at a time
    assert frozenset("ab") in two.overlaps
    assert not any({"a", "c"} <= overlap for overlap in two.overlaps)  # a chain stays in order
    ends_of_a = max(i for i, (e, x, _) in enumerate(two.log) if e == "end" and x == "a")
    assert min(i for i, (e, x, _) in enumerate(two.log) if x == "c") > ends_of_a
    assert len({box for e, x, box in two.log if x in "ac"}) == 1  # one sandbox per chain
    assert len({box for _, _, box in two.log}) == 2  # one per worker
    report = json.loads((roots[1] / ".kernelfix" / "report.json").read_text())
    assert report["reruns"]["workers"] == 2 and sequential.workers == 1
    # the baseline, two rounds, the winner's two poisoned reruns (made at the same time);
    # c shares a.py with a, so a's winner is tried on c first (one rerun, its
    # representative still fails)
    assert [bug["reruns"]["count"] for bug in report["bugs"]] == [5, 5, 6, 5]
    assert report["reruns"]["count"] == 21 == len(two.log) // 2
    rounds = [line for line in lines if "round " in line]
    assert rounds and all(line.split(": ", 1)[0] in ids for line in rounds)  # named bugs
    markdown = (roots[1] / ".kernelfix" / "report.md").read_text()
    assert "Sandbox reruns: 21 (subprocess) in 21 child process(es), " in markdown
    assert ", 2 worker(s)." in markdown


def test_workers_on_a_gpu_each_pin_their_reruns_to_their_own_gpu(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    session = inputs(root, workers=0)  # auto: one worker per visible GPU
    session = replace(session, failures=many_bugs(root), passed=(),
                      setup=RerunSetup(root, 10.0, DevicePlan(interpret=False)))
    seen: dict[str, set[str]] = {}
    runner = ParallelRunner(parallel=True)

    def pinned(spec: RerunSpec) -> RerunResult:
        gpu = spec.setup.env["CUDA_VISIBLE_DEVICES"]
        seen.setdefault(letter_of(spec.nodeids[0]), set()).add(gpu)
        return runner(spec)

    report = heal_session(session, Stages(fixer=PerBugAnswers(), runner=pinned))
    assert report.workers == 2
    assert all(len(gpus) == 1 for gpus in seen.values())  # a bug stays on its worker's GPU
    assert set().union(*seen.values()) == {"3", "5"}
    assert seen["a"] == seen["c"]  # one chain, one worker


def test_reruns_get_the_sessions_jobs_and_say_how_far_they_are(root: Path) -> None:
    runner = FakeRunner()

    def talking(spec: RerunSpec) -> RerunResult:
        if spec.progress is not None:  # as run_tests does while a long rerun runs
            spec.progress(1, len(spec.nodeids), 12.4)
        return runner(spec)

    lines: list[str] = []
    heal_session(inputs(root, rerun_jobs=3),
                 Stages(fixer=Answers(fix()), runner=talking, progress=lines.append))
    assert {spec.setup.jobs for spec in runner.specs} == {3}
    assert "  rerun: 1 of 1 test(s) finished after 12 s" in lines  # the baseline


def test_a_stopped_rerun_names_the_failing_tests_it_did_not_run() -> None:
    from pytest_kernelfix.verify.judge import Expectations, judge

    nodeids = ("t.py::a", "t.py::b", "t.py::c")
    stopped = RerunResult((TestOutcome("t.py::a", "passed", "call", launch_count=1),
                           TestOutcome("t.py::b", "failed", "call")), returncode=1)
    verdict = judge(stopped, Expectations(nodeids))
    assert verdict.kind == "failing"
    assert verdict.summary == ("1 of 3 failing tests still fail (1 not run: the rerun stops at "
                               "the first that still fails)")
    assert "t.py::b: failed" in verdict.feedback and "t.py::c" not in verdict.feedback


def test_the_token_cap_stops_the_session_between_rounds(root: Path) -> None:
    """``max_tokens`` from the settings reaches the session's fixer: the answer that
    crossed the cap was verified, the next round was not bought."""
    wrong = Proposal((Modification(BUG, "    y = x - factor\n", file="kernels/ops.py"),),
                     usage=Usage(1, 900, 300), source="scripted")
    fixer = Answers(wrong, fix())
    report = heal_session(inputs(root, rounds=3, max_tokens=1000),
                         Stages(fixer=fixer, runner=FakeRunner()))
    (bug,) = report.bugs
    assert len(fixer.requests) == 1  # round 2's answer was never asked for
    assert (bug.result.status, bug.result.reason) == (
        "unhealed",
        "round 2: the session's budget is spent: 1200 of 1000 tokens (--kernelfix-max-tokens)")
    data = json.loads((root / ".kernelfix" / "report.json").read_text())
    assert data["budget"] == {"max_cost": None, "max_tokens": 1000}
    assert data["totals"]["prompt_tokens"] + data["totals"]["completion_tokens"] == 1200


def test_a_slow_fixer_is_announced_with_lines_while_it_is_awaited(
    root: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pytest_kernelfix.session import asking

    monkeypatch.setattr(asking, "HEARTBEAT", 0.05)

    class Slow(Answers):
        def propose(self, request: ProposalRequest) -> Proposal:
            time.sleep(0.3)
            return super().propose(request)

    lines: list[str] = []
    report = heal_session(inputs(root), Stages(fixer=Slow(fix()), runner=FakeRunner(),
                                               progress=lines.append))
    said = [line.strip() for line in lines]
    asked = said.index("round 1: asking scripted")
    assert said[asked + 1].startswith("round 1: still waiting for scripted (")
    assert any(line.startswith("round 1: answered in ") for line in said[asked:])
    start = said.index("baseline: running 1 test(s)")  # every phase starts and ends
    assert said[start + 1].startswith("baseline: 1 failed (") and said[start + 1].endswith(" s)")
    assert [line.split(" (")[0] for line in said
            if line.startswith("failing tests and regression: ")] == [
        "failing tests and regression: running 2 test(s)",
        "failing tests and regression: 2 passed",
        "failing tests and regression: 2 test(s), 2 passed → step passed"]
    # one vocabulary: each step reads the same in the terminal and in report.md, its tests'
    # results beside the step's own outcome (poisoned tests fail when the step passes)
    markdown = (root / ".kernelfix" / "report.md").read_text()
    (verified,) = [line for line in markdown.splitlines() if "- verified: " in line]
    steps = verified.split("- verified: ")[1].split(" → step ")
    decided = [line for line in said if " → step " in line]
    judged = [p for p in report.bugs[0].result.rounds[-1].phases if p.outcome != "ran"]
    assert len(decided) == len(judged) == len(steps) - 1 == 3
    assert all(line in verified for line in decided)
    assert "sensitivity (nan): 2 test(s), " in verified


# -- one root cause, one bug: the limit and re-verification ---------------------------------


def test_bugs_an_earlier_patch_heals_do_not_count_toward_the_limit(root: Path) -> None:
    """Two bugs of one file (one root cause, two error types) and a third of another
    file, with room for one bug: the first heals, its patch heals the second without a
    place of its own, and the third is over the limit."""
    (root / "kernels" / "other.py").write_text(KERNEL.replace("scale_", "other_"))
    test = str(root / "tests" / "test_scale.py")
    third = Failure("tests/test_scale.py::test_other", test,
                    ErrorInfo("AssertionError", "Mismatched elements: 1 / 8",
                              (Frame(test, 9, "test_other", "assert_close(...)"),)), "longrepr",
                    (KernelLaunch("other_kernel", str(root / "kernels" / "other.py"), 1),))
    runner = FakeRunner()
    session = replace(inputs(root, max_groups=1, workers=1),
                      failures=(*two_error_types(root), third))
    first, second, over = heal_session(session, Stages(fixer=Answers(fix()),
                                                       runner=runner)).bugs
    assert first.result.status == second.result.status == "healed"
    assert second.result.healed_by == first.group.id
    assert (over.result.status, over.result.reason) == (
        "skipped", "over the limit of 1 bugs per session (--kernelfix-max-groups)")
    # the second bug reruns its own test, not the regression test the first patch passed
    mine = [spec.nodeids for spec in runner.specs
            if "tests/test_scale.py::test_allclose" in spec.nodeids]
    assert mine and all(REGRESSION not in nodeids for nodeids in mine)
    assert any(REGRESSION in spec.nodeids for spec in runner.specs)  # the first bug's
    (record,) = second.result.rounds
    assert (f"1 regression test(s) this patch was already verified passing on (for "
            f"{first.group.id}) were not rerun") in record.notes


def test_a_file_that_is_not_utf8_is_named_with_its_encoding(root: Path) -> None:
    (root / "kernels" / "ops.py").write_bytes(
        b"# -*- coding: latin-1 -*-\n# \xe9\n" + KERNEL.encode())
    runner = FakeRunner()
    (bug,) = heal_session(inputs(root), Stages(fixer=Answers(), runner=runner)).bugs
    assert bug.result.status == "skipped"
    assert bug.result.reason.startswith(
        "cannot heal: kernels/ops.py is encoded as latin-1 (its coding declaration), not UTF-8")
    assert runner.specs == []


# -- interrupted sessions: what was finished is kept -----------------------------------------


class InterruptingRunner(FakeRunner):
    """Judges kernels/a.py and b.py; Ctrl-C arrives while b's fix is verified."""

    def __call__(self, spec: RerunSpec) -> RerunResult:
        self.specs.append(spec)
        letter = letter_of(spec.nodeids[0])
        fixed = FIX in (spec.sandbox_root / "kernels" / f"{letter}.py").read_text()
        if letter == "b" and fixed:
            raise KeyboardInterrupt
        return RerunResult(tuple(TestOutcome(n, "passed" if fixed else "failed", "call",
                                             launch_count=1) for n in spec.nodeids),
                           returncode=0 if fixed else 1)


def paid_fix(letter: str) -> Proposal:
    return Proposal((Modification(BUG, FIX, file=f"kernels/{letter}.py"),), source="scripted",
                    usage=Usage(calls=1, prompt_tokens=100, completion_tokens=20, cost=0.01))


def test_an_interrupt_keeps_the_healed_bugs_and_the_calls_spent(root: Path) -> None:
    """Ctrl-C while the second bug's answer is verified: the first keeps its patch (and,
    in apply mode, is written), the second's paid round is reported, nothing of it is
    written, and the report says it was interrupted."""
    two = many_bugs(root)[:2]
    session = replace(inputs(root, apply=True, workers=1), failures=two, passed=())
    report = heal_session(session, Stages(fixer=Answers(paid_fix("a"), paid_fix("b")),
                                          runner=InterruptingRunner()))
    healed, stopped = report.bugs
    assert report.interrupted
    assert healed.result.status == "healed" and healed.applied == ("kernels/a.py",)
    assert (root / ".kernelfix" / healed.patch_file).is_file()
    assert FIX in (root / "kernels" / "a.py").read_text()
    assert (root / "kernels" / "b.py").read_text() == KERNEL.replace("scale_", "b_")
    assert stopped.result.status == "unhealed" and not stopped.applied
    assert stopped.result.reason == "interrupted in round 1: nothing more was tried (Ctrl-C)"
    (record,) = stopped.result.rounds
    assert record.outcome == "interrupted while its answer was being tried"
    assert report.usage.calls == 2 and report.usage.cost == pytest.approx(0.02)
    data = json.loads((root / ".kernelfix" / "report.json").read_text())
    assert data["interrupted"] is True and data["schema_version"] == 3
    assert data["totals"]["calls"] == 2
    assert data["notes"][-1] == ("the session was interrupted (Ctrl-C): 1 bug(s) healed "
                                 "before it keep their patches; 1 bug(s) were stopped or not "
                                 "started")
    assert "**Interrupted**" in (root / ".kernelfix" / "report.md").read_text()


def test_an_interrupt_before_healing_reports_every_bug_not_started(root: Path) -> None:
    """The test run itself was interrupted: no rerun, no call, a report that says so."""
    cancel = Cancel()
    cancel.set("SIGTERM")
    runner, fixer = FakeRunner(), Answers()
    report = heal_session(inputs(root), Stages(fixer=fixer, runner=runner, cancel=cancel))
    (bug,) = report.bugs
    assert report.interrupted and runner.specs == [] and fixer.requests == []
    assert bug.result.reason == ("not healed: the session was interrupted (SIGTERM) before "
                                 "its turn")


def test_parallel_workers_stop_at_their_next_step_once_the_session_is_cancelled(
        root: Path) -> None:
    """Healing runs in worker threads, the interrupt lands elsewhere: each worker stops
    at its next rerun or question, the bugs not started are reported so."""
    cancel = Cancel()

    class Cancelling(PerBugAnswers):
        def propose(self, request: ProposalRequest) -> Proposal:
            if letter_of(request.context.nodeids[0]) == "b":
                cancel.set("SIGTERM")  # the main thread caught a SIGTERM
            return super().propose(request)

    session = replace(inputs(root, workers=2), failures=many_bugs(root), passed=())
    report = heal_session(session, Stages(fixer=Cancelling(), runner=ParallelRunner(False),
                                          cancel=cancel))
    assert report.interrupted
    bugs = {letter_of(bug.group.nodeids[0]): bug.result for bug in report.bugs}
    assert bugs["b"].reason == "interrupted in round 1: nothing more was tried (SIGTERM)"
    assert bugs["d"].reason == ("not healed: the session was interrupted (SIGTERM) before "
                                "its turn")
    assert all("(SIGTERM)" in result.reason for result in bugs.values()
               if result.status != "healed")
