"""Fail fast: check the healing settings before any test runs, offline.

A wrong setting used to surface only after the whole suite ran, as every bug ending
"unhealed". :func:`check` runs at configure time, on the plain session or the xdist
controller (never in a worker or a rerun child), and raises :class:`pytest.UsageError`
with the fix in one line. It checks:

- the fixer: ``recipes``; a ``replay:PATH`` cassette that exists (else the error names
  the places it was looked for), parses and holds answers (with the replay loader
  itself); or a litellm model string that names a provider litellm knows, with that
  provider's credentials in the environment;
- ``--kernelfix-record`` only with a live model, ``--kernelfix-prompts-dir`` a directory;
- ``--kernelfix-api-base`` an ``http(s)://host`` URL;
- ``--kernelfix-target`` a GPU target the compile gate knows (``cuda:xx`` is refused),
  and, when the gate will run, one the installed Triton can compile for;
- ``--kernelfix-cache-dir`` a directory or a path one can be made at.

No check makes a network call: litellm answers "which provider" and "which keys" from
the model string and the environment (``litellm.get_llm_provider``,
``litellm.validate_environment``). litellm is imported only for a litellm model (it
takes seconds), with the bundled price list. Local servers need no key (ollama,
hosted_vllm, lm_studio..., and ``openai/`` models with ``--kernelfix-api-base``).
Providers that can also sign in without environment variables (cloud roles, gcloud
credentials, Azure AD) get a warning, not an error, when litellm sees no key.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from pytest_kernelfix.config import Settings, replay_candidates
from pytest_kernelfix.target import gate_enabled

#: Providers served from the user's own machine or network: they need no API key.
LOCAL_PROVIDERS = frozenset({
    "ollama", "ollama_chat", "hosted_vllm", "vllm", "lm_studio", "llamafile", "xinference",
    "oobabooga", "triton", "custom",
})
#: Providers that can authenticate without environment variables.
AMBIENT_PROVIDERS = frozenset({
    "vertex_ai", "vertex_ai_beta", "bedrock", "bedrock_converse", "sagemaker", "sagemaker_chat",
    "azure", "azure_ai", "azure_text", "watsonx",
})
_OTHER_FIXERS = "recipes (no model) or replay:PATH (a cassette)"

Warn = Callable[[Warning, int], None]


def _warn(warning: Warning, stacklevel: int) -> None:
    warnings.warn(warning, stacklevel=stacklevel + 1)


def _fail(problem: str) -> pytest.UsageError:
    return pytest.UsageError(f"kernelfix: {problem}")


def check(settings: Settings, device: str, *, warn: Warn = _warn) -> None:
    """Raise :class:`pytest.UsageError` on the first setting that cannot work.

    ``warn`` shows a :class:`pytest.PytestConfigWarning` (from the plugin: pytest's
    configure-time channel, ``config.issue_config_time_warning``).
    """
    check_api_base(settings.api_base)
    check_target(settings.target, gate=device == "interpret" and gate_enabled(settings.target))
    check_cache_dir(settings.cache_root)
    if settings.prompts_dir is not None and not settings.prompts_dir.is_dir():
        raise _fail(f"--kernelfix-prompts-dir {settings.prompts_dir} is not a directory: "
                    "create it with the templates to override, or drop the option")
    check_fixer(settings, warn)


def check_api_base(api_base: str) -> None:
    if not api_base:
        return
    parts = urlsplit(api_base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _fail(f"--kernelfix-api-base {api_base!r} is not a URL: give the server's "
                    "base URL, as in http://localhost:8000/v1")


def check_target(target: str, *, gate: bool) -> None:
    """A known target; with the gate on, one the installed Triton has a backend for."""
    if not gate_enabled(target):
        return
    from pytest_kernelfix.rerun.probes.gate import parse_target

    try:
        parse_target(target, require_backend=gate)
    except ValueError as error:
        raise _fail(f"--kernelfix-target: {error}; or turn the compile gate off with "
                    "--kernelfix-target off") from None
    except ImportError as error:
        raise _fail(f"--kernelfix-target {target}: the compile gate needs triton, which "
                    f"cannot be imported ({error}); install it or pass --kernelfix-target "
                    "off") from None


def check_cache_dir(path: Path) -> None:
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise _fail(f"--kernelfix-cache-dir {path}: {existing} is a file, not a directory; "
                    "point the option at a directory")


def check_fixer(settings: Settings, warn: Warn = _warn) -> None:
    """Build the configured fixer as the session will (no call made), then, for a
    litellm model, ask litellm whether it knows the provider and sees its keys."""
    from pytest_kernelfix.fixers.factory import RECIPES, REPLAY_PREFIX, build_fixer
    from pytest_kernelfix.fixers.replay import CassetteError, ReplayFixer

    model = settings.model.strip()
    if model.startswith(REPLAY_PREFIX):
        check_cassette_found(model[len(REPLAY_PREFIX):].strip(), settings.rootdir)
    try:
        fixer = build_fixer(model, api_base=settings.api_base or None,
                            prompts_dir=settings.prompts_dir, record=settings.record)
    except CassetteError as error:
        raise _fail(f"{error}; record one with --kernelfix-record, or pick {_OTHER_FIXERS}"
                    ) from None
    except ValueError as error:
        raise _fail(str(error)) from None
    if isinstance(fixer, ReplayFixer) and not fixer.entries:
        raise _fail(f"replay cassette {fixer.path} holds no answers; record one with "
                    f"--kernelfix-record, or pick {_OTHER_FIXERS}")
    if model == RECIPES or model.startswith(REPLAY_PREFIX):
        return
    check_litellm_model(model, settings.api_base, warn)


def check_cassette_found(path: str, rootdir: Path) -> None:
    """A missing cassette's error names every place it was looked for."""
    candidates = replay_candidates(path, rootdir)
    if any(candidate.exists() for candidate in candidates):
        return
    searched = " and ".join(dict.fromkeys(os.path.abspath(c) for c in candidates))
    raise _fail(f"replay cassette {path} not found: searched {searched}; record one with "
                f"--kernelfix-record, or pick {_OTHER_FIXERS}")


def check_litellm_model(model: str, api_base: str, warn: Warn = _warn) -> None:
    from pytest_kernelfix.fixers.llm import import_litellm

    litellm = import_litellm()
    try:
        _, provider, _, _ = litellm.get_llm_provider(model=model, api_base=api_base or None)
    except Exception:
        raise _fail(
            f"--kernelfix-model {model!r} names no provider litellm knows: write it as "
            "provider/model (openai/gpt-4o, anthropic/claude-sonnet-4-5, ollama/qwen2.5-coder;"
            f" https://docs.litellm.ai/docs/providers), or pick {_OTHER_FIXERS}"
        ) from None
    if provider in LOCAL_PROVIDERS or (provider == "openai" and api_base):
        return
    api_key = getattr(litellm, "api_key", None) or None
    found = litellm.validate_environment(model=model, api_key=api_key,
                                         api_base=api_base or None)
    missing = [str(key) for key in found.get("missing_keys", ())]
    if not missing:
        return
    needed = " and ".join(missing)
    if provider in AMBIENT_PROVIDERS:
        warn(pytest.PytestConfigWarning(
            f"kernelfix: --kernelfix-model {model}: litellm sees no {needed}; going on, as "
            f"{provider} can also sign in from the machine's own credentials"), 2)
        return
    raise _fail(f"--kernelfix-model {model} needs {needed} in the environment: set it (in CI, "
                f"from a secret), or pick {_OTHER_FIXERS}")
