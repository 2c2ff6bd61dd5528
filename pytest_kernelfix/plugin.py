"""pytest hooks of pytest-kernelfix: options, the ``kernel`` marker, hand-off to a session.

This module is the ``pytest11`` entry point, imported by every pytest run in an
environment where the plugin is installed: it imports nothing heavy, and it does
nothing beyond registering the marker unless ``--kernelfix``, ``--kernelfix-apply`` or
an explicit ``--kernelfix-device`` asks for it.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from pytest_kernelfix import config as kernelfix_config

SESSION_PLUGIN = "kernelfix-session"
MARKER = (
    "kernel: the test launches a Triton kernel; "
    "pytest --kernelfix heals the kernel when the test fails"
)
device_key = pytest.StashKey[str]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_kernelfix import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    kernelfix_config.add_options(parser)


def _wanted(config: pytest.Config, namespace: Any = None) -> bool:
    if os.environ.get(kernelfix_config.RERUN_PLAN_ENV):
        return False  # a rerun child: its own agent prepares the device
    resolve = kernelfix_config.resolve
    healing = bool(resolve(config, "kernelfix", namespace)) or bool(
        resolve(config, "kernelfix_apply", namespace)
    )
    return healing or kernelfix_config.device_requested(config, namespace)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    """Choose the device before conftest files and test modules import kernels."""
    namespace = early_config.known_args_namespace
    if not _wanted(early_config, namespace):
        return
    from pytest_kernelfix import device

    def value(name: str) -> Any:
        return kernelfix_config.resolve(early_config, name, namespace)

    chosen = kernelfix_config.resolve_device(value("kernelfix_device"))
    device.prepare(
        chosen,
        cuda_shim=bool(value("kernelfix_cuda_shim")),
        capability=kernelfix_config.target_capability(value("kernelfix_target")),
        install_shim=device.runs_tests(early_config),
    )
    early_config.stash[device_key] = chosen


def pytest_report_header(config: pytest.Config) -> str | None:
    from pytest_kernelfix.device import report_header

    return report_header(config, config.stash.get(device_key, None))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    settings = kernelfix_config.load_settings(config)
    if not settings.heal or os.environ.get(kernelfix_config.RERUN_PLAN_ENV):
        return
    from pytest_kernelfix.session import KernelfixSession

    chosen = config.stash.get(device_key, None) or kernelfix_config.resolve_device(
        settings.device
    )
    config.pluginmanager.register(KernelfixSession(config, settings, chosen), SESSION_PLUGIN)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.pluginmanager.get_plugin(SESSION_PLUGIN)
    if session is not None:
        session.close()
        config.pluginmanager.unregister(session)
