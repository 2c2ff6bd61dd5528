"""Historic bugs: real fix commits of public Triton libraries, reverted at HEAD, healed.

    .venv/bin/python benchmarks/historic_bench.py --checkout liger=/path/to/Liger-Kernel \\
        --checkout fla=/path/to/flash-linear-attention [--work DIR] [--jobs 2] \\
        [--only NAME ...] [--check] [--json OUT]

Each bug of ``historic_bugs.json`` names a project, the sha of a fix commit in that
project's history and a selection of the project's own tests. A checkout is a git clone
of the project (with its history); a project whose checkout is not given, or is absent,
is skipped. Nothing of theirs is committed here: the trees are made from the checkout at
run time, under ``--work`` (cached there between runs):

- the **clean tree** is the project at the sha recorded as its ``head`` (``git archive``),
  with the project's ``compat`` edits (a line that keeps the library importable with the
  installed Triton, the same in both trees; each one says why);
- the **bugged tree** is the clean tree with the fix commit's non-test hunks reversed
  (``git apply -R``, or with one line of context, ``-C1``, where the code around a hunk
  has changed since);
- the **true fix** is what turns the bugged files back into the clean ones, cut into
  hunks (:func:`fix_hunks`);
- the **selection** passes on the clean tree and fails on the bugged one, on the CPU
  (``--kernelfix-device interpret``); ``--check`` runs both and says so.

:func:`materialise` gives those four; another benchmark can import it.

Healing runs ``pytest --kernelfix`` on a fresh copy of the bugged tree, selecting the
failing tests that launched a kernel of the project and those of the selection's test
files (``kernelfix_select = launched,<file>::*``, as a maintainer opting in a test
directory would). The fixer is an oracle, a pytest plugin of this benchmark's own (``-p
historic_oracle``, a module written under ``--work``, never into their tree): it renders
the prompt the model would get (``render_messages``) and answers, as search/replace
edits, each hunk of the true fix whose faulty code the prompt shows, and no edit when
it shows none. What "shows" means:

- a hunk that replaces or deletes lines is shown when those lines (the bugged ones the
  fix changes, blank lines left out of the ends) appear in the prompt as one block,
  exactly as the bugged file has them;
- a pure addition (the fix only inserts lines) is shown when the place is: the nearest
  non-blank line before the insertion point and, when it lies in the same top-level
  definition, the nearest non-blank line after it, with the lines between them, as one
  block;
- the bug's faulty code is shown when every hunk is. A hunk already fixed in the text
  the prompt shows (a later round, on a candidate) is neither shown nor answered.

An edit quotes the hunk's bugged lines with enough unchanged lines around them to be
unique in the file, and replaces them with the fixed ones. So a bug heals only when the
plugin showed its code and verified the true fix; a fix proposed in full and not
accepted is an **honest fix refused**, named by the verdict of its round.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import difflib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
CATALOGUE = HERE / "historic_bugs.json"
CATALOGUES = (CATALOGUE, HERE / "historic_bugs_more.json")  # read together by default
PROMPT_LIMIT = 24_000  # characters: the bar for every first prompt
READY = ".historic-ready"


@dataclass(frozen=True)
class Compat:
    """An edit made to both trees so that the library imports with the installed Triton."""

    file: str
    old: str
    new: str
    why: str


@dataclass(frozen=True)
class Project:
    name: str
    repo: str  # owner/name on GitHub
    head: str  # the sha the trees are made from
    paths: tuple[str, ...]  # what of the repository the trees need
    exclude: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)  # values may hold {tree}
    args: tuple[str, ...] = ()  # extra pytest arguments
    compat: tuple[Compat, ...] = ()


@dataclass(frozen=True)
class HistoricBug:
    name: str
    project: str
    fix: str  # the fix commit's sha
    files: tuple[str, ...]  # the non-test files of the fix
    tests: tuple[str, ...]  # node ids: pass clean, fail bugged
    description: str
    shape: str = ""  # which shape of issue 25 it is, if any
    miss: str = ""  # the kind of miss, once measured
    hunks: int = 0  # hunks of the true fix at HEAD (filled in by --check)


@dataclass(frozen=True)
class Hunk:
    """One hunk of the true fix, as the bugged file has it."""

    file: str
    line: int  # first line of ``faulty`` in the bugged file (1-based)
    faulty: str  # what must be shown: the changed lines, or the place of an addition
    addition: bool
    old_string: str  # unique in the bugged file
    new_string: str
    fixed: str  # the lines the fix puts there ("" for a deletion)
    definition: str  # the enclosing definition in the bugged file ("module level")


@dataclass(frozen=True)
class Materialised:
    """What a benchmark needs of one bug: two trees, the true fix, the selection."""

    bug: HistoricBug
    project: Project
    clean: Path
    bugged: Path
    hunks: tuple[Hunk, ...]
    selection: tuple[str, ...]


def load(path: Path = CATALOGUE) -> tuple[dict[str, Project], list[HistoricBug]]:
    data = json.loads(path.read_text())
    projects = {}
    for name, raw in data["projects"].items():
        projects[name] = Project(
            name=name, repo=raw["repo"], head=raw["head"], paths=tuple(raw["paths"]),
            exclude=tuple(raw.get("exclude", ())), env=dict(raw.get("env", {})),
            args=tuple(raw.get("args", ())),
            compat=tuple(Compat(**c) for c in raw.get("compat", ())))
    bugs = [HistoricBug(**{**raw, "files": tuple(raw["files"]), "tests": tuple(raw["tests"])})
            for raw in data["bugs"]]
    return projects, bugs


def load_all(paths: Iterable[Path] = CATALOGUES
             ) -> tuple[dict[str, Project], list[HistoricBug]]:
    """Several catalogues read as one (a project named twice must be the same)."""
    projects: dict[str, Project] = {}
    bugs: list[HistoricBug] = []
    for path in paths:
        more_projects, more_bugs = load(path)
        for name, project in more_projects.items():
            if projects.setdefault(name, project) != project:
                raise ValueError(f"{path}: project {name} differs from an earlier catalogue")
        bugs += more_bugs
    names = [bug.name for bug in bugs]
    if len(set(names)) != len(names):
        raise ValueError("a bug name occurs in two catalogues")
    return projects, bugs


def _git(checkout: Path, *args: str, input: bytes | None = None) -> bytes:
    done = subprocess.run(["git", "-C", str(checkout), *args], input=input,
                          capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr.decode()[-800:]}")
    return done.stdout


def clean_tree(project: Project, checkout: Path, work: Path) -> Path:
    """The project at its recorded head, compat edits made; made once per work dir."""
    tree = work / "trees" / f"{project.name}@{project.head[:12]}"
    if (tree / READY).exists():
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    tree.mkdir(parents=True)
    specs = [*project.paths, *(f":(exclude){path}" for path in project.exclude)]
    archive = _git(checkout, "archive", project.head, "--", *specs)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for compat in project.compat:
        path = tree / compat.file
        text = path.read_text()
        if text.count(compat.old) != 1:
            raise RuntimeError(f"{project.name}: compat edit not found once in {compat.file}")
        path.write_text(text.replace(compat.old, compat.new))
    (tree / READY).write_text(project.head + "\n")
    return tree


def bugged_tree(bug: HistoricBug, clean: Path, checkout: Path, work: Path) -> Path:
    """The clean tree with the fix commit's hunks in ``bug.files`` reversed."""
    tree = work / "trees" / bug.name
    if (tree / READY).exists():
        return tree
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(clean, tree, symlinks=True)
    (tree / READY).unlink()
    diff = _git(checkout, "diff", f"{bug.fix}^", bug.fix, "--", *bug.files)
    if not diff.strip():
        raise RuntimeError(f"{bug.name}: the fix commit changes none of {bug.files}")
    for context in ([], ["-C1"]):  # the fix's own context, else one line of it
        done = subprocess.run(["git", "apply", "-R", *context, "--whitespace=nowarn", "-"],
                              input=diff, cwd=tree, capture_output=True)
        if done.returncode == 0:
            break
    if done.returncode != 0:
        shutil.rmtree(tree, ignore_errors=True)
        raise RuntimeError(f"{bug.name}: the revert does not apply at HEAD: "
                           f"{done.stderr.decode()[-500:]}")
    for file in bug.files:
        # hunks that change only comments, docstrings or layout stay fixed: no test can
        # tell them apart, and no prompt need show them
        path, clean_text = tree / file, (clean / file).read_text()
        path.write_text(keep_code_hunks(path.read_text(), clean_text))
    (tree / READY).write_text(bug.fix + "\n")
    return tree


def _code(text: str) -> str | None:
    """The module's syntax tree without docstrings, as text (None if it does not parse)."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            body[0] = ast.Pass()
    return ast.dump(tree)


def _groups(old: list[str], new: list[str]) -> list[tuple[int, int, int, int]]:
    """(i1, i2, j1, j2) of each run of changes, runs at most two unchanged lines apart."""
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    spans = []
    for group in matcher.get_grouped_opcodes(1):
        changes = [op for op in group if op[0] != "equal"]
        spans.append((changes[0][1], changes[-1][2], changes[0][3], changes[-1][4]))
    return spans


def keep_code_hunks(bugged: str, clean: str) -> str:
    """``bugged`` with every hunk that changes no code (by the syntax tree, docstrings
    left out) put back as ``clean`` has it."""
    old, new = bugged.splitlines(keepends=True), clean.splitlines(keepends=True)
    reference = _code(clean)
    out: list[str] = []
    at = 0
    for i1, i2, j1, j2 in _groups(old, new):
        out += old[at:i1]
        alone = "".join(new[:j1] + old[i1:i2] + new[j2:])
        out += new[j1:j2] if reference is not None and _code(alone) == reference else old[i1:i2]
        at = i2
    out += old[at:]
    return "".join(out)


def _definitions(source: str) -> list[tuple[int, int, str, int]]:
    """(first line, last line, qualified name, depth) of every def and class."""
    found: list[tuple[int, int, str, int]] = []

    def walk(node: ast.AST, prefix: str, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                name = prefix + child.name
                found.append((start, child.end_lineno or start, name, depth))
                walk(child, name + ".", depth + 1)

    with contextlib.suppress(SyntaxError):
        walk(ast.parse(source), "", 0)
    return found


def enclosing(source: str, line: int) -> str:
    spans = [d for d in _definitions(source) if d[0] <= line <= d[1]]
    return max(spans, key=lambda d: d[3])[2] if spans else "module level"


def _top_level(source: str, line: int) -> tuple[int, int] | None:
    spans = [d for d in _definitions(source) if d[3] == 0 and d[0] <= line <= d[1]]
    return (spans[0][0], spans[0][1]) if spans else None


def _unique(lines: list[str], start: int, end: int) -> tuple[int, int]:
    """Widen ``lines[start:end]`` by unchanged lines until it occurs once in the file."""
    text = "".join(lines)
    while True:
        block = "".join(lines[start:end])
        if block.strip() and text.count(block) == 1:
            return start, end
        if start == 0 and end == len(lines):
            return start, end
        start, end = max(0, start - 1), min(len(lines), end + 1)


def fix_hunks(file: str, bugged: str, clean: str) -> list[Hunk]:
    """The true fix of one file as hunks: runs of changed lines at most two unchanged
    lines apart form one hunk."""
    old, new = bugged.splitlines(keepends=True), clean.splitlines(keepends=True)
    hunks = []
    for i1, i2, j1, j2 in _groups(old, new):
        addition = i1 == i2
        if addition:
            before = i1 - 1
            while before >= 0 and not old[before].strip():
                before -= 1
            after = i1
            while after < len(old) and not old[after].strip():
                after += 1
            span = _top_level(bugged, before + 1) if before >= 0 else None
            first = max(before, 0)
            last = after + 1 if (after < len(old) and span is not None
                                 and span[0] <= after + 1 <= span[1]) else before + 1
            faulty_lines = old[first:max(last, first + 1)]
            line = first + 1
        else:
            a, b = i1, i2
            while a < b and not old[a].strip():
                a += 1
            while b > a and not old[b - 1].strip():
                b -= 1
            faulty_lines = old[a:b] if b > a else old[i1:i2]
            line = a + 1
        start, end = _unique(old, i1, i2) if i2 > i1 else _unique(old, max(i1 - 1, 0), i1 + 1)
        old_string = "".join(old[start:end])
        new_string = "".join(old[start:i1]) + "".join(new[j1:j2]) + "".join(old[i2:end])
        hunks.append(Hunk(
            file=file, line=line, faulty="".join(faulty_lines).rstrip("\n"),
            addition=addition, old_string=old_string, new_string=new_string,
            fixed="".join(new[j1:j2]), definition=enclosing(bugged, line)))
    return hunks


def materialise(bug: HistoricBug, project: Project, checkout: Path, work: Path
                ) -> Materialised:
    """The clean and bugged trees of ``bug`` (cached under ``work``), the true fix as
    hunks, and the selection of the project's tests."""
    clean = clean_tree(project, checkout, work)
    bugged = bugged_tree(bug, clean, checkout, work)
    hunks: list[Hunk] = []
    for file in bug.files:
        hunks += fix_hunks(file, (bugged / file).read_text(), (clean / file).read_text())
    return Materialised(bug, project, clean, bugged, tuple(hunks), bug.tests)


# -- running the project's tests -----------------------------------------------------------


def project_env(project: Project, tree: Path, extra: dict[str, str] | None = None
                ) -> dict[str, str]:
    env = {**os.environ, **{k: v.format(tree=tree) for k, v in project.env.items()},
           **(extra or {})}
    env.pop("TRITON_INTERPRET", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env


def pytest_command(project: Project, selection: Sequence[str], *more: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *selection, "-q", "-p", "no:cacheprovider",
            "-p", "no:randomly", "--kernelfix-device=interpret", *project.args, *more]


@dataclass(frozen=True)
class Plain:
    passed: int
    failed: int
    seconds: float
    tail: str


def run_plain(project: Project, tree: Path, selection: Sequence[str], timeout: int = 900
              ) -> Plain:
    """One plain run of the selection (no healing) in ``tree``."""
    started = time.monotonic()
    try:
        done = subprocess.run(pytest_command(project, selection, "--tb=line"), cwd=tree,
                              env=project_env(project, tree), capture_output=True, text=True,
                              timeout=timeout)
        out = done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        out = f"timed out after {timeout} s\n{expired.stdout or ''}"
    seconds = time.monotonic() - started
    counts = _counts(out)
    return Plain(counts.get("passed", 0), counts.get("failed", 0) + counts.get("error", 0)
                 + counts.get("errors", 0), seconds, out[-1500:])


def _counts(out: str) -> dict[str, int]:
    import re

    lines = [line for line in out.splitlines() if re.search(r"\d+ (passed|failed|error)", line)]
    if not lines:
        return {}
    return {word: int(number) for number, word in re.findall(r"(\d+) (\w+)", lines[-1])}


# -- the oracle ------------------------------------------------------------------------------

ORACLE = '''\
"""The historic-bug benchmark's oracle: answers the true fix where the prompt shows it."""

import json
import os

from pytest_kernelfix.fixers.prompting import render_messages

SPEC = os.environ.get("KERNELFIX_HISTORIC_SPEC")


def pytest_kernelfix_propose(request, config):
    if not SPEC:
        return None
    with open(SPEC, encoding="utf-8") as handle:
        spec = json.load(handle)
    messages = render_messages(request)
    shown = "\\n".join(message["content"] for message in messages)
    hunks = spec["hunks"]
    current = {source.path: source.text for source in request.files or request.context.editable}
    # a hunk is pending while the current text still has its bugged lines (a candidate
    # of an earlier round may have fixed it), and shown when the prompt has its faulty code
    pending = [hunk["file"] not in current or hunk["old_string"] in current[hunk["file"]]
               for hunk in hunks]
    visible = [hunk["faulty"] in shown for hunk in hunks]
    answer = [seen or spec.get("always", False) for seen in visible]
    edits = [{"file": hunk["file"], "old_string": hunk["old_string"],
              "new_string": hunk["new_string"], "reason": "the historic fix"}
             for hunk, seen, todo in zip(hunks, answer, pending) if seen and todo]
    with open(spec["log"], "a", encoding="utf-8") as log:
        log.write(json.dumps({"round": request.round, "shown": visible, "pending": pending,
                              "answered": len(edits), "chars": len(shown),
                              "files": sorted(current),
                              "prompt": shown if request.round == 1 else ""}) + "\\n")
    if edits:
        return json.dumps({"analysis": "the historic fix", "modifications": edits})
    return json.dumps({"analysis": "the faulty code is not in what I was shown",
                       "modifications": []})
'''


def write_oracle(work: Path) -> Path:
    folder = work / "oracle"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "historic_oracle.py"
    if not path.exists() or path.read_text() != ORACLE:
        path.write_text(ORACLE)
    return folder


@dataclass(frozen=True)
class Outcome:
    name: str
    project: str
    hunks: int
    shown_first: bool  # every hunk's faulty code in the first prompt
    hunks_shown_first: int
    healed: bool
    refused: str  # the verdict that rejected the full true fix, "" if none
    first_prompt_chars: int
    rounds: int
    seconds: float
    miss: str  # what kind of miss, "" when shown and healed
    detail: str


def _select(selection: Sequence[str]) -> str:
    files = sorted({nodeid.split("::")[0] for nodeid in selection if "::" in nodeid})
    return ",".join(["launched", *(f"{file}::*" for file in files)])


def heal(mat: Materialised, work: Path, rounds: int = 3, timeout: int = 2400,
         always: bool = False) -> Outcome:
    """``pytest --kernelfix`` on a fresh copy of the bugged tree, the oracle answering
    (with ``always``: the true fix in every round, shown or not)."""
    run = work / ("runs-always" if always else "runs") / mat.bug.name
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    root = run / "tree"
    shutil.copytree(mat.bugged, root, symlinks=True)
    (root / READY).unlink()
    log = run / "oracle.jsonl"
    spec = run / "spec.json"
    spec.write_text(json.dumps({"log": str(log), "always": always,
                                "hunks": [asdict(h) for h in mat.hunks]}))
    oracle = write_oracle(work)
    python_path = os.pathsep.join(filter(None, [
        str(oracle), mat.project.env.get("PYTHONPATH", "").format(tree=root),
        os.environ.get("PYTHONPATH")]))
    env = project_env(mat.project, root, {"KERNELFIX_HISTORIC_SPEC": str(spec),
                                          "PYTHONPATH": python_path})
    command = pytest_command(
        mat.project, mat.selection, "-p", "historic_oracle", "--kernelfix",
        f"--kernelfix-rounds={rounds}", f"--kernelfix-select={_select(mat.selection)}",
        "--kernelfix-workers=1", "--kernelfix-rerun-jobs=1", "--tb=short")
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True,
                              timeout=timeout)
        out = done.stdout + done.stderr
    except subprocess.TimeoutExpired as expired:
        out = f"timed out after {timeout} s: {expired.stdout!s}"[-3000:]
    seconds = time.monotonic() - started
    (run / "pytest.out").write_text(out)
    return judge(mat, root, log, seconds, out)


def judge(mat: Materialised, root: Path, log: Path, seconds: float, out: str) -> Outcome:
    """Read the report and the oracle's log into an :class:`Outcome`."""
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    first = next((call for call in calls if call["round"] == 1), None)
    shown = first["shown"] if first else [False] * len(mat.hunks)
    report_path = root / ".kernelfix" / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {"bugs": []}
    files = set(mat.bug.files)
    ours = [b for b in report["bugs"] if files & set(b.get("changed_files") or ())
            or files & set(b.get("files") or ())] or report["bugs"]
    healed = [b for b in ours if b["status"] == "healed" and files & set(b["changed_files"])]
    refused = "" if healed else _refusal(ours, calls, len(mat.hunks))
    miss = "" if healed and all(shown) else describe_miss(mat, first, shown, ours, refused,
                                                           calls, report)
    detail = "; ".join(f"{b['id']}: {b['status']}: {b['reason'][:160]}" for b in ours) or \
        "no bug in the report: " + out[-600:].replace("\n", " | ")
    return Outcome(
        name=mat.bug.name, project=mat.project.name, hunks=len(mat.hunks),
        shown_first=bool(first) and all(shown), hunks_shown_first=sum(shown),
        healed=bool(healed), refused=refused,
        first_prompt_chars=first["chars"] if first else 0,
        rounds=max((b["rounds"] for b in healed), default=0), seconds=seconds, miss=miss,
        detail=detail)


def _refusal(bugs: list[dict], calls: list[dict], hunks: int) -> str:
    """The verdict of the first round in which the oracle proposed the whole fix."""
    full = {call["round"] for call in calls
            if call.get("answered", 0) == hunks or (len(call["shown"]) == hunks
                                                     and all(call["shown"]))}
    for bug in bugs:
        for detail in bug.get("round_details") or ():
            if detail.get("round") in full and detail.get("outcome") != "healed":
                notes = "; ".join(detail.get("notes") or ())
                return f"{detail.get('outcome')}: {notes}"[:300] or bug["reason"][:300]
    if full and bugs and bugs[0]["status"] != "healed":
        return bugs[0]["reason"][:300]
    return ""


def describe_miss(mat: Materialised, first: dict | None, shown: list[bool], bugs: list[dict],
                  refused: str, calls: list[dict], report: dict) -> str:
    """One line per hunk not shown (which definition, what the prompt had of its file),
    or the verdict that refused the true fix."""
    if not bugs:
        unselected = report.get("unselected") or {}
        return f"no bug healed at all (unselected: {unselected.get('reasons')})"
    if first is None:
        return f"the oracle was never asked: {bugs[0]['status']}: {bugs[0]['reason'][:200]}"
    if refused:
        return f"refused: {refused}"
    missing: dict[tuple[str, str, str], list[int]] = {}
    prompt = first["prompt"]
    shown_defs = [entry for bug in bugs for entry in bug.get("shown") or ()]
    for hunk, seen in zip(mat.hunks, shown, strict=True):
        if seen:
            continue
        name = hunk.definition.rsplit(".", 1)[-1]
        if hunk.file not in prompt:
            where = "file not in the prompt; it showed " + (", ".join(first["files"]) or "none")
        elif any(entry == hunk.file for entry in shown_defs):
            where = "file shown whole, hunk lines not found"
        elif any(entry.endswith(":" + hunk.definition) or entry.endswith(":" + name)
                 for entry in shown_defs if entry.startswith(hunk.file)):
            where = "definition shown but cut before the hunk"
        elif f"def {name}(" in prompt or f"class {name}" in prompt:
            where = "definition only in the outline"
        else:
            where = "file shown without the definition"
        missing.setdefault((hunk.file, hunk.definition, where), []).append(hunk.line)
    parts = [f"not shown: {file}: {definition} (line{'s' if len(lines) > 1 else ''} "
             f"{', '.join(map(str, lines))}: {where})"
             for (file, definition, where), lines in missing.items()]
    later = [call["round"] for call in calls if call["round"] > 1 and all(call["shown"])]
    if not parts:
        parts.append(f"shown, not healed: {bugs[0]['status']}: {bugs[0]['reason'][:200]}")
    elif later:
        parts.append(f"shown from round {later[0]}")
    return "; ".join(parts)


# -- the command line ------------------------------------------------------------------------


def check(mat: Materialised) -> tuple[Plain, Plain]:
    """The selection on the clean and on the bugged tree."""
    return (run_plain(mat.project, mat.clean, mat.selection),
            run_plain(mat.project, mat.bugged, mat.selection))


def checkouts(values: Iterable[str]) -> dict[str, Path]:
    found = {}
    for value in values:
        name, _, path = value.partition("=")
        found[name] = Path(path).expanduser().resolve()
    return found


def runnable(bugs: Iterable[HistoricBug], only: Sequence[str] | None,
             given: dict[str, Path]) -> list[tuple[HistoricBug, Path]]:
    """The bugs asked for (``only``: by name; None: all) with the git checkout of their
    project; a line says which were skipped for want of one."""
    chosen = []
    for bug in bugs:
        if only is not None and bug.name not in only:
            continue
        checkout = given.get(bug.project)
        if checkout is None or not (checkout / ".git").exists():
            print(f"skipped {bug.name}: no checkout of {bug.project}")
            continue
        chosen.append((bug, checkout))
    return chosen


def table(outcomes: list[Outcome]) -> list[str]:
    lines = ["| bug | project | hunks | faulty code in first prompt | healed | honest fix "
             "refused | first prompt chars | rounds | seconds | miss |",
             "|---|---|---:|---|---|---|---:|---:|---:|---|"]
    for o in outcomes:
        lines.append(
            f"| {o.name} | {o.project} | {o.hunks} | "
            f"{'yes' if o.shown_first else f'no ({o.hunks_shown_first}/{o.hunks})'} | "
            f"{'yes' if o.healed else 'no'} | {o.refused.split(':')[0] if o.refused else ''} | "
            f"{o.first_prompt_chars} | {o.rounds} | {o.seconds:.0f} | {o.miss} |")
    return lines


def totals(outcomes: list[Outcome]) -> list[str]:
    n = len(outcomes)
    if not n:
        return ["no bug run"]
    sizes = [o.first_prompt_chars for o in outcomes if o.first_prompt_chars]
    per_project = ", ".join(f"{p}: {sum(o.project == p for o in outcomes)}"
                            for p in sorted({o.project for o in outcomes}))
    lines = [
        f"bugs: {n} ({per_project})",
        f"faulty code in the first prompt: {sum(o.shown_first for o in outcomes)} / {n}",
        f"healed: {sum(o.healed for o in outcomes)} / {n}",
        f"honest fixes refused: {sum(bool(o.refused) for o in outcomes)}",
    ]
    if sizes:
        lines.append(f"first prompt: median {statistics.median(sizes):.0f} chars, max "
                     f"{max(sizes)}; at most {PROMPT_LIMIT}: "
                     f"{sum(s <= PROMPT_LIMIT for s in sizes)} / {len(sizes)}")
    lines.append(f"seconds per bug: median {statistics.median(o.seconds for o in outcomes):.0f}, "
                 f"total {sum(o.seconds for o in outcomes):.0f}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkout", action="append", default=[], metavar="PROJECT=PATH",
                        help="a git clone of a project of the catalogue (repeatable)")
    parser.add_argument("--catalogue", type=Path, action="append", default=None,
                        help="a catalogue of bugs (repeatable; default: "
                        + " and ".join(path.name for path in CATALOGUES) + ")")
    parser.add_argument("--work", type=Path, default=None,
                        help="where trees and runs are kept (default: a temporary folder)")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, metavar="NAME")
    parser.add_argument("--check", action="store_true",
                        help="run each selection on the clean and bugged trees, no healing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--always", action="store_true",
                        help="the oracle answers the true fix whether shown or not: does "
                        "verification accept it? (not the benchmark's measure)")
    parser.add_argument("--json", type=Path, default=None, help="write the outcomes here")
    options = parser.parse_args(argv)
    projects, bugs = load_all(options.catalogue or CATALOGUES)
    given = checkouts(options.checkout)
    work = (options.work or Path(tempfile.mkdtemp(prefix="kernelfix-historic-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    chosen = runnable(bugs, options.only, given)
    if not chosen:
        print("no bug to run")
        return 0
    # trees are made one project at a time, so two jobs never archive the same one
    mats = [materialise(bug, projects[bug.project], checkout, work) for bug, checkout in chosen]
    print(f"work dir: {work}")
    if options.check:
        with ThreadPoolExecutor(options.jobs) as pool:
            results = list(pool.map(check, mats))
        bad = 0
        for mat, (clean, bugged) in zip(mats, results, strict=True):
            good = clean.failed == 0 and clean.passed > 0 and bugged.failed > 0
            bad += not good
            print(f"{'ok ' if good else 'BAD'} {mat.bug.name}: hunks {len(mat.hunks)}; clean "
                  f"{clean.passed} passed {clean.failed} failed ({clean.seconds:.0f} s); "
                  f"bugged {bugged.passed} passed {bugged.failed} failed "
                  f"({bugged.seconds:.0f} s)")
            if not good:
                print("  clean: " + clean.tail[-700:].replace("\n", "\n  "))
                print("  bugged: " + bugged.tail[-700:].replace("\n", "\n  "))
        return 1 if bad else 0
    started = time.monotonic()
    with ThreadPoolExecutor(options.jobs) as pool:
        outcomes = list(pool.map(
            lambda mat: heal(mat, work, options.rounds, always=options.always), mats))
    wall = time.monotonic() - started
    print("\n".join(table(outcomes)))
    print()
    print("\n".join(totals(outcomes)))
    print(f"wall time: {wall:.0f} s with {options.jobs} job(s)")
    for o in outcomes:
        if not o.healed:
            print(f"not healed: {o.name}: {o.detail}")
    if options.json:
        options.json.write_text(json.dumps([asdict(o) for o in outcomes], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
