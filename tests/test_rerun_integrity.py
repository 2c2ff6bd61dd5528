"""The rerun child's instruments, in this process: integrity snapshot, poisoner, observer.

Project code is a module written under a temporary root (so :class:`CodeSites` calls it
"project"); every change made to torch here is undone by ``monkeypatch`` or a scoped
library before the test ends.
"""

from __future__ import annotations

import ast
import builtins
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from pytest_kernelfix.rerun.probes.checks import RECORDER, CheckLog, wrap_checks  # noqa: E402
from pytest_kernelfix.rerun.probes.integrity import (  # noqa: E402
    MISSING,
    CodeSites,
    ImportBindings,
    IntegrityCheck,
    LibraryWatch,
    Snapshot,
    dispatcher_findings,
)
from pytest_kernelfix.rerun.probes.poison import (  # noqa: E402
    Poisoner,
    make_observer,
    poison_nan,
    poison_scramble,
    remove_mode,
    storage_view,
)


def load(root: Path, relative: str, source: str) -> ModuleType:
    """Write ``source`` under ``root`` and import it (a project or a test module)."""
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    name = "kfx_" + relative.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def sites(tmp_path: Path) -> CodeSites:
    return CodeSites(str(tmp_path))


def test_code_sites_tell_project_from_test_code(tmp_path: Path, sites: CodeSites) -> None:
    assert sites.site(str(tmp_path / "kernels" / "k.py")) == ("project", "kernels/k.py")
    assert sites.kind(str(tmp_path / "tests" / "helpers.py")) == "test"
    assert sites.kind(str(tmp_path / "conftest.py")) == "test"
    assert sites.kind(str(tmp_path / "test_k.py")) == "test"
    assert sites.kind(str(tmp_path / ".venv" / "lib" / "site-packages" / "x.py")) == ""
    assert sites.kind(torch.__file__) == "" and sites.kind("<string>") == ""


# -- the snapshot of watched namespaces -------------------------------------------------------


CHEATS = {
    "through an alias": "import torch\n_t = torch.testing\n\ndef cheat():\n"
                        "    _t.assert_close = lambda *a, **k: None\n",
    "through a getattr chain": "import torch\n\ndef cheat():\n"
                               "    getattr(getattr(torch, 'testing'), '__dict__')"
                               "['assert_close'] = lambda *a, **k: None\n",
    "a Tensor dunder through type()": "import torch\n\ndef cheat():\n"
                                      "    type(torch.ones(1)).__eq__ = lambda a, b: True\n",
    "a decorator's side effect": "import torch\n\ndef _install(fn):\n"
                                 "    m = torch\n    m.allclose = fn\n    return fn\n\n"
                                 "def cheat():\n    @_install\n"
                                 "    def allclose(*a, **k):\n        return True\n",
    "numpy.testing": "import numpy.testing as npt\n\ndef cheat():\n"
                     "    npt.assert_allclose = lambda *a, **k: None\n",
    "math.isclose": "import math\n\ndef cheat():\n    math.isclose = lambda *a, **k: True\n",
    "an nn module's forward": "import torch\n\ndef cheat():\n"
                              "    torch.nn.Softmax.forward = lambda self, x: x\n",
}
EXPECTED = {
    "through an alias":
        "torch.testing.assert_close is replaced (now cheat.<locals>.<lambda> from",
    "through a getattr chain": "torch.testing.assert_close is replaced",
    "a Tensor dunder through type()":
        "torch.Tensor.__eq__ is replaced (now cheat.<locals>.<lambda> from",
    "a decorator's side effect": "torch.allclose is replaced (now cheat.<locals>.allclose from",
    "numpy.testing": "numpy.testing.assert_allclose is replaced",
    "math.isclose": "math.isclose is replaced",
    "an nn module's forward": "torch.nn.Softmax.forward is replaced",
}


def restore(snapshot: Snapshot) -> None:
    """Put every watched object back as the snapshot saw it (absent ones: absent)."""
    for _, owner, attr, original in snapshot.entries:
        if vars(owner).get(attr, MISSING) is original:
            continue
        if original is MISSING:
            delattr(owner, attr)  # inherited before: drop the shadowing entry
        else:
            setattr(owner, attr, original)


@pytest.mark.parametrize("case", sorted(CHEATS))
def test_a_patched_helper_is_found_however_it_was_reached(
    case: str, tmp_path: Path, sites: CodeSites
) -> None:
    snapshot = Snapshot.take()
    assert list(snapshot.changed(sites)) == []
    module = load(tmp_path, "kernels/cheat.py", CHEATS[case])
    try:
        module.cheat()
        found = list(snapshot.changed(sites))
    finally:
        restore(snapshot)
    assert list(snapshot.changed(sites)) == []
    assert any(EXPECTED[case] in item for item in found), found
    assert any("kernels/cheat.py" in item for item in found), found


def test_a_replaced_module_in_sys_modules_is_found(sites: CodeSites,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = Snapshot.take()
    monkeypatch.setitem(sys.modules, "torch.testing", ModuleType("torch.testing"))
    assert "sys.modules['torch.testing'] is replaced" in list(snapshot.changed(sites))


def test_names_a_test_module_imported_must_stay_what_they_were(
    tmp_path: Path, sites: CodeSites
) -> None:
    test_module = load(tmp_path, "tests/test_names.py",
                       "import torch\nfrom torch.testing import assert_close\n"
                       "import numpy as np\n\ndef test_x():\n    pass\n")
    bindings = ImportBindings(Snapshot.take(), sites)
    assert list(bindings.findings()) == []
    # what import-time stack tricks could do to a test module's names
    setattr(test_module, "assert_close", lambda *a, **k: None)  # noqa: B010
    setattr(test_module, "np", ModuleType("numpy"))  # noqa: B010
    found = list(bindings.findings())
    assert any("tests/test_names.py: the name 'assert_close' is no longer "
               "torch.testing.assert_close" in item for item in found), found
    assert any("the name 'np' is no longer numpy" in item for item in found), found


# -- torch modes, Tensor subclasses, torch.library -------------------------------------------


@pytest.mark.filterwarnings("ignore:Warning only once")
def test_modes_subclasses_and_library_overrides_are_found(tmp_path: Path) -> None:
    check = IntegrityCheck.start(str(tmp_path))
    try:
        assert check.findings() == []
        cheats = load(tmp_path, "kernels/tricks.py", '''
import torch
from torch.overrides import TorchFunctionMode


class Always(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class Exact(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs)


def override():
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("isclose", lambda a, b, *r, **k: torch.ones(a.shape, dtype=torch.bool),
             "CompositeImplicitAutograd")
    return lib
''')
        mode = cheats.Always()
        mode.__enter__()
        try:
            found = check.findings()
        finally:
            remove_mode(mode)
        assert "a torch function mode is active: Always from kernels/tricks.py" in found
        assert "a Tensor subclass is defined in kernels/tricks.py: Exact" in found
        lib = cheats.override()
        try:
            found = check.findings()
        finally:
            lib._destroy()
        assert ("torch.library: kernels/tricks.py registers into torch's 'aten' namespace "
                "(IMPL library)") in found
    finally:
        check.close()


@pytest.mark.filterwarnings("ignore:Warning only once")
def test_the_dispatcher_names_an_aten_kernel_a_project_file_registered(
    tmp_path: Path, sites: CodeSites
) -> None:
    watch = LibraryWatch(sites)  # not installed: only the dispatcher can tell
    module = load(tmp_path, "kernels/raw.py", '''
import torch


def override():
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("isclose", lambda a, b, *r, **k: torch.ones(a.shape, dtype=torch.bool),
             "CompositeImplicitAutograd")
    return lib
''')
    lib = module.override()
    try:
        found = list(dispatcher_findings(sites))
        assert "torch.library: kernels/raw.py registers a kernel for aten::isclose" in found
        assert list(watch.findings()) == []
    finally:
        lib._destroy()
    assert list(dispatcher_findings(sites)) == []


# -- poisoning ----------------------------------------------------------------------------------


def test_nan_poison_by_dtype() -> None:
    for dtype, check in [
        (torch.float32, lambda t: bool(t.isnan().all())),
        (torch.bfloat16, lambda t: bool(t.isnan().all())),
        (torch.complex64, lambda t: bool(t.isnan().all())),
        (torch.int32, lambda t: bool((t == torch.iinfo(torch.int32).min).all())),
        (torch.uint8, lambda t: bool((t == 255).all())),
    ]:
        tensor = torch.zeros(5, dtype=dtype)
        poison_nan(tensor)
        assert check(tensor), dtype
    flags = torch.tensor([True, False])
    poison_nan(flags)
    assert flags.tolist() == [False, True]


def test_scrambled_poison_changes_every_value_into_finite_ones() -> None:
    for dtype in (torch.float32, torch.float16, torch.int64):
        values = torch.arange(1, 65).to(dtype)
        scrambled = values.clone()
        poison_scramble(scrambled, torch.Generator().manual_seed(1))
        assert bool((scrambled != values).all()), dtype
        assert bool(torch.isfinite(scrambled.double()).all())
    constant = torch.zeros(16)  # a kernel that writes zeros still loses them
    poison_scramble(constant, torch.Generator().manual_seed(2))
    assert bool((constant != 0).all())


KERNEL_MODULE = "def scale_kernel(x, out):\n    pass\n"


def test_the_poisoner_poisons_what_a_project_launch_wrote(tmp_path: Path, sites: CodeSites) -> None:
    project = load(tmp_path, "kernels/scale.py", KERNEL_MODULE)
    foreign = load(tmp_path, "tests/test_scale.py", KERNEL_MODULE)
    poisoner = Poisoner("nan", sites)
    poisoner.active = True
    x, out = torch.arange(8.0), torch.zeros(8)
    base = torch.zeros(2, 8)
    after = poisoner(project.scale_kernel, (x, out, base[1], 8), {"BLOCK": 8})
    assert after is not None
    out.copy_(x * 2)  # the "launch" writes out and one row of base; x is read only
    base[1].fill_(1.0)
    after()
    assert poisoner.launches == 1 and poisoner.poisoned == 2
    assert bool(out.isnan().all()) and bool(base.isnan().all())  # the whole storage
    assert x.tolist() == list(range(8))
    assert poisoner(foreign.scale_kernel, (x, out), {}) is None  # a test file's kernel
    poisoner.active = False
    assert poisoner(project.scale_kernel, (x, out), {}) is None  # outside the call phase


def test_nan_bits_are_compared_bitwise(tmp_path: Path, sites: CodeSites) -> None:
    """A buffer already NaN that the launch leaves alone is not 'changed'."""
    project = load(tmp_path, "kernels/same.py", KERNEL_MODULE)
    poisoner = Poisoner("scramble", sites)
    poisoner.active = True
    out = torch.full((4,), float("nan"))
    after = poisoner(project.scale_kernel, (out,), {})
    assert after is not None
    after()
    assert poisoner.poisoned == 0
    view = storage_view(out, torch.int32)
    assert view.numel() == 4


# -- the observer --------------------------------------------------------------------------------


def test_the_observer_counts_the_tests_checks_and_their_poison(tmp_path: Path,
                                                              sites: CodeSites) -> None:
    test_code = load(tmp_path, "tests/test_obs.py", '''
import torch


def check(actual, expected):
    torch.testing.assert_close(actual, expected)


def empty():
    return torch.equal(torch.empty(0), torch.empty(0))
''')
    wrapper = load(tmp_path, "kernels/wrapper.py", '''
def sizes(x):
    return int(x.sum().item())
''')
    observer = make_observer(sites, taint=True)
    observer.__enter__()
    try:
        wrapper.sizes(torch.ones(3))  # the project's own reads do not count
        test_code.empty()  # nor do reads of empty tensors
        assert observer.checks == 0 and observer.taint == ""
        poisoned = torch.full((4,), float("nan"))
        poisoned[0] = 1.0
        with pytest.raises(AssertionError):
            test_code.check(poisoned, torch.ones(4))
    finally:
        remove_mode(observer)
    assert observer.checks >= 1
    assert observer.taint == "partial"
    assert observer.blind < observer.checks  # assert_close compares values too


def test_nan_and_infinity_checks_are_blind_to_scrambled_values(tmp_path: Path,
                                                               sites: CodeSites) -> None:
    test_code = load(tmp_path, "tests/test_finite.py", '''
import torch


def finite(loss):
    assert loss.numel() == 1
    assert not torch.isnan(loss)
    assert not torch.isinf(loss).any()


def close(loss):
    assert torch.allclose(loss, torch.ones(1))
''')
    observer = make_observer(sites, taint=False)
    observer.__enter__()
    try:
        test_code.finite(torch.ones(1))
        finite = (observer.checks, observer.blind)
        test_code.close(torch.ones(1))
    finally:
        remove_mode(observer)
    assert finite[0] > 0 and finite[0] == finite[1]  # the predicate and its truth, both blind
    assert observer.checks > observer.blind


def test_each_run_of_a_check_in_a_loop_has_its_own_taint(tmp_path: Path,
                                                         sites: CodeSites) -> None:
    """A loop over the outputs of two kernels checks both at one line: which run read the
    poison is kept run by run, beside the worst of the line."""
    source = (
        "import torch\n\n\n"
        "def test_outputs(outputs, expected):\n"
        "    for got in outputs:\n"
        "        torch.testing.assert_close(got, expected)\n")
    path = tmp_path / "tests" / "test_loop.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    tree = ast.parse(source)
    wrap_checks(tree)
    namespace: dict[str, Any] = {}
    exec(compile(tree, str(path), "exec"), namespace)
    log = CheckLog()
    log.start(str(path))
    setattr(builtins, RECORDER, log)
    observer = make_observer(sites, taint=True, runs=log.run_index)
    observer.reset(str(path))
    observer.__enter__()
    try:
        namespace["test_outputs"]((torch.ones(4), torch.full((4,), float("nan"))),
                                  torch.ones(4))
    finally:
        remove_mode(observer)
        delattr(builtins, RECORDER)
    assert log.sites[6].outcomes == "PF"
    reads, worst, runs = observer.sites[6]
    assert reads >= 2
    assert worst == "full" and runs == {0: "clean", 1: "full"}



def test_the_launch_hook_runs_around_each_launch_but_not_after_one_that_raised() -> None:
    from pytest_kernelfix.capture.launches import LaunchRecorder

    calls: list[str] = []

    def hook(kernel: object, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        calls.append(f"before {args[0]}")
        return lambda: calls.append(f"after {args[0]}")

    def launch(kernel: object, *args: object, **kwargs: object) -> str:
        calls.append(f"launch {args[0]}")
        if args[0] == "bad":
            raise RuntimeError("kernel failed")
        return "done"

    run = LaunchRecorder(on_launch=hook)._wrap(launch)
    assert run(object(), "ok") == "done"
    with pytest.raises(RuntimeError):
        run(object(), "bad")
    run(object(), "warm", warmup=True)  # a compile-only warmup is no launch
    assert calls == ["before ok", "launch ok", "after ok", "before bad", "launch bad",
                     "launch warm"]
