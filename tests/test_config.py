"""Options: one group, ini twins, CLI > env > ini > default, clear errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pytest_kernelfix.config import FLAGS, OPTIONS, resolve_device

SHOW = """
import json, pathlib
from pytest_kernelfix.config import load_settings

def pytest_configure(config):
    s = load_settings(config)
    pathlib.Path("settings.json").write_text(json.dumps({
        "heal": s.heal, "apply": s.apply, "rounds": s.rounds, "model": s.model,
        "timeout": s.timeout, "device": s.device, "report_dir": str(s.report_dir),
        "cuda_shim": s.cuda_shim, "paths": list(s.paths), "target": s.target,
        "workers": s.workers, "rerun": s.rerun, "rerun_jobs": s.rerun_jobs,
        "cache_root": str(s.cache_root), "no_cache": s.no_cache, "max_cost": s.max_cost,
        "max_tokens": s.max_tokens, "save_prompts": s.save_prompts,
    }))
"""


def settings_of(pytester: pytest.Pytester, *args: str) -> dict[str, object]:
    pytester.makeconftest(SHOW)
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    # a subprocess: device set-up changes the process environment (TRITON_INTERPRET)
    pytester.runpytest_subprocess(*args)
    return json.loads((pytester.path / "settings.json").read_text())  # type: ignore[no-any-return]


def test_every_option_is_prefixed_and_has_an_ini_twin(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    out = result.stdout.str()
    assert "heal failing Triton kernel tests:" in out  # the one option group
    for option in OPTIONS:
        assert option.name.startswith("kernelfix")
        assert f"{option.name} (" in out  # ini twin listed
        if option.kind != "lines":
            assert option.flag in out


def test_on_off_options_state_their_default_in_the_words_they_take() -> None:
    for option in OPTIONS:
        if option.kind != "bool":
            continue
        if option.name in FLAGS:  # a bare flag is off until given: no default to state
            assert "default" not in option.help, option.name
        else:
            word = "on" if option.default else "off"
            assert option.help.endswith(f"(default: {word})"), option.name


def test_defaults(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KERNELFIX_MODEL", "KERNELFIX_RERUN", "KERNELFIX_WORKERS",
                 "KERNELFIX_RERUN_JOBS"):
        monkeypatch.delenv(name, raising=False)
    settings = settings_of(pytester)
    assert settings["heal"] is False
    assert settings["rounds"] == 3
    assert settings["model"] == "recipes"
    assert settings["device"] == "auto"
    assert settings["target"] == "cuda:90"
    assert settings["cuda_shim"] is True
    assert settings["report_dir"] == str(pytester.path / ".kernelfix")
    assert settings["workers"] == 0  # auto: one per GPU, half the cores on the interpreter
    assert settings["rerun"] == "auto"
    assert settings["rerun_jobs"] == 0  # auto: the cores left to each heal worker
    assert settings["cache_root"] == str(pytester.path / ".kernelfix" / "cache")
    assert (settings["no_cache"], settings["max_cost"], settings["max_tokens"]) == (False, 0, 0)
    assert settings["save_prompts"] is True


def test_cache_and_budget_options(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                  tmp_path: Path) -> None:
    pytester.makeini("[pytest]\nkernelfix_cache_dir = ci-cache\nkernelfix_max_tokens = 5000\n")
    settings = settings_of(pytester, "--kernelfix-no-cache", "--kernelfix-max-cost=$2.50")
    assert settings["cache_root"] == str(pytester.path / "ci-cache")  # relative to the rootdir
    assert (settings["no_cache"], settings["max_cost"], settings["max_tokens"]) == (
        True, 2.5, 5000)
    monkeypatch.setenv("KERNELFIX_CACHE_DIR", str(tmp_path / "shared"))
    assert settings_of(pytester)["cache_root"] == str(tmp_path / "shared")


def test_ini_values_are_read_and_cli_wins(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("KERNELFIX_MODEL", "KERNELFIX_RERUN", "KERNELFIX_WORKERS",
                 "KERNELFIX_RERUN_JOBS"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeini(
        """
        [pytest]
        kernelfix_rounds = 5
        kernelfix_model = replay:tape.jsonl
        kernelfix_timeout = 12.5
        kernelfix_cuda_shim = false
        kernelfix_workers = 3
        kernelfix_rerun = subprocess
        kernelfix_save_prompts = off
        kernelfix_rerun_jobs = 4
        kernelfix_paths =
            kernels/*.py
            ops/*.py
        """
    )
    settings = settings_of(pytester)
    assert settings["rounds"] == 5
    assert settings["workers"] == 3 and settings["rerun"] == "subprocess"
    assert settings["rerun_jobs"] == 4
    assert settings["model"] == "replay:tape.jsonl"
    assert settings["timeout"] == 12.5
    assert settings["cuda_shim"] is False
    assert settings["paths"] == ["kernels/*.py", "ops/*.py"]
    assert settings["save_prompts"] is False
    settings = settings_of(pytester, "--kernelfix-rounds=2", "--kernelfix-cuda-shim=on",
                           "--kernelfix-workers=auto", "--kernelfix-rerun=fork",
                           "--kernelfix-save-prompts=on", "--kernelfix-rerun-jobs=auto")
    assert settings["rounds"] == 2 and settings["save_prompts"] is True
    assert settings["cuda_shim"] is True
    assert settings["workers"] == 0 and settings["rerun"] == "fork"
    assert settings["rerun_jobs"] == 0


def test_environment_model_sits_between_cli_and_ini(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeini("[pytest]\nkernelfix_model = from-ini\nkernelfix_rerun = fork\n")
    monkeypatch.setenv("KERNELFIX_MODEL", "openai/from-env")
    monkeypatch.setenv("KERNELFIX_RERUN", "subprocess")  # how the test suites pick a mode
    monkeypatch.setenv("KERNELFIX_WORKERS", "2")
    monkeypatch.setenv("KERNELFIX_RERUN_JOBS", "3")
    settings = settings_of(pytester)
    assert settings["model"] == "openai/from-env"
    assert settings["rerun"] == "subprocess" and settings["workers"] == 2
    assert settings["rerun_jobs"] == 3
    assert settings_of(pytester, "--kernelfix-model=ollama/cli")["model"] == "ollama/cli"


def test_apply_implies_heal(pytester: pytest.Pytester) -> None:
    settings = settings_of(pytester, "--kernelfix-apply", "-p", "no:cacheprovider")
    assert settings["heal"] is True and settings["apply"] is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--kernelfix-rounds=many",), "expected a whole number"),
        (("--kernelfix-timeout=0",), "a number of seconds > 0"),
        # 0 and -1 fail the same one check, with the same message.
        (("--kernelfix-rounds=0",), "expected a whole number >= 1"),
        (("--kernelfix-rounds=-1",), "expected a whole number >= 1"),
        (("--kernelfix-llm-retries=-1",), "expected a whole number >= 0"),
        (("--kernelfix-workers=0",), "expected auto or a whole number >= 1"),
        (("--kernelfix-workers=some",), "expected auto or a whole number >= 1"),
        (("--kernelfix-rerun-jobs=0",), "expected auto or a whole number >= 1"),
        (("--kernelfix-rerun=thread",), "invalid choice"),
        (("--kernelfix-max-cost=-1",), "an amount of US dollars >= 0 (0: no cap)"),
        (("--kernelfix-max-cost=nan",), "an amount of US dollars >= 0"),
        (("--kernelfix-max-tokens=lots",), "expected a whole number"),
    ],
)
def test_bad_values_are_usage_errors(
    pytester: pytest.Pytester, args: tuple[str, ...], message: str
) -> None:
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


def test_rounds_below_one_in_the_ini_file_get_the_command_line_message(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeini("[pytest]\nkernelfix_rounds = 0\n")
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    result = pytester.runpytest("--kernelfix")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert ("invalid value '0' for --kernelfix-rounds / ini kernelfix_rounds: "
            "expected a whole number >= 1") in result.stderr.str()


def test_each_setting_knows_where_it_came_from(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages name the source of a value: the flag, the variable or the ini key."""
    from pytest_kernelfix.config import load_settings

    monkeypatch.setenv("KERNELFIX_MODEL", "openai/m")
    monkeypatch.setenv("KERNELFIX_WORKERS", "")  # empty: unset
    pytester.makeini("[pytest]\nkernelfix_rounds = 2\nkernelfix_save_prompts = false\n")
    settings = load_settings(pytester.parseconfig("--kernelfix-timeout=5"))
    origins = dict(settings.origins)
    assert (origins["kernelfix_model"], origins["kernelfix_rounds"]) == (
        "KERNELFIX_MODEL", "ini kernelfix_rounds")
    assert (origins["kernelfix_timeout"], origins["kernelfix_workers"]) == (
        "--kernelfix-timeout", "default")
    assert origins["kernelfix_save_prompts"] == "ini kernelfix_save_prompts"
    assert origins["kernelfix_cuda_shim"] == "default"
    assert settings.origin("kernelfix_workers") == "--kernelfix-workers"  # unset: the flag
    monkeypatch.setenv("KERNELFIX_WORKERS", "zero")
    with pytest.raises(pytest.UsageError) as info:
        load_settings(pytester.parseconfig())
    assert str(info.value) == ("kernelfix: invalid value 'zero' for KERNELFIX_WORKERS "
                               "(--kernelfix-workers / ini kernelfix_workers): expected auto "
                               "or a whole number >= 1")


def test_bad_device_choice_is_rejected(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--kernelfix-device=tpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "invalid choice" in result.stderr.str()


def test_resolve_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert resolve_device("cuda", lambda: False) == "cuda"
    assert resolve_device("interpret", lambda: True) == "interpret"
    assert resolve_device("auto", lambda: True) == "cuda"
    assert resolve_device("auto", lambda: False) == "interpret"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_device("auto", lambda: True) == "interpret"


def test_plugin_is_inert_and_import_light_without_flags(pytester: pytest.Pytester) -> None:
    """Without the flags nothing heavy is imported and no report dir appears."""
    pytester.makepyfile(
        test_light="""
        import sys

        def test_modules():
            heavy = [m for m in ("torch", "triton", "litellm", "jinja2", "rapidfuzz")
                     if m in sys.modules]
            assert heavy == []
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert not (pytester.path / ".kernelfix").exists()
    assert sys.executable  # the subprocess ran with this interpreter


def test_marker_is_registered_always(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.kernel: the test launches a Triton kernel*"])
    pytester.makepyfile(
        test_marked="""
        import pytest

        @pytest.mark.kernel
        def test_one():
            pass
        """
    )
    pytester.runpytest("--strict-markers").assert_outcomes(passed=1)


def test_replay_cassette_named_in_the_ini_is_found_from_another_directory(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KERNELFIX_MODEL", raising=False)
    (pytester.path / "tapes").mkdir()
    (pytester.path / "tapes" / "t.jsonl").write_text("")
    pytester.makeini("[pytest]\nkernelfix_model = replay:tapes/t.jsonl\n")
    monkeypatch.chdir(pytester.path / "tapes")  # pytest runs from elsewhere
    pytester.makeconftest(SHOW)
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    pytester.runpytest_subprocess(str(pytester.path))
    settings = json.loads((pytester.path / "tapes" / "settings.json").read_text())
    assert settings["model"] == f"replay:{pytester.path / 'tapes' / 't.jsonl'}"


def test_hook_author_names_load_lazily_from_the_package() -> None:
    import pytest_kernelfix
    from pytest_kernelfix.engine.parse import Modification
    from pytest_kernelfix.fixers.base import Proposal, ProposalRequest

    assert pytest_kernelfix.Modification is Modification
    assert pytest_kernelfix.Proposal is Proposal
    assert pytest_kernelfix.ProposalRequest is ProposalRequest
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        pytest_kernelfix.Nothing  # noqa: B018
