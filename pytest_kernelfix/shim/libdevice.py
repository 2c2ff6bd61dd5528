"""Make ``libdevice`` functions compute real values under the Triton interpreter.

Two gaps, two patches:

- The portable ``triton.language.extra.libdevice`` functions are stubs (``...``) that the
  compiler swaps for the backend's through ``get_module_map``; the interpreter calls the
  stub and gets None. The backend builtins (``extra.cuda.libdevice`` /
  ``extra.hip.libdevice``) need a ``_semantic`` the interpreter does not pass.
  Every function in the three modules is replaced by a wrapper that, when called
  without a semantic or with the interpreter's, calls the backend builtin with the
  interpreter's semantic, and otherwise behaves exactly like the original. The
  wrappers keep ``__module__`` / ``__name__`` (and the builtin marker), so the GPU
  compiler still maps and hashes them as before: the compile gate is unaffected.
- The interpreter's ``create_extern_elementwise`` raises ``NotImplementedError``; it
  now evaluates the symbol with ``libdevice_numpy``. Types, broadcasting and the
  "no fp16 overload" errors still come from Triton's own ``extern_elementwise``.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from types import ModuleType
from typing import Any

from pytest_kernelfix.shim._patches import Patches

GENERIC = "triton.language.extra.libdevice"
BACKENDS = ("triton.language.extra.cuda.libdevice", "triton.language.extra.hip.libdevice")

_patches = Patches()


def _modules() -> tuple[ModuleType, list[ModuleType]]:
    generic = importlib.import_module(GENERIC)
    backends = []
    for name in BACKENDS:
        try:
            backends.append(importlib.import_module(name))
        except ImportError:  # a triton build without that backend
            continue
    return generic, backends


def _interpreter_semantic() -> Any:
    from triton.runtime import interpreter

    return interpreter.interpreter_semantic


def _dual(original: Any, backend_builtin: Any) -> Any:
    """A function that runs ``backend_builtin`` on the interpreter and ``original`` elsewhere."""
    compiled = original if getattr(original, "__triton_builtin__", False) else backend_builtin

    @functools.wraps(original)
    def libdevice_function(*args: Any, _semantic: Any = None, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # a wrong call is the kernel's error, not the shim's
        interpreter = _interpreter_semantic()
        if _semantic is None or _semantic is interpreter:
            return backend_builtin(*args, _semantic=interpreter, **kwargs)
        return compiled(*args, _semantic=_semantic, **kwargs)

    libdevice_function.__kernelfix_original__ = original  # type: ignore[attr-defined]
    return libdevice_function


def _functions(module: ModuleType) -> dict[str, Any]:
    return {
        name: value
        for name, value in vars(module).items()
        if inspect.isfunction(value) and value.__module__ == module.__name__
    }


def _create_extern_elementwise(
    self: Any, libName: str, libPath: str, symbol: str, argList: list[Any], retType: Any,
    isPure: bool,
) -> Any:
    from triton.runtime.interpreter import TensorHandle, _get_np_dtype

    from pytest_kernelfix.shim.libdevice_numpy import evaluate

    scalar = retType.scalar
    data = evaluate(symbol, [arg.data for arg in argList], _get_np_dtype(scalar))
    return TensorHandle(data, scalar)


def install() -> None:
    from triton.runtime.interpreter import InterpreterBuilder

    if _patches:
        return
    generic, backends = _modules()
    backend_functions = [_functions(module) for module in backends]
    for functions, module in zip(backend_functions, backends, strict=True):
        for name, original in functions.items():
            if getattr(original, "__triton_builtin__", False):
                _patches.set(module, name, _dual(original, original))
    for name, stub in _functions(generic).items():
        builtin = next((fns[name] for fns in backend_functions if name in fns), None)
        if builtin is not None:
            _patches.set(generic, name, _dual(stub, builtin))
    _patches.set(InterpreterBuilder, "create_extern_elementwise", _create_extern_elementwise)


def uninstall() -> None:
    _patches.restore()


def installed() -> bool:
    return bool(_patches)
