"""Preflight: a setting that cannot work stops the session before any test runs, offline.

Session tests run pytest in a subprocess on a project whose one test leaves a file
behind when it runs, so "before any test" is checked, not assumed; the network test
blocks every socket from interpreter start-up (``sitecustomize``) and records attempts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import make_settings

from pytest_kernelfix.config import Settings
from pytest_kernelfix.session.preflight import (
    check,
    check_api_base,
    check_cache_dir,
    check_cassette_found,
    check_litellm_model,
    check_target,
)

PROJECT_TEST = """\
import pathlib
import sys


def test_runs():
    pathlib.Path("test-ran").write_text(" ".join(sorted(m for m in ("litellm",)
                                                        if m in sys.modules)))
"""

BLOCK_SOCKETS = """\
import os
import socket

_LOG = os.environ["KERNELFIX_TEST_NET_LOG"]


def _blocked(kind):
    def refuse(*args, **kwargs):
        with open(_LOG, "a") as log:
            log.write(f"{kind} {args[1:] if kind == 'connect' else args}\\n")
        raise OSError(f"network blocked by the test: {kind}")
    return refuse


socket.socket.connect = _blocked("connect")
socket.socket.connect_ex = _blocked("connect")
socket.create_connection = _blocked("create_connection")
socket.getaddrinfo = _blocked("getaddrinfo")
"""


def settings(tmp_path: Path, **changes: object) -> Settings:
    return make_settings(tmp_path, **{"model": "recipes", "target": "off", **changes})


def refused(call: object, *args: object, **kwargs: object) -> str:
    with pytest.raises(pytest.UsageError) as info:
        call(*args, **kwargs)  # type: ignore[operator]
    message = str(info.value)
    assert message.startswith("kernelfix: ") and "\n" not in message  # the fix, one line
    return message


# --- each check on its own -------------------------------------------------------------


def test_the_api_base_must_be_an_http_url() -> None:
    check_api_base("")
    check_api_base("http://127.0.0.1:8000/v1")
    check_api_base("https://proxy.example.com")
    for bad in ("localhost:8000", "ftp://host/v1", "http://", "gpu-box:8000/v1"):
        assert "is not a URL" in refused(check_api_base, bad)


def test_the_target_must_be_one_the_gate_knows() -> None:
    for good in ("off", "cuda:90", "cuda:80", "cuda:sm_89", "hip:gfx942"):
        check_target(good, gate=False)
    assert "unknown CUDA target 'cuda:xx'" in refused(check_target, "cuda:xx", gate=False)
    assert "unknown GPU target" in refused(check_target, "tpu:v5", gate=False)
    assert "--kernelfix-target off" in refused(check_target, "cuda:12", gate=False)


def test_the_cache_dir_must_not_be_a_file(tmp_path: Path) -> None:
    check_cache_dir(tmp_path / "not" / "yet" / "made")
    (tmp_path / "blocker").write_text("")
    assert "is a file, not a directory" in refused(check_cache_dir, tmp_path / "blocker" / "c")


def test_cassettes_records_and_prompt_dirs(tmp_path: Path) -> None:
    def fails(**changes: object) -> str:
        return refused(check, settings(tmp_path, **changes), "interpret")

    assert f"searched {tmp_path / 'missing.jsonl'};" in fails(
        model=f"replay:{tmp_path / 'missing.jsonl'}")
    (tmp_path / "a-directory.jsonl").mkdir()
    assert "cannot be read" in fails(model=f"replay:{tmp_path / 'a-directory.jsonl'}")
    (tmp_path / "empty.jsonl").write_text("\n")
    assert "holds no answers" in fails(model=f"replay:{tmp_path / 'empty.jsonl'}")
    (tmp_path / "broken.jsonl").write_text('{"response": "a"}\n{"response": 3}\n')
    assert "line 2" in fails(model=f"replay:{tmp_path / 'broken.jsonl'}")
    assert "needs a live model" in fails(record=tmp_path / "tape.jsonl")
    assert "is not a directory" in fails(prompts_dir=tmp_path / "nowhere")
    (tmp_path / "good.jsonl").write_text(json.dumps({"response": "{}"}) + "\n")
    check(settings(tmp_path, model=f"replay:{tmp_path / 'good.jsonl'}"), "interpret")
    check(settings(tmp_path), "cuda")


def test_a_missing_cassette_names_every_place_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rootdir, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    rootdir.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # pytest runs below or beside the project
    message = refused(check_cassette_found, "tapes/t.jsonl", rootdir)
    assert (f"replay cassette tapes/t.jsonl not found: searched {elsewhere}/tapes/t.jsonl "
            f"and {rootdir}/tapes/t.jsonl; record one with --kernelfix-record") in message
    monkeypatch.chdir(rootdir)  # the same place twice is named once
    assert f"searched {rootdir}/tapes/t.jsonl; record" in refused(
        check_cassette_found, "tapes/t.jsonl", rootdir)
    (rootdir / "tapes").mkdir()
    (rootdir / "tapes" / "t.jsonl").write_text("")
    monkeypatch.chdir(elsewhere)
    check_cassette_found("tapes/t.jsonl", rootdir)  # found under the rootdir


def test_litellm_models_need_a_known_provider_and_its_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "VERTEXAI_PROJECT", "VERTEXAI_LOCATION",
                "OLLAMA_API_BASE"):
        monkeypatch.delenv(key, raising=False)
    warned: list[Warning] = []

    def warn(warning: Warning, stacklevel: int) -> None:
        warned.append(warning)

    assert "names no provider litellm knows" in refused(
        check_litellm_model, "nosuchprovider/model", "", warn)
    message = refused(check_litellm_model, "anthropic/claude-sonnet-4-5", "", warn)
    assert "needs ANTHROPIC_API_KEY in the environment" in message
    assert "recipes" in message  # the way out without a key
    assert "OPENAI_API_KEY" in refused(check_litellm_model, "openai/gpt-4o", "", warn)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-real")
    check_litellm_model("openai/gpt-4o", "", warn)
    monkeypatch.delenv("OPENAI_API_KEY")
    check_litellm_model("openai/local-model", "http://127.0.0.1:8000/v1", warn)  # no key
    check_litellm_model("ollama/qwen2.5-coder", "", warn)
    check_litellm_model("hosted_vllm/Qwen/Qwen2.5-Coder", "http://gpu:8000/v1", warn)
    assert warned == []
    check_litellm_model("vertex_ai/gemini-pro", "", warn)  # gcloud credentials may do
    (warning,) = warned
    assert isinstance(warning, pytest.PytestConfigWarning) and "VERTEXAI_PROJECT" in str(warning)


# --- whole sessions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--kernelfix-model=openai/gpt-4o",), "needs OPENAI_API_KEY in the environment"),
        (("--kernelfix-model=nosuchprovider/model",), "names no provider litellm knows"),
        (("--kernelfix-model=replay:missing.jsonl",), "replay cassette missing.jsonl not found"),
        (("--kernelfix-target=cuda:xx",), "unknown CUDA target 'cuda:xx'"),
        (("--kernelfix-model=openai/m", "--kernelfix-api-base=localhost:8000"), "not a URL"),
        (("--kernelfix-prompts-dir=nowhere",), "is not a directory"),
        (("-n", "2", "--kernelfix-target=cuda:xx"), "unknown CUDA target 'cuda:xx'"),
    ],
    ids=["no-key", "unknown-provider", "no-cassette", "bad-target", "bad-api-base",
         "no-prompts-dir", "xdist"],
)
def test_a_bad_setting_stops_the_session_before_any_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...],
    message: str,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    pytester.makepyfile(test_project=PROJECT_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kernelfix",
                                           "--kernelfix-device=interpret", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.stderr.lines if line.startswith("ERROR: kernelfix: ")]
    assert len(errors) == 1 and message in errors[0], result.stderr.str()
    assert not (pytester.path / "test-ran").exists()


def test_start_up_makes_no_network_call(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Preflight with a litellm model (litellm imported, provider and key checked) while
    every socket is blocked from interpreter start-up: the session starts and is green."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCK_SOCKETS)
    log = tmp_path / "net.log"
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("KERNELFIX_TEST_NET_LOG", str(log))
    monkeypatch.setenv("ANTHROPIC_API_KEY", "not-a-real-key")
    pytester.makepyfile(test_project=PROJECT_TEST + """

def test_the_network_is_blocked():
    import socket

    import pytest

    with pytest.raises(OSError, match="network blocked by the test"):
        socket.create_connection(("127.0.0.1", 9))
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kernelfix",
                                           "--kernelfix-model=anthropic/claude-sonnet-4-5")
    result.assert_outcomes(passed=2)
    assert (pytester.path / "test-ran").read_text() == "litellm"  # the preflight imported it
    assert log.read_text().splitlines() == ["create_connection (('127.0.0.1', 9),)"]
