"""Precision and recall of the heal verdict, end to end, on real liger-kernel code.

Every case of ``integrity_cases.py`` (42 honest fixes, 42 cheats) becomes a bug in a
temporary project: a copy of one module of the installed ``liger_kernel.ops`` (imports
pointed at a copy of liger's two helper modules, so that every kernel is the project's)
with the case's bug injected, and a test. One ``pytest --kernelfix`` session per side
heals them all, one round each, the scripted fixer (a conftest ``pytest_kernelfix_propose``
hook) answering with the case's candidate. The benchmark then reads report.json:

- honest fixes must heal (accepted / total);
- cheats must not (rejected / total), each by a stated check.

Before that, two plain pytest runs check the cases themselves: every bugged test fails,
and every candidate, applied, passes (a cheat that fails its test proves nothing).

    .venv/bin/python benchmarks/integrity_bench.py              # everything (about 20-40 min
                                                                 # on 2 shared cores)
    .venv/bin/python benchmarks/integrity_bench.py --only h01,c07 --keep /tmp/bench
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from integrity_cases import CASES, GAPS, SETUP, TEST_HEAD, TESTS, Case, Edits

INI = """[pytest]
pythonpath = .
markers =
    kernel: launches a Triton kernel
kernelfix_device = interpret
kernelfix_target = off
"""

HOOK = '''import json
from pathlib import Path

from pytest_kernelfix import Modification

ANSWERS = json.loads((Path(__file__).parent / "answers.json").read_text())


def pytest_kernelfix_propose(request, config):
    """The case's candidate, keyed by the failing test's file."""
    case = Path(request.context.nodeids[0].split("::")[0]).stem.removeprefix("test_")
    edits = ANSWERS.get(case)
    if edits is None or request.round > 1:
        return None
    return [Modification(old, new, file=path) for path, old, new in edits]
'''


def liger_root() -> Path:
    import liger_kernel

    return Path(liger_kernel.__file__).parent


def localise(source: str) -> str:
    """Point liger's absolute imports at the project's copy (``lk``)."""
    return re.sub(r"\bliger_kernel\.", "lk.", source)


def copy_liger(root: Path, ops: Sequence[str] = ()) -> Path:
    """liger's two helper modules (and ``ops``) copied into ``root/lk``, imports pointed at
    the copy, and an empty ``tests`` folder; returns the installed package's folder."""
    liger = liger_root()
    (root / "lk" / "ops").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "lk" / "__init__.py").write_text("")
    (root / "lk" / "ops" / "__init__.py").write_text("")
    (root / "lk" / "utils.py").write_text(localise((liger / "utils.py").read_text()))
    for name in ("utils", *ops):
        text = localise((liger / "ops" / f"{name}.py").read_text())
        (root / "lk" / "ops" / f"{name}.py").write_text(text)
    return liger


def replace_first(text: str, old: str, new: str, what: str) -> str:
    if old not in text:
        raise ValueError(f"{what}: {old[:80]!r} is not in the module")
    return text.replace(old, new, 1)


def answer_edits(case: Case, bugged: str) -> Edits:
    if case.answer is None:
        return tuple((new, old) for old, new in case.bug)
    if callable(case.answer):
        return case.answer(bugged)
    return case.answer


def apply_unique(text: str, edits: Edits, what: str) -> str:
    """Apply edits the way the heal's engine needs them: each old text exactly once."""
    for old, new in edits:
        count = text.count(old)
        if count != 1:
            raise ValueError(f"{what}: {old[:80]!r} occurs {count} times")
        text = text.replace(old, new)
    return text


def module_name(case: Case) -> str:
    return f"{case.name}_{case.op}"


def build(root: Path, cases: Sequence[Case], *, candidate: bool) -> dict[str, list[list[str]]]:
    """Write the project (bugged, or with every candidate applied); returns the answers."""
    liger = copy_liger(root)
    (root / "pytest.ini").write_text(INI)
    answers: dict[str, list[list[str]]] = {}
    for case in cases:
        name = module_name(case)
        text = localise((liger / "ops" / f"{case.op}.py").read_text()) + case.append
        text = apply_unique(text, SETUP.get(case.op, ()), f"{case.name} set-up")
        for old, new in case.bug:
            text = replace_first(text, old, new, case.name)
        edits = answer_edits(case, text)
        fixed = apply_unique(text, edits, case.name)
        path = f"lk/ops/{name}.py"
        (root / path).write_text(fixed if candidate else text)
        answers[case.name] = [[path, old, new] for old, new in edits]
        test = TEST_HEAD.format(module=f"lk.ops.{name}", name=case.name) + TESTS[case.test]
        (root / "tests" / f"test_{case.name}.py").write_text(test)
    (root / "answers.json").write_text(json.dumps(answers))
    (root / "conftest.py").write_text(HOOK)
    return answers


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "PYTEST_ADDOPTS", "KERNELFIX_MODEL")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def plain_run(root: Path, tests: Sequence[str] = ("tests",), label: str = "") -> dict[str, str]:
    """Outcome per case of a plain pytest run of the project (no healing)."""
    report = root / f"outcomes{label}.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         f"--junitxml={report}", *tests],
        cwd=root, env=environment(), capture_output=True, text=True, timeout=3600,
    )
    import xml.etree.ElementTree as ElementTree

    outcomes = {}
    for test in ElementTree.parse(report).iter("testcase"):
        name = test.get("name", "").removeprefix("test_")
        failed = test.find("failure") is not None or test.find("error") is not None
        outcomes[name] = "failed" if failed else "passed"
    return outcomes


def heal_session(root: Path, cases: Sequence[Case]) -> tuple[dict[str, dict], float]:  # type: ignore[type-arg]
    """One ``pytest --kernelfix`` session over the cases; report.json's bugs per case."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "--kernelfix", "--kernelfix-rounds=1", f"--kernelfix-max-groups={len(cases) + 10}",
         "--kernelfix-timeout=600", "tests"],
        cwd=root, env=environment(), capture_output=True, text=True, timeout=4 * 3600,
    )
    seconds = time.monotonic() - started
    report_path = root / ".kernelfix" / "report.json"
    if not report_path.exists():
        raise RuntimeError("no report.json:\n" + done.stdout[-4000:] + done.stderr[-4000:])
    bugs = json.loads(report_path.read_text())["bugs"]
    by_case = {}
    for bug in bugs:
        stem = Path(bug["nodeids"][0].split("::")[0]).stem
        by_case[stem.removeprefix("test_")] = bug
    return by_case, seconds


def decided_by(bug: dict | None) -> str:  # type: ignore[type-arg]
    """Which check ended the case, from its round outcome (or its skip reason)."""
    if bug is None:
        return "no bug reported"
    if bug["status"] == "healed":
        return "accepted"
    text = bug["round_details"][0]["outcome"] if bug["round_details"] else bug["reason"]
    rules = [
        ("rejected: unsafe code", "static: unsafe code"),
        ("rejected: monkeypatch", "static: monkeypatch"),
        ("rejected: skip injection", "static: skip injection"),
        ("rejected:", "static"),
        ("run-time integrity", "run-time integrity"),
        ("masks the kernel's output", "mask of an unchanged kernel"),
        ("does not depend on", "sensitivity (per kernel)"),
        ("the check that failed", "sensitivity (per check)"),
        ("replaced by NaN", "sensitivity (NaN)"),
        ("replaced by scrambled values", "sensitivity (scrambled)"),
        ("only part of which come from the kernel", "sensitivity (partly poisoned)"),
        ("kernel launches wrote nothing", "sensitivity (nothing written)"),
        ("without launching", "launch count"),
        ("cannot certify", "uncertifiable"),
        ("still fail", "tests still fail"),
    ]
    for needle, label in rules:
        if needle in text:
            return label
    return text[:60]


def run(cases: Sequence[Case], keep: Path | None, jobs: int, heal: bool = True
        ) -> dict[str, object]:
    base = Path(tempfile.mkdtemp(prefix="kernelfix-integrity-"))
    try:
        bugged, candidates = base / "bugged", base / "candidates"
        build(bugged, cases, candidate=False)
        build(candidates, cases, candidate=True)
        sides = {"honest": [c for c in cases if c.honest], "cheats": [c for c in cases
                                                                      if not c.honest]}
        projects = {}
        for side, members in sides.items():
            if members:
                projects[side] = base / side
                build(projects[side], members, candidate=False)
        print(f"checking {len(cases)} cases with plain pytest runs ...", flush=True)
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            before_future = pool.submit(plain_run, bugged)
            honest_future = pool.submit(plain_run, candidates, [
                f"tests/test_{case.name}.py" for case in sides["honest"]] or ["--co"], "-honest")
            # a cheat may patch torch for the whole process: each runs alone
            cheat_futures = [pool.submit(plain_run, candidates, [f"tests/test_{case.name}.py"],
                                         f"-{case.name}") for case in sides["cheats"]]
            before, after = before_future.result(), honest_future.result()
            for future in cheat_futures:
                after.update(future.result())
        sessions: dict[str, tuple[dict[str, dict], float]] = {  # type: ignore[type-arg]
            side: ({}, 0.0) for side in sides}
        if heal:
            print("healing ...", flush=True)
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                futures = {side: pool.submit(heal_session, root, sides[side])
                           for side, root in projects.items()}
                sessions = {side: future.result() for side, future in futures.items()}
        rows = []
        for case in cases:
            bugs, _ = sessions["honest" if case.honest else "cheats"]
            bug = bugs.get(case.name)
            valid = before.get(case.name) == "failed" and after.get(case.name) == "passed"
            rows.append({
                "case": case.name, "op": case.op, "honest": case.honest, "kind": case.kind,
                "where": case.where, "valid": valid,
                "bugged": before.get(case.name, "?"), "candidate": after.get(case.name, "?"),
                "status": bug["status"] if bug else "missing",
                "decided_by": decided_by(bug),
                "outcome": (bug["round_details"][0]["outcome"] if bug and bug["round_details"]
                            else (bug or {}).get("reason", "")),
                "notes": (bug["round_details"][0].get("notes", []) if bug and bug["round_details"]
                          else []),
            })
        return {"rows": rows, "seconds": {side: round(s, 1) for side, (_, s) in sessions.items()}}
    finally:
        if keep is not None:
            shutil.copytree(base, keep, dirs_exist_ok=True)
        shutil.rmtree(base, ignore_errors=True)


def table(rows: list[dict[str, object]]) -> list[str]:
    by_kind: dict[tuple[bool, str], list[dict[str, object]]] = defaultdict(list)
    for row in rows:
        by_kind[(bool(row["honest"]), str(row["kind"]))].append(row)
    lines = ["| side | kind | cases | healed | refused | deciding check |",
             "|---|---|---:|---:|---:|---|"]
    for (honest, kind), members in sorted(by_kind.items(), key=lambda item: (not item[0][0],
                                                                             item[0][1])):
        healed = sum(1 for r in members if r["status"] == "healed")
        checks = Counter(str(r["decided_by"]) for r in members if r["status"] != "healed")
        why = ", ".join(f"{name} x{count}" for name, count in checks.most_common()) or "-"
        lines.append(f"| {'honest' if honest else 'cheat'} | {kind} | {len(members)} | {healed} "
                     f"| {len(members) - healed} | {why} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--keep", type=Path, help="copy the projects here")
    parser.add_argument("--jobs", type=int, default=2, help="sessions run side by side")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--gaps", action="store_true",
                        help="run the cheats the checks are known to miss instead")
    parser.add_argument("--check", action="store_true",
                        help="only check the cases (bugged tests fail, candidates pass)")
    args = parser.parse_args()
    wanted = {name for name in args.only.split(",") if name}
    pool = GAPS if args.gaps else CASES
    cases = [case for case in pool if not wanted or case.name in wanted]
    if not cases:
        print("no case to run" + (": no cheat is known to be missed" if args.gaps else ""))
        return
    started = time.monotonic()
    result = run(cases, args.keep, args.jobs, heal=not args.check)
    rows: list[dict[str, object]] = result["rows"]  # type: ignore[assignment]
    invalid = [row for row in rows if not row["valid"]]
    if args.check:
        for row in invalid:
            print(f"  INVALID {row['case']} ({row['kind']}): bugged test {row['bugged']}, "
                  f"candidate {row['candidate']}")
        print(f"{len(rows) - len(invalid)} of {len(rows)} cases valid")
        return
    honest = [row for row in rows if row["honest"] and row["valid"]]
    cheats = [row for row in rows if not row["honest"] and row["valid"]]
    print("\n".join(table(rows)))
    print(f"\nhonest fixes accepted: {sum(r['status'] == 'healed' for r in honest)} / "
          f"{len(honest)} ({sum(1 for r in honest if r['where'] == 'wrapper')} in wrappers)")
    print(f"cheats rejected:       {sum(r['status'] != 'healed' for r in cheats)} / {len(cheats)}")
    for row in rows:
        wrong = (row["honest"] and row["status"] != "healed") or (
            not row["honest"] and row["status"] == "healed")
        if wrong and row["valid"]:
            print(f"  MISSED {row['case']} ({row['kind']}): {row['outcome']}")
    for row in invalid:
        print(f"  INVALID {row['case']} ({row['kind']}): bugged test {row['bugged']}, "
              f"candidate {row['candidate']}")
    print(f"sessions: {result['seconds']} s; whole benchmark {time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
