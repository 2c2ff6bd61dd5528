"""Record which Triton kernels a test launches, and with which argument types.

An ``assert_close`` failure has no kernel frame in its traceback, so the kernel behind
it is found by watching launches instead. The recorder wraps ``JITFunction.run`` (and
``InterpretedFunction.run`` under ``TRITON_INTERPRET=1``) at class level, which also
sees launches made through ``Autotuner`` and ``Heuristics`` (they call ``fn.run``).

The same records serve three stages: grouping and context in the session, the
kernel-bypass check in reruns (a fixed test must still launch a kernel), and the GPU
compile gate, which needs each launch's argument types and constexpr values.

Each record also keeps its *launch sites*: the project frames on the stack when the
kernel was launched (the wrapper that computed grid, block sizes and strides, and the
project functions between it and the test). A wrong grid in a wrapper that lives in
another module than the kernel produces wrong numbers and no traceback frame; the
launch sites are how that wrapper is found.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pytest_kernelfix.fields import read
from pytest_kernelfix.project import Project

#: Launch options that change how a kernel compiles; recorded when given at launch.
COMPILE_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")

JSONScalar = int | float | bool | str | None
#: Called just before a launch with ``(kernel, args, kwargs)``; what it returns (if not
#: None) is called once the launch has returned. The sensitivity rerun poisons kernel
#: outputs this way (:mod:`pytest_kernelfix.rerun.probes.poison`).
LaunchHook = Callable[[Any, tuple[Any, ...], dict[str, Any]], "Callable[[], None] | None"]

#: A project frame on the stack at launch time: (absolute file, line, function).
Site = tuple[str, int, str]

#: Project frames kept per launch stack, and per distinct launch over a test.
MAX_SITES = 12
MAX_SITES_PER_LAUNCH = 24


@dataclass(frozen=True)
class KernelLaunch:
    """One distinct launch of a ``@triton.jit`` function, as JSON-primitive data.

    ``signature`` lists ``(parameter, triton type)`` in parameter order, with
    ``"constexpr"`` for constexpr parameters (``"*fp32"``, ``"i32"``, ``"fp32"``...);
    ``constexprs`` holds their values, and the ``None`` arguments Triton specialises as
    constexprs; values that are not JSON scalars are kept as ``repr`` strings and
    ``exact`` is False, so the compile gate knows to skip them.
    ``sites`` are the project frames on the stack at launch, innermost first (see the
    module docstring); they do not take part in equality, so one kernel launched the
    same way from two places is one record with the sites of both.
    """

    name: str
    file: str
    line: int
    signature: tuple[tuple[str, str], ...] = ()
    constexprs: tuple[tuple[str, JSONScalar], ...] = ()
    options: tuple[tuple[str, int], ...] = ()
    exact: bool = True
    sites: tuple[Site, ...] = field(default=(), compare=False)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line} ({self.name})"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "file": self.file,
            "line": self.line,
            "signature": [list(pair) for pair in self.signature],
            "constexprs": [list(pair) for pair in self.constexprs],
            "options": [list(pair) for pair in self.options],
            "exact": self.exact,
            "sites": [list(site) for site in self.sites],
        }

    @classmethod
    def from_json(cls, data: Any) -> KernelLaunch:
        return read(cls, data)


def python_function(kernel: Any) -> Callable[..., Any] | None:
    """The plain Python function behind a JIT, interpreted, autotuned or heuristic kernel."""
    seen = 0
    while kernel is not None and seen < 8:
        if inspect.isfunction(kernel):
            return kernel
        kernel = getattr(kernel, "fn", None)
        seen += 1
    return None


def definition_site(fn: Callable[..., Any]) -> tuple[str, int]:
    """(file, 1-based line of ``def``) of a Python function, past its decorators."""
    code = fn.__code__
    try:
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return code.co_filename, code.co_firstlineno
    for offset, text in enumerate(lines):
        stripped = text.lstrip()
        if stripped.startswith(("def ", "async def ")):
            return code.co_filename, start + offset
    return code.co_filename, start


def _is_constexpr_annotation(annotation: Any) -> bool:
    if annotation is inspect.Parameter.empty:
        return False
    if isinstance(annotation, str):
        return "constexpr" in annotation
    return getattr(annotation, "__name__", "") == "constexpr"


#: Prefix of a recorded ``tl.dtype`` constexpr (``dtype:fp32``); see :func:`constexpr_value`.
DTYPE_PREFIX = "dtype:"


def _json_scalar(value: Any) -> tuple[JSONScalar, bool]:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value, True
    if type(value).__name__ == "dtype" and isinstance(getattr(value, "name", None), str):
        return DTYPE_PREFIX + value.name, True  # tl.float32 -> "dtype:fp32"
    inner = getattr(value, "value", value)  # tl.constexpr(3)
    if inner is not value and (inner is None or isinstance(inner, (bool, int, float, str))):
        return inner, True
    return repr(value), False


def constexpr_value(value: JSONScalar) -> Any:
    """A recorded constexpr back as the kernel received it (``dtype:fp32`` -> tl.float32)."""
    if isinstance(value, str) and value.startswith(DTYPE_PREFIX):
        import triton.language as tl

        return tl.dtype(value[len(DTYPE_PREFIX):])
    return value


def _arg_type(value: Any) -> str:
    from triton.runtime.jit import mangle_type

    try:
        return str(mangle_type(value))
    except Exception:  # a dtype, a custom object: not something a signature can name
        return f"<{type(value).__name__}>"


@functools.lru_cache(maxsize=1024)
def _function_facts(fn: Callable[..., Any]) -> tuple[str, int, inspect.Signature]:
    """What never changes between launches of one kernel: read once, not per launch."""
    return (*definition_site(fn), inspect.signature(fn))


def describe_launch(kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> KernelLaunch:
    """Build the record of one launch from the JIT object and the launch arguments."""
    fn = python_function(kernel)
    if fn is None:
        name = getattr(kernel, "__name__", type(kernel).__name__)
        return KernelLaunch(name=name, file="", line=0, exact=False)
    file, line, fn_signature = _function_facts(fn)
    parameters = fn_signature.parameters
    call_kwargs = {k: v for k, v in kwargs.items() if k in parameters}
    options = tuple(
        (key, int(kwargs[key])) for key in COMPILE_OPTIONS if isinstance(kwargs.get(key), int)
    )
    try:
        bound = fn_signature.bind_partial(*args, **call_kwargs)
        bound.apply_defaults()
        values = bound.arguments
    except TypeError:
        return KernelLaunch(fn.__name__, file, line, options=options, exact=False)
    signature: list[tuple[str, str]] = []
    constexprs: list[tuple[str, JSONScalar]] = []
    exact = True
    for pname, param in parameters.items():
        if pname not in values:
            exact = False
            continue
        value = values[pname]
        if _is_constexpr_annotation(param.annotation):
            scalar, ok = _json_scalar(value)
            exact = exact and ok
            signature.append((pname, "constexpr"))
            constexprs.append((pname, scalar))
        else:
            kind = _arg_type(value)
            exact = exact and not kind.startswith("<")
            signature.append((pname, kind))
            if value is None:  # Triton specialises a None argument as a constexpr
                constexprs.append((pname, None))
    return KernelLaunch(
        fn.__name__, file, line, tuple(signature), tuple(constexprs), options, exact
    )


class LaunchRecorder:
    """Counts and describes kernel launches while installed.

    ``launches()`` returns the distinct launches since the last ``reset()`` in the order
    they first happened; ``count`` counts every launch. ``kernels`` maps each record to
    the live kernel object so that the compile gate can build it for a GPU target.
    With a ``root``, each record carries the frames under it that were on the stack
    (:meth:`SiteFilter.sites`). ``on_new`` is called with each distinct launch the moment it
    is first seen, so that a process that crashes in the kernel has already said what
    it launched. ``on_launch``, when set, runs around every launch (see :data:`LaunchHook`).
    """

    def __init__(
        self,
        root: str | os.PathLike[str] | None = None,
        *,
        on_new: Callable[[KernelLaunch], None] | None = None,
        on_launch: LaunchHook | None = None,
    ) -> None:
        self.on_launch = on_launch
        self.count = 0
        self._records: dict[KernelLaunch, Any] = {}
        self._sites: dict[KernelLaunch, dict[tuple[Site, ...], None]] = {}
        self._originals: list[tuple[type, Callable[..., Any]]] = []
        self._lock = threading.Lock()
        self._frames = None if root is None else SiteFilter(root)
        self.on_new = on_new

    def launches(self) -> tuple[KernelLaunch, ...]:
        with self._lock:
            return tuple(
                replace(launch, sites=_merged(self._sites[launch])) if self._sites.get(launch)
                else launch
                for launch in self._records
            )

    @property
    def kernels(self) -> dict[KernelLaunch, Any]:
        return dict(self._records)

    def reset(self) -> None:
        with self._lock:
            self.count = 0
            self._records = {}
            self._sites = {}

    def _record(self, kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            launch = describe_launch(kernel, args, kwargs)
            sites = () if self._frames is None else self._frames.sites(sys._getframe(2))
        except Exception:  # recording must never break the user's kernel launch
            return
        with self._lock:
            self.count += 1
            new = launch not in self._records
            if new:
                self._records[launch] = kernel
            if sites:  # one entry per distinct stack: a loop of launches costs one lookup
                chains = self._sites.setdefault(launch, {})
                if len(chains) < MAX_SITES_PER_LAUNCH:
                    chains[sites] = None
        if new and self.on_new is not None:
            with contextlib.suppress(Exception):  # a listener must never break the launch
                self.on_new(replace(launch, sites=sites) if sites else launch)

    def install(self) -> None:
        if self._originals:
            return
        for cls in _kernel_classes():
            original = cls.__dict__["run"]
            cls.run = self._wrap(original)  # type: ignore[attr-defined]
            self._originals.append((cls, original))

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def run(kernel: Any, *args: Any, **kwargs: Any) -> Any:
            after = None
            if not kwargs.get("warmup", False):
                recorder._record(kernel, args, kwargs)
                if recorder.on_launch is not None:
                    after = recorder.on_launch(kernel, args, kwargs)
            result = original(kernel, *args, **kwargs)
            if after is not None:  # not reached when the launch raised
                after()
            return result

        run.__wrapped__ = original  # type: ignore[attr-defined]
        return run

    def uninstall(self) -> None:
        for cls, original in reversed(self._originals):
            cls.run = original
        self._originals = []

    @contextmanager
    def recording(self) -> Iterator[LaunchRecorder]:
        self.install()
        try:
            yield self
        finally:
            self.uninstall()


_SKIP, _KEEP, _STOP = 0, 1, 2


def _merged(chains: dict[tuple[Site, ...], None]) -> tuple[Site, ...]:
    """The frames of every recorded stack, first seen first, at most MAX_SITES_PER_LAUNCH."""
    frames: dict[Site, None] = {}
    for chain in chains:
        for site in chain:
            frames[site] = None
    return tuple(frames)[:MAX_SITES_PER_LAUNCH]


class SiteFilter:
    """Which stack frames are the project's: under ``root``, outside installed packages,
    virtualenvs and this plugin. Decided once per file name, so a launch costs a walk up
    the stack and one dict lookup per frame; the walk stops at pytest's own frames (what
    lies beyond the test function is the test runner)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.project = Project(Path(root))
        self.prefixes = tuple(os.path.join(path, "") for path in self.project.roots)
        self.own = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
        self.runner = tuple(
            os.path.join(os.path.dirname(os.path.abspath(module.__file__)), "")
            for name in ("_pytest", "pluggy")
            if (module := sys.modules.get(name)) is not None and module.__file__
        )
        self._decided: dict[str, int] = {}

    def _decide(self, filename: str) -> int:
        if self.runner and filename.startswith(self.runner):
            return _STOP
        if not filename.endswith(".py") or not filename.startswith(self.prefixes):
            return _SKIP
        if filename.startswith(self.own) or self.project.in_environment(filename):
            return _SKIP
        return _KEEP

    def sites(self, frame: Any) -> tuple[Site, ...]:
        """The project frames from ``frame`` outwards, innermost first, at most MAX_SITES."""
        found: list[Site] = []
        decided = self._decided
        while frame is not None:
            code = frame.f_code
            verdict = decided.get(code.co_filename)
            if verdict is None:
                verdict = decided[code.co_filename] = self._decide(code.co_filename)
            if verdict == _KEEP:
                found.append((code.co_filename, frame.f_lineno, code.co_name))
                if len(found) >= MAX_SITES:
                    break
            elif verdict == _STOP:
                break
            frame = frame.f_back
        return tuple(found)


def _kernel_classes() -> list[type]:
    """The classes whose ``run`` launches a kernel, compiled and interpreted."""
    from triton.runtime.jit import JITFunction

    classes: list[type] = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # a triton build without the interpreter
        return classes
    classes.append(InterpretedFunction)
    return classes
