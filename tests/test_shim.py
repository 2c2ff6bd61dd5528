"""The shim as a whole: install / uninstall / installed, in fresh interpreters.

Each scenario runs in a child Python so that the shim is installed before any kernel is
decorated and the test session's own state does not leak in or out.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).parent


def run_child(code: str) -> str:
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}  # the caller's code
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", textwrap.dedent(code)],
        env=env, cwd=TESTS, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


SNAPSHOT = """
    import torch, triton
    from torch.overrides import _get_current_function_mode_stack
    from triton.runtime import interpreter
    from triton.language.extra import libdevice
    from triton.language.extra.cuda import libdevice as cuda_libdevice

    def snapshot():
        return {
            "is_available": torch.cuda.is_available,
            "get_device_properties": torch.cuda.get_device_properties,
            "modes": len(_get_current_function_mode_stack()),
            "driver": getattr(triton.runtime.driver, "_active", None),
            "tanh": libdevice.tanh,
            "cuda_tanh": cuda_libdevice.tanh,
            "extern": interpreter.InterpreterBuilder.__dict__["create_extern_elementwise"],
            "cvt": interpreter._implicit_cvt,
            "call": interpreter.InterpretedFunction.__call__,
            "parameter": torch.nn.Parameter.__dict__["__new__"],
            "engine": torch.autograd.graph._engine_run_backward,
            "engine_by_name": torch.autograd._engine_run_backward,
            "function_apply": torch.autograd.Function.__dict__["apply"],
            "save_for_backward": torch.autograd.function.FunctionCtx.save_for_backward,
            "node_apply": torch.autograd.function.BackwardCFunction.__dict__["apply"],
            "saved_tensors": torch.autograd.function.BackwardCFunction.__dict__.get(
                "saved_tensors"),
            "saved_tensors_hooks": torch.autograd.graph.saved_tensors_hooks.__init__,
        }
"""


def test_nothing_changes_until_install_and_uninstall_restores_all() -> None:
    out = run_child(SNAPSHOT + """
    import os
    import pytest_kernelfix.shim as shim
    import pytest_kernelfix.rerun.probes.gate  # importing the gate installs nothing either
    before = snapshot()
    assert not shim.installed() and shim.state() is None
    assert not torch.cuda.is_available()
    try:
        triton.runtime.driver.active
    except RuntimeError as e:
        assert "0 active drivers" in str(e)
    else:
        raise AssertionError("a driver is active without the shim")
    assert libdevice.tanh(1.0) is None

    shim.install()
    installed = snapshot()
    changed = sorted(k for k in before if before[k] is not installed[k] and k != "modes")
    print("changed", changed, installed["modes"])
    shim.install()  # idempotent: nothing is wrapped twice
    assert snapshot() == installed
    assert not hasattr(interpreter._implicit_cvt.__wrapped__, "__wrapped__")
    assert shim.state().target_capability == (9, 0) and shim.state().cuda_mapped

    shim.install(target_capability=(8, 0))  # other options: reinstalled with them
    assert torch.cuda.get_device_capability() == (8, 0)
    assert snapshot()["modes"] == 1

    shim.uninstall()
    assert snapshot() == before, [k for k in before if before[k] != snapshot()[k]]
    assert not shim.installed()
    shim.uninstall()  # a second uninstall is harmless

    shim.install(cuda=False)
    assert not torch.cuda.is_available()
    assert triton.runtime.driver.active.get_active_torch_device() == torch.device("cpu")
    assert shim.state() == shim.ShimState(False, (9, 0), False)
    shim.uninstall()
    assert snapshot() == before
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        shim.install()
    except RuntimeError as e:
        assert "TRITON_INTERPRET=1" in str(e)
    else:
        raise AssertionError("installed for compiled kernels")
    assert snapshot() == before
    print("ok")
    """)
    assert "ok" in out
    changed = out.split("changed ")[1].split("\n")[0]
    for key in ("is_available", "driver", "tanh", "cuda_tanh", "extern", "cvt", "call",
                "parameter", "engine", "engine_by_name", "function_apply", "save_for_backward",
                "node_apply", "saved_tensors", "saved_tensors_hooks"):
        assert repr(key) in changed
    assert changed.endswith("1")  # one torch function mode pushed


def test_installed_before_kernels_import_everything_works_together() -> None:
    out = run_child("""
    from pytest_kernelfix import shim
    shim.install()
    import torch, triton
    import triton.language as tl
    from triton.language.extra.libdevice import tanh  # bound by name at import

    @triton.jit
    def gelu_tanh(x_ptr, out_ptr, n, k, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        inner = k.to(tl.float32) * (x + 0.044715 * x * x * x)
        y = 0.5 * x * (1 + tanh(inner))
        tl.store(out_ptr + offs, y - tl.max(y, axis=0) + tl.max(y, axis=0), mask=mask)

    x = torch.randn(1000, device="cuda")
    out = torch.empty_like(x)
    gelu_tanh[(triton.cdiv(1000, 256),)](x, out, 1000, 0.7978845608, BLOCK=256)
    torch.testing.assert_close(out, torch.nn.functional.gelu(x, approximate="tanh"))
    from torch._dynamo import trace_rules
    trace_rules.get_torch_obj_rule_map()  # indexes torch.cuda by object: one rule each
    assert torch.nn.Linear(4, 4, device="cuda").weight.is_cuda  # with dynamo's polyfills in

    leaked = [n for n, v in vars(tl.core).items()
              if getattr(v, "__module__", "") == "triton.runtime.interpreter"]
    assert not leaked, leaked  # tl.max ran as an interpreted helper and cleaned up
    print("ok", out.device)
    """)
    assert "ok cuda:0" in out
