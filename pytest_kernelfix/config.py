"""One frozen settings object, built from the command line, the ini file and the environment.

Every option has an ini twin; the command line wins, then the environment variable
(where one exists), then the ini file, then the documented default. This module stays
import-light: it is loaded by every pytest run in an environment with the plugin.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from pytest_kernelfix.root import ProjectRoot, find_root
from pytest_kernelfix.target import DEFAULT_TARGET

DEVICES = ("auto", "cuda", "interpret")
#: How sandbox reruns start (see :mod:`pytest_kernelfix.rerun.launcher`).
RERUN_MODES = ("auto", "fork", "subprocess")
#: How candidates are verified (see :mod:`pytest_kernelfix.verify.verifier`).
VERIFY_MODES = ("staged", "thorough")


@dataclass(frozen=True)
class Option:
    """A ``--kernelfix-*`` flag, its ini twin and (optionally) an environment variable."""

    name: str
    help: str
    default: Any
    kind: str = "string"  # string | int | float | usd | bool | lines | choice | workers
    choices: tuple[str, ...] = ()
    env: str = ""
    metavar: str = ""
    minimum: int = 0  # the smallest whole number an "int" option takes

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return self.name


OPTIONS: tuple[Option, ...] = (
    Option("kernelfix", "Heal failing kernel tests and write patches to the report dir", False,
           "bool"),
    Option("kernelfix_apply", "Heal failing kernel tests and write the winning patches into "
           "the working tree", False, "bool"),
    Option("kernelfix_rounds", "Propose-and-verify rounds per bug (default: 3)", 3, "int",
           metavar="N", minimum=1),
    Option("kernelfix_model", "Fixer: a litellm model string (openai/gpt-4o, "
           "anthropic/claude-sonnet-4-5, ollama/qwen2.5-coder...), replay:PATH for a "
           "cassette, or recipes (default: recipes)", "recipes", env="KERNELFIX_MODEL",
           metavar="NAME"),
    Option("kernelfix_api_base", "Base URL of an OpenAI-compatible endpoint (vLLM, a proxy)",
           "", env="KERNELFIX_API_BASE", metavar="URL"),
    Option("kernelfix_llm_timeout", "Seconds to wait for one model answer (default: 120)",
           120.0, "float", metavar="SECONDS"),
    Option("kernelfix_llm_retries", "Retries of a failed model call (default: 2)", 2, "int",
           metavar="N"),
    Option("kernelfix_root", "The project's folder: what edits may touch, the sandbox copies "
           "and the report dir is under; it must hold pytest's rootdir (default: the rootdir, "
           "or the project it is a test folder of)", "", env="KERNELFIX_ROOT", metavar="DIR"),
    Option("kernelfix_report_dir", "Directory for patches and reports, relative to the project "
           "root (default: .kernelfix)", ".kernelfix", metavar="DIR"),
    Option("kernelfix_timeout", "Seconds allowed for one sandbox rerun (default: 600)", 600.0,
           "float", metavar="SECONDS"),
    Option("kernelfix_device", "Where kernels run: auto (CUDA when torch sees a GPU, else the "
           "Triton interpreter), cuda or interpret (default: auto)", "auto", "choice",
           choices=DEVICES),
    Option("kernelfix_record", "Append every live model answer to this JSONL cassette", "",
           metavar="PATH"),
    Option("kernelfix_prompts_dir", "Directory of jinja2 templates that override the packaged "
           "prompts", "", metavar="DIR"),
    Option("kernelfix_save_prompts", "Keep each round's prompt and raw answer, redacted, in "
           "<report dir>/prompts, linked from the report (default: on)", True, "bool"),
    Option("kernelfix_max_groups", "Heal at most this many bugs of their own per session; a "
           "bug an earlier bug's patch heals takes no place (default: 10)", 10, "int",
           metavar="N"),
    Option("kernelfix_target", "GPU target of the compile gate in interpret mode: cuda:90, "
           f"cuda:80... or off (default: {DEFAULT_TARGET})", DEFAULT_TARGET, metavar="TARGET"),
    Option("kernelfix_cuda_shim", "In interpret mode, map device='cuda' tensors and torch.cuda "
           "queries to the CPU (default: on)", True, "bool"),
    Option("kernelfix_sandbox_exclude", "Glob patterns (relative to the project root) left out of "
           "the sandbox copy", (), "lines"),
    Option("kernelfix_paths", "Glob patterns (relative to the project root) of the only files "
           "edits may touch", (), "lines"),
    Option("kernelfix_select", "Which failing tests are healed, comma-separated: kernel "
           "(tests marked kernel), launched (tests that launched a Triton kernel of the "
           "project, or failed in its module before the launch), or nodeid globs such as "
           "'tests/ops/*' (default: kernel)", "kernel",
           metavar="WHICH"),
    Option("kernelfix_workers", "Bugs healed at the same time, each in its own sandbox "
           "(bugs sharing a file stay in order): auto (one per visible GPU; one per core "
           "on the interpreter) or N (default: auto)", 0, "workers", env="KERNELFIX_WORKERS",
           metavar="N"),
    Option("kernelfix_rerun", "How sandbox reruns start: fork (children of a warm server "
           "that imported pytest, torch and triton once), subprocess (a fresh interpreter "
           "each), or auto: fork where it is safe (default: auto)", "auto", "choice",
           choices=RERUN_MODES, env="KERNELFIX_RERUN"),
    Option("kernelfix_verify", "How candidates are verified: staged (a representative "
           "failing test first, then the others, then the regression set; poisoned reruns on "
           "a few diverse failing tests) or thorough (every failing test at every step) "
           "(default: staged)", "staged", "choice", choices=VERIFY_MODES,
           env="KERNELFIX_VERIFY"),
    Option("kernelfix_rerun_jobs", "Children one sandbox rerun of many tests may split them "
           "across, run at the same time: auto (the cores left to each heal worker on the "
           "interpreter, at most 2 on a GPU) or N (default: auto)", 0, "workers",
           env="KERNELFIX_RERUN_JOBS", metavar="N"),
    Option("kernelfix_overlap", "Heal while the tests run: the first failure of a bug starts "
           "its triage, baseline and model call on the cores the test run leaves; off: heal "
           "once the run has ended (default: on)", True, "bool", env="KERNELFIX_OVERLAP"),
    Option("kernelfix_cache_dir", "Directory of the answer cache and the compile gate's cache, "
           "relative to the project root; point a CI cache at it (default: <report dir>/cache)", "",
           env="KERNELFIX_CACHE_DIR", metavar="DIR"),
    Option("kernelfix_no_cache", "Ask the model again: neither read nor write cached answers",
           False, "bool"),
    Option("kernelfix_max_cost", "Stop asking the model once the session spent this many US "
           "dollars; the remaining bugs are reported skipped (default: 0, no cap)", 0.0, "usd",
           metavar="USD"),
    Option("kernelfix_max_tokens", "Stop asking the model once the session used this many "
           "tokens, prompt and completion; the remaining bugs are reported skipped (default: 0, "
           "no cap)", 0, "int", metavar="N"),
    Option("kernelfix_redact_env", "Environment variables whose values are redacted "
           "wherever they appear, comma-separated names or globs (STRIPE_*,DB_URL), besides "
           "those whose name or value looks like a credential", "",
           env="KERNELFIX_REDACT_ENV", metavar="NAMES"),
    Option("kernelfix_base", "What the failing tests are compared with: a git revision "
           "(REF), auto (a pull request's merge base in CI, else the last run in which the "
           "test passed, else the uncommitted changes against HEAD) or none (default: auto)",
           "auto", env="KERNELFIX_BASE", metavar="REF"),
)

#: Boolean options given as a bare flag (``--kernelfix``); the others take ``on|off``.
FLAGS = ("kernelfix", "kernelfix_apply", "kernelfix_no_cache")

#: Words of ``kernelfix_select``; anything else must look like a nodeid glob.
SELECT_WORDS = ("kernel", "launched")


_BY_NAME = {option.name: option for option in OPTIONS}


def add_ini_keys(parser: pytest.Parser) -> None:
    """Register the ini twins (also in reruns, so ``--strict-config`` suites accept them)."""
    for option in OPTIONS:
        ini_type: Literal["bool", "linelist", "string"] = (
            "bool" if option.kind == "bool" else "linelist" if option.kind == "lines" else "string"
        )
        parser.addini(option.name, option.help, type=ini_type, default=_ini_default(option))


def add_options(parser: pytest.Parser) -> None:
    """Register every option in one ``kernelfix`` group, each with its ini twin."""
    add_ini_keys(parser)
    group = parser.getgroup("kernelfix", "heal failing Triton kernel tests")
    for option in OPTIONS:
        if option.kind == "lines":
            continue  # lists live in the ini file only
        if option.kind == "bool" and option.name in FLAGS:
            group.addoption(option.flag, action="store_true", default=None, dest=option.dest,
                            help=option.help)
        elif option.kind == "bool":
            group.addoption(option.flag, choices=("on", "off"), default=None, dest=option.dest,
                            help=option.help)
        elif option.kind == "choice":
            group.addoption(option.flag, choices=option.choices, default=None, dest=option.dest,
                            help=option.help)
        else:
            group.addoption(option.flag, default=None, dest=option.dest,
                            metavar=option.metavar or None, help=option.help)


def _ini_default(option: Option) -> Any:
    """Empty means "not set in the ini file", so :func:`resolve` can fall back."""
    if option.kind == "lines":
        return []
    if option.kind == "bool":
        return bool(option.default)
    return ""


def _convert(option: Option, value: Any, where: str = "") -> Any:
    """Turn a CLI, env or ini value into the option's type, with a clear error that
    names where the value came from (``where``: an environment variable's name)."""
    try:
        if option.kind == "int":
            number = int(str(value).strip())
            if number < option.minimum:
                raise ValueError
            return number
        if option.kind == "float":
            seconds = float(str(value).strip())
            if seconds <= 0:
                raise ValueError
            return seconds
        if option.kind == "usd":
            dollars = float(str(value).strip().removeprefix("$"))
            if not dollars >= 0 or dollars == float("inf"):  # also refuses nan
                raise ValueError
            return dollars
        if option.kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError
        if option.kind == "choice":
            text = str(value).strip()
            if text not in option.choices:
                raise ValueError
            return text
        if option.kind == "workers":  # 0 stands for auto
            text = str(value).strip().lower()
            if text == "auto":
                return 0
            count = int(text)
            if count < 1:
                raise ValueError
            return count
        if option.kind == "lines":
            return tuple(str(line).strip() for line in value if str(line).strip())
        return str(value).strip()
    except (TypeError, ValueError):
        expected = {
            "int": f"a whole number >= {option.minimum}",
            "float": "a number of seconds > 0",
            "usd": "an amount of US dollars >= 0 (0: no cap)",
            "bool": "true or false",
            "choice": " | ".join(option.choices),
            "workers": "auto or a whole number >= 1",
        }.get(option.kind, "a string")
        given = f"{where} ({option.flag} / ini {option.name})" if where else (
            f"{option.flag} / ini {option.name}")
        raise pytest.UsageError(
            f"kernelfix: invalid value {value!r} for {given}: expected {expected}"
        ) from None


def resolve(config: pytest.Config, name: str, namespace: Any = None) -> Any:
    """The value of one option: CLI first, then environment, then ini, then default."""
    option = _BY_NAME[name]
    where = origin(config, name, namespace)
    if where == option.flag:
        return _convert(option, getattr(namespace if namespace is not None else config.option,
                                        option.dest))
    if where == option.env:
        return _convert(option, os.environ[option.env], option.env)
    if where == "default":
        return option.default
    return _convert(option, config.getini(option.name))


def origin(config: pytest.Config, name: str, namespace: Any = None) -> str:
    """Where an option's value comes from, as a message names it: the flag
    (``--kernelfix-model``), the environment variable (``KERNELFIX_MODEL``), the ini key
    (``ini kernelfix_model``) or ``default``."""
    option = _BY_NAME[name]
    space = namespace if namespace is not None else config.option
    if getattr(space, option.dest, None) is not None:
        return option.flag
    if option.env and os.environ.get(option.env, "").strip():
        return option.env
    ini = config.getini(option.name)
    if isinstance(ini, str):
        unset = not ini.strip()
    else:  # a bool ini reads as its default when unset; a list, as empty
        unset = ini == _ini_default(option) if option.kind == "bool" else not ini
    return "default" if unset else f"ini {option.name}"


def cli_given(config: pytest.Config, name: str, namespace: Any = None) -> bool:
    space = namespace if namespace is not None else config.option
    return getattr(space, _BY_NAME[name].dest, None) is not None


@dataclass(frozen=True)
class Settings:
    """Everything the plugin was asked to do, resolved once per session."""

    heal: bool
    apply: bool
    rounds: int
    model: str
    api_base: str
    llm_timeout: float
    llm_retries: int
    report_dir: Path
    timeout: float
    device: str
    record: Path | None
    prompts_dir: Path | None
    max_groups: int
    target: str
    cuda_shim: bool
    sandbox_exclude: tuple[str, ...]
    paths: tuple[str, ...]
    #: pytest's rootdir: node ids are relative to it, reruns take its twin as theirs.
    rootdir: Path
    #: The project root (:mod:`pytest_kernelfix.root`): what a fix may edit, what the
    #: sandbox copies, what relative paths of the options are relative to.
    root: Path
    select: tuple[str, ...] = ("kernel",)
    workers: int = 0  # 0: auto (see pytest_kernelfix.session.schedule.worker_count)
    rerun: str = "auto"
    rerun_jobs: int = 0  # 0: auto (see pytest_kernelfix.session.schedule.rerun_jobs)
    cache_dir: Path | None = None
    no_cache: bool = False
    max_cost: float = 0.0
    max_tokens: int = 0
    verify: str = "staged"
    save_prompts: bool = True
    overlap: bool = True
    redact_env: tuple[str, ...] = ()
    base: str = "auto"
    #: Where each option's value came from (see :func:`origin`), by option name.
    origins: tuple[tuple[str, str], ...] = ()
    #: The terminal line that says how the project root was found ("": it is the rootdir).
    root_note: str = ""

    def origin(self, name: str) -> str:
        """How a message names the source of option ``name``'s value: its flag, its
        environment variable or its ini key (the flag when not known)."""
        found = dict(self.origins).get(name, "default")
        return _BY_NAME[name].flag if found == "default" else found

    @property
    def cache_root(self) -> Path:
        """Where answers and compile-gate results are cached (``<report dir>/cache`` unset)."""
        return self.cache_dir if self.cache_dir is not None else self.report_dir / "cache"


def load_settings(config: pytest.Config, namespace: Any = None) -> Settings:
    """Build :class:`Settings`; raises :class:`pytest.UsageError` on a bad value."""
    rootdir = Path(config.rootpath)
    project = project_root(config, namespace)
    root = project.path

    def value(name: str) -> Any:
        return resolve(config, name, namespace)

    def path_or_none(name: str) -> Path | None:
        text = value(name)
        return _under(root, text) if text else None

    apply = bool(value("kernelfix_apply"))
    heal = bool(value("kernelfix")) or apply
    return Settings(
        heal=heal,
        apply=apply,
        rounds=value("kernelfix_rounds"),
        model=_replay_path(value("kernelfix_model") or "recipes", root, rootdir),
        api_base=value("kernelfix_api_base"),
        llm_timeout=value("kernelfix_llm_timeout"),
        llm_retries=value("kernelfix_llm_retries"),
        report_dir=_under(root, value("kernelfix_report_dir") or ".kernelfix"),
        timeout=value("kernelfix_timeout"),
        device=value("kernelfix_device"),
        record=path_or_none("kernelfix_record"),
        prompts_dir=path_or_none("kernelfix_prompts_dir"),
        max_groups=value("kernelfix_max_groups"),
        target=value("kernelfix_target"),
        cuda_shim=bool(value("kernelfix_cuda_shim")),
        sandbox_exclude=value("kernelfix_sandbox_exclude"),
        paths=value("kernelfix_paths"),
        rootdir=rootdir,
        root=root,
        root_note=project.note,
        select=parse_select(value("kernelfix_select")),
        workers=value("kernelfix_workers"),
        rerun=value("kernelfix_rerun"),
        rerun_jobs=value("kernelfix_rerun_jobs"),
        cache_dir=path_or_none("kernelfix_cache_dir"),
        no_cache=bool(value("kernelfix_no_cache")),
        max_cost=value("kernelfix_max_cost"),
        max_tokens=value("kernelfix_max_tokens"),
        verify=value("kernelfix_verify"),
        save_prompts=bool(value("kernelfix_save_prompts")),
        overlap=bool(value("kernelfix_overlap")),
        redact_env=tuple(value("kernelfix_redact_env").replace(",", " ").split()),
        base=value("kernelfix_base") or "auto",
        origins=tuple((option.name, origin(config, option.name, namespace))
                      for option in OPTIONS),
    )


def project_root(config: pytest.Config, namespace: Any = None) -> ProjectRoot:
    """The project root (:func:`pytest_kernelfix.root.find_root`). A ``kernelfix_root``
    given on the command line or in the environment is relative to where pytest runs; one
    in the ini file, to the ini file's folder."""
    where = origin(config, "kernelfix_root", namespace)
    text = str(resolve(config, "kernelfix_root", namespace))
    given = None
    if text:
        base = config.inipath.parent if where.startswith("ini") and config.inipath else (
            config.invocation_params.dir)
        given = base / os.path.expanduser(text)
    try:
        return find_root(Path(config.rootpath), given, where)
    except ValueError as error:
        raise pytest.UsageError(f"kernelfix: invalid value {text!r} for {where}: {error}"
                                ) from None


def parse_select(text: str) -> tuple[str, ...]:
    """``kernelfix_select`` as its items: ``kernel``, ``launched`` and nodeid globs.

    A word that is neither and does not look like a glob or a nodeid (no ``*?[/:.``) is
    a usage error, so a typo such as ``lauched`` does not silently heal nothing.
    """
    items = tuple(dict.fromkeys(text.replace(",", " ").split()))
    for item in items:
        if item not in SELECT_WORDS and not any(char in item for char in "*?[/:."):
            raise pytest.UsageError(
                f"kernelfix: invalid value {item!r} for --kernelfix-select / ini "
                f"kernelfix_select: expected kernel, launched or a nodeid glob")
    return items or ("kernel",)


def device_requested(config: pytest.Config, namespace: Any = None) -> bool:
    """True when the user chose a device explicitly (CLI or ini), even without healing.

    ``--kernelfix-device interpret`` on its own runs a GPU suite on the interpreter with
    the CPU shim: the way to run GPU kernel tests on a CPU-only CI.
    """
    if cli_given(config, "kernelfix_device", namespace):
        return True
    return bool(str(config.getini("kernelfix_device")).strip())


def resolve_device(requested: str, detect_cuda: Callable[[], bool] | None = None) -> str:
    """``cuda`` or ``interpret``; ``auto`` asks torch, unless TRITON_INTERPRET is already on."""
    if requested in ("cuda", "interpret"):
        return requested
    if os.environ.get("TRITON_INTERPRET", "").strip() in ("1", "true", "True"):
        return "interpret"
    if detect_cuda is None:
        detect_cuda = _torch_sees_cuda
    return "cuda" if detect_cuda() else "interpret"


def _torch_sees_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def replay_candidates(path: str, *roots: Path) -> tuple[Path, ...]:
    """Where the cassette of ``replay:PATH`` is looked for, in order: a relative PATH in
    the current directory first, then under each of ``roots`` (the project root, then
    pytest's rootdir).

    A cassette named on the command line is relative to where pytest runs; one named in
    the ini file is relative to the project, wherever pytest runs from.
    """
    given = Path(os.path.expanduser(path))
    if given.is_absolute():
        return (given,)
    return tuple(dict.fromkeys((given, *(root / given for root in roots))))


def _replay_path(model: str, *roots: Path) -> str:
    """``replay:PATH`` with PATH where the cassette was found (as given: found nowhere)."""
    prefix = "replay:"
    if not model.startswith(prefix):
        return model
    candidates = replay_candidates(model[len(prefix):], *roots)
    return prefix + str(next((path for path in candidates if path.exists()), candidates[0]))


def _under(root: Path, text: str) -> Path:
    path = Path(os.path.expanduser(text))
    return path if path.is_absolute() else root / path
