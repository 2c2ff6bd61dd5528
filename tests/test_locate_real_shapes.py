"""Reach, the prompt's budget and the failure's signals on the shapes real libraries have.

The library is :mod:`real_shapes` (written for these tests): an autotuned, heuristic
kernel calling a dispatcher of a 900-line activation module through a relative import
with positional arguments, ``if`` chains with and without ``elif`` that assign, an
autograd Function whose ``backward`` sizes a partial-gradient buffer and launches its
own kernels, and tests whose ids name the activation. Its launches are recorded for
real, on the interpreter, once for the module.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import real_shapes

from pytest_kernelfix.capture.errors import ErrorInfo, Frame
from pytest_kernelfix.capture.launches import KernelLaunch, LaunchRecorder
from pytest_kernelfix.capture.records import Failure
from pytest_kernelfix.fixers.base import ProposalRequest
from pytest_kernelfix.fixers.prompting import prompt_chars, render_messages
from pytest_kernelfix.locate.branches import constexpr_env
from pytest_kernelfix.locate.context import (
    PROMPT_BUDGET,
    Shape,
    SourceFile,
    build_context,
    fit,
    render_source,
)
from pytest_kernelfix.locate.grouping import failure_seeds, group_failures
from pytest_kernelfix.locate.reach import (
    TIER_FIRST,
    TIER_HELPER,
    TIER_KERNEL,
    TIER_REST,
    Located,
    Reach,
    Seeds,
)
from pytest_kernelfix.locate.signals import (
    check_frames,
    checks_gradients,
    expects_raise,
    involves_gradients,
)
from pytest_kernelfix.project import Project

#: The library's root, and what a forward and a backward launched.
Library = tuple[Path, dict[str, tuple[KernelLaunch, ...]]]
ACTS = "fusedlib/ops/act_kernels.py"
KERNELS = "fusedlib/ops/matmul_kernels.py"
LAYER = "fusedlib/ops/layer.py"
TEST = "tests/test_layer.py"


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Library]:
    """The library, and what a forward and a backward (on another thread, as the autograd
    engine runs it on a GPU) launch; the CPU shim lets the autotuner pick a config."""
    import torch

    from pytest_kernelfix import shim

    root = tmp_path_factory.mktemp("real")
    real_shapes.write(root)
    sys.path.insert(0, str(root))
    shim.install(cuda=False)
    try:
        layer = importlib.import_module("fusedlib.ops.layer")
        launches = {}
        recorder = LaunchRecorder(root)
        with recorder.recording():
            out = layer.matmul_act(torch.randn(20, 8, requires_grad=True),
                                   torch.randn(8, 24, requires_grad=True), "gelu",
                                   torch.randn(24, requires_grad=True))
            launches["forward"] = recorder.launches()
            recorder.reset()
            thread = threading.Thread(target=out.backward, args=(torch.randn_like(out),))
            thread.start()
            thread.join()
            launches["backward"] = recorder.launches()
        yield root, launches
    finally:
        shim.uninstall()
        sys.path.remove(str(root))
        for name in [name for name in sys.modules if name.startswith("fusedlib")]:
            del sys.modules[name]


def line_of(root: Path, rel: str, text: str) -> int:
    return next(n for n, line in enumerate((root / rel).read_text().splitlines(), 1)
                if text in line)


def by_name(located: tuple[Located, ...]) -> dict[str, Located]:
    return {f"{item.path}:{item.qualname}": item for item in located}


# -- what the launches record -------------------------------------------------------------


def test_an_autotuned_heuristic_kernel_records_its_config_and_positional_constexprs(
    library: Library,
) -> None:
    root, launches = library
    matmul = next(launch for launch in launches["forward"] if launch.name == "matmul_act_kernel")
    values = dict(matmul.constexprs)
    assert values["act"] == "gelu" and values["save_pre"] is True  # passed by position
    assert values["BLOCK_M"] == 16 and values["BLOCK_N"] == 16  # the chosen config's
    assert values["EVEN_N"] is False  # the heuristic's
    assert matmul.exact
    layer = str(root / LAYER)
    assert matmul.sites[0][::2] == (layer, "forward")  # MatmulAct.forward launched it
    assert (layer, "matmul_act") in [(f, name) for f, _, name in matmul.sites]


def test_launches_inside_backward_on_another_thread_keep_their_sites(
    library: Library,
) -> None:
    root, launches = library
    names = [launch.name for launch in launches["backward"]]
    assert names == ["act_grad_kernel", "column_sum_kernel"]
    layer = str(root / LAYER)
    grad, column = launches["backward"]
    assert grad.sites[0][::2] == (layer, "backward")
    assert [name for _, _, name in column.sites][:2] == ["bias_grad", "backward"]
    assert dict(grad.constexprs)["act"] == "gelu"


# -- reach ---------------------------------------------------------------------------------


def seeds_from(root: Path, launches: tuple[KernelLaunch, ...], **more: object) -> Seeds:
    return replace(Seeds(
        kernels=tuple((launch.file, launch.line) for launch in launches),
        sites=tuple(launch.sites for launch in launches),
        constexprs=tuple(constexpr_env(launch.constexprs, launch.exact) for launch in launches),
        backward_kernels=tuple((launch.file, launch.line) for launch in launches
                               if any(name == "backward" for _, _, name in launch.sites)),
    ), **more)  # type: ignore[arg-type]


def test_the_dispatcher_of_an_autotuned_kernel_leads_to_the_launched_helper_only(
    library: Library,
) -> None:
    root, launches = library
    found = by_name(Reach(Project(root)).locate(seeds_from(root, launches["forward"])))
    assert found[f"{KERNELS}:matmul_act_kernel"].tier == TIER_KERNEL
    assert found[f"{LAYER}:MatmulAct.forward"].tier == TIER_FIRST
    for helper in ("apply_act", "gelu"):  # relative import, positional, no elif, assigned
        assert found[f"{ACTS}:{helper}"].tier == TIER_HELPER
    siblings = {f"{ACTS}:{name}" for name, _, _ in real_shapes.ACTS if name != "gelu"}
    assert not siblings & set(found)
    assert "fusedlib/ops/utils.py:seed_scale" not in found  # the dropout branch never ran
    # with the values unknown, every branch is kept
    blind = replace(seeds_from(root, launches["forward"]), constexprs=())
    found = by_name(Reach(Project(root)).locate(blind))
    assert siblings <= set(found)
    assert "fusedlib/ops/utils.py:seed_scale" not in found  # the call passes False itself


def test_a_gradient_failure_shows_forward_and_backward_and_what_sizes_their_buffers(
    library: Library,
) -> None:
    root, launches = library
    both = launches["forward"] + launches["backward"]
    found = by_name(Reach(Project(root)).locate(seeds_from(root, both, gradients=True)))
    for first in ("MatmulAct.forward", "MatmulAct.backward", "bias_grad"):
        assert found[f"{LAYER}:{first}"].tier == TIER_FIRST
    assert found[f"{KERNELS}:act_grad_kernel"].tier == TIER_KERNEL
    assert found[f"{KERNELS}:column_sum_kernel"].tier == TIER_KERNEL
    assert found["fusedlib/ops/utils.py:program_count"].tier == TIER_HELPER  # sizes the buffer
    # the forward's check failed: its kernel ranks above the backward's; a gradient check,
    # the other way round
    assert found[f"{KERNELS}:matmul_act_kernel"].score > found[f"{KERNELS}:act_grad_kernel"].score
    found = by_name(Reach(Project(root)).locate(
        seeds_from(root, both, gradients=True, gradient_check=True)))
    assert found[f"{KERNELS}:matmul_act_kernel"].score < found[f"{KERNELS}:act_grad_kernel"].score
    # the forward alone launched, the test computes gradients and a gradient check failed
    # (or autograd raised): backward is shown first, and what it launches
    found = by_name(Reach(Project(root)).locate(
        seeds_from(root, launches["forward"], gradients=True, gradient_check=True)))
    assert found[f"{LAYER}:MatmulAct.backward"].tier == TIER_FIRST
    assert found[f"{KERNELS}:act_grad_kernel"].why.startswith("launched by MatmulAct.backward")
    # the forward check failed before backward ever ran: backward is pinned, a helper
    found = by_name(Reach(Project(root)).locate(
        seeds_from(root, launches["forward"], gradients=True)))
    assert found[f"{LAYER}:MatmulAct.backward"].tier == TIER_HELPER
    plain = by_name(Reach(Project(root)).locate(seeds_from(root, launches["forward"])))
    assert f"{LAYER}:MatmulAct.backward" not in plain


def test_the_frame_that_raised_and_a_test_expecting_an_error_come_first(
    library: Library,
) -> None:
    root, launches = library
    layer = str(root / LAYER)
    raised = line_of(root, LAYER, "    return total")
    seeds = seeds_from(root, launches["backward"], frames=((layer, raised),))
    found = by_name(Reach(Project(root)).locate(seeds))
    assert found[f"{LAYER}:bias_grad"].tier == TIER_FIRST
    assert found[f"{LAYER}:bias_grad"].why == "raised the error"
    # every project function on the way to the launch may be where the check is missing
    found = by_name(Reach(Project(root)).locate(seeds_from(root, launches["forward"])))
    assert found[f"{LAYER}:matmul_act"].tier == TIER_REST
    found = by_name(Reach(Project(root)).locate(
        seeds_from(root, launches["forward"], expects_raise=True)))
    assert found[f"{LAYER}:matmul_act"].tier == TIER_FIRST


def test_a_kernel_on_a_branch_the_run_did_not_take_ranks_below_its_wrapper(
    tmp_path: Path,
) -> None:
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "k.py").write_text(
        "import triton\n\n\n@triton.jit\ndef small_kernel(x):\n    pass\n\n\n"
        "@triton.jit\ndef large_kernel(x):\n    pass\n\n\n"
        "def run(x, n):\n    if n < 1024:\n        small_kernel[(1,)](x)\n"
        "    else:\n        large_kernel[(1,)](x)\n")
    path = str(tmp_path / "ops" / "k.py")
    seeds = Seeds(kernels=((path, 5),), sites=(((path, 15, "run"),),))
    found = by_name(Reach(Project(tmp_path)).locate(seeds))
    run, large = found["ops/k.py:run"], found["ops/k.py:large_kernel"]
    assert large.tier == TIER_REST and large.score < run.score
    assert "not in this test run" in large.why


# -- the prompt ----------------------------------------------------------------------------


def failure_of(root: Path, nodeid: str, launches: tuple[KernelLaunch, ...],
               frames: tuple[Frame, ...] = (), error: str = "AssertionError",
               message: str = "Tensor-likes are not close!") -> Failure:
    test = str(root / TEST)
    frames = frames or (Frame(test, line_of(root, TEST, "torch.testing.assert_close(out, ref"),
                              "_check_once", "torch.testing.assert_close(out, ref, rtol=1e-4, "
                              "atol=1e-4)"),)
    return Failure(nodeid, test, ErrorInfo(error, message, frames),
                   f"E   {error}: {message}\n" * 20, launches)


def test_the_first_prompt_shows_the_named_helper_behind_the_dispatcher_within_budget(
    library: Library,
) -> None:
    root, launches = library
    failure = failure_of(root, f"{TEST}::test_gradients[True-gelu]",
                         launches["forward"] + launches["backward"])
    (group,) = group_failures([failure], Project(root))
    context = build_context(group, Project(root), device="interpret")
    request = ProposalRequest(context, 1, context.editable)
    assert prompt_chars(request) <= PROMPT_BUDGET
    user = render_messages(request)[1]["content"]
    assert real_shapes.BUGS["gelu"][1] in user and real_shapes.BUGS["gelu-grad"][1] in user
    assert "def apply_act(x, drop_p, seed, param" in user
    assert "def backward(ctx, dout):" in user and "def forward(ctx, x, w, b, act, param):" in user
    acts = next(view for view in context.editable if view.path == ACTS)
    assert acts.shown and not acts.content.startswith("# --- lines 1-")  # no header alone


def test_docstrings_give_way_to_a_marker_and_edits_still_apply() -> None:
    text = real_shapes.ACT_KERNELS
    full = render_source(ACTS, text, ["gelu", "apply_act"])
    lean = render_source(ACTS, text, ["gelu", "apply_act"], shape=Shape(docs=False))
    assert len(lean.content) < len(full.content) - 1_000
    assert "Notes:" in full.content and "Notes:" not in lean.content
    assert real_shapes.BUGS["gelu"][1] in lean.content
    assert "(docstring, lines" in lean.content and "not shown) ---" in lean.content
    assert '"""Applies the activation named by' in lean.content  # a short one is kept


def test_what_gives_way_first_under_the_budget(
    library: Library,
) -> None:
    root, launches = library
    project = Project(root)
    failure = failure_of(root, f"{TEST}::test_gradients[True-gelu]",
                         launches["forward"] + launches["backward"])
    (group,) = group_failures([failure], project)
    texts = {rel: (root / rel).read_text() for rel in group.editable}
    tests_text = (root / TEST).read_text() + "".join(
        f"\n\ndef test_unrelated_{i}():\n    assert {i} == {i}\n" for i in range(60))
    whole = SourceFile(TEST, tests_text)
    least = render_source(TEST, tests_text, ["test_gradients", "_check_once"])
    first = {(i.path, i.qualname) for i in group.located if i.tier <= TIER_KERNEL}
    gone: dict[str, int] = {}
    for limit in range(40_000, 5_000, -500):  # tighter and tighter
        done = fit(group.located, texts, limit, [(whole, least)])
        views = done.views.values()
        focus = {(path, name) for path, names in done.focus.items() for name in names}
        focus |= {(i.path, i.qualname) for i in group.located if i.path in done.views
                  and not done.views[i.path].focused}
        state = {
            "docstrings": any("(docstring, lines" in view.content for view in views),
            "tests": done.tests[0] is least,
            "headers": any(line.endswith(": imports") for v in views for line in v.outline),
            "helpers": (ACTS, "gelu") not in focus,
            "cut": any("cut for length" in line for view in views for line in view.outline),
        }
        for what, happened in state.items():
            if happened:
                gone.setdefault(what, limit)
        if not first <= focus:  # they leave only once cut to their heads, tails, anchors
            assert "cut" in gone, (limit, first - focus)
            missing = first - focus
            kernels = {(i.path, i.qualname) for i in group.located if i.tier == TIER_KERNEL}
            assert not missing & kernels or (first - kernels) - focus  # the kernels last
    assert set(gone) == {"docstrings", "tests", "headers", "helpers", "cut"}
    order = sorted(gone, key=lambda what: -gone[what])
    assert order == ["docstrings", "tests", "headers", "helpers", "cut"], gone
    done = fit(group.located, texts, 9_000, [(whole, least)])
    shown = "\n".join(view.content for view in done.views.values())
    assert "def backward(ctx, dout):" in shown  # whole, even at the last
    assert "        return dpre @ w.t(), x.t() @ dpre, db, None, None" in shown
    assert "def _check_once" in done.tests[0].content


# -- the failure's signals, and the bug's name ---------------------------------------------


def test_a_failed_check_inside_a_helper_of_the_test_module_is_read_as_such(
    library: Library,
) -> None:
    root, launches = library
    project = Project(root)
    test = str(root / TEST)
    call = Frame(test, line_of(root, TEST, "    _check_once(act, bias)"), "test_gradients",
                 "_check_once(act, bias)")
    both = launches["forward"] + launches["backward"]
    forward = failure_of(root, f"{TEST}::test_gradients[True-gelu]", both, (call, Frame(
        test, line_of(root, TEST, "assert_close(out, ref"), "_check_once",
        "torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)"), Frame(
        "/venv/torch/testing/_comparison.py", 1530, "assert_close", "raise error")))
    gradient = replace(forward, error=replace(forward.error, frames=(call, Frame(
        test, line_of(root, TEST, "assert_close(x.grad"), "_check_once",
        "torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-4)"))))
    assert [f.name for f in check_frames(forward, project)] == ["_check_once"]
    assert involves_gradients(forward) and involves_gradients(gradient)
    assert not checks_gradients(forward, project) and checks_gradients(gradient, project)
    names = [g.kernel for g in group_failures([forward], project)]
    names += [g.kernel for g in group_failures([gradient], project)]
    assert names == ["matmul_act_kernel", "act_grad_kernel"]  # the kernel the check reads
    engine = replace(forward, error=ErrorInfo(
        "RuntimeError", "function MatmulActBackward returned an incorrect number of gradients "
        "(expected 5, got 4)", (call,)))
    assert checks_gradients(engine, project)
    assert group_failures([engine], project)[0].kernel == "act_grad_kernel"


def test_names_bound_to_gradients_and_a_check_in_a_utility_module(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    test = tmp_path / "tests" / "test_x.py"
    test.write_text("def test_x():\n    got, want = torch.autograd.grad(y, x), ref\n"
                    "    close(got[0], want[0])\n")
    utility = str(tmp_path / "tests" / "utils.py")
    failure = Failure("tests/test_x.py::test_x", str(test), ErrorInfo("AssertionError", "x", (
        Frame(str(test), 3, "test_x", "close(got[0], want[0])"),
        Frame(utility, 9, "close", "assert torch.allclose(a, b)"))), "log")
    frames = check_frames(failure, Project(tmp_path))
    assert [frame.name for frame in frames] == ["close", "test_x"]  # innermost first
    assert checks_gradients(failure, Project(tmp_path))


@pytest.mark.parametrize(("body", "expected"), [
    ("    with pytest.raises(ValueError):\n        run('bad')\n", True),
    ("    try:\n        run('bad')\n        assert False, 'Should have thrown'\n"
     "    except AssertionError as e:\n        assert 'bounds' in str(e)\n", True),
    ("    run('bad')\n    with pytest.raises(ValueError):\n        pass\n", False),
])
def test_a_test_that_expects_an_error(tmp_path: Path, body: str, expected: bool) -> None:
    test = tmp_path / "test_e.py"
    test.write_text("import pytest\n\n\ndef test_e():\n" + body)
    failure = Failure("test_e.py::test_e", str(test), ErrorInfo(
        "UnboundLocalError", "cannot access local variable 'output'",
        (Frame(str(test), 5, "test_e"), Frame("/lib/kernel.py", 3, "k"))), "log")
    assert expects_raise(failure) is expected
    said = replace(failure, error=ErrorInfo("Failed", "DID NOT RAISE <class 'ValueError'>"))
    assert expects_raise(said)


def test_failure_seeds_carry_the_signals(
    library: Library,
) -> None:
    root, launches = library
    failure = failure_of(root, f"{TEST}::test_forward[gelu]", launches["forward"])
    seeds = failure_seeds(failure)
    assert not seeds.gradients and not seeds.expects_raise
    failure = failure_of(root, f"{TEST}::test_gradients[True-gelu]", launches["forward"])
    assert failure_seeds(failure).gradients  # the test calls .backward()
    assert not failure_seeds(failure).returned_by


def test_a_backward_the_engine_rejected_is_where_the_error_was_raised(
    library: Library,
) -> None:
    """Autograd raises about what ``backward`` returned from its own frames: the Function
    it names has its ``backward`` shown as the frame that raised, above the launchers, so
    that the budget cuts it last."""
    root, launches = library
    both = launches["forward"] + launches["backward"]
    failure = failure_of(
        root, f"{TEST}::test_gradients[True-gelu]", both, error="RuntimeError",
        message="function MatmulActBackward returned an incorrect number of gradients "
                "(expected 4, got 3)")
    seeds = failure_seeds(failure, project=Project(root))
    assert seeds.returned_by == "MatmulAct" and seeds.gradient_check
    found = by_name(Reach(Project(root)).locate(seeds))
    backward = found[f"{LAYER}:MatmulAct.backward"]
    assert backward.tier == TIER_FIRST and backward.why == "raised the error"
    assert backward.score > max(item.score for key, item in found.items()
                                if item.tier == TIER_FIRST and key != f"{LAYER}:MatmulAct.backward")


def test_an_assertion_helper_of_the_project_is_part_of_the_check(tmp_path: Path) -> None:
    """fla keeps ``assert_close`` in ``fla/utils/_testing.py``, beside its code: called
    by the test as a check, it is where the check failed, not a frame that raised."""
    (tmp_path / "pkg" / "utils").mkdir(parents=True)
    helper = tmp_path / "pkg" / "utils" / "_testing.py"
    helper.write_text("def assert_close(prefix, ref, tri, ratio):\n"
                      "    assert (ref - tri).abs().max() < ratio, prefix\n")
    (tmp_path / "tests").mkdir()
    test = tmp_path / "tests" / "test_op.py"
    test.write_text("def test_op():\n    assert_close('dk', ref_dk, tri_dk, 0.005)\n")
    frames = (Frame(str(test), 2, "test_op", "assert_close('dk', ref_dk, tri_dk, 0.005)"),
              Frame(str(helper), 2, "assert_close", "assert (ref - tri).abs().max() < ratio"))
    failure = Failure("tests/test_op.py::test_op", str(test),
                      ErrorInfo("AssertionError", "dk", frames), "log")
    project = Project(tmp_path)
    assert [frame.name for frame in check_frames(failure, project)] == ["assert_close",
                                                                        "test_op"]
    assert checks_gradients(failure, project)  # the test's line names dk
    assert failure_seeds(failure, project=project).frames == ((str(test), 2),)
    # a wrapper that raised an AssertionError of its own is no check helper
    wrapper = replace(failure, error=ErrorInfo("AssertionError", "bad target", (
        Frame(str(test), 2, "test_op", "loss = cross_entropy(x, target)"),
        Frame(str(helper), 2, "cross_entropy", "assert target.max() < n"))))
    assert [frame.name for frame in check_frames(wrapper, project)] == ["test_op"]


def test_an_autograd_function_the_test_calls_through_an_alias_is_found_without_launches(
    tmp_path: Path,
) -> None:
    """A pure-torch autograd Function (no kernel launched), called by the test through
    ``wrap = Wrap.apply``: its backward is where a gradient check fails."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "wrap.py").write_text(
        "import torch\n\n\nclass Wrap(torch.autograd.Function):\n"
        "    @staticmethod\n    def forward(ctx, loss, logits):\n        return loss\n\n"
        "    @staticmethod\n    def backward(ctx, grad):\n        return grad, None\n\n\n"
        "wrap = Wrap.apply\n")
    (tmp_path / "tests").mkdir()
    test = tmp_path / "tests" / "test_wrap.py"
    test.write_text("from pkg.wrap import wrap as standalone\n\n\ndef test_scaling():\n"
                    "    g, = torch.autograd.grad(standalone(loss, logits), (loss,))\n")
    seeds = Seeds(test_path=str(test), test_name="test_scaling", gradients=True,
                  gradient_check=True)
    found = by_name(Reach(Project(tmp_path)).locate(seeds))
    assert found["pkg/wrap.py:Wrap.backward"].tier == TIER_FIRST
    assert found["pkg/wrap.py:Wrap.forward"].tier == TIER_FIRST
