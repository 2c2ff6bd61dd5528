"""Fail fast: check the healing settings before any test runs.

A wrong setting used to surface only after the whole suite ran, as every bug ending
"unhealed". :func:`check` runs at configure time, on the plain session or the xdist
controller (never in a worker or a rerun child), and raises :class:`pytest.UsageError`
with the fix in one line that names where the setting came from: the option, the ini
key or the environment variable (``KERNELFIX_MODEL=...``). It checks:

- the fixer: ``recipes``; a ``replay:PATH`` cassette that exists (else the error names
  the places it was looked for), parses and holds answers (with the replay loader
  itself); or a litellm model string that names a provider litellm knows and a model
  (``openai/`` alone is refused), with that provider's credentials in the environment
  and not empty (``OPENAI_API_KEY=`` is what CI gives for a secret a run cannot read);
- the endpoint of a litellm model, as litellm resolves it (:func:`resolve_endpoint`:
  ``--kernelfix-api-base``, else the provider's own variables such as
  ``OPENAI_API_BASE``, else a local provider's default): one probe, bounded by
  :data:`PROBE_SECONDS`, that it answers HTTP at all. Only a configured or local endpoint
  is probed, never a provider's public service, a cassette or the recipes;
- ``--kernelfix-device cuda`` only where torch sees a GPU (:func:`check_device`);
- ``--kernelfix-record`` only with a live model, ``--kernelfix-prompts-dir`` a directory;
- ``--kernelfix-api-base`` an ``http(s)://host`` URL;
- ``--kernelfix-target`` a GPU target the compile gate knows (``cuda:xx`` is refused),
  and, when the gate will run, one the installed Triton can compile for;
- ``--kernelfix-cache-dir`` a directory or a path one can be made at.

Besides the probe no check makes a network call: litellm answers "which provider" and
"which keys" from the model string and the environment (``litellm.get_llm_provider``,
``litellm.validate_environment``). litellm is imported only for a litellm model (it
takes seconds), with the bundled price list. Local servers need no key (ollama,
hosted_vllm, lm_studio..., and ``openai/`` models with an endpoint of their own).
Providers that can also sign in without environment variables (cloud roles, gcloud
credentials, Azure AD) get a warning, not an error, when litellm sees no key; so does
``--kernelfix-max-cost`` for a model litellm has no price for (it cannot cap it).
"""

from __future__ import annotations

import contextlib
import os
import threading
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
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
#: The longest the endpoint probe may take, name resolution included.
PROBE_SECONDS = 5.0

Warn = Callable[[Warning, int], None]
#: Asks whether a server answers at a URL: "" when it does, else why not, in words.
Probe = Callable[[str], str]


def _warn(warning: Warning, stacklevel: int) -> None:
    warnings.warn(warning, stacklevel=stacklevel + 1)


def _fail(problem: str) -> pytest.UsageError:
    return pytest.UsageError(f"kernelfix: {problem}")


def check(settings: Settings, device: str, *, warn: Warn = _warn,
          probe: Probe | None = None) -> None:
    """Raise :class:`pytest.UsageError` on the first setting that cannot work.

    ``warn`` shows a :class:`pytest.PytestConfigWarning` (from the plugin: pytest's
    configure-time channel, ``config.issue_config_time_warning``); ``probe`` asks
    whether an endpoint answers (:func:`probe_endpoint`).
    """
    check_api_base(settings.api_base, settings.origin("kernelfix_api_base"))
    check_target(settings.target, gate=device == "interpret" and gate_enabled(settings.target))
    check_cache_dir(settings.cache_root, settings.origin("kernelfix_cache_dir"))
    if settings.prompts_dir is not None and not settings.prompts_dir.is_dir():
        raise _fail(f"{given(settings, 'kernelfix_prompts_dir', settings.prompts_dir)} is not "
                    "a directory: create it with the templates to override, or drop the option")
    check_fixer(settings, warn, probe)


def given(settings: Settings, name: str, value: object) -> str:
    """Option ``name`` as the user gave it (see :func:`spelled`)."""
    return spelled(settings.origin(name), value)


def spelled(where: str, value: object) -> str:
    """A setting as the user wrote it, by where it came from: ``--kernelfix-model x``,
    ``KERNELFIX_MODEL=x`` or ``ini kernelfix_model = x``."""
    if where.startswith("--"):
        return f"{where} {value}"
    if where.startswith("ini "):
        return f"{where} = {value}"
    return f"{where}={value}"


def check_device(settings: Settings, detect: Callable[[], str] | None = None) -> None:
    """``--kernelfix-device cuda`` (given explicitly) on a machine where torch sees no
    GPU: every test would fail with "0 active drivers", and each failure would be handed
    to the fixer as a kernel bug."""
    if settings.device != "cuda":
        return
    why = (detect or no_gpu)()
    if why:
        raise _fail(f"{given(settings, 'kernelfix_device', 'cuda')}, but {why}: run the "
                    "kernels on the Triton interpreter with --kernelfix-device interpret (or "
                    "auto, which picks it when no GPU is seen), or run where there is a GPU")


def no_gpu() -> str:
    """Why torch cannot run CUDA here, or "" when it can."""
    try:
        import torch
    except ImportError as error:
        return f"torch cannot be imported ({error})"
    if torch.cuda.is_available():
        return ""
    return (f"torch {torch.__version__} sees no CUDA GPU on this machine "
            "(torch.cuda.is_available() is False)")


def check_api_base(api_base: str, source: str = "--kernelfix-api-base") -> None:
    if not api_base:
        return
    parts = urlsplit(api_base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _fail(f"{spelled(source, repr(api_base))} is not a URL: give the server's "
                    "base URL, as in http://localhost:8000/v1")


def check_target(target: str, *, gate: bool) -> None:
    """A known target; with the gate on, one the installed Triton has a backend for."""
    if not gate_enabled(target):
        return
    from pytest_kernelfix.rerun.probes.gate import parse_target  # start-up: the gate's only

    try:
        parse_target(target, require_backend=gate)
    except ValueError as error:
        raise _fail(f"--kernelfix-target: {error}; or turn the compile gate off with "
                    "--kernelfix-target off") from None
    except ImportError as error:
        raise _fail(f"--kernelfix-target {target}: the compile gate needs triton, which "
                    f"cannot be imported ({error}); install it or pass --kernelfix-target "
                    "off") from None


def check_cache_dir(path: Path, source: str = "--kernelfix-cache-dir") -> None:
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise _fail(f"{spelled(source, path)}: {existing} is a file, not a directory; "
                    "point it at a directory")


def check_fixer(settings: Settings, warn: Warn = _warn, probe: Probe | None = None) -> None:
    """Build the configured fixer as the session will (no call made), then, for a
    litellm model, ask litellm whether it knows the provider and sees its keys, and
    probe the endpoint."""
    # start-up: a session that only checks its device imports this module too
    from pytest_kernelfix.fixers.factory import RECIPES, REPLAY_PREFIX, build_fixer
    from pytest_kernelfix.fixers.replay import CassetteError, ReplayFixer

    model = settings.model.strip()
    if model.startswith(REPLAY_PREFIX):
        check_cassette_found(model[len(REPLAY_PREFIX):].strip(), settings.root,
                             settings.rootdir)
    if model == RECIPES or model.startswith(REPLAY_PREFIX):
        try:
            fixer = build_fixer(model, prompts_dir=settings.prompts_dir, record=settings.record)
        except CassetteError as error:
            raise _fail(f"{error}; record one with --kernelfix-record, or pick "
                        f"{_OTHER_FIXERS}") from None
        except ValueError as error:
            raise _fail(str(error)) from None
        if isinstance(fixer, ReplayFixer) and not fixer.entries:
            raise _fail(f"replay cassette {fixer.path} holds no answers; record one with "
                        f"--kernelfix-record, or pick {_OTHER_FIXERS}")
        return
    check_litellm_model(model, settings.api_base, warn,
                        source=settings.origin("kernelfix_model"),
                        api_base_source=settings.origin("kernelfix_api_base"), probe=probe)
    if settings.max_cost > 0:
        check_priced(model, given(settings, "kernelfix_max_cost", f"{settings.max_cost:g}"),
                     warn)


def check_cassette_found(path: str, *roots: Path) -> None:
    """A missing cassette's error names every place it was looked for."""
    candidates = replay_candidates(path, *roots)
    if any(candidate.exists() for candidate in candidates):
        return
    searched = " and ".join(dict.fromkeys(os.path.abspath(c) for c in candidates))
    raise _fail(f"replay cassette {path} not found: searched {searched}; record one with "
                f"--kernelfix-record, or pick {_OTHER_FIXERS}")


def check_litellm_model(model: str, api_base: str, warn: Warn = _warn, *,
                        source: str = "--kernelfix-model",
                        api_base_source: str = "--kernelfix-api-base",
                        probe: Probe | None = None) -> None:
    """A provider litellm knows, a model name after it, the provider's keys (not empty),
    and an endpoint that answers where one is configured."""
    from pytest_kernelfix.fixers.llm import import_litellm, resolve_endpoint  # a model's only

    litellm = import_litellm()
    named = spelled(source, model)
    try:
        name, provider, _, _ = litellm.get_llm_provider(model=model, api_base=api_base or None)
    except Exception:
        raise _fail(
            f"{named} names no provider litellm knows: write it as "
            "provider/model (openai/gpt-4o, anthropic/claude-sonnet-4-5, ollama/qwen2.5-coder;"
            f" https://docs.litellm.ai/docs/providers), or pick {_OTHER_FIXERS}"
        ) from None
    if not str(name or "").strip():
        raise _fail(f"{named} names the provider {provider} but no model: write it as "
                    f"{provider}/<model name> (as in openai/gpt-4o), or pick {_OTHER_FIXERS}")
    endpoint = resolve_endpoint(model, api_base, api_base_source)
    if endpoint.url and endpoint.source != api_base_source:
        check_api_base(endpoint.url, endpoint.source)
    if not (provider in LOCAL_PROVIDERS or (provider == "openai" and endpoint.url)):
        check_keys(litellm, model, provider, named, api_base, warn)
    if endpoint.url:
        why = (probe or probe_endpoint)(endpoint.url)
        if why:
            raise _fail(f"the model endpoint {endpoint.url} (from {endpoint.source}) does not "
                        f"answer: {why}; start the server or correct the URL, or pick "
                        f"{_OTHER_FIXERS}")


def check_keys(litellm: Any, model: str, provider: str, named: str, api_base: str,
               warn: Warn) -> None:
    """The provider's credentials, as litellm looks for them; a variable that is set but
    empty counts as missing (litellm would take it as set, and every call would fail)."""
    empty = sorted(name for name, value in os.environ.items() if not value.strip())
    api_key = getattr(litellm, "api_key", None) or None
    with _unset(empty):
        found = litellm.validate_environment(model=model, api_key=api_key,
                                             api_base=api_base or None)
    missing = [str(key) for key in found.get("missing_keys", ())]
    if not missing:
        return
    needed = " and ".join(missing)
    blank = [key for key in missing if key in empty]
    if provider in AMBIENT_PROVIDERS:
        warn(pytest.PytestConfigWarning(
            f"kernelfix: {named}: litellm sees no {needed}; going on, as "
            f"{provider} can also sign in from the machine's own credentials"), 2)
        return
    if blank:
        empty_ones = "which is" if blank == missing else f"and {' and '.join(blank)} is"
        raise _fail(f"{named} needs {needed}, {empty_ones} set but empty (in CI: a secret "
                    "this run cannot read, as on a pull request from a fork): set it, or "
                    f"pick {_OTHER_FIXERS}")
    raise _fail(f"{named} needs {needed} in the environment: set it (in CI, "
                f"from a secret), or pick {_OTHER_FIXERS}")


@contextlib.contextmanager
def _unset(names: list[str]) -> Iterator[None]:
    """The environment without ``names`` for a moment (configure time: one thread)."""
    saved = {name: os.environ.pop(name) for name in names if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def check_priced(model: str, cap: str, warn: Warn = _warn) -> None:
    """``--kernelfix-max-cost`` counts dollars from litellm's price list: a model it has
    no price for costs $0 there, so the cap never stops it. Say so at start-up."""
    from pytest_kernelfix.fixers.llm import import_litellm  # start-up: a model's only

    try:
        info = import_litellm().get_model_info(model)
        priced = bool(info.get("input_cost_per_token") or info.get("output_cost_per_token"))
    except Exception:
        priced = False
    if not priced:
        warn(pytest.PytestConfigWarning(
            f"kernelfix: {cap} cannot cap {model}: litellm has no price for it, so its "
            "answers count as $0; cap what it uses with --kernelfix-max-tokens N"), 2)


def probe_endpoint(url: str, timeout: float = PROBE_SECONDS) -> str:
    """One GET of ``url``: "" when a server answers HTTP at all (any status: the route
    and the key are the first call's business), else why not, in a few words. Bounded
    by ``timeout`` as a whole, name resolution included."""
    outcome: list[str] = []

    def ask() -> None:
        request = urllib.request.Request(url, method="GET",
                                         headers={"User-Agent": "pytest-kernelfix preflight"})
        try:
            with urllib.request.urlopen(request, timeout=timeout):
                outcome.append("")
        except urllib.error.HTTPError:
            outcome.append("")  # it answered, with an error status
        except urllib.error.URLError as error:
            outcome.append(_why(error.reason))
        except OSError as error:  # a timeout while reading, a reset connection
            outcome.append(_why(error))
        except ValueError as error:  # not a URL urllib can open
            outcome.append(str(error))

    thread = threading.Thread(target=ask, name="kernelfix-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"no answer within {timeout:g} s"


def _why(reason: object) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError):
        return "no answer within the probe's time"
    text = getattr(reason, "strerror", None) or str(reason)
    return str(text)
