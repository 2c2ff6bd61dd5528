"""Put the process on the chosen device before any kernel module is imported.

``TRITON_INTERPRET`` is read when ``@triton.jit`` decorates a function, so interpret
mode must be set (and the CPU shim installed) before conftest files and test modules
import kernels. The same preparation runs in the session and in every rerun.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pytest

from pytest_kernelfix.target import DEFAULT_CAPABILITY, capability_of, gate_enabled

if TYPE_CHECKING:
    from pytest_kernelfix.shim import ShimState


def prepare(
    device: str,
    *,
    cuda_shim: bool = True,
    capability: tuple[int, int] = DEFAULT_CAPABILITY,
    install_shim: bool = True,
) -> None:
    """Set up ``interpret`` (interpreter + CPU shim) or ``cuda`` in this process.

    ``capability`` is what the shim's ``torch.cuda`` answers: the compile gate's target.
    With ``install_shim=False`` only the environment is set (children inherit it): for
    a process that runs no test, such as an xdist controller (:func:`runs_tests`).
    """
    if device == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"
        if not install_shim:
            return
        from pytest_kernelfix import shim

        try:
            shim.install(cuda=cuda_shim, target_capability=capability)
        except ImportError as error:
            raise pytest.UsageError(
                f"kernelfix: running kernels on the Triton interpreter needs triton, torch "
                f"and numpy: {error}"
            ) from None
    elif device == "cuda":
        os.environ.pop("TRITON_INTERPRET", None)


def runs_tests(config: pytest.Config) -> bool:
    """False in an xdist controller that hands every test to workers.

    Such a process needs ``TRITON_INTERPRET`` set (its conftest files may import kernels)
    but not the shim: installing it there imports torch and triton once more, serially,
    before any worker starts. Read from the early command line, as xdist decides in
    ``pytest_cmdline_main``: ``-n N`` or ``-n auto`` (``auto`` with ``--pdb`` runs
    in-process), or ``--tx`` with a ``--dist`` mode. A worker is known by the
    ``PYTEST_XDIST_WORKER`` variable; a pytest started from inside a worker inherits it
    and installs the shim even as a controller: slower, never wrong.
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return True
    return not distributes(config.known_args_namespace)


def distributes(options: object) -> bool:
    """Whether these command-line options make xdist hand the tests to workers."""
    workers = getattr(options, "numprocesses", None)
    if workers in ("auto", "logical"):
        return not getattr(options, "usepdb", False)
    if isinstance(workers, int) and workers > 0:
        return True
    return bool(getattr(options, "tx", None) and getattr(options, "dist", "no") != "no")


def remote_workers(options: object) -> bool:
    """Whether xdist runs tests on other machines (``--tx ssh=...``, ``socket=...``)."""
    specs = getattr(options, "tx", None) or ()
    return any(not str(spec).split("*", 1)[-1].startswith("popen") for spec in specs)


def is_xdist_controller(config: pytest.Config) -> bool:
    """A configured session that hands every test to xdist workers.

    Unlike :func:`runs_tests` (which must decide before ``workerinput`` exists), this
    reads the configured session, so a pytest started inside a worker is told apart.
    """
    return not hasattr(config, "workerinput") and distributes(config.option)


def header_line(
    device: str, *, cuda_shim: bool, target: str, state: ShimState | None = None
) -> str:
    """The session header's line: where kernels run, what the shim maps, what the gate targets.

    ``state`` is the installed shim's (None where it is not installed in this process, as
    on an xdist controller, whose workers install it): the line then says what was asked.
    """
    if device != "interpret":
        return f"kernelfix: device {device} (kernels compiled and run on the GPU)"
    from pytest_kernelfix.shim.devices import properties_for

    parts = ["kernelfix: device interpret (Triton interpreter on the CPU, TRITON_INTERPRET=1)"]
    if not cuda_shim or (state is not None and not state.cuda_mapped):
        parts.append("CUDA shim not needed (torch sees a real GPU)" if cuda_shim
                     else "CUDA shim off")
    else:
        props = properties_for(capability_of(target))
        extras = [] if state is None else [
            "autocast emulated" if state.autocast else "autocast not emulated",
            "bf16 exact" if state.bf16_exact else "bf16 inexact, so not announced",
        ]
        parts.append(f"CUDA shim on (device='cuda' on the CPU, torch.cuda answers as "
                     f"{props.name}, sm_{props.major}{props.minor}"
                     + "".join(f"; {extra}" for extra in extras) + ")")
    gate = target.strip()
    parts.append(f"compile gate target {gate}" if gate_enabled(gate) else "compile gate off")
    return "; ".join(parts)


def report_header(config: pytest.Config, device: str | None) -> str | None:
    """:func:`header_line` for this session, or None where the plugin set up no device."""
    if device is None:
        return None
    from pytest_kernelfix import shim
    from pytest_kernelfix.config import resolve

    return header_line(device, cuda_shim=bool(resolve(config, "kernelfix_cuda_shim")),
                       target=str(resolve(config, "kernelfix_target")), state=shim.state())
