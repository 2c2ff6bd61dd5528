"""The docs as a newcomer reads them: every option documented as it is, the CI job valid
and runnable, every command, example and link pointing at something that exists.

The docs are read as text: Markdown tables, fenced code blocks and links. Most tests are
unit tests; the two that run a documented example (the CI job's ``pytest`` step, the hook
example of ``docs/hooks.md``) are whole sessions through ``pytester``.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import test_layering as layering
import yaml
from factories import make_settings
from kernel_project import git_init, git_status, make_project, report_of

from pytest_kernelfix.config import FLAGS, OPTIONS, Option
from pytest_kernelfix.engine.parse import parse_modifications
from pytest_kernelfix.report.github import SUGGESTIONS_FILE, SUMMARY_ENV

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = (README, ROOT / "benchmarks" / "README.md", *sorted(DOCS.glob("*.md")))
PACKAGE = ROOT / "pytest_kernelfix"
BY_NAME = {option.name: option for option in OPTIONS}
KNOWN_FLAGS = {option.flag: option for option in OPTIONS if option.kind != "lines"}
REPORT_DIR = BY_NAME["kernelfix_report_dir"].default
CACHE_ENV = BY_NAME["kernelfix_cache_dir"].env

_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FLAG = re.compile(r"--kernelfix(?:-[a-z]+)*")


# -- reading Markdown ---------------------------------------------------------------------


def text_of(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def code_blocks(text: str, language: str) -> list[str]:
    """The bodies of the fenced blocks of one language (``sh``, ``yaml``...)."""
    return [body for lang, body in _FENCE.findall(text) if lang == language]


def prose(text: str) -> str:
    """The page without its fenced blocks (headings and links are read from this)."""
    return _FENCE.sub("", text)


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row, separator rows left out."""
    rows = []
    for line in prose(text).splitlines():
        if not line.startswith("|") or re.fullmatch(r"\|[-:| ]+\|", line.strip()):
            continue
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        rows.append([cell.strip() for cell in cells])
    return rows


def section(text: str, heading: str) -> str:
    """The text under ``heading`` (a ``## `` line), up to the next heading of that level."""
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:] if end < 0 else text[start:end]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to ``-``."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(line.lstrip("#")) for line in prose(text_of(page)).splitlines()
            if re.match(r"#{1,6} ", line)}


def links(text: str) -> list[str]:
    """The targets of a page's links, outside code blocks and code spans."""
    return _LINK.findall(re.sub(r"`[^`\n]*`", "", prose(text)))


def ticked(cell: str) -> list[str]:
    """The ``code`` spans of a cell, in order."""
    return re.findall(r"`([^`]+)`", cell)


# -- (a) every option in docs/options.md -----------------------------------------------------


def documented_default(option: Option) -> str:
    """How options.md writes a default: the value in backticks, or "unset"."""
    value = option.default
    if option.kind == "bool":
        return "on" if value else "off"
    if option.kind == "workers" and value == 0:
        return "auto"
    if value in ("", ()):
        return "unset"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def option_rows() -> dict[str, list[str]]:
    """options.md's table rows by the ini name in their second cell."""
    rows: dict[str, list[str]] = {}
    for cells in table_rows(text_of(DOCS / "options.md")):
        names = ticked(cells[1]) if len(cells) == 5 else []
        if names and names[0].startswith("kernelfix"):
            assert names[0] not in rows, f"{names[0]} is documented twice"
            rows[names[0]] = cells
    return rows


@pytest.mark.parametrize("option", OPTIONS, ids=lambda option: option.name)
def test_every_option_is_documented_with_its_flag_ini_env_and_default(option: Option) -> None:
    row = option_rows().get(option.name)
    assert row is not None, f"docs/options.md has no row for {option.name}"
    flag, ini, env, default, what = row
    assert ticked(ini) == [option.name]
    if option.kind == "lines":
        assert flag == "", f"{option.name} is ini-only, yet options.md shows a flag"
    else:
        (shown,) = ticked(flag)
        assert shown.split(" ")[0] == option.flag
        assert (shown == option.flag) == (option.name in FLAGS), (
            f"{option.flag}: a bare flag takes no value, the others show one")
    assert ticked(env) == ([option.env] if option.env else [])
    expected = documented_default(option)
    if expected == "unset":
        assert default.startswith("unset"), default
    else:
        assert default.split(" ")[0].strip(":") == f"`{expected}`", default
    for choice in option.choices:
        assert f"`{choice}`" in what or choice in flag, f"{option.flag}: {choice} not shown"
    assert what, f"{option.name}: say what it does"


def test_options_md_documents_no_option_that_does_not_exist() -> None:
    assert set(option_rows()) == set(BY_NAME)


def test_options_md_states_the_precedence_that_resolve_applies() -> None:
    text = section(text_of(DOCS / "options.md"), "## Where a value comes from")
    order = [text.index(word) for word in
             ("the command line", "the environment variable", "the ini file", "the default")]
    assert order == sorted(order)


# -- (b) the GitHub Actions job --------------------------------------------------------------


def ci_workflow() -> dict[Any, Any]:
    (workflow,) = [yaml.safe_load(block) for block in code_blocks(text_of(DOCS / "ci.md"), "yaml")
                   if "jobs:" in block]
    assert isinstance(workflow, dict)
    return workflow


def ci_job() -> dict[str, Any]:
    (job,) = ci_workflow()["jobs"].values()
    return job


def steps_using(job: Mapping[str, Any], action: str) -> list[dict[str, Any]]:
    return [step for step in job["steps"] if str(step.get("uses", "")).startswith(action + "@")]


def step_running(job: Mapping[str, Any], pattern: str) -> dict[str, Any]:
    (step,) = [step for step in job["steps"] if re.search(pattern, str(step.get("run", "")))]
    return step


def makefile_torch() -> str:
    match = re.search(r"^TORCH_CPU \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert match is not None
    return match.group(1)


def test_the_ci_job_is_one_valid_github_actions_job() -> None:
    workflow = ci_workflow()
    triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as true
    assert isinstance(triggers, list) and "pull_request" in triggers
    job = ci_job()
    assert job["runs-on"] == "ubuntu-latest"
    assert job["permissions"]["pull-requests"] == "write"  # reviewdog posts a review
    assert all(isinstance(step, dict) and ("uses" in step or "run" in step)
               for step in job["steps"])


def test_the_ci_job_has_every_step_a_newcomer_needs_in_order() -> None:
    job = ci_job()
    steps = job["steps"]
    (checkout,) = steps_using(job, "actions/checkout")
    (python,) = steps_using(job, "actions/setup-python")
    install = step_running(job, r"pip install torch")
    (restore,) = steps_using(job, "actions/cache/restore")
    tests = step_running(job, r"^pytest ")
    (save,) = steps_using(job, "actions/cache/save")
    (upload,) = steps_using(job, "actions/upload-artifact")
    (reviewdog_setup,) = steps_using(job, "reviewdog/action-setup")
    reviewdog = step_running(job, r"^reviewdog ")
    order = [steps.index(step) for step in (checkout, python, install, restore, tests, save,
                                            upload, reviewdog_setup, reviewdog)]
    assert order == sorted(order)

    assert python["with"]["cache"] == "pip"
    torch = f"pip install {makefile_torch()} --index-url https://download.pytorch.org/whl/cpu"
    assert torch in install["run"], "the CPU build of the torch the Makefile installs"
    assert 'pip install "$KERNELFIX_PLUGIN"' in install["run"]
    assert "KERNELFIX_PLUGIN" in job["env"]

    cache_dir = job["env"][CACHE_ENV]
    assert restore["with"]["path"] == save["with"]["path"] == cache_dir
    assert restore["with"]["key"] == save["with"]["key"]
    assert restore["with"]["restore-keys"]
    assert Path(REPORT_DIR) not in (Path(cache_dir), *Path(cache_dir).parents), (
        "the cache dir lies outside the report dir: the artifact holds the reports only")

    assert "--kernelfix" in shlex.split(tests["run"])
    assert "if" not in tests
    assert upload["with"]["path"].rstrip("/") == REPORT_DIR
    # .kernelfix is hidden: upload-artifact@v4 (from v4.4) skips it unless told, and a lost
    # upload must fail the step, not pass as a warning
    assert upload["with"]["include-hidden-files"] is True
    assert upload["with"].get("if-no-files-found", "warn") == "error"
    assert f"hashFiles('{REPORT_DIR}/report.json') != ''" in upload["if"]
    assert isinstance(job["timeout-minutes"], int) and 0 < job["timeout-minutes"] <= 360
    rdjson = f"{REPORT_DIR}/{SUGGESTIONS_FILE}"
    assert "-f=rdjson" in reviewdog["run"] and f"< {rdjson}" in reviewdog["run"]
    for step in (save, upload, reviewdog_setup, reviewdog):  # wanted most when tests fail
        assert "always()" in step["if"], step
    for step in (reviewdog_setup, reviewdog):  # a green run writes no report dir
        assert f"hashFiles('{rdjson}')" in step["if"]


def test_the_ci_job_leaves_the_step_summary_to_the_plugin() -> None:
    """The plugin appends report.md itself: a step doing it too would show it twice."""
    assert SUMMARY_ENV not in json.dumps(ci_workflow())


# -- (c) the documented commands -------------------------------------------------------------


def command_lines() -> Iterator[tuple[str, list[str]]]:
    """Every pytest command line of the docs' shell blocks and of the CI job's steps."""
    runs = [str(step.get("run", "")) for step in ci_job()["steps"]]
    for page in PAGES:
        for block in [*code_blocks(text_of(page), "sh"), *(runs if page.name == "ci.md" else [])]:
            for line in block.replace("\\\n", " ").splitlines():
                words = shlex.split(line, comments=True)
                if "pytest" in words:
                    yield page.name, words[words.index("pytest"):]


def test_every_kernelfix_flag_the_docs_mention_exists() -> None:
    for page in PAGES:
        unknown = set(_FLAG.findall(text_of(page))) - set(KNOWN_FLAGS)
        assert not unknown, f"{page.name} mentions {sorted(unknown)}, which are no options"


def test_every_documented_pytest_command_gives_each_option_its_value() -> None:
    lines = list(command_lines())
    assert any(words[:2] == ["pytest", "--kernelfix"] for _, words in lines)
    for page, words in lines:
        for index, word in enumerate(words):
            name, equals, value = word.partition("=")
            option = KNOWN_FLAGS.get(name)
            if option is None:
                assert not name.startswith("--kernelfix"), f"{page}: {' '.join(words)}"
                continue
            if option.name in FLAGS:
                assert not equals, f"{page}: {name} takes no value"
                continue
            given = value if equals else (words[index + 1] if index + 1 < len(words) else "")
            assert given and not given.startswith("-"), f"{page}: {name} needs a value"
            if option.choices:
                assert given in option.choices, f"{page}: {word} {given}"


def test_every_ini_key_of_the_docs_is_an_option() -> None:
    for page in PAGES:
        text = text_of(page)
        for block in [*code_blocks(text, "ini"), *code_blocks(text, "toml")]:
            keys = re.findall(r"^(kernelfix\w*)\s*=", block, re.M)
            assert set(keys) <= set(BY_NAME), f"{page.name}: {keys}"


def test_every_kernelfix_environment_variable_of_the_docs_exists() -> None:
    in_code = set()
    for path in PACKAGE.rglob("*.py"):
        in_code |= set(re.findall(r'"(KERNELFIX_[A-Z_]+)"', path.read_text(encoding="utf-8")))
    known = in_code | {option.env for option in OPTIONS if option.env} | set(ci_job()["env"])
    for page in PAGES:
        unknown = set(re.findall(r"KERNELFIX_[A-Z_]+", text_of(page))) - known
        assert not unknown, f"{page.name} mentions {sorted(unknown)}"


def test_the_make_targets_the_readme_names_exist() -> None:
    targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = set(re.findall(r"(?:^|`)make ([a-z][\w-]*)", text_of(README), re.M))
    assert {"demo", "test"} <= named  # the quickstart's two commands
    assert named <= targets, sorted(named - targets)


def test_the_readme_shows_an_install_that_works_without_an_index() -> None:
    """The package is not on PyPI: no line may install it from there by name."""
    for page in PAGES:
        for block in code_blocks(text_of(page), "sh"):
            for line in block.splitlines():
                assert not re.search(r"pip install\s+(-U\s+)?pytest-kernelfix\b", line), line
    assert "pip install /path/to/pytest-kernelfix" in text_of(README)


def test_every_json_example_of_the_docs_parses() -> None:
    for page in PAGES:
        for block in code_blocks(text_of(page), "json"):
            document = json.loads(block)
            if "modifications" in document:  # an answer: the parser reads it too
                parse_modifications(block)


def test_the_hook_example_answer_string_is_a_readable_answer() -> None:
    text = text_of(DOCS / "hooks.md")
    (block,) = [block for block in code_blocks(text, "python")
                if block.lstrip().startswith("return")]
    function = ast.parse("def hook():\n" + block).body[0]
    assert isinstance(function, ast.FunctionDef) and isinstance(function.body[0], ast.Return)
    answer = ast.literal_eval(function.body[0].value)  # type: ignore[arg-type]
    (edit,) = parse_modifications(answer).modifications
    assert (edit.file, edit.old_string) == ("kernels/gelu.py", "tl.tanh(u)")
    assert edit.old_string in (ROOT / "example_project" / "kernels" / "gelu.py").read_text()


def evaluated(value: object) -> str:
    """An env value as GitHub evaluates it on a run without secrets (a fork's pull request):
    ``${{ secrets.X }}`` is empty, ``${{ secrets.X && 'a' || 'b' }}`` is ``b``."""
    text = str(value)
    fallback = re.fullmatch(r"\$\{\{\s*secrets\.\w+\s*&&\s*'[^']*'\s*\|\|\s*'([^']*)'\s*\}\}",
                            text)
    if fallback:
        return fallback.group(1)
    if re.fullmatch(r"\$\{\{\s*secrets\.\w+\s*\}\}", text):
        return ""
    assert "${{" not in text, text
    return text


def condition_holds(condition: str, root: Path, event: str = "pull_request") -> bool:
    """A step's ``if:`` as the runner evaluates it after a failed step: the expressions
    the job uses (``always()``, ``hashFiles('path') != ''``, the event name), joined by
    ``&&``."""
    holds = True
    for term in (part.strip() for part in condition.split("&&")):
        found = re.fullmatch(r"hashFiles\('([^']+)'\) != ''", term)
        if term == "always()":
            continue
        if found:
            holds &= any(root.glob(found.group(1)))
        elif (name := re.fullmatch(r"github\.event_name == '(\w+)'", term)) is not None:
            holds &= name.group(1) == event
        else:
            raise AssertionError(f"an expression this test cannot evaluate: {term}")
    return holds


def uploaded(step: Mapping[str, Any], root: Path) -> dict[str, Path]:
    """What ``actions/upload-artifact@v4`` puts in the artifact: the files under ``path``
    (relative to it), hidden ones (a name starting with a dot, anywhere in the path) only
    with ``include-hidden-files``; an empty artifact fails only with
    ``if-no-files-found: error``."""
    base = root / step["with"]["path"]
    hidden_ok = step["with"].get("include-hidden-files") is True
    files = {}
    for path in sorted(base.rglob("*")):
        hidden = any(part.startswith(".") for part in path.relative_to(root).parts)
        if path.is_file() and (hidden_ok or not hidden):
            files[path.relative_to(base).as_posix()] = path
    if not files:
        assert step["with"].get("if-no-files-found", "warn") == "error", (
            "the artifact is empty and nothing says so")
    return files


def test_the_ci_jobs_pytest_step_runs_as_documented(pytester: pytest.Pytester,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    """The job's test step, run as the runner would on a project with a broken kernel and
    no ``kernel`` marker: the step fails, the plugin heals, fills the step summary once and
    leaves what the artifact and reviewdog steps read; the artifact, downloaded, applies
    as the page says."""
    job = ci_job()
    tests = step_running(job, r"^pytest ")
    kernel = make_project(pytester, "tanh")  # recipes heal it: a run without the secret
    test_file = pytester.path / "tests" / "test_ops.py"
    test_file.write_text(test_file.read_text().replace("@pytest.mark.kernel\n", ""))
    git_init(pytester.path)
    for name, value in {**job["env"], **tests.get("env", {})}.items():
        monkeypatch.setenv(name, evaluated(value))
    summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv(SUMMARY_ENV, str(summary))

    command = shlex.split(tests["run"])
    assert command[0] == "pytest"
    result = pytester.runpytest_subprocess(*command[1:])

    result.assert_outcomes(failed=5)
    assert result.ret == pytest.ExitCode.TESTS_FAILED  # the step still fails
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed", bug["reason"]
    result.stdout.fnmatch_lines(["::notice file=kernels/ops.py,line=*"])
    report_dir = pytester.path / step_running(job, r"^reviewdog ")["run"].split("< ")[1].split(
        "/")[0]
    (upload,) = steps_using(job, "actions/upload-artifact")
    assert report_dir == pytester.path / upload["with"]["path"].rstrip("/")
    assert (report_dir / bug["patch"]).is_file()
    assert summary.read_text() == (report_dir / "report.md").read_text()  # once, by the plugin
    suggestions = json.loads((report_dir / SUGGESTIONS_FILE).read_text())
    assert [d["location"]["path"] for d in suggestions["diagnostics"]] == ["kernels/ops.py"]
    cache = pytester.path / job["env"][CACHE_ENV]  # what the cache steps save and restore
    assert cache.is_dir() and any(cache.iterdir())
    untracked = git_status(pytester.path)  # the cache dir keeps out of it, as the reports
    assert (cache / ".gitignore").is_file() and job["env"][CACHE_ENV] not in untracked
    assert REPORT_DIR + "/" not in untracked
    assert not (report_dir / "cache").exists()

    # the upload step runs, and the artifact holds the reports and the patch
    (save,) = steps_using(job, "actions/cache/save")
    assert condition_holds(upload["if"], pytester.path)
    assert condition_holds(save["if"], pytester.path)
    artifact = uploaded(upload, pytester.path)
    assert {"report.md", "report.json", SUGGESTIONS_FILE, bug["patch"]} <= set(artifact)
    # a reviewer downloads it and applies the patch as the page says
    download = tmp_path / "kernelfix-artifact"
    for name, path in artifact.items():
        (download / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, download / name)
    (how,) = [block for block in code_blocks(text_of(DOCS / "ci.md"), "sh")
              if "gh run download" in block]
    (apply_line,) = [line for line in how.splitlines() if line.startswith("git apply")]
    command = shlex.split(apply_line.replace("<bug id>", bug["id"]).replace(
        "kernelfix-artifact/", f"{download}/"))
    subprocess.run(command, cwd=pytester.path, check=True, capture_output=True)
    assert "tl.tanh" not in kernel.read_text()
    # a green run: nothing is uploaded (the step is skipped, not failed)
    shutil.rmtree(report_dir)
    assert not condition_holds(upload["if"], pytester.path)


def test_a_ci_job_without_hidden_files_would_upload_nothing(tmp_path: Path) -> None:
    """What the upload check guards against: the report dir is hidden."""
    (tmp_path / REPORT_DIR).mkdir()
    (tmp_path / REPORT_DIR / "report.md").write_text("# kernelfix report\n")
    step = {"with": {"path": f"{REPORT_DIR}/", "if-no-files-found": "ignore"}}
    with pytest.raises(AssertionError, match="the artifact is empty"):
        uploaded(step, tmp_path)
    step["with"]["include-hidden-files"] = True
    assert set(uploaded(step, tmp_path)) == {"report.md"}


# -- every message the docs quote is the code's own -------------------------------------------


def quoted_messages() -> set[str]:
    """The plugin's errors and start-up warnings as the docs quote them: the lines (in code
    blocks, indented ones in lists too) that start ``ERROR: kernelfix:`` or
    ``PytestConfigWarning: kernelfix:``."""
    found = set()
    for page in PAGES:
        found |= {line.strip() for line in text_of(page).splitlines() if line.strip().startswith(
            ("ERROR: kernelfix:", "PytestConfigWarning: kernelfix:"))}
    return found


def produced_messages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> set[str]:
    """The same messages, made by the code that prints them, with the settings the docs
    describe."""
    from pytest_kernelfix.config import _convert
    from pytest_kernelfix.session import preflight

    for name in ("OPENAI_API_KEY", "OPENAI_API_BASE", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    errors: list[str] = []
    warned: list[str] = []

    def refused(call: Any, *args: Any, **kwargs: Any) -> None:
        with pytest.raises(pytest.UsageError) as info:
            call(*args, **kwargs)
        errors.append(str(info.value))

    def warn(warning: Warning, stacklevel: int) -> None:
        warned.append(f"{type(warning).__name__}: {warning}")

    refused(_convert, BY_NAME["kernelfix_rounds"], "three")
    refused(preflight.check_litellm_model, "openai/gpt-4o", "")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "")
    refused(preflight.check_litellm_model, "anthropic/claude-sonnet-4-5", "",
            source="KERNELFIX_MODEL")
    refused(preflight.check_litellm_model, "openai/", "", source="KERNELFIX_MODEL")
    monkeypatch.setenv("OPENAI_API_BASE", "http://localhost:8000/v1")
    refused(preflight.check_litellm_model, "openai/qwen2.5-coder", "",
            probe=lambda url: "connection refused")
    settings = make_settings(tmp_path, device="cuda")
    refused(preflight.check_device, settings, lambda: (
        "torch 2.13.0+cpu sees no CUDA GPU on this machine (torch.cuda.is_available() is "
        "False)"))
    preflight.check_priced("openai/my-model", "--kernelfix-max-cost 2", warn)
    return {f"ERROR: {error}" for error in errors} | set(warned)


def test_every_message_the_docs_quote_is_the_one_the_code_prints(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    quoted = quoted_messages()
    assert len(quoted) >= 4
    unknown = quoted - produced_messages(monkeypatch, tmp_path)
    assert not unknown, f"the docs quote messages the code does not print: {sorted(unknown)}"


@pytest.mark.slow
def test_the_hook_example_heals_the_example_projects_gelu(pytester: pytest.Pytester) -> None:
    """docs/hooks.md's conftest, at the root of a copy of the example project, answers the
    missing tl.tanh itself: the configured fixer (recipes, which knows it too) is not asked."""
    text = text_of(DOCS / "hooks.md")
    (conftest,) = [block for block in code_blocks(text, "python")
                   if block.startswith("# conftest.py")]
    example = ROOT / "example_project"
    shutil.copytree(example / "kernels", pytester.path / "kernels")
    (pytester.path / "tests").mkdir()
    for name in ("conftest.py", "test_gelu.py"):
        shutil.copy(example / "tests" / name, pytester.path / "tests" / name)
    shutil.copy(example / "pyproject.toml", pytester.path / "pyproject.toml")
    (pytester.path / "conftest.py").write_text(conftest)

    result = pytester.runpytest_subprocess("tests/test_gelu.py", "-k", "1000-fp32",
                                           "-p", "no:cacheprovider", "--kernelfix")

    result.assert_outcomes(failed=1)
    (bug,) = report_of(pytester.path)["bugs"]
    assert bug["status"] == "healed", bug["reason"]
    assert [round_["source"] for round_ in bug["round_details"]] == ["hook"]


def module_of(parts: list[str]) -> tuple[Path, int] | None:
    """The source file of the longest module that ``parts`` start with (found on disk,
    never imported), and how many of the parts name it."""
    dirs = dict(re.findall(r'^"(pytest_kernelfix\.\w+)" = "(\w+)"$',
                           (ROOT / "pyproject.toml").read_text(), re.M))
    for length in range(len(parts), 0, -1):
        name = ".".join(parts[:length])
        base = ROOT / dirs[name] if name in dirs else ROOT.joinpath(*parts[:length])
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                return candidate, length
    return None


def top_level_names(source: Path) -> set[str]:
    """What a module defines at its top level, lazy exports (``_EXPORTS``) included."""
    names = set()
    for node in ast.parse(source.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {target.id for target in targets if isinstance(target, ast.Name)}
            if any(isinstance(t, ast.Name) and t.id == "_EXPORTS" for t in targets) and (
                    isinstance(node.value, ast.Dict)):
                names |= {key.value for key in node.value.keys
                          if isinstance(key, ast.Constant) and isinstance(key.value, str)}
    return names


def test_every_module_and_name_the_docs_spell_out_exists() -> None:
    """``pytest_kernelfix.a.b`` and ``pytest_kernelfix.a.b.name`` in the docs: the module
    is a file of the package, the name one it defines."""
    for page in PAGES:
        for dotted in set(re.findall(r"pytest_kernelfix(?:\.\w+)+", text_of(page))):
            parts = dotted.split(".")
            found = module_of(parts)
            assert found is not None, f"{page.name}: {dotted}"
            source, length = found
            rest = parts[length:]
            assert not rest or rest[0] in top_level_names(source), f"{page.name}: {dotted}"


# -- docs/architecture.md matches the code ------------------------------------------------------


def test_architecture_names_every_module_in_its_package_row() -> None:
    rows = [(ticked(cells[0])[0].removeprefix("pytest_kernelfix/"), " ".join(cells))
            for cells in table_rows(section(text_of(DOCS / "architecture.md"),
                                            "## The packages"))[1:]]
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "__init__.py" and path.parent != PACKAGE:
            continue
        folder = path.parent.relative_to(PACKAGE).as_posix()
        package = "" if folder == "." else folder + "/"
        cells = " ".join(row for key, row in rows if key == package)
        assert f"`{path.name}`" in cells, f"docs/architecture.md: {package}{path.name} is missing"


def test_architecture_states_the_layering_rules_the_layering_test_enforces() -> None:
    text = section(text_of(DOCS / "architecture.md"), "## The layering rules")
    stated = {}
    for cells in table_rows(text)[1:]:
        (stage,) = ticked(cells[0])
        stated[stage] = frozenset(ticked(cells[1]))
    assert stated == dict(layering.ALLOWED)
    shared = re.search(r"^- The shared modules.*?(?=^- )", text, re.S | re.M)
    assert shared is not None
    names = set(ticked(shared.group(0)))
    assert names - set(layering.ALLOWED) == layering.SHARED - {"", "__version__"}
    assert names & set(layering.ALLOWED) == layering.SHARED_MAY_USE
    faces = re.search(r"^- The faces.*?(?=^- )", text, re.S | re.M)
    assert faces is not None
    assert {name for name in ticked(faces.group(0))} == {"__init__", *layering.FACES - {""}}


# -- (d) links -------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_points_at_an_existing_file_and_heading(page: Path) -> None:
    for target in links(text_of(page)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target} does not exist"
        if anchor and linked.suffix == ".md":
            assert anchor in anchors(linked), f"{page.name}: {target}: no such heading"


def test_the_readme_links_every_docs_page() -> None:
    linked = {target.partition("#")[0] for target in links(text_of(README))}
    pages = {f"docs/{page.name}" for page in DOCS.glob("*.md")}
    assert pages <= linked, sorted(pages - linked)
