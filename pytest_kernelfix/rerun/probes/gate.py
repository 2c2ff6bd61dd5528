"""GPU compile gate: does a kernel that passed on the interpreter compile for a real GPU?

The interpreter hides a class of bugs a GPU compiler refuses (``tl.dot`` with K < 16,
Python globals, ``break``, runtime ``static_range``, returned values, ``num_warps=3``,
shared memory over the limit). ``compile_launch`` compiles one recorded launch with
``triton.compile(ASTSource(...), target=GPUTarget(...))``, which needs no GPU, and
returns a ``GateResult`` whose ``error`` names the kernel's file and line so that it
can be fed back to a model.

Under ``TRITON_INTERPRET=1`` every ``@triton.jit`` function, Triton's own
``tl.sum`` / ``tl.sigmoid`` included, is an ``InterpretedFunction`` that the compiler
cannot use. For the duration of one compile the gate swaps each reachable one for a
``JITFunction`` of the same Python function (module dicts and closure cells, restored
afterwards), switches ``knobs.runtime.interpret`` off, points ``TRITON_CACHE_DIR`` at
``cache_dir`` and makes ``driver.active`` report the gate's target.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_kernelfix.capture.launches import KernelLaunch, constexpr_value, python_function
from pytest_kernelfix.rerun.report import GateResult
from pytest_kernelfix.shim.devices import known_capabilities, shared_limit
from pytest_kernelfix.target import cuda_capability

RESULT_DIR = "kernelfix-gate"
_HIP_SHARED = {"gfx90a": 65536, "gfx942": 65536, "gfx950": 163840}
_MAX_ERROR_LINE = 400


@dataclass(frozen=True)
class GpuTarget:
    """A GPU to compile for; ``shared_limit`` is the opt-in shared memory per block."""

    backend: str
    arch: int | str
    warp_size: int
    shared_limit: int

    def __str__(self) -> str:
        return f"{self.backend}:{self.arch}"

    def triton_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


def parse_target(text: str, *, require_backend: bool = True) -> GpuTarget:
    """``"cuda:90"`` (H100), ``"cuda:80"`` (A100), ``"cuda:89"``, ``"hip:gfx942"``...

    ``require_backend`` also asks the installed Triton for the target's backend (it
    imports triton); without it only the text is checked.
    """
    backend, _, arch = text.strip().lower().partition(":")
    if backend == "cuda":
        capability = cuda_capability(text)
        limit = None if capability is None else shared_limit(capability)
        if capability is None or limit is None:
            known = ", ".join(f"cuda:{major}{minor}" for major, minor in known_capabilities())
            raise ValueError(f"unknown CUDA target {text!r}; known targets: {known}")
        if require_backend:
            _require_backend("nvidia", text)
        return GpuTarget("cuda", capability[0] * 10 + capability[1], 32, limit)
    if backend == "hip":
        if arch not in _HIP_SHARED:
            known = ", ".join(f"hip:{name}" for name in _HIP_SHARED)
            raise ValueError(f"unknown HIP target {text!r}; known targets: {known}")
        if require_backend:
            _require_backend("amd", text)
        return GpuTarget("hip", arch, 64, _HIP_SHARED[arch])
    raise ValueError(
        f"unknown GPU target {text!r}; expected 'cuda:<arch>' (e.g. cuda:90, cuda:80) "
        "or 'hip:<gfx>' (e.g. hip:gfx942)"
    )


def _require_backend(name: str, text: str) -> None:
    backends = installed_backends()
    if name not in backends:
        raise ValueError(
            f"the installed triton cannot compile for {text!r}: no {name!r} backend "
            f"(available: {', '.join(sorted(backends)) or 'none'})"
        )


def installed_backends() -> frozenset[str]:
    """The Triton backends installed, found where Triton finds them (its entry points,
    or its own ``backends`` folder under ``TRITON_BACKENDS_IN_TREE=1``) without importing
    triton: the start-up check of an xdist controller must not pay for it."""
    loaded = sys.modules.get("triton.backends")
    if loaded is not None:
        return frozenset(getattr(loaded, "backends", {}))
    spec = importlib.util.find_spec("triton")
    if spec is None:
        raise ImportError("No module named 'triton'")
    if os.environ.get("TRITON_BACKENDS_IN_TREE", "") == "1":
        folders = [Path(p) / "backends" for p in spec.submodule_search_locations or ()]
        return frozenset(entry.name for folder in folders if folder.is_dir()
                         for entry in folder.iterdir()
                         if entry.is_dir() and not entry.name.startswith("__"))
    return frozenset(ep.name for ep in importlib.metadata.entry_points(group="triton.backends"))


def compile_launch(
    kernel: object, launch: KernelLaunch, target: GpuTarget, *, cache_dir: str | None,
    root: str | None = None,
) -> GateResult:
    """Compile one recorded launch for ``target`` and judge it (see the module docstring).

    With ``root`` (the rerun's rootdir), cached verdicts are keyed and stored with paths
    relative to it, so another sandbox copy of the project (a parallel worker, the next
    session) reuses them.
    """
    started = time.perf_counter()
    skip = _skip_reason(kernel, launch)
    if skip:
        return _result(launch, ok=True, error=skip, started=started)
    with _compile_scope(target, cache_dir) as swap:
        jit = swap.jit_function(kernel)
        key = _cache_key(jit, _relative_launch(launch, root), target)
        cached = _load(cache_dir, key)
        if cached is not None:
            error = _rooted(cached.error, root)
            return _result(launch, cached.ok, error, started, cached.shared, cached=True)
        result = _compile(jit, launch, target, swap, started)
    _store(cache_dir, key, GateResult(**{**asdict(result), "error": _unrooted(result.error, root)}))
    return result


_ROOT_MARK = "<rootdir>"


def _relative_launch(launch: KernelLaunch, root: str | None) -> KernelLaunch:
    if not root or not launch.file.startswith(root.rstrip(os.sep) + os.sep):
        return launch
    relative = launch.file[len(root.rstrip(os.sep)) + 1:]
    return KernelLaunch(launch.name, relative, launch.line, launch.signature, launch.constexprs,
                        launch.options, launch.exact)


def _unrooted(text: str, root: str | None) -> str:
    return text.replace(root.rstrip(os.sep) + os.sep, _ROOT_MARK + os.sep) if root else text


def _rooted(text: str, root: str | None) -> str:
    return text.replace(_ROOT_MARK + os.sep, root.rstrip(os.sep) + os.sep) if root else text


def compile_launches(
    kernels: dict[KernelLaunch, object], target: GpuTarget, *, cache_dir: str | None
) -> list[GateResult]:
    """``compile_launch`` for every record of ``LaunchRecorder.kernels``, in order."""
    return [
        compile_launch(kernel, launch, target, cache_dir=cache_dir)
        for launch, kernel in kernels.items()
    ]


def _skip_reason(kernel: object, launch: KernelLaunch) -> str:
    if not launch.exact:
        return (
            f"gate skipped {launch.name}: the launch's argument types or constexpr values "
            "are not known exactly, and the gate does not guess them"
        )
    if any(kind.startswith("(") for _, kind in launch.signature):
        return f"gate skipped {launch.name}: tuple arguments are not supported by the gate"
    if python_function(kernel) is None:
        return f"gate skipped {launch.name}: no Python function behind {kernel!r}"
    return ""


def _result(
    launch: KernelLaunch, ok: bool, error: str, started: float, shared: int = 0,
    cached: bool = False,
) -> GateResult:
    seconds = round(time.perf_counter() - started, 4)
    return GateResult(launch.name, launch.file, launch.line, ok, error, shared, seconds, cached)


def _compile(
    jit: Any, launch: KernelLaunch, target: GpuTarget, swap: _JitSwap, started: float
) -> GateResult:
    import triton
    from triton.compiler import ASTSource

    signature = dict(launch.signature)
    constexprs: dict[str, Any] = {
        name: constexpr_value(value) for name, value in launch.constexprs
    }
    for name, kind in signature.items():
        if kind == "constexpr":
            constexprs.setdefault(name, None)  # a None argument is specialised as constexpr
    # Pointers from torch are 16-byte aligned; integers (sizes, strides) are taken to be
    # multiples of 16, the specialisation a GPU compiles for the usual power-of-two
    # shapes and the one that pipelines loads, so the most shared memory is checked.
    attrs = {
        (index,): [["tt.divisibility", 16]]
        for index, kind in enumerate(signature.values())
        if kind.startswith("*") or kind in ("i32", "i64")
    }
    stderr: list[str] = []
    try:
        with _stderr_into(stderr), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION is unset")
            compiled = triton.compile(
                ASTSource(jit, signature, constexprs, attrs),
                target=target.triton_target(),
                options=dict(launch.options),
            )
    except Exception as exc:
        return _result(launch, False, describe_error(exc, swap.sources(), "".join(stderr)), started)
    shared = int(getattr(compiled.metadata, "shared", 0) or 0)
    if shared > target.shared_limit:
        message = (
            f"{launch.where}: out of resource: shared memory, Required: {shared}, Hardware "
            f"limit: {target.shared_limit} ({target}). Reducing block sizes or `num_stages` "
            "may help."
        )
        return _result(launch, False, message, started, shared)
    return _result(launch, True, "", started, shared)


# --- turning interpreted kernels into compilable ones ------------------------------------


_converted: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


class _JitSwap:
    """Replaces reachable ``InterpretedFunction`` objects by ``JITFunction`` ones, reversibly."""

    def __init__(self) -> None:
        from triton.runtime.interpreter import InterpretedFunction
        from triton.runtime.jit import JITFunction

        self._jit_type = JITFunction
        self._interpreted_type = InterpretedFunction
        self._undo: list[Callable[[], None]] = []
        self._seen_dicts: set[int] = set()
        self._jits: list[Any] = []

    def _convert(self, interpreted: Any) -> Any:
        jit = _converted.get(interpreted)
        if jit is None:
            jit = self._jit_type(interpreted.fn, **getattr(interpreted, "kwargs", {}))
            _converted[interpreted] = jit
        return jit

    def _swap_dict(self, namespace: dict[str, Any]) -> None:
        if id(namespace) in self._seen_dicts:
            return
        self._seen_dicts.add(id(namespace))
        for name, value in list(namespace.items()):
            if isinstance(value, self._interpreted_type):
                jit = self._convert(value)
                namespace[name] = jit
                self._undo.append(functools.partial(namespace.__setitem__, name, value))
                self._visit(jit.fn)
            elif isinstance(value, self._jit_type):
                self._visit(value.fn)

    def _visit(self, fn: Any) -> None:
        self._swap_dict(fn.__globals__)
        for name in fn.__code__.co_names:
            module = fn.__globals__.get(name)
            if isinstance(module, types.ModuleType) and not _is_library(module):
                self._swap_dict(vars(module))
        for cell in fn.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if isinstance(value, self._interpreted_type):
                cell.cell_contents = self._convert(value)
                self._undo.append(functools.partial(setattr, cell, "cell_contents", value))
                self._visit(value.fn)
            elif isinstance(value, self._jit_type):
                self._visit(value.fn)

    def swap_triton(self) -> None:
        modules = [
            module
            for name, module in list(sys.modules.items())
            if name.startswith("triton.language") and module is not None
        ]
        for module in modules:
            _repair_interpreter_leaks(vars(module))
        for module in modules:
            self._swap_dict(vars(module))

    def jit_function(self, kernel: object) -> Any:
        """The ``JITFunction`` behind a JIT, interpreted, autotuned or heuristic kernel."""
        current: Any = kernel
        for _ in range(8):
            if isinstance(current, self._jit_type):
                jit = current
                break
            if isinstance(current, self._interpreted_type):
                jit = self._convert(current)
                break
            if isinstance(current, types.FunctionType):
                jit = self._jit_type(current)
                break
            current = getattr(current, "fn", None)
        else:
            raise TypeError(f"not a Triton kernel: {kernel!r}")
        self._jits.append(jit)
        self._visit(jit.fn)
        return jit

    def sources(self) -> dict[str, tuple[str, int]]:
        """``JITFunction.src`` -> (file, def line) for every function the compile may touch."""
        found: dict[str, tuple[str, int]] = {}
        for jit in [*self._jits, *_converted.values()]:
            found.setdefault(jit.src, (jit.file_name, jit.def_file_line_number))
        return found

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


def _interpreter_made(value: Any) -> bool:
    if isinstance(value, functools.partial):
        value = value.func
    return not isinstance(value, type) and (
        getattr(value, "__module__", None) == "triton.runtime.interpreter"
    )


def _repair_interpreter_leaks(namespace: dict[str, Any]) -> None:
    """Put back ``triton.language`` members an interpreted helper call left patched.

    Triton 3.9's ``InterpretedFunction.__call__`` never restores the patches it makes
    (the shim's ``leaks`` piece prevents this; without the shim the gate repairs it).
    The leaked lambdas keep the original as their ``member`` default; other leaked
    objects are taken from ``triton.language``. Not undone: the originals are correct.
    """
    import triton.language as tl

    for name, value in list(namespace.items()):
        if not _interpreter_made(value):
            continue
        original = (getattr(value, "__kwdefaults__", None) or {}).get("member")
        if original is None:
            original = getattr(tl, name, None)
        if original is not None and not _interpreter_made(original):
            namespace[name] = original


def _is_library(module: types.ModuleType) -> bool:
    name = module.__name__.partition(".")[0]
    return name in {"triton", "torch", "numpy", "builtins"} or name in sys.stdlib_module_names


class _TargetDriver:
    """Answers ``driver.active.get_current_target()`` (``tl.target_info``) during a compile."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def get_current_target(self) -> Any:
        return self._target


@contextmanager
def _compile_scope(target: GpuTarget, cache_dir: str | None) -> Iterator[_JitSwap]:
    from triton import knobs
    from triton.runtime.driver import driver

    with ExitStack() as stack:
        stack.enter_context(knobs.runtime.scope())
        stack.enter_context(knobs.cache.scope())
        knobs.runtime.interpret = False
        if cache_dir is None:
            scratch = tempfile.mkdtemp(prefix="kernelfix-gate-")
            stack.callback(shutil.rmtree, scratch, True)
            knobs.cache.dir = scratch
        else:
            knobs.cache.dir = str(Path(cache_dir) / "triton")
        previous = getattr(driver, "_active", None)
        driver.set_active(_TargetDriver(target.triton_target()))
        stack.callback(setattr, driver, "_active", previous)
        swap = _JitSwap()
        stack.callback(swap.restore)
        swap.swap_triton()
        yield swap


@contextmanager
def _stderr_into(sink: list[str]) -> Iterator[None]:
    """Capture file descriptor 2: MLIR prints its diagnostics there, not in the exception."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            sink.append(capture.read().decode("utf-8", "replace"))


# --- error text --------------------------------------------------------------------------


def describe_error(exc: BaseException, sources: dict[str, tuple[str, int]], stderr: str) -> str:
    """The compiler's complaint with file lines instead of ``at L:C`` inside the ``def``.

    Walks ``__cause__`` to the root; each ``CompilationError`` on the way is a call site
    (outermost first), the deepest one locates the error.
    """
    from triton.compiler.errors import CompilationError

    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__
    sites = [err for err in chain if isinstance(err, CompilationError)]
    root = chain[-1]
    if not sites:
        text = f"{type(root).__name__}: {root}".strip()
        diagnostics = [line for line in stderr.splitlines() if ": error: " in line]
        return "\n".join([text, *(d[:_MAX_ERROR_LINE] for d in diagnostics)])
    deepest = sites[-1]
    if isinstance(root, CompilationError):
        message = root.error_message or type(root).__name__
        if type(root) is not CompilationError:
            message = f"{type(root).__name__}: {message}"
    else:
        message = f"{type(root).__name__}: {root}"
    lines = [f"{_where(deepest, sources)}: {message}"]
    lines += _excerpt(deepest)
    for caller in reversed(sites[:-1]):
        lines.append(f"  called from {_where(caller, sources)}")
    return "\n".join(lines)


def _where(err: Any, sources: dict[str, tuple[str, int]]) -> str:
    line = getattr(err.node, "lineno", None)
    col = getattr(err.node, "col_offset", 0)
    site = sources.get(err.src) if err.src else None
    if site is None or line is None:
        return f"<kernel source> line {line} (relative to the def)"
    file, def_line = site
    return f"{file}:{def_line + line - 1}:{col + 1}"


def _excerpt(err: Any) -> list[str]:
    line = getattr(err.node, "lineno", None)
    if not err.src or line is None:
        return []
    source_lines = err.src.split("\n")
    if not 0 < line <= len(source_lines):
        return []
    text = source_lines[line - 1]
    return [f"    {text}", "    " + " " * err.node.col_offset + "^"]


# --- result cache ------------------------------------------------------------------------


def _cache_key(jit: Any, launch: KernelLaunch, target: GpuTarget) -> str | None:
    """Hash of the kernel and everything it calls, the launch and the target.

    None when Triton cannot hash the kernel (``torch.exp`` in it, say): the compile
    then fails with the same message, and that verdict is simply not cached.
    """
    import triton

    try:
        source_key = jit.cache_key  # the source of the kernel and of every function it calls
    except Exception:
        return None
    payload = json.dumps(
        [triton.__version__, source_key, launch.to_json(), asdict(target)],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _load(cache_dir: str | None, key: str | None) -> GateResult | None:
    if cache_dir is None or key is None:
        return None
    path = Path(cache_dir) / RESULT_DIR / f"{key}.json"
    try:
        return GateResult.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _store(cache_dir: str | None, key: str | None, result: GateResult) -> None:
    if cache_dir is None or key is None:
        return
    folder = Path(cache_dir) / RESULT_DIR
    folder.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    with os.fdopen(handle, "w") as out:
        json.dump(result.to_json(), out)
    os.replace(temp, folder / f"{key}.json")
