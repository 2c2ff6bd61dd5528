"""What a healing session starts from, built from pytest's configuration.

The controller builds these at the session's start, and the healing helper (started
earlier, from ``pytest_load_initial_conftests``, :mod:`pytest_kernelfix.session.helper`)
builds the same from the same configuration: the project, how every rerun is made, and
the fixer the settings name. Light to import: the helper starts before torch and triton.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from pytest_kernelfix.config import Settings
from pytest_kernelfix.project import Project
from pytest_kernelfix.rerun.args import carried_args
from pytest_kernelfix.rerun.launcher import RerunSetup
from pytest_kernelfix.rerun.plan import device_plan

if TYPE_CHECKING:
    from pytest_kernelfix.fixers.base import Fixer


def session_project(config: pytest.Config, settings: Settings) -> Project:
    """The project as this session's configuration defines it."""
    return Project(settings.root, tuple(config.getini("python_files")), settings.paths)


def positional_args(config: pytest.Config) -> tuple[str, ...]:
    """The paths and node ids of the command line, also before collection has set
    ``config.args`` (the overlap helper starts with the initial conftests). Early, a
    conftest's options are not known yet (``--mode quick`` reads as the path ``quick``),
    so only what names an existing path counts."""
    if config.args:
        return tuple(config.args)
    early = getattr(getattr(config, "known_args_namespace", None), "file_or_dir", None) or ()
    here = config.invocation_params.dir
    return tuple(arg for arg in early if (here / arg.partition("::")[0]).exists())


def rerun_setup(config: pytest.Config, settings: Settings, device: str) -> RerunSetup:
    """What every rerun of this session shares."""
    cache_dir = settings.cache_root
    env = {}
    if device == "cuda":  # candidates share compiled kernels; never the user's ~/.triton
        env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
    return RerunSetup(
        original_root=settings.root,
        rootdir=settings.rootdir,
        invocation_dir=config.invocation_params.dir,
        timeout=settings.timeout,
        device=device_plan(device=device, cuda_shim=settings.cuda_shim,
                           target=settings.target, cache_dir=cache_dir),
        addopts=tuple(config.getini("addopts")),
        inifile=config.inipath,
        extra_args=carried_args(config.invocation_params.args, positional_args(config)),
        env=env,
        mode=settings.rerun,
        base_env=dict(os.environ),
    )


def configured_fixer(settings: Settings) -> Fixer:
    """The fixer the settings name (a stand-in that says why when it cannot be built)."""
    # start-up: the fixers (prompts, templates, a model's client) load once one is built,
    # never where the helper starts before torch
    from pytest_kernelfix.fixers.base import FixerError
    from pytest_kernelfix.fixers.factory import build_fixer
    from pytest_kernelfix.fixers.hook import UnavailableFixer

    try:
        return build_fixer(
            settings.model,
            api_base=settings.api_base or None,
            timeout=settings.llm_timeout,
            num_retries=settings.llm_retries,
            prompts_dir=settings.prompts_dir,
            record=settings.record,
            cache_dir=None if settings.no_cache else settings.cache_root,
        )
    except (ValueError, OSError, FixerError) as error:
        return UnavailableFixer(f"fixer {settings.model!r} unavailable: {error}")
