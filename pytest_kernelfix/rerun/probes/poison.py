"""The sensitivity rerun's two instruments: a poisoner and an observer.

A heal must make the tests pass *because of* what the kernel computed. The experiment:
rerun the failing tests with every project kernel's output replaced right after each
launch; they must now fail. :class:`Poisoner` is the launch hook
(:data:`pytest_kernelfix.capture.launches.LaunchHook`): before a launch of a kernel defined in
the project (not in a test file, not in an installed package) it copies the bytes of
every tensor argument's storage; after the launch it compares them bit for bit (NaN-safe)
and overwrites each storage the launch changed, whole:

- ``nan``: NaN for floating and complex storages, the type's extreme value for
  integers (its minimum, or maximum when unsigned), booleans flipped;
- ``scramble``: the written values permuted, scaled and shifted into other finite
  values (integers shifted, booleans flipped), so that code cannot recognise poison by
  its look: the NaN run catches post-processing that repairs bad values, the scramble
  run catches code that only propagates them (``ref + 0 * out``).

:class:`Observer` (a torch function mode, only in poisoned runs) counts the value checks
the *test's own code* makes on non-empty tensors (comparisons, ``item``, ``tolist``,
``numpy``...): a test that passes with poisoned output and checks no value does not
check the kernel at all. In the NaN run it also measures how much poison the checked
tensors carry, so a result only partly taken from the kernel shows.

PYTEST_DONT_REWRITE: imported by the rerun agent before pytest collects.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from pytest_kernelfix.capture.launches import python_function
from pytest_kernelfix.rerun.probes.checks import site_line
from pytest_kernelfix.rerun.probes.integrity import CodeSites, project_subclass

#: Names of the torch functions and Tensor methods through which a test reads values.
VALUE_READS = frozenset({
    "eq", "ne", "lt", "le", "gt", "ge", "__eq__", "__ne__", "__lt__", "__le__", "__gt__",
    "__ge__", "isclose", "allclose", "equal", "item", "tolist", "numpy", "__array__",
    "__bool__", "__float__", "__int__", "__index__", "__complex__", "isnan", "isinf",
    "isfinite", "isposinf", "isneginf",
})
#: Reads that cannot tell scrambled values from right ones: NaN and infinity predicates,
#: and a boolean (a predicate's result) read back into Python.
BLIND_READS = frozenset({"isnan", "isinf", "isfinite", "isposinf", "isneginf"})
_READ_BACK = frozenset({"__bool__", "item", "tolist", "__int__", "__float__", "__index__"})
#: Launches fingerprinted per test, at most (a loop of launches is summarised by its first).
MAX_FINGERPRINTS = 64
#: How much poison the checked tensors carried, least to most telling: one tensor that
#: holds poison only in part (a result partly put in place after the launch) outweighs
#: any number that hold it throughout.
TAINT_ORDER = ("", "clean", "full", "partial")
#: One letter per taint, for the taint of each run of a check site (``-``: no read).
TAINT_LETTERS = {"": "-", "clean": "C", "full": "F", "partial": "P"}


@contextlib.contextmanager
def _untouchable() -> Iterator[None]:
    """No torch function mode, subclass, dispatch mode or autograd sees our own work."""
    import torch

    with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch(), torch.no_grad():
        yield


def _tensors(values: Any, depth: int = 0) -> Iterator[Any]:
    """Tensors among launch arguments: plain, wrapped (``triton.reinterpret``, tensor
    descriptors: their ``base``), or one level inside tuples and lists."""
    import torch

    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(getattr(value, "base", None), torch.Tensor):
            yield value.base
        elif isinstance(value, (tuple, list)) and depth == 0:
            yield from _tensors(value, depth + 1)


def storage_view(tensor: Any, dtype: Any = None) -> Any:
    """A flat tensor over the whole storage behind ``tensor`` (bytes, or ``dtype``)."""
    import torch

    storage = tensor.untyped_storage()
    dtype = dtype or torch.uint8
    size = storage.nbytes() // torch.empty((), dtype=dtype).element_size()
    return torch.empty(0, dtype=dtype, device=storage.device).set_(storage, 0, (size,), (1,))


def sentinel(dtype: Any) -> Any:
    """The value integer poison uses: the type's minimum, or maximum when unsigned."""
    import torch

    info = torch.iinfo(dtype)
    return info.min if info.min < 0 else info.max


def poison_nan(view: Any) -> None:
    import torch

    if view.dtype == torch.bool:
        view.logical_not_()
    elif view.is_complex():
        view.fill_(complex(float("nan"), float("nan")))
    elif view.is_floating_point():
        view.fill_(float("nan"))
    else:
        view.fill_(sentinel(view.dtype))


def poison_scramble(view: Any, generator: Any) -> None:
    """Other finite values of the same kind: permuted, scaled by 1.5-2.5, shifted by more
    than the largest magnitude (integers: permuted and shifted by 1-7)."""
    import torch

    count = view.numel()
    if count == 0:
        return
    if view.dtype == torch.bool:
        view.logical_not_()
        return
    order = torch.randperm(count, generator=generator).to(view.device)
    draws = torch.rand(3, generator=generator, dtype=torch.float64).tolist()
    if view.is_floating_point() or view.is_complex():
        wide = view.to(torch.complex128 if view.is_complex() else torch.float64)
        finite = wide[torch.isfinite(wide)]
        span = float(finite.abs().max()) + 1.0 if finite.numel() else 1.0
        shift = span * (0.5 + 0.5 * draws[1]) * (1.0 if draws[2] < 0.5 else -1.0)
        view.copy_(wide[order] * (1.5 + draws[0]) + shift)
    else:
        view.copy_(view.to(torch.int64)[order] + 1 + int(draws[0] * 7))


def _digest(views: list[Any], scalars: list[Any]) -> str:
    """A short hash of storages' bytes (in order) and of scalar arguments."""
    import hashlib

    digest = hashlib.blake2b(digest_size=12)
    for view in views:
        digest.update(view.detach().cpu().contiguous().numpy().tobytes())
        digest.update(b"\0")
    digest.update(repr(scalars).encode())
    return digest.hexdigest()


class Poisoner:
    """The launch hook of a probing rerun; counts per test (see :meth:`reset`).

    ``mode`` poisons what each project kernel wrote ("" poisons nothing); ``kernels``
    limits it to these kernels (``relpath::name`` keys, :meth:`key`; empty: every project
    kernel). With ``fingerprint`` each project launch is also recorded as (kernel, hash of
    what it read, hash of what it wrote), taken before any poison: two runs whose
    launches read the same bytes and wrote the same bytes ran the same kernel computation.
    """

    def __init__(self, mode: str, sites: CodeSites, seed: int = 0, *,
                 kernels: frozenset[str] = frozenset(), fingerprint: bool = False) -> None:
        self.mode = mode
        self.sites = sites
        self.kernels = kernels
        self.fingerprint = fingerprint
        self.active = False
        self.launches = 0
        self.poisoned = 0
        self.fingerprints: list[tuple[str, str, str]] = []
        self.errors: list[str] = []
        self._seed = seed
        self._keys: dict[int, str] = {}

    def reset(self) -> None:
        self.launches = 0
        self.poisoned = 0
        self.fingerprints = []

    def key(self, kernel: Any) -> str:
        """``relpath::name`` of a kernel defined in the project, else ""."""
        known = self._keys.get(id(kernel))
        if known is None:
            fn = python_function(kernel)
            kind, relative = ("", "") if fn is None else self.sites.site(
                fn.__code__.co_filename)
            known = f"{relative}::{fn.__name__}" if kind == "project" and fn else ""
            self._keys[id(kernel)] = known
        return known

    def is_project_kernel(self, kernel: Any) -> bool:
        return bool(self.key(kernel))

    def __call__(self, kernel: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
                 ) -> Callable[[], None] | None:
        if not self.active:
            return None
        key = self.key(kernel)
        if not key:
            return None
        self.launches += 1
        poison = bool(self.mode) and (not self.kernels or key in self.kernels)
        if not (poison or self.fingerprint):
            return None
        values = (*args, *kwargs.values())
        try:
            with _untouchable():
                before = self._snapshot(values)
        except Exception as error:  # never break the launch itself
            self.errors.append(f"snapshot failed: {type(error).__name__}: {error}")
            return None
        scalars = [v for v in values if isinstance(v, (bool, int, float, str))]
        return lambda: self._after(key, before, scalars, poison)

    def _snapshot(self, values: tuple[Any, ...]) -> list[tuple[Any, Any, Any]]:
        taken: dict[tuple[str, int], tuple[Any, Any, Any]] = {}
        for tensor in _tensors(values):
            storage = tensor.untyped_storage()
            key = (str(storage.device), storage.data_ptr())
            if key in taken or storage.nbytes() == 0:
                continue
            raw = storage_view(tensor)
            taken[key] = (tensor, raw, raw.clone())
        return list(taken.values())

    def _after(self, key: str, before: list[tuple[Any, Any, Any]], scalars: list[Any],
               poison: bool) -> None:
        import torch

        try:
            with _untouchable():
                written = [(tensor, raw) for tensor, raw, copy in before
                           if not torch.equal(raw, copy)]
                if self.fingerprint and len(self.fingerprints) < MAX_FINGERPRINTS:
                    read = [copy for _, raw, copy in before if torch.equal(raw, copy)]
                    self.fingerprints.append((key, _digest(read, scalars),
                                              _digest([raw for _, raw in written], [])))
                if not poison:
                    return
                for tensor, _ in written:
                    view = storage_view(tensor, tensor.dtype)
                    if self.mode == "nan":
                        poison_nan(view)
                    else:
                        self._seed += 1
                        poison_scramble(view, torch.Generator().manual_seed(self._seed))
                    self.poisoned += 1
        except Exception as error:
            self.errors.append(f"poisoning failed: {type(error).__name__}: {error}")


def _taint(tensor: Any) -> str:
    """How much NaN / integer poison one checked tensor carries."""
    import torch

    if tensor.dtype == torch.bool:
        return ""  # a flipped boolean looks like any other
    if tensor.is_floating_point() or tensor.is_complex():
        bad = int(torch.isnan(tensor).sum())
    else:
        bad = int((tensor == sentinel(tensor.dtype)).sum())
    if bad == 0:
        return "clean"
    return "full" if bad == tensor.numel() else "partial"


def make_observer(sites: CodeSites, *, taint: bool,
                  runs: Callable[[int], int] | None = None) -> Any:
    """A torch function mode that watches the test's value checks (see the module doc).
    ``runs`` says which run of the check at a line is running (reach mode): each run's
    reads are then tainted apart, so a loop of checks over several kernels' outputs says
    which of its runs read which poison."""
    import torch
    from torch.overrides import TorchFunctionMode

    class Observer(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.reset()

        def reset(self, test_file: str = "") -> None:
            self.checks = 0
            self.blind = 0  # of which NaN and infinity checks (see BLIND_READS)
            self.taint = ""
            self.foreign: set[str] = set()
            self.test_file = test_file
            #: site line -> [value reads, worst taint, {run: worst taint}] (see :mod:`.checks`)
            self.sites: dict[int, list[Any]] = {}

        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if name in VALUE_READS:
                with contextlib.suppress(Exception):  # watching must never break the test
                    self._observe((*args, *kwargs.values()), sys._getframe(1), name)
            return func(*args, **kwargs)

        def _observe(self, values: tuple[Any, ...], frame: Any, name: str = "") -> None:
            tensors = list(_tensors(values))
            for tensor in tensors:
                if type(tensor) is not torch.Tensor:
                    finding = project_subclass(tensor, sites)
                    if finding:
                        self.foreign.add(finding)
            if sites.caller(frame)[0] != "test":
                return
            with _untouchable():
                present = [t for t in tensors if t.numel() > 0]
                if not present:
                    return
                self.checks += 1
                self.blind += name in BLIND_READS or (
                    name in _READ_BACK and all(t.dtype == torch.bool for t in present))
                line = site_line(frame, self.test_file)
                site = self.sites.setdefault(line, [0, "", {}])
                site[0] += 1
                if taint:
                    worst = max((_taint(t) for t in present), key=TAINT_ORDER.index)
                    self.taint = max(self.taint, worst, key=TAINT_ORDER.index)
                    site[1] = max(site[1], worst, key=TAINT_ORDER.index)
                    run = runs(line) if runs is not None else 0
                    site[2][run] = max(site[2].get(run, ""), worst, key=TAINT_ORDER.index)

    return Observer()


def remove_mode(mode: Any) -> None:
    """Pop ``mode`` from torch's function-mode stack even when others were pushed after it."""
    from pytest_kernelfix.shim.cuda import _remove_mode

    _remove_mode(mode)
