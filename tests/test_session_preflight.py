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
from fake_llm import FakeLLM, closed_port_url

from pytest_kernelfix.config import Settings
from pytest_kernelfix.session.preflight import (
    check,
    check_api_base,
    check_cache_dir,
    check_cassette_found,
    check_device,
    check_litellm_model,
    check_priced,
    check_target,
    no_gpu,
    probe_endpoint,
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
    probed: list[str] = []

    def answers(url: str) -> str:
        probed.append(url)
        return ""

    check_litellm_model("openai/local-model", "http://127.0.0.1:8000/v1", warn,
                        probe=answers)  # no key
    check_litellm_model("ollama/qwen2.5-coder", "", warn, probe=answers)
    check_litellm_model("hosted_vllm/Qwen/Qwen2.5-Coder", "http://gpu:8000/v1", warn,
                        probe=answers)
    assert probed == ["http://127.0.0.1:8000/v1", "http://localhost:11434",
                      "http://gpu:8000/v1"]  # a configured or local endpoint: one probe each
    assert warned == []
    check_litellm_model("vertex_ai/gemini-pro", "", warn)  # gcloud credentials may do
    (warning,) = warned
    assert isinstance(warning, pytest.PytestConfigWarning) and "VERTEXAI_PROJECT" in str(warning)


def test_empty_keys_and_empty_model_names_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("OPENAI_API_BASE", "OPENAI_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "")  # what CI gives for a secret it cannot read
    message = refused(check_litellm_model, "openai/gpt-4o", "")
    assert ("--kernelfix-model openai/gpt-4o needs OPENAI_API_KEY, which is set but empty (in "
            "CI: a secret this run cannot read") in message
    monkeypatch.setenv("ANTHROPIC_API_KEY", "   ")
    assert "ANTHROPIC_API_KEY, which is set but empty" in refused(
        check_litellm_model, "anthropic/claude-sonnet-4-5", "")
    for model in ("openai/", "openai/  ", "anthropic/"):
        assert "but no model: write it as" in refused(check_litellm_model, model, "")
    assert refused(check_litellm_model, "openai/", "", source="KERNELFIX_MODEL").startswith(
        "kernelfix: KERNELFIX_MODEL=openai/ names the provider openai but no model")


def test_an_endpoint_set_by_the_providers_variable_is_understood_and_probed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_BASE", "http://127.0.0.1:8000/v1")
    probed: list[str] = []
    check_litellm_model("openai/local", "", probe=lambda url: probed.append(url) or "")
    assert probed == ["http://127.0.0.1:8000/v1"]  # a local server: no key needed
    message = refused(check_litellm_model, "openai/local", "",
                      probe=lambda url: "connection refused")
    assert message == ("kernelfix: the model endpoint http://127.0.0.1:8000/v1 (from "
                       "OPENAI_API_BASE) does not answer: connection refused; start the server "
                       "or correct the URL, or pick recipes (no model) or replay:PATH (a "
                       "cassette)")
    monkeypatch.setenv("OPENAI_API_BASE", "gpu-box:8000")
    assert refused(check_litellm_model, "openai/local", "", probe=lambda url: "").startswith(
        "kernelfix: OPENAI_API_BASE='gpu-box:8000' is not a URL")


def test_the_probe_asks_once_and_says_why_a_server_does_not_answer(fake_llm: FakeLLM) -> None:
    assert probe_endpoint(fake_llm.url) == ""  # any HTTP answer will do (here 501 to a GET)
    assert fake_llm.requests == []  # and no chat request: nothing was paid for
    assert probe_endpoint(closed_port_url()) == "connection refused"
    assert probe_endpoint("http://no-such-host.invalid:8000/v1", timeout=2)


def test_a_cuda_device_without_a_gpu_is_refused(tmp_path: Path) -> None:
    no_gpu = "torch 2.13.0+cpu sees no CUDA GPU on this machine"
    message = refused(check_device, settings(tmp_path, device="cuda"), lambda: no_gpu)
    assert message.startswith(f"kernelfix: --kernelfix-device cuda, but {no_gpu}: run the "
                              "kernels on the Triton interpreter with --kernelfix-device "
                              "interpret")
    ini = settings(tmp_path, device="cuda", origins=(("kernelfix_device", "ini kernelfix_device"),))
    assert "kernelfix: ini kernelfix_device = cuda, but" in refused(check_device, ini,
                                                                    lambda: no_gpu)
    check_device(settings(tmp_path, device="cuda"), lambda: "")  # a GPU is seen
    check_device(settings(tmp_path, device="auto"), lambda: no_gpu)  # auto picks the interpreter


def test_a_cost_cap_on_a_model_without_a_price_is_said_to_cap_nothing() -> None:
    warned: list[Warning] = []

    def warn(warning: Warning, stacklevel: int) -> None:
        warned.append(warning)

    check_priced("openai/gpt-4o-mini", "--kernelfix-max-cost 2", warn)
    assert warned == []
    check_priced("openai/my-local-model", "--kernelfix-max-cost 2", warn)
    (warning,) = warned
    assert str(warning) == ("kernelfix: --kernelfix-max-cost 2 cannot cap openai/my-local-model: "
                            "litellm has no price for it, so its answers count as $0; cap what "
                            "it uses with --kernelfix-max-tokens N")


# --- whole sessions ------------------------------------------------------------------------


CLOSED = closed_port_url()


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (("--kernelfix-model=openai/gpt-4o",), {}, "needs OPENAI_API_KEY in the environment"),
        (("--kernelfix-model=nosuchprovider/model",), {}, "names no provider litellm knows"),
        (("--kernelfix-model=replay:missing.jsonl",), {},
         "replay cassette missing.jsonl not found"),
        (("--kernelfix-target=cuda:xx",), {}, "unknown CUDA target 'cuda:xx'"),
        (("--kernelfix-model=openai/m", "--kernelfix-api-base=localhost:8000"), {}, "not a URL"),
        (("--kernelfix-prompts-dir=nowhere",), {}, "is not a directory"),
        (("-n", "2", "--kernelfix-target=cuda:xx"), {}, "unknown CUDA target 'cuda:xx'"),
        (("--kernelfix-model=openai/gpt-4o",), {"OPENAI_API_KEY": ""},
         "--kernelfix-model openai/gpt-4o needs OPENAI_API_KEY, which is set but empty"),
        ((), {"KERNELFIX_MODEL": "openai/"},
         "KERNELFIX_MODEL=openai/ names the provider openai but no model"),
        (("--kernelfix-device=cuda",), {},
         "sees no CUDA GPU on this machine (torch.cuda.is_available() is False): run the "
         "kernels on the Triton interpreter with --kernelfix-device interpret"),
        (("--kernelfix-model=openai/m",), {"OPENAI_API_BASE": CLOSED},
         f"the model endpoint {CLOSED} (from OPENAI_API_BASE) does not answer: connection "
         "refused; start the server"),
    ],
    ids=["no-key", "unknown-provider", "no-cassette", "bad-target", "bad-api-base",
         "no-prompts-dir", "xdist", "empty-key", "empty-model-from-env", "cuda-without-gpu",
         "endpoint-down"],
)
def test_a_bad_setting_stops_the_session_before_any_test(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...],
    env: dict[str, str], message: str,
) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_API_BASE", "OPENAI_BASE_URL", "KERNELFIX_MODEL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    pytester.makepyfile(test_project=PROJECT_TEST)
    device = () if "--kernelfix-device=cuda" in args else ("--kernelfix-device=interpret",)
    if not device and not no_gpu():
        pytest.skip("this machine has a GPU: --kernelfix-device cuda can work here")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--kernelfix", *device,
                                           *args)
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
