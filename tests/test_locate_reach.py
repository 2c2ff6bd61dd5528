"""Static reach: from launched kernels, launch sites and frames to the code behind them.

The project below splits a gated activation the way real Triton libraries do: a jit
helper module, a kernel module importing it (relatively, under an alias, and through a
module attribute), a wrapper module in another package computing block sizes with a
utils helper, an ``__init__`` re-export, and a 1,000-line module for the bounds.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from pytest_kernelfix.capture.launches import KernelLaunch, LaunchRecorder
from pytest_kernelfix.locate.outline import parse_module
from pytest_kernelfix.locate.reach import (
    TIER_FIRST,
    TIER_HELPER,
    TIER_KERNEL,
    TIER_REST,
    Reach,
    Seeds,
    high_group,
    nodeid_qualname,
    seeds_of,
    split_need,
)
from pytest_kernelfix.project import Project

FILES = {
    "pkg/__init__.py": "",
    "pkg/kernels/__init__.py": "from .act import silu as exported_silu\n",
    "pkg/kernels/act.py": '''\
        import triton
        import triton.language as tl

        SCALE = 1.0


        @triton.jit
        def silu(x):
            return x * tl.sigmoid(x) * SCALE


        @triton.jit
        def identity(x):
            return x


        @triton.jit
        def never_called(x):
            return x
        ''',
    "pkg/kernels/gated.py": '''\
        import triton
        import triton.language as tl

        from .act import silu as act_silu
        from pkg.kernels import act

        CONFIGS = [triton.Config({"BLOCK": 128}), triton.Config({"BLOCK": 256})]


        @triton.autotune(configs=CONFIGS, key=["n"])
        @triton.jit
        def gated_kernel(a_ptr, b_ptr, c_ptr, n, BLOCK: tl.constexpr):
            pid = tl.program_id(0)
            offs = pid * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            a = tl.load(a_ptr + offs, mask=mask)
            b = tl.load(b_ptr + offs, mask=mask)
            tl.store(c_ptr + offs, act_silu(a) * act.identity(b), mask=mask)
        ''',
    "pkg/utils.py": '''\
        import triton


        def block_size(n):
            return min(triton.next_power_of_2(n), 1024)


        def log_call(name):
            return name
        ''',
    "pkg/ops/__init__.py": "",
    "pkg/ops/gated.py": '''\
        import torch
        import triton

        import pkg.utils as U
        from pkg.kernels.gated import gated_kernel


        def gated(a, b):
            c = torch.empty_like(a)
            n = a.numel()
            block = U.block_size(n)
            U.log_call("gated")
            grid = lambda meta: (triton.cdiv(n, block),)
            gated_kernel[grid](a, b, c, n)
            return c


        class Gated:
            @staticmethod
            def apply(a, b):
                return gated(a, b)
        ''',
    "pkg/user.py": '''\
        from pkg.kernels import exported_silu


        def uses_reexport():
            return exported_silu
        ''',
    "tests/test_gated.py": '''\
        import torch

        from pkg.ops.gated import Gated, gated


        def test_gated():
            a = torch.randn(100)
            torch.testing.assert_close(gated(a, a), a)


        def test_gated_class():
            a = torch.randn(100)
            torch.testing.assert_close(Gated.apply(a, a), a)
        ''',
}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name, text in FILES.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def line_of(root: Path, rel: str, text: str) -> int:
    lines = (root / rel).read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if text in line)


def names(found: object) -> list[str]:
    return [f"{item.path}:{item.qualname}" for item in found]  # type: ignore[attr-defined]


def test_outline_reads_definitions_launches_and_what_feeds_them(root: Path) -> None:
    index = parse_module((root / "pkg/ops/gated.py").read_text())
    gated = index.find("gated")
    assert gated is not None and gated.kind == "function" and not gated.jit
    assert gated.launches == ("gated_kernel",)
    assert "U.block_size" in gated.feeds and "triton.cdiv" in gated.feeds
    assert "U.log_call" not in gated.feeds and "U.log_call" in gated.calls
    method = index.find("Gated.apply")
    assert method is not None and method.kind == "method"
    assert index.at(method.line + 1) == method  # the method, not its class
    kernel = parse_module((root / "pkg/kernels/gated.py").read_text()).find("gated_kernel")
    assert kernel is not None and kernel.jit
    assert kernel.start < kernel.line  # decorators are part of the span
    assert kernel.header.startswith("@triton.jit def gated_kernel(a_ptr, b_ptr")
    configs = parse_module((root / "pkg/kernels/gated.py").read_text()).find("CONFIGS")
    assert configs is not None and configs.configs
    assert parse_module("def broken(:\n").error.startswith("SyntaxError")


def test_the_import_header_ends_before_the_first_definition() -> None:
    """A test module that imports again between its tests (``import random`` two hundred
    lines down): that import still resolves, but the header a view shows is the top's."""
    text = ("import torch\nimport pytest\n\n\ndef test_a():\n    pass\n\n\n"
            "import random\n\n\ndef test_b():\n    random.random()\n")
    index = parse_module(text)
    assert index.import_span == (1, 2)
    assert "random" in index.import_map


def test_names_resolve_through_every_import_form(root: Path) -> None:
    reach = Reach(Project(root))
    gated = str(root / "pkg/kernels/gated.py")
    resolved = reach.resolve(gated, "act_silu")  # from .act import silu as act_silu
    assert resolved is not None and resolved[0] == str(root / "pkg/kernels/act.py")
    assert resolved[1].qualname == "silu"
    assert reach.resolve(gated, "act.identity")[1].qualname == "identity"  # type: ignore[index]
    ops = str(root / "pkg/ops/gated.py")
    assert reach.resolve(ops, "U.block_size")[0] == str(root / "pkg/utils.py")  # type: ignore[index]
    assert reach.resolve(ops, "gated_kernel")[1].jit  # type: ignore[index]
    assert reach.resolve(ops, "Gated.apply")[1].qualname == "Gated.apply"  # type: ignore[index]
    assert reach.resolve(ops, "torch.empty_like") is None  # installed: not the project's
    user = str(root / "pkg/user.py")  # through the package __init__'s re-export
    assert reach.resolve(user, "exported_silu")[1].qualname == "silu"  # type: ignore[index]


def test_reach_finds_helpers_wrapper_and_python_helpers_in_other_modules(root: Path) -> None:
    kernel = root / "pkg/kernels/gated.py"
    wrapper = root / "pkg/ops/gated.py"
    seeds = Seeds(
        kernels=((str(kernel), line_of(root, "pkg/kernels/gated.py", "def gated_kernel")),),
        sites=(((str(wrapper), line_of(root, "pkg/ops/gated.py", "gated_kernel[grid]"),
                 "gated"),
                (str(root / "tests/test_gated.py"), 8, "test_gated")),),
    )
    found = Reach(Project(root)).locate(seeds)
    order = names(found)
    # the function that launched the kernel first, then the kernel, then its helpers
    assert order[:2] == ["pkg/ops/gated.py:gated", "pkg/kernels/gated.py:gated_kernel"]
    tiers = {f"{i.path}:{i.qualname}": i.tier for i in found}
    assert tiers["pkg/ops/gated.py:gated"] == TIER_FIRST
    assert tiers["pkg/kernels/gated.py:gated_kernel"] == TIER_KERNEL
    assert tiers["pkg/kernels/act.py:silu"] == tiers["pkg/kernels/act.py:identity"] == TIER_HELPER
    assert tiers["pkg/utils.py:log_call"] == TIER_REST
    for expected in ("pkg/kernels/act.py:silu", "pkg/kernels/act.py:identity",
                     "pkg/kernels/act.py:SCALE", "pkg/kernels/gated.py:CONFIGS",
                     "pkg/ops/gated.py:gated", "pkg/utils.py:block_size"):
        assert expected in order
    assert "pkg/kernels/act.py:never_called" not in order
    assert not any(name.startswith("tests/") for name in order)  # never tests
    score = {f"{i.path}:{i.qualname}": i.score for i in found}
    # what computes the launch's arguments ranks above a call whose result is unused
    assert score["pkg/utils.py:block_size"] > score["pkg/utils.py:log_call"]


def test_without_records_the_search_widens_to_what_the_test_calls(root: Path) -> None:
    reach = Reach(Project(root))
    test = str(root / "tests/test_gated.py")
    direct = names(reach.locate(Seeds(test_path=test, test_name="test_gated")))
    assert direct[0] == "pkg/ops/gated.py:gated"
    assert "pkg/kernels/gated.py:gated_kernel" in direct and "pkg/kernels/act.py:silu" in direct
    through_class = names(reach.locate(Seeds(test_path=test, test_name="test_gated_class")))
    assert "pkg/kernels/gated.py:gated_kernel" in through_class
    # level 3: nothing recorded, nothing the test calls resolves: the test's words
    by_words = names(reach.locate(Seeds(test_name="test_gated_missing")))
    assert by_words == ["pkg/kernels/gated.py:gated_kernel"]


def test_search_finds_definitions_and_text_ranked_and_cut(root: Path) -> None:
    reach = Reach(Project(root))
    assert names(reach.search_definition("silu")) == ["pkg/kernels/act.py:silu"]
    assert names(reach.search_text("tl.sigmoid")) == ["pkg/kernels/act.py:silu"]
    assert reach.search_text("no such text anywhere") == ()
    assert all(not p.startswith(str(root / "tests")) for p in reach.files())


def test_high_group_keeps_the_group_above_the_largest_gap() -> None:
    assert high_group([10, 9.5, 9, 2, 1.5, 1]) == 3
    assert high_group([5, 1]) == 2
    assert high_group([3, 3, 3]) == 3
    assert high_group([100, 99, 98, 97, 96, 95, 94, 10]) == 7


def test_need_items_and_nodeids_split() -> None:
    assert split_need("search: BLOCK_SIZE_N") == ("search", "", "BLOCK_SIZE_N")
    assert split_need("ops/activations.py:silu") == ("symbol", "ops/activations.py", "silu")
    assert split_need("ops/a.py::Cls.method") == ("symbol", "ops/a.py", "Cls.method")
    assert split_need("ops/a.py") == ("file", "ops/a.py", "")
    assert split_need("silu") == ("symbol", "", "silu")
    assert nodeid_qualname("tests/t.py::TestX::test_y[a-1]") == "TestX.test_y"


def test_a_thousand_line_module_is_indexed_fast_and_once(tmp_path: Path) -> None:
    body = "\n".join(
        f"@triton.jit\ndef k{i}(x_ptr, BLOCK: tl.constexpr):\n"
        f"    x = tl.load(x_ptr + tl.arange(0, BLOCK))\n    tl.store(x_ptr, k{i - 1}(x))\n"
        for i in range(1, 200)
    )
    (tmp_path / "big.py").write_text("import triton\nimport triton.language as tl\n\n" + body)
    reach = Reach(Project(tmp_path))
    started = time.perf_counter()
    found = reach.locate(seeds_of([], [(str(tmp_path / "big.py"),
                                         line_of(tmp_path, "big.py", "def k199("), ())]))
    assert time.perf_counter() - started < 5  # a loose bound: the benchmark measures it
    assert len(found) <= 40 and found[0].qualname == "k199"
    assert [item.qualname for item in found[:3]] == ["k199", "k198", "k197"]
    assert reach.module(str(tmp_path / "big.py")) is reach.module(str(tmp_path / "big.py"))


def test_launches_record_their_project_sites(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    monkeypatch.syspath_prepend(str(root))
    (root / "pkg/small.py").write_text(textwrap.dedent('''\
        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def copy_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(y_ptr + offs, tl.load(x_ptr + offs))


        def copy(x):
            y = torch.empty_like(x)
            copy_kernel[(1,)](x, y, BLOCK=16)
            return y


        def outer(x):
            return copy(x)
        '''))
    import importlib

    module = importlib.import_module("pkg.small")
    seen: list[KernelLaunch] = []
    recorder = LaunchRecorder(root, on_new=seen.append)
    with recorder.recording():
        import torch

        module.outer(torch.arange(16, dtype=torch.float32))
        module.outer(torch.arange(16, dtype=torch.float32))
    (launch,) = recorder.launches()
    assert recorder.count == 2 and len(seen) == 1  # told once, when first seen
    small = str(root / "pkg/small.py")
    assert [(f, name) for f, _, name in launch.sites] == [(small, "copy"), (small, "outer")]
    assert launch.sites[0][1] == line_of(root, "pkg/small.py", "copy_kernel[(1,)]")
    again = KernelLaunch.from_json(launch.to_json())
    assert again == launch and again.sites == launch.sites
    without = LaunchRecorder()
    with without.recording():
        module.copy(torch.arange(16, dtype=torch.float32))
    assert without.launches()[0].sites == ()


def test_a_request_for_code_is_resolved_inside_the_project_within_a_budget(root: Path) -> None:
    from pytest_kernelfix.locate.need import NeedResolver

    project = Project(root)
    gated = (root / "pkg/kernels/gated.py").read_text()
    resolve = NeedResolver(project)
    answer = resolve(["pkg/kernels/act.py:silu", "search: next_power_of_2",
                      "tests/test_gated.py:test_gated", "pkg/nope.py:x", "/etc/passwd",
                      "pkg/kernels/act.py:nothing_here", "no_such_name"],
                     {"pkg/kernels/gated.py": gated}, {})
    assert set(answer.files) == {"pkg/kernels/act.py", "pkg/utils.py"}  # editable, whole
    assert answer.files["pkg/kernels/act.py"] == (root / "pkg/kernels/act.py").read_text()
    (test_view,) = answer.context  # a test: read-only, focused on what was asked
    assert test_view.path == "tests/test_gated.py" and test_view.shown == ("test_gated",)
    assert any("pkg/utils.py" in line for line in answer.found)
    missing = " ".join(answer.missing)
    assert "pkg/nope.py" in missing and "/etc/passwd" in missing
    assert "defines no 'nothing_here'" in missing and "no_such_name" in missing
    tight = NeedResolver(project, budget=50)(["pkg/kernels/act.py:silu"], {}, {})
    assert tight.files == {} and "over the budget" in tight.missing[0]
