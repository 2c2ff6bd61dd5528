"""Secrets never reach a prompt, a cassette, a report or the plugin's terminal lines.

Three kinds are redacted: values of environment variables whose names hold KEY, TOKEN,
SECRET or PASSWORD or that ``kernelfix_redact_env`` lists, values shaped like a random
key whatever their variable is called (``STRIPE_LIVE=rk_live_...``), and well-known key
shapes (``sk-...``, ``ghp_...``, ``AKIA...``), wherever they appear: tracebacks, sources,
feedback, model answers, reasons.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_llm import FakeLLM, Reply
from hostile.project import BUG, fix_answer, report, write_project

from pytest_kernelfix.capture.errors import ErrorInfo
from pytest_kernelfix.capture.records import Failure
from pytest_kernelfix.engine.files import EditOutcome
from pytest_kernelfix.fixers.base import Proposal, ProposalRequest, Usage
from pytest_kernelfix.fixers.replay import RecordingFixer, load_cassette
from pytest_kernelfix.heal.outcomes import HEALED, HealResult, RoundRecord
from pytest_kernelfix.locate.context import BugContext, SourceFile
from pytest_kernelfix.locate.grouping import BugGroup
from pytest_kernelfix.redact import MARKER, listed, redact, secret_values
from pytest_kernelfix.report.model import BugReport, SessionReport
from pytest_kernelfix.report.patches import patch_name, write_patches
from pytest_kernelfix.report.publish import write_reports

ENV = {
    "KERNELFIX_DEMO_API_KEY": "kfx-live-7f3a9c2e5b1d4086",
    "MY_SERVICE_TOKEN": "tok9d8c7b6a5f4e3d2c1b0a",
    "DB_PASSWORD": "correct-horse-battery",
    "HF_SECRET_VALUE": "s3cr3t-v4lu3-0042",
    "STRIPE_LIVE": "rk_live_51HxYzAbCdEfGhIjKlMnOpQr7x9",  # no rule for its name: its shape
    "DB_PASS": "hunter2hunter2",  # what a CI's service settings are called
    "BACKUP_PASSPHRASE": "correct horse battery staple",
    "SENTRY_DSN": "https://abcdef0123456789abcdef0123456789@o12345.ingest.sentry.io/678",
}
#: A URL's password, whatever the variable is called: the password goes, the URL stays.
URLS = {"DATABASE_URL": ("postgres://ci:Pg-pass-4u@db:5432/app", "Pg-pass-4u")}
#: Redacted because ``kernelfix_redact_env`` lists it (``DEPLOY_*``): neither its name
#: nor its value says so.
LISTED = {"DEPLOY_HOOK": "hook-a1b2"}
SHAPES = {
    "openai": "sk-proj-AbCdEfGhIjKlMnOpQrStUv123456",
    "github": "ghp_0123456789abcdefghijABCDEFGHIJ0123",
    "aws": "AKIAIOSFODNN7EXAMPLE",
}
SECRETS = [*ENV.values(), *SHAPES.values(), *LISTED.values(),
           *(password for _, password in URLS.values())]


#: Long values that are not credentials: paths, URLs, model strings, versions, words.
NOT_SECRETS = {
    "VIRTUAL_ENV": "/home/ci/work/project/.venv-3.11-abcdef0123456789",
    "KERNELFIX_MODEL": "hosted_vllm/Qwen2.5-Coder-32B-Instruct",
    "OTHER_MODEL": "meta-llama/Llama-3.1-8B-Instruct",
    "PIP_INDEX_URL": "https://user@pypi.example.org/simple/a1b2c3d4e5f6a7b8c9d0",
    "GITHUB_REF": "refs/pull/12345/merge",
    "IMAGE": "ubuntu-22.04-x64-20240101",
    "RUNNER_ID": "550e8400-e29b-41d4-a716-446655440000",
    "LS_COLORS": "rs=0:di=01;34:ln=01;36:mh=00:pi=40;33:so=01;35:do=01;35",
    "FILLER": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa1",
    "GIT_AUTHOR_NAME": "Jane Doe-Smithson",
    "OLDPWD": "/home/ci/work",
}


def test_secret_names_values_and_key_shapes_are_redacted() -> None:
    environ = {**ENV, **NOT_SECRETS, "PATH": "/usr/bin", "KEY_COUNT": "3",
               "TOKEN_FILE": "/run/token", **LISTED}
    assert set(secret_values(environ)) == set(ENV.values())  # settings and paths stay
    text = "\n".join(f"{name}={value}" for name, value in {**ENV, **SHAPES}.items())
    cleaned = redact(text, environ)
    assert all(secret not in cleaned for secret in [*ENV.values(), *SHAPES.values()])
    assert cleaned.count(MARKER) == len(ENV) + len(SHAPES)
    assert redact("PATH=/usr/bin", environ) == "PATH=/usr/bin"
    for url, password in URLS.values():
        assert redact(f"connect {url} failed", environ) == (
            f"connect {url.replace(password, MARKER)} failed")
    kept = " ".join(NOT_SECRETS.values())
    assert redact(kept, environ) == kept


def test_listed_variables_are_redacted_whatever_their_value() -> None:
    environ = {**LISTED, "DEPLOY_REGION": "eu1", "KERNELFIX_MODEL": "m"}
    listed(["DEPLOY_*", "KERNELFIX_MODEL"])
    try:
        assert redact("hook-a1b2 to eu1 with m", environ) == f"{MARKER} to eu1 with m"
    finally:  # three characters or fewer would blank out words: kept
        listed(())
    assert redact("hook-a1b2", environ) == "hook-a1b2"


def test_recorded_cassettes_hold_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                           ) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)

    class Echo:
        name = "echo"
        model = "echo-model"

        def propose(self, request: ProposalRequest) -> Proposal:
            return Proposal((), raw=f"my key is {ENV['KERNELFIX_DEMO_API_KEY']} or "
                            f"{SHAPES['openai']}", usage=Usage(1))

    tape = tmp_path / "rec.jsonl"
    context = BugContext("k1_kernel-e-1", ("t::t",), ErrorInfo("E", "m"), "log",
                         (SourceFile("kernels/k1.py", ""),))
    RecordingFixer(Echo(), tape).propose(ProposalRequest(context, 1, ()))
    text = tape.read_text()
    assert all(secret not in text for secret in SECRETS)
    [entry] = load_cassette(tape)
    assert entry.response == f"my key is {MARKER} or {MARKER}"


def test_reports_and_patch_headers_are_redacted(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """report.py redacts on its own, whatever the heal handed it."""
    monkeypatch.setenv("DB_PASSWORD", ENV["DB_PASSWORD"])
    secret = f"{ENV['DB_PASSWORD']} {SHAPES['github']}"
    failure = Failure("tests/test_k1.py::test_k1", "tests/test_k1.py",
                      ErrorInfo("AssertionError", f"login {secret} failed"), f"log {secret}")
    group = BugGroup("k1_kernel-assertionerror-abc123", "k1_kernel", "sig",
                     ("kernels/k1.py",), (failure,))
    record = RoundRecord(1, "model", (EditOutcome("kernels/k1.py", "none", f"near {secret}"),),
                         f"rejected: {secret}")
    result = HealResult(group.id, HEALED, f"healed; {secret}", (record,),
                        {"kernels/k1.py": "a = 1\n"}, {"kernels/k1.py": "a = 2\n"})
    bug = BugReport(group, result, patch_name(group), (), f"not written: {secret}")
    session = SessionReport((bug,), tmp_path, tmp_path, "report", "interpret", "m", 1.0,
                            (f"note {secret}",))
    write_patches(session)
    paths = write_reports(session)
    for path in [paths["json"], paths["markdown"], tmp_path / bug.patch_file]:
        text = path.read_text()
        assert ENV["DB_PASSWORD"] not in text and SHAPES["github"] not in text, path.name
        assert MARKER in text
    assert "+a = 2" in (tmp_path / bug.patch_file).read_text()  # the diff is untouched


KERNEL_SECRETS = (
    f"# Service credentials (never commit these): {SHAPES['openai']}\n"
    f"# {SHAPES['github']} {SHAPES['aws']}\n"
)


TEST_WITH_SECRETS = """import os

import pytest
import torch

from kernels.k1 import k1


@pytest.mark.kernel
def test_k1() -> None:
    x = torch.arange(300, dtype=torch.float32)
    secrets = (f"token {os.environ['MY_SERVICE_TOKEN']}, password {os.environ['DB_PASSWORD']}, "
               f"stripe {os.environ['STRIPE_LIVE']}, hook {os.environ['DEPLOY_HOOK']}, "
               f"db {os.environ['DATABASE_URL']} as {os.environ['DB_PASS']}, "
               f"{os.environ['BACKUP_PASSPHRASE']}, {os.environ['SENTRY_DSN']}")
    torch.testing.assert_close(k1(x, 2.0), x * 2.0, msg=lambda m: f"{m} ({secrets})")
"""


def test_no_secret_leaves_a_session(
    pytester: pytest.Pytester, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    urls = {name: url for name, (url, _) in URLS.items()}
    for name, value in {**ENV, **LISTED, **urls, "KERNELFIX_REDACT_ENV": "DEPLOY_*"}.items():
        monkeypatch.setenv(name, value)
    root = write_project(pytester.path, "k1")
    kernel = root / "kernels" / "k1.py"
    kernel.write_text(KERNEL_SECRETS + kernel.read_text())  # far from the fix: not in its diff
    (root / "tests" / "test_k1.py").write_text(TEST_WITH_SECRETS)
    echo = " ".join(SECRETS)
    fake_llm.script(
        # echoes every secret, and tries to write the redacted line back
        Reply(json.dumps({"analysis": f"I saw {echo}", "modifications": [
            {"file": "kernels/k1.py", "old_string": f"# {MARKER} {MARKER}",
             "new_string": f"# {MARKER}", "reason": echo}]})),
        Reply(fix_answer("k1", analysis=f"Fixed; by the way {echo}")),
    )
    tape = root / "recorded.jsonl"
    result = pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:cacheprovider", "--kernelfix",
        "--kernelfix-model=openai/fake-model", f"--kernelfix-api-base={fake_llm.url}",
        "--kernelfix-rounds=3", f"--kernelfix-record={tape}", timeout=300)

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    bug = report(root)["k1"]
    assert bug["status"] == "healed"
    assert "writes the redaction marker" in bug["round_details"][0]["outcome"]
    prompts = json.dumps(fake_llm.requests)
    assert MARKER in prompts and BUG.strip() in prompts  # the prompts were sent, redacted
    output = result.stdout.str()
    plugin_lines = "\n".join(line for line in output.splitlines() if "kernelfix" in line)
    section = output.split("= kernelfix =")[-1].split("short test summary")[0]
    artifacts = {
        "prompts": prompts,
        "cassette": tape.read_text(),
        "report.json": (root / ".kernelfix" / "report.json").read_text(),
        "report.md": (root / ".kernelfix" / "report.md").read_text(),
        "patch": (root / ".kernelfix" / bug["patch"]).read_text(),
        "suggestions": (root / ".kernelfix" / "suggestions.rdjson").read_text(),
        "terminal": plugin_lines + section,
    }
    prompt_files = sorted((root / ".kernelfix" / "prompts").glob("*/round-*.md"))
    assert len(prompt_files) == 2  # both rounds' prompts and answers
    artifacts.update({path.name: path.read_text() for path in prompt_files})
    leaks = [(where, secret) for where, text in artifacts.items() for secret in SECRETS
             if secret in text]
    assert leaks == []
    assert ENV["MY_SERVICE_TOKEN"] in output  # pytest's own failure report is not ours to edit
