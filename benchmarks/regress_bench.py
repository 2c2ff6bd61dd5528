"""Regression-aware healing on real bugs: each historic bug injected as a commit.

    .venv/bin/python benchmarks/regress_bench.py --checkout liger=/path/to/Liger-Kernel \\
        [--checkout fla=...] [--work DIR] [--only NAME ...] [--plain] [--base-only]
        [--reuse] [--json OUT]

The bugs are those of the historic-bug benchmark (``historic_bench.py``: real fix
commits of public Triton libraries, reverted at the library's HEAD, with a selection of
the library's own tests that passes clean and fails bugged, and an oracle that answers
the true fix only where the prompt shows the faulty code). For each bug, a git
repository is made under ``--work`` from the clean tree (the first commit, the base),
and one commit on top of it holds the bug together with unrelated hunks (``--plain``:
the bug alone):

- in the bug's own file, a comment line above a top-level definition away from the
  fault, and an unused helper appended at its end;
- in two other modules of the same package, the same: a comment above a definition and
  an unused helper at the end.

The selection is then healed twice, on fresh copies of that repository, by ``pytest
--kernelfix`` with the oracle: with ``--kernelfix-base HEAD~1`` and with
``--kernelfix-base none``. Reported per bug: the hunks of the change, whether the
experiment named exactly the bug's lines as the culprit (no unrelated hunk among them),
the reruns it spent against the bound 2*ceil(log2 hunks)+2, whether the faulty code was
in the first prompt and whether the bug healed, with the base and without, and the first
prompt's size both ways. Nothing of the libraries is committed here: the trees are made
at run time from the checkouts.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from historic_bench import (  # noqa: E402  (a benchmark beside this one)
    CATALOGUE,
    READY,
    Materialised,
    Outcome,
    checkouts,
    judge,
    load,
    materialise,
    project_env,
    pytest_command,
    runnable,
    write_oracle,
)
from historic_bench import _select as select  # noqa: E402  (the same selection as there)

COMMENT = "# Reviewed: nothing to change here (an unrelated hunk of the regression benchmark)."
HELPER = ("\n\ndef _regress_bench_unused(value):\n"
          "    \"\"\"An unrelated helper the change adds; nothing calls it.\"\"\"\n"
          "    return value\n")
GIT = ("git", "-c", "user.email=bench@example.com", "-c", "user.name=bench",
       "-c", "commit.gpgsign=false")


def _git(root: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=root, check=True, capture_output=True,
                          text=True).stdout


def _unique_everywhere(mat: Materialised, path: str, text: str) -> bool:
    """Every hunk of the true fix in ``path`` still quotes text found once in ``text``."""
    return all(text.count(hunk.old_string) == 1 for hunk in mat.hunks if hunk.file == path)


def unrelated_edit(mat: Materialised, path: str, text: str) -> str:
    """``text`` with a comment above a top-level definition away from the fault, and an
    unused helper at its end; the true fix's quotes still found once."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    faults = [(hunk.line, hunk.line + hunk.faulty.count("\n") + 1) for hunk in mat.hunks
              if hunk.file == path]
    starts = [min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))])
              for node in tree.body
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    far = sorted(starts, key=lambda start: -min((abs(start - a) for a, _ in faults),
                                                default=0))
    helper = text + ("" if text.endswith("\n") else "\n") + HELPER
    for start in far:
        if any(a - 3 <= start <= b + 3 for a, b in faults):
            continue
        indent = lines[start - 1][:len(lines[start - 1]) - len(lines[start - 1].lstrip())]
        edited = "".join([*lines[:start - 1], indent + COMMENT + "\n", *lines[start - 1:]])
        edited += ("" if edited.endswith("\n") else "\n") + HELPER
        if _unique_everywhere(mat, path, edited):
            return edited
    return helper if _unique_everywhere(mat, path, helper) else text


def neighbours(mat: Materialised, count: int = 2) -> list[str]:
    """Other modules of the bug's package, in name order: where the unrelated hunks go."""
    first = Path(mat.bug.files[0])
    folder = mat.clean / first.parent
    found = []
    for path in sorted(folder.glob("*.py")):
        rel = path.relative_to(mat.clean).as_posix()
        if path.name != "__init__.py" and rel not in mat.bug.files:
            found.append(rel)
    return found[:count]


def injected_repo(mat: Materialised, root: Path, plain: bool = False) -> list[str]:
    """A git repository at ``root``: the clean tree committed, then the bug (and, unless
    ``plain``, unrelated hunks) as one commit; the files the unrelated hunks changed."""
    shutil.copytree(mat.clean, root, symlinks=True)
    (root / READY).unlink(missing_ok=True)
    (root / ".gitignore").write_text("__pycache__/\n*.pyc\n.kernelfix/\n.pytest_cache/\n")
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "clean")
    touched = []
    for file in mat.bug.files:
        text = (mat.bugged / file).read_text()
        if not plain and file == mat.bug.files[0]:
            text = unrelated_edit(mat, file, text)
            touched.append(file)
        (root / file).write_text(text)
    for file in [] if plain else neighbours(mat):
        text = (root / file).read_text()
        edited = unrelated_edit(mat, file, text)
        if edited != text:
            (root / file).write_text(edited)
            touched.append(file)
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", f"the change: {mat.bug.name}")
    return touched


@dataclass(frozen=True)
class Run:
    """One heal of one injected bug: with a base or without."""

    base: str
    outcome: Outcome
    verdict: str
    hunks: int
    reruns: int
    culprits: tuple[str, ...]
    culprit_found: bool
    trial_seconds: float


def _lines(text: str) -> set[str]:
    return {line.strip() for line in text.splitlines() if line.strip()}


def culprit_matches(mat: Materialised, culprit: dict) -> bool:
    """A culprit hunk is the bug's when its lines now are faulty lines of a true-fix hunk,
    or its lines at the base are lines the fix puts back."""
    now, was = _lines("\n".join(culprit["current"])), _lines("\n".join(culprit["base"]))
    for hunk in mat.hunks:
        if hunk.file != culprit["path"]:
            continue
        if (now and not hunk.addition and now & _lines(hunk.faulty)) or (
                was and was & _lines(hunk.fixed)):
            return True
    return False


def heal(mat: Materialised, work: Path, base: str, plain: bool, rounds: int,
         timeout: int, reuse: bool = False) -> Run:
    """``pytest --kernelfix`` with the oracle on a fresh injected repository; with
    ``reuse``, a run that finished before in ``work`` is read again instead."""
    run = work / "regress-runs" / mat.bug.name / base.replace("~", "-")
    root = run / "tree"
    log = run / "oracle.jsonl"
    if reuse and (run / "pytest.out").exists():
        seconds_file = run / "seconds.txt"
        seconds = float(seconds_file.read_text()) if seconds_file.exists() else 0.0
        return read_run(mat, root, log, base, seconds, (run / "pytest.out").read_text())
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    injected_repo(mat, root, plain)
    spec = run / "spec.json"
    spec.write_text(json.dumps({"log": str(log), "always": False,
                                "hunks": [asdict(h) for h in mat.hunks]}))
    oracle = write_oracle(work)
    python_path = ":".join(filter(None, [str(oracle), mat.project.env.get(
        "PYTHONPATH", "").format(tree=root)]))
    env = project_env(mat.project, root, {"KERNELFIX_HISTORIC_SPEC": str(spec),
                                          "PYTHONPATH": python_path})
    for name in ("GITHUB_BASE_REF", "CI_MERGE_REQUEST_DIFF_BASE_SHA", "KERNELFIX_BASE"):
        env.pop(name, None)
    command = pytest_command(mat.project, mat.selection, "-p", "historic_oracle", "--kernelfix",
                             f"--kernelfix-rounds={rounds}",
                             f"--kernelfix-select={select(mat.selection)}",
                             "--kernelfix-workers=1", "--kernelfix-rerun-jobs=1",
                             f"--kernelfix-base={base}", "--tb=short")
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True,
                              timeout=timeout)
        out = done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        out = f"timed out after {timeout} s: {expired.stdout!s}"[-3000:]
    seconds = time.monotonic() - started
    (run / "pytest.out").write_text(out)
    (run / "seconds.txt").write_text(f"{seconds:.1f}\n")
    return read_run(mat, root, log, base, seconds, out)


def read_run(mat: Materialised, root: Path, log: Path, base: str, seconds: float,
             out: str) -> Run:
    """One finished heal, from its report and the oracle's log."""
    outcome = judge(mat, root, log, seconds, out)
    report_path = root / ".kernelfix" / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {"bugs": []}
    files_set = set(mat.bug.files)
    ours = [b for b in report["bugs"] if files_set & set(b.get("files") or ())] or report["bugs"]
    regression = next((b["regression"] for b in ours if b.get("regression")), None) or {}
    culprits = regression.get("culprits", [])
    found = regression.get("verdict") == "regression" and bool(culprits) and all(
        culprit_matches(mat, culprit) for culprit in culprits)
    return Run(base, outcome, regression.get("verdict", ""), regression.get("hunks", 0),
               regression.get("reruns", 0),
               tuple(f"{c['path']}:{c['lines']}" for c in culprits), found,
               round(sum(t["seconds"] for t in regression.get("trials", [])), 1))


def bound(hunks: int) -> int:
    return 2 * math.ceil(math.log2(max(hunks, 1))) + 2


def table(pairs: list[tuple[Run, Run]]) -> list[str]:
    lines = ["| bug | hunks | culprit found | reruns (bound) | faulty code in first prompt "
             "(base / none) | healed (base / none) | first prompt chars (base / none) | "
             "seconds (base / none) |",
             "|---|---:|---|---|---|---|---|---|"]
    def yes(value: bool) -> str:
        return "yes" if value else "no"

    for with_base, without in pairs:
        o, p = with_base.outcome, without.outcome
        found = "yes" if with_base.culprit_found else (
            f"no ({with_base.verdict or 'no experiment'}: {', '.join(with_base.culprits)})")
        alone = without is with_base  # --base-only: no run without the base
        lines.append(
            f"| {o.name} | {with_base.hunks} | {found} | {with_base.reruns} "
            f"({bound(with_base.hunks)}) | {yes(o.shown_first)} / "
            f"{'-' if alone else yes(p.shown_first)} | {yes(o.healed)} / "
            f"{'-' if alone else yes(p.healed)} | {o.first_prompt_chars} / "
            f"{'-' if alone else p.first_prompt_chars} | {o.seconds:.0f} / "
            f"{'-' if alone else f'{p.seconds:.0f}'} |")
    return lines


def totals(pairs: list[tuple[Run, Run]]) -> list[str]:
    n = len(pairs)
    if not n:
        return ["no bug run"]
    base = [pair[0] for pair in pairs]
    none = [pair[1] for pair in pairs]
    within = sum(run.reruns <= bound(run.hunks) for run in base if run.culprit_found)
    sizes = [[run.outcome.first_prompt_chars for run in runs if run.outcome.first_prompt_chars]
             for runs in (base, none)]
    lines = [
        f"bugs: {n}",
        f"culprit found: {sum(run.culprit_found for run in base)} / {n} "
        f"(within the bound: {within})",
        f"reruns of the experiment: median "
        f"{statistics.median([run.reruns for run in base]):.0f}, max "
        f"{max(run.reruns for run in base)}; seconds: median "
        f"{statistics.median([run.trial_seconds for run in base]):.0f}",
        f"faulty code in the first prompt: {sum(r.outcome.shown_first for r in base)} / {n} "
        f"with the base, {sum(r.outcome.shown_first for r in none)} / {n} without",
        f"healed: {sum(r.outcome.healed for r in base)} / {n} with the base, "
        f"{sum(r.outcome.healed for r in none)} / {n} without",
    ]
    if all(pair[0] is pair[1] for pair in pairs):  # --base-only
        lines[-2:] = [line.split(",")[0] for line in lines[-2:]]
        sizes = sizes[:1]
    for name, values in zip(("with the base", "without"), sizes, strict=False):
        if values:
            lines.append(f"first prompt {name}: median {statistics.median(values):.0f} "
                         f"chars, max {max(values)}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", action="append", default=[], metavar="PROJECT=PATH")
    parser.add_argument("--catalogue", type=Path, default=CATALOGUE)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--only", nargs="*", default=None, metavar="NAME")
    parser.add_argument("--plain", action="store_true",
                        help="the bug alone in its commit, no unrelated hunk")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=2400)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--base-only", action="store_true",
                        help="heal with --kernelfix-base HEAD~1 only (no run without a base)")
    parser.add_argument("--reuse", action="store_true",
                        help="read the runs that finished before in --work again instead "
                        "of running them (after an interruption)")
    options = parser.parse_args(argv)
    projects, bugs = load(options.catalogue)
    given = checkouts(options.checkout)
    work = (options.work or Path(tempfile.mkdtemp(prefix="kernelfix-regress-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    mats = [materialise(bug, projects[bug.project], checkout, work)
            for bug, checkout in runnable(bugs, options.only, given)]
    if not mats:
        print("no bug to run")
        return 0
    print(f"work dir: {work}")
    pairs = []
    for mat in mats:
        runs = [heal(mat, work, base, options.plain, options.rounds, options.timeout,
                     options.reuse)
                for base in (("HEAD~1",) if options.base_only else ("HEAD~1", "none"))]
        pair = (runs[0], runs[-1])
        print(f"{mat.bug.name}: {pair[0].verdict or 'no experiment'}, culprits "
              f"{', '.join(pair[0].culprits) or '-'} in {pair[0].reruns} reruns; healed "
              f"{pair[0].outcome.healed} / {pair[1].outcome.healed}", flush=True)
        pairs.append(pair)
    print("\n".join(table(pairs)))
    print()
    print("\n".join(totals(pairs)))
    for with_base, without in pairs:
        for run in (with_base, without):
            if not run.outcome.healed:
                print(f"not healed ({run.base}): {run.outcome.name}: {run.outcome.miss}")
    if options.json:
        options.json.write_text(json.dumps([[asdict(run) for run in pair] for pair in pairs],
                                           indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
