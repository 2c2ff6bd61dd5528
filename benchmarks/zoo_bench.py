"""A zoo of real Triton projects, each tried as a new user would: first contact, then bugs.

    python benchmarks/zoo_bench.py --checkout liger=/path/to/Liger-Kernel \\
        --python liger=/path/to/venv/bin/python [--checkout NAME=PATH ...] \\
        [--work DIR] [--only PROJECT ...] [--bugs NAME ...] [--no-bugs] [--json OUT]

``zoo_projects.json`` lists public Triton projects nobody tuned the plugin for. Per
project: the repository and the commit tried, how it was set up on a CPU-only machine
(``setup``: its README's steps, with what had to change), a selection of its own kernel
tests that runs in minutes on the CPU, and three bugs injected into code its tests launch:
a flipped operator, an off-by-one mask, a wrong stride or shape unpack, each an exact
old/new text edit of one file with a description. A project that cannot run on the CPU
at all says why (``cpu``) and is counted apart.

Nothing of theirs is committed here. A checkout is a git clone of the project; a project
whose checkout is not given, or is absent, is skipped. Its trees are made at run time
under ``--work`` with :func:`historic_bench.clean_tree` (``git archive`` of the recorded
commit, plus the project's ``compat`` edits). Its tests run with the project's own
interpreter (``--python NAME=PATH``: the venv its README's set-up made, with the plugin
installed; default: this one), the tree first on ``PYTHONPATH`` where ``env`` says so.

Per project, on fresh copies of the trees:

- **plain**: the selection with ``--kernelfix-device interpret`` and no healing (how a
  CPU-only user runs a GPU suite), its counts and time;
- **as is**: ``pytest SELECTION --kernelfix --kernelfix-select=launched``, the command a
  new user runs once the README told them a suite that marks nothing opts in with
  ``launched``: it must end with a report and no INTERNALERROR;
- **each bug**: the same command on the tree with the bug injected, the oracle of
  ``historic_bench`` answering (``-p historic_oracle``: the true fix, i.e. the edit
  undone, whenever the prompt shows the faulty lines).

Per bug: report written, INTERNALERROR, the failing tests captured (every test the run
counted as failed is in the report: in a bug, or unselected with the reason), the faulty
lines in the first prompt, and healed with the oracle (:func:`historic_bench.judge`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import historic_bench as hb  # noqa: E402  (a benchmark beside this one)

CATALOGUE = HERE / "zoo_projects.json"
KINDS = ("operator", "mask", "stride")  # the three kinds of injected bug the issue asks for


@dataclass(frozen=True)
class InjectedBug:
    name: str
    kind: str  # one of KINDS
    file: str
    old: str  # occurs exactly once in the clean file
    new: str
    description: str


@dataclass(frozen=True)
class ZooProject:
    project: hb.Project  # repo, commit, paths, env, args, compat: as historic_bench has them
    setup: tuple[str, ...]  # how it was set up on a CPU-only machine, step by step
    selection: tuple[str, ...]  # node ids of its own kernel tests
    cpu: str  # "" when its selection runs on the CPU; else why not, in one line
    bugs: tuple[InjectedBug, ...]


def load(path: Path = CATALOGUE) -> dict[str, ZooProject]:
    data = json.loads(path.read_text())
    zoo = {}
    for name, raw in data["projects"].items():
        project = hb.Project(
            name=name, repo=raw["repo"], head=raw["head"], paths=tuple(raw["paths"]),
            exclude=tuple(raw.get("exclude", ())), env=dict(raw.get("env", {})),
            args=tuple(raw.get("args", ())),
            compat=tuple(hb.Compat(**c) for c in raw.get("compat", ())))
        bugs = tuple(InjectedBug(**bug) for bug in raw.get("bugs", ()))
        unknown = [bug.name for bug in bugs if bug.kind not in KINDS]
        if unknown:
            raise ValueError(f"{name}: bugs of no known kind: {unknown}")
        zoo[name] = ZooProject(project, tuple(raw.get("setup", ())),
                               tuple(raw.get("selection", ())), raw.get("cpu", ""), bugs)
    return zoo


def bugged_tree(bug: InjectedBug, project: hb.Project, clean: Path, work: Path) -> Path:
    """The clean tree with ``bug`` injected; made once per work dir and edit (an edited
    catalogue entry makes it anew)."""
    tree = work / "trees" / f"{project.name}-{bug.name}"
    stamp = json.dumps([project.head, bug.file, bug.old, bug.new]) + "\n"
    if (tree / hb.READY).exists() and (tree / hb.READY).read_text() == stamp:
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(clean, tree, symlinks=True)
    (tree / hb.READY).unlink()
    path = tree / bug.file
    text = path.read_text()
    if text.count(bug.old) != 1:
        shutil.rmtree(tree)
        raise RuntimeError(f"{project.name}/{bug.name}: the edit's old text occurs "
                           f"{text.count(bug.old)} times in {bug.file}")
    path.write_text(text.replace(bug.old, bug.new))
    (tree / hb.READY).write_text(stamp)
    return tree


def materialise(zoo: ZooProject, bug: InjectedBug, checkout: Path, work: Path
                ) -> hb.Materialised:
    """What historic_bench's judge needs: both trees, the true fix (the edit undone)
    as hunks, the selection."""
    clean = hb.clean_tree(zoo.project, checkout, work)
    bugged = bugged_tree(bug, zoo.project, clean, work)
    hunks = hb.fix_hunks(bug.file, (bugged / bug.file).read_text(),
                         (clean / bug.file).read_text())
    historic = hb.HistoricBug(name=f"{zoo.project.name}-{bug.name}", project=zoo.project.name,
                              fix="", files=(bug.file,), tests=zoo.selection,
                              description=bug.description)
    return hb.Materialised(historic, zoo.project, clean, bugged, tuple(hunks), zoo.selection)


# -- running pytest as a new user would --------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One pytest run of the selection, as its output and report dir tell it."""

    exit_code: int
    passed: int
    failed: int
    seconds: float
    internal_error: bool
    report: bool  # .kernelfix/report.json written
    captured: bool  # every failing test is in the report: in a bug, or unselected with why
    bugs: tuple[str, ...]  # "id: status: reason" per bug of the report
    unselected: int  # failing tests the selection left out
    header: str  # the plugin's "kernelfix: device ..." line
    tail: str

    @property
    def ended(self) -> bool:
        """The session ended as pytest ends one: tests ran, no INTERNALERROR, and a report
        when a test failed (a green run writes none, as docs/reports.md says)."""
        return (self.exit_code in (0, 1) and not self.internal_error
                and (self.report or self.failed == 0))


def new_user_command(python: str, project: hb.Project, selection: Sequence[str],
                     *more: str) -> list[str]:
    return [python, "-m", "pytest", *selection, "-q", "-p", "no:cacheprovider",
            *project.args, *more]


def fresh_copy(tree: Path, run: Path) -> Path:
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    root = run / "tree"
    shutil.copytree(tree, root, symlinks=True)
    (root / hb.READY).unlink(missing_ok=True)
    return root


def run_pytest(command: list[str], root: Path, env: dict[str, str], timeout: int) -> Run:
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True,
                              timeout=timeout)
        out, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        parts = [part.decode(errors="replace") if isinstance(part, bytes) else part or ""
                 for part in (expired.stdout, expired.stderr)]
        out = "".join(parts) + f"\ntimed out after {timeout} s"
        code = -9
    seconds = time.monotonic() - started
    (root.parent / "pytest.out").write_text(out)
    counts = hb._counts(out)
    failed = counts.get("failed", 0) + counts.get("error", 0) + counts.get("errors", 0)
    report_path = root / ".kernelfix" / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    bugs = report.get("bugs") or []
    grouped = {nodeid for bug in bugs for nodeid in bug.get("nodeids") or ()}
    unselected = (report.get("unselected") or {}).get("count", 0)
    header = next((line for line in out.splitlines() if line.startswith("kernelfix: device")),
                  "")
    return Run(exit_code=code, passed=counts.get("passed", 0), failed=failed, seconds=seconds,
               internal_error="INTERNALERROR" in out, report=report_path.exists(),
               captured=len(grouped) + unselected >= failed,
               bugs=tuple(f"{b['id']}: {b['status']}: {b['reason'][:200]}" for b in bugs),
               unselected=unselected, header=header, tail=out[-2500:])


def project_env(zoo: ZooProject, root: Path, python_path: str = "") -> dict[str, str]:
    merged = os.pathsep.join(filter(None, [python_path,
                                           zoo.project.env.get("PYTHONPATH", "").format(
                                               tree=root)]))
    env = hb.project_env(zoo.project, root, {"PYTHONPATH": merged} if merged else None)
    if not merged:
        env.pop("PYTHONPATH", None)
    return env


def run_plain(zoo: ZooProject, python: str, tree: Path, work: Path, timeout: int) -> Run:
    root = fresh_copy(tree, work / "runs" / zoo.project.name / "plain")
    command = new_user_command(python, zoo.project, zoo.selection,
                               "--kernelfix-device=interpret", "--tb=short")
    return run_pytest(command, root, project_env(zoo, root), timeout)


def run_as_is(zoo: ZooProject, python: str, clean: Path, work: Path, timeout: int) -> Run:
    root = fresh_copy(clean, work / "runs" / zoo.project.name / "as-is")
    command = new_user_command(python, zoo.project, zoo.selection, "--kernelfix",
                               "--kernelfix-select=launched", "--tb=short")
    return run_pytest(command, root, project_env(zoo, root), timeout)


@dataclass(frozen=True)
class BugOutcome:
    project: str
    bug: str
    kind: str
    run: Run
    shown_first: bool
    healed: bool
    refused: str
    miss: str
    first_prompt_chars: int


def run_bug(zoo: ZooProject, bug: InjectedBug, python: str, checkout: Path, work: Path,
            timeout: int) -> BugOutcome:
    mat = materialise(zoo, bug, checkout, work)
    run_dir = work / "runs" / zoo.project.name / bug.name
    root = fresh_copy(mat.bugged, run_dir)
    log, spec = run_dir / "oracle.jsonl", run_dir / "spec.json"
    spec.write_text(json.dumps({"log": str(log), "always": False,
                                "hunks": [asdict(h) for h in mat.hunks]}))
    env = project_env(zoo, root, str(hb.write_oracle(work)))
    env["KERNELFIX_HISTORIC_SPEC"] = str(spec)
    command = new_user_command(python, zoo.project, zoo.selection, "--kernelfix",
                               "--kernelfix-select=launched", "-p", "historic_oracle",
                               "--tb=short")
    run = run_pytest(command, root, env, timeout)
    judged = hb.judge(mat, root, log, run.seconds, run.tail)
    return BugOutcome(zoo.project.name, bug.name, bug.kind, run, judged.shown_first,
                      judged.healed, judged.refused, judged.miss, judged.first_prompt_chars)


# -- the command line ------------------------------------------------------------------------


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def project_lines(name: str, plain: Run | None, run: Run) -> list[str]:
    lines = [f"## {name}"]
    if plain is not None:  # no healing: its counts and time are all it tells
        lines.append(f"plain: exit {plain.exit_code}, {plain.passed} passed, {plain.failed} "
                     f"failed, {plain.seconds:.0f} s")
    lines.append(f"as is: exit {run.exit_code}, {run.passed} passed, {run.failed} failed, "
                 f"{run.seconds:.0f} s, report {_yes(run.report)}, ended {_yes(run.ended)}, "
                 f"INTERNALERROR {_yes(run.internal_error)}, captured {_yes(run.captured)}"
                 + (f", unselected {run.unselected}" if run.unselected else ""))
    lines += [f"  {bug}" for bug in run.bugs]
    if not run.ended:
        lines.append("  " + run.tail[-1200:].replace("\n", "\n  "))
    return lines


def bug_table(outcomes: Sequence[BugOutcome]) -> list[str]:
    lines = ["| project | bug | kind | report | INTERNALERROR | failed | captured | faulty lines "
             "in first prompt | healed | seconds | miss |",
             "|---|---|---|---|---|---:|---|---|---|---:|---|"]
    for o in outcomes:
        lines.append(f"| {o.project} | {o.bug} | {o.kind} | {_yes(o.run.report)} | "
                     f"{_yes(o.run.internal_error)} | {o.run.failed} | {_yes(o.run.captured)} | "
                     f"{_yes(o.shown_first)} | {_yes(o.healed)} | {o.run.seconds:.0f} | "
                     f"{o.miss[:200]} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--checkout", action="append", default=[], metavar="PROJECT=PATH",
                        help="a git clone of a project of the zoo (repeatable)")
    parser.add_argument("--python", action="append", default=[], metavar="PROJECT=PATH",
                        help="the interpreter of the project's venv (default: this one)")
    parser.add_argument("--catalogue", type=Path, default=CATALOGUE)
    parser.add_argument("--work", type=Path, default=None,
                        help="where trees and runs are kept (default: a temporary folder)")
    parser.add_argument("--only", nargs="*", default=None, metavar="PROJECT")
    parser.add_argument("--bugs", nargs="*", default=None, metavar="NAME",
                        help="only these bugs (default: all of each project)")
    parser.add_argument("--no-bugs", action="store_true", help="plain and as-is runs only")
    parser.add_argument("--no-plain", action="store_true", help="skip the plain run")
    parser.add_argument("--check", action="store_true",
                        help="only run the selection, unhealed, on each bugged tree: it must fail")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per pytest run")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    options = parser.parse_args(argv)
    zoo = load(options.catalogue)
    given = hb.checkouts(options.checkout)
    # not resolved: a venv's python is a link to the base interpreter, and only the
    # link's own path starts the venv
    pythons = dict(value.partition("=")[::2] for value in options.python)
    work = (options.work or Path(tempfile.mkdtemp(prefix="kernelfix-zoo-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"work dir: {work}")
    results: dict[str, dict] = {}
    outcomes: list[BugOutcome] = []
    apart = []
    for name, project in zoo.items():
        if options.only is not None and name not in options.only:
            continue
        if project.cpu:
            apart.append(f"{name} ({project.project.repo}): {project.cpu}")
            continue
        checkout = given.get(name)
        if checkout is None or not (checkout / ".git").exists():
            print(f"skipped {name}: no checkout")
            continue
        python = pythons.get(name, sys.executable)
        clean = hb.clean_tree(project.project, checkout, work)
        try:  # every edit applies before anything runs
            for bug in project.bugs:
                bugged_tree(bug, project.project, clean, work)
        except RuntimeError as error:
            print(f"skipped {name}: {error}")
            continue
        if options.check:
            for bug in project.bugs:
                bugged = bugged_tree(bug, project.project, clean, work)
                run = run_plain(project, python, bugged, work / "check" / bug.name,
                                options.timeout)
                print(f"{'ok ' if run.failed else 'BAD'} {name}/{bug.name}: {run.passed} passed, "
                      f"{run.failed} failed ({run.seconds:.0f} s)", flush=True)
            continue
        plain = None if options.no_plain else run_plain(project, python, clean, work,
                                                        options.timeout)
        as_is = run_as_is(project, python, clean, work, options.timeout)
        print("\n".join(project_lines(name, plain, as_is)), flush=True)
        results[name] = {"plain": plain and asdict(plain), "as_is": asdict(as_is),
                         "ended": as_is.ended, "bugs": []}
        if options.no_bugs:
            continue
        for bug in project.bugs:
            if options.bugs is not None and bug.name not in options.bugs:
                continue
            outcome = run_bug(project, bug, python, checkout, work, options.timeout)
            outcomes.append(outcome)
            results[name]["bugs"].append(asdict(outcome))
            print("\n".join(bug_table([outcome])[2:]), flush=True)
    if outcomes:
        print()
        print("\n".join(bug_table(outcomes)))
        n = len(outcomes)
        print(f"bugs: {n}; report written {sum(o.run.report for o in outcomes)}; INTERNALERROR "
              f"{sum(o.run.internal_error for o in outcomes)}; captured "
              f"{sum(o.run.captured for o in outcomes)}; faulty lines in the first prompt "
              f"{sum(o.shown_first for o in outcomes)}; healed {sum(o.healed for o in outcomes)}")
    ended = [name for name, result in results.items() if result["ended"]]
    print(f"projects run: {len(results)}; as-is sessions that end with a report and no "
          f"INTERNALERROR: {len(ended)}")
    for line in apart:
        print(f"counted apart: {line}")
    if options.json:
        options.json.write_text(json.dumps({"projects": results, "apart": apart}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
