"""pytest hooks of pytest-kernelfix: options, the ``kernel`` marker, one object per role.

This module is the ``pytest11`` entry point, imported by every pytest run in an
environment where the plugin is installed: it imports nothing heavy, and it does
nothing beyond registering the marker unless ``--kernelfix``, ``--kernelfix-apply`` or
an explicit ``--kernelfix-device`` asks for it.

While healing, two objects are registered, each where its job is (as pytest registers
``junitxml`` nowhere but on the controller, and xdist a session per role):

- :class:`~pytest_kernelfix.capture.plugin.CapturePlugin` wherever tests run (a plain
  session or an xdist worker): records kernel launches onto the reports;
- :class:`~pytest_kernelfix.session.controller.HealingController` wherever reports arrive (a
  plain session or the xdist controller): collects, heals, prints the summary.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kernelfix import config as kernelfix_config
from pytest_kernelfix.target import capability_of

if TYPE_CHECKING:  # quoted below: the plugin objects' modules load only when healing
    from pytest_kernelfix.capture.plugin import CapturePlugin  # noqa: F401
    from pytest_kernelfix.report.junit import JUnitProperties  # noqa: F401
    from pytest_kernelfix.session.controller import HealingController  # noqa: F401
    from pytest_kernelfix.session.helper import Helper  # noqa: F401

MARKER = (
    "kernel: the test launches a Triton kernel; "
    "pytest --kernelfix heals the kernel when the test fails"
)
device_key = pytest.StashKey[str]()
capture_key = pytest.StashKey["CapturePlugin"]()
controller_key = pytest.StashKey["HealingController"]()
#: The healing helper ``pytest_load_initial_conftests`` started (overlap on), for the
#: controller to take over at the session's start.
helper_key = pytest.StashKey["Helper"]()
junit_key = pytest.StashKey["JUnitProperties"]()


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_kernelfix import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    kernelfix_config.add_options(parser)


def _in_rerun() -> bool:
    """A rerun child: its own agent prepares the device and records outcomes."""
    from pytest_kernelfix.rerun.plan import PLAN_ENV  # only once an option asks for us

    return bool(os.environ.get(PLAN_ENV))


def _wanted(config: pytest.Config, namespace: Any = None) -> bool:
    resolve = kernelfix_config.resolve
    healing = bool(resolve(config, "kernelfix", namespace)) or bool(
        resolve(config, "kernelfix_apply", namespace)
    )
    if not healing and not kernelfix_config.device_requested(config, namespace):
        return False
    return not _in_rerun()


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
    if (value("kernelfix") or value("kernelfix_apply")) and value("kernelfix_overlap"):
        from pytest_kernelfix.session.helper import early

        started = early(early_config, namespace, chosen)  # its server imports beside ours
        if started is not None:
            early_config.stash[helper_key] = started
    device.prepare(
        chosen,
        cuda_shim=bool(value("kernelfix_cuda_shim")),
        capability=capability_of(value("kernelfix_target")),
        install_shim=device.runs_tests(early_config),
    )
    early_config.stash[device_key] = chosen


def pytest_report_header(config: pytest.Config) -> list[str]:
    from pytest_kernelfix.device import report_header

    lines = [report_header(config, config.stash.get(device_key, None))]
    controller = config.stash.get(controller_key, None)
    if controller is not None:  # healing: where the project is, when it is not the rootdir
        lines.append(controller.settings.root_note)
    return [line for line in lines if line]


def _device(config: pytest.Config, requested: str) -> str:
    """The session's device, resolved once: before conftests where possible, else now."""
    if device_key not in config.stash:
        config.stash[device_key] = kernelfix_config.resolve_device(requested)
    return config.stash[device_key]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER)
    settings = kernelfix_config.load_settings(config)
    # settings.device is "cuda" only when asked for (CLI or ini): checked without healing too
    if not (settings.heal or settings.device == "cuda") or _in_rerun():
        return
    device = _device(config, settings.device)
    from pytest_kernelfix import redact

    redact.listed(settings.redact_env)
    if not hasattr(config, "workerinput"):  # once per session, before any test runs
        from pytest_kernelfix.device import remote_workers
        from pytest_kernelfix.session import preflight

        if not remote_workers(config.option):  # their GPUs are not this machine's
            preflight.check_device(settings)
        if settings.heal:
            preflight.check(settings, device, warn=config.issue_config_time_warning)
    if not settings.heal:
        return
    notes: list[str] = []
    from pytest_kernelfix.device import is_xdist_controller

    if not is_xdist_controller(config):
        from pytest_kernelfix.capture.plugin import CapturePlugin

        capture = CapturePlugin(config, settings.root)
        config.stash[capture_key] = capture
        config.pluginmanager.register(capture, "kernelfix-capture")
        notes = capture.notes
    if not hasattr(config, "workerinput"):
        from pytest_kernelfix.session.controller import HealingController

        controller = HealingController(config, settings, device, notes,
                                       early=config.stash.get(helper_key, None))
        config.stash[controller_key] = controller
        config.pluginmanager.register(controller, "kernelfix-controller")
        xmlpath = getattr(config.option, "xmlpath", None)
        if xmlpath:  # junitxml writes where reports arrive; our properties follow it
            from pytest_kernelfix.report.junit import JUnitProperties

            prefix = str(getattr(config.option, "junitprefix", None) or "")
            junit = JUnitProperties(xmlpath, prefix, controller.ci_notes.append)
            config.stash[junit_key] = junit
            config.pluginmanager.register(junit, "kernelfix-junit")
            controller.sinks = (junit,)


def pytest_unconfigure(config: pytest.Config) -> None:
    unused = config.stash.get(helper_key, None)  # started early, for a session that never began
    if unused is not None and unused.reader is None:
        unused.close()
    if controller_key in config.stash or capture_key in config.stash:
        from pytest_kernelfix import redact

        redact.listed(())
    junit = config.stash.get(junit_key, None)
    if junit is not None:
        config.pluginmanager.unregister(junit)
        del config.stash[junit_key]
    controller = config.stash.get(controller_key, None)
    if controller is not None:
        config.pluginmanager.unregister(controller)
        del config.stash[controller_key]
    capture = config.stash.get(capture_key, None)
    if capture is not None:
        capture.close()
        config.pluginmanager.unregister(capture)
        del config.stash[capture_key]
