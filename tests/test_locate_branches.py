"""Constexpr-aware reach: a launch follows only the jit branches its constexpr values take.

The project below is an activation library laid out the way real ones are: a long module
of ``@triton.jit`` activations behind a dispatcher on a ``tl.constexpr`` name, a kernel
module that passes the name down, and a wrapper that sizes the launch with a helper of a
``utils`` module.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_kernelfix.capture.errors import ErrorInfo, Frame
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.capture.records import Failure
from pytest_kernelfix.locate.branches import (
    Branching,
    Use,
    callee_env,
    constexpr_env,
    decide,
    entry_env,
    taken,
)
from pytest_kernelfix.locate.grouping import group_failures
from pytest_kernelfix.locate.outline import index_branching, parse_module
from pytest_kernelfix.locate.reach import Located, Reach, Seeds, id_words, rank_by_words
from pytest_kernelfix.project import Project

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "tanh", "silu", "softplus")

FNS = "import triton\nimport triton.language as tl\n\nSCALE: tl.constexpr = 2.0\n" + "".join(
    f"\n\n@triton.jit\ndef {name}(x):\n    y = x * {index}\n    return y\n"
    for index, name in enumerate(ACTIVATIONS)
) + '''

@triton.jit
def dispatch(x, KIND: tl.constexpr):
    if KIND == "relu":
        y = relu(x)
    elif KIND == "gelu" or KIND == "gelu_tanh":
        y = gelu(x) if KIND == "gelu" else gelu_tanh(x)
    elif KIND in ("tanh", "hardtanh"):
        y = tanh(x)
    elif KIND == "silu":
        y = silu(x) * SCALE
    else:
        y = softplus(x)
    return y


@triton.jit
def dispatch_by_size(x, n, KIND: tl.constexpr):
    if n > 16:  # a runtime value: both branches may run
        y = relu(x)
    else:
        y = gelu(x)
    if KIND == OTHER:  # a module constant, not a literal: undecided
        y = tanh(y)
    return y


@triton.jit
def rebinding(x, KIND: tl.constexpr):
    KIND = "relu"
    if KIND == "silu":
        return silu(x)
    return relu(x)
'''

KERNELS = '''\
import triton
import triton.language as tl

from actlib.fns import dispatch, dispatch_by_size, rebinding


@triton.jit
def act_kernel(x_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(x_ptr + offs, dispatch(x, ACT), mask=offs < n)


@triton.jit
def literal_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, dispatch(tl.load(x_ptr + offs), KIND="gelu"))


@triton.jit
def runtime_kernel(x_ptr, n, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, dispatch_by_size(tl.load(x_ptr + offs), n, ACT))


@triton.jit
def rebinding_kernel(x_ptr, ACT: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, rebinding(tl.load(x_ptr + offs), ACT))


@triton.jit
def bias_kernel(x_ptr, b_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    if b_ptr is not None:
        x = dispatch(x, "silu")
    tl.store(x_ptr + offs, x)
'''


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for name, text in {"actlib/__init__.py": "", "actlib/fns.py": FNS,
                       "actlib/kernels.py": KERNELS}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def kernel_line(root: Path, name: str) -> int:
    lines = (root / "actlib/kernels.py").read_text().splitlines()
    return next(n for n, line in enumerate(lines, 1) if line.startswith(f"def {name}("))


def reached(root: Path, kernel: str, values: tuple[tuple[str, object], ...] = ()) -> set[str]:
    seeds = Seeds(kernels=((str(root / "actlib/kernels.py"), kernel_line(root, kernel)),),
                  constexprs=(values,))  # type: ignore[arg-type]
    return {item.qualname for item in Reach(Project(root)).locate(seeds)
            if item.path == "actlib/fns.py"}


def function(source: str) -> Branching:
    node = ast.parse(source).body[0]
    assert isinstance(node, ast.FunctionDef)
    return index_branching(node)


def test_conditions_on_known_values_are_decided() -> None:
    env = (("ACT", "silu"), ("BLOCK", 128), ("HAS_BIAS", False), ("MODE", -1),
           ("DTYPE", "dtype:fp32"), ("BIAS", None))
    assert decide('ACT == "silu"', env) is True
    assert decide('ACT != "silu"', env) is False
    assert decide('ACT in ("silu", "swish")', env) is True
    assert decide('ACT not in ["silu"]', env) is False
    assert decide("BIAS is None", env) is True and decide("BIAS is not None", env) is False
    assert decide("HAS_BIAS", env) is False and decide("not HAS_BIAS", env) is True
    assert decide('ACT == "gelu" or BLOCK >= 128', env) is True
    assert decide('ACT == "silu" and not HAS_BIAS', env) is True
    assert decide("MODE == -1", env) is True  # a negative literal is a unary minus
    assert decide("64 < BLOCK <= 128", env) is True
    assert decide("DTYPE == tl.float32", env) is True
    assert decide("DTYPE == tl.bfloat16", env) is False


def test_conditions_that_cannot_be_told_are_undecided() -> None:
    env = (("ACT", "silu"), ("DTYPE", "dtype:fp32"))
    assert decide("n > 0", env) is None  # a runtime value
    assert decide("ACT == OTHER", env) is None  # a module constant, not a literal
    assert decide('ACT is "silu"', env) is None  # string identity is not Triton's rule
    assert decide('DTYPE == "fp32"', env) is None  # a tl.dtype is not a string
    assert decide("len(ACT) == 4", env) is None
    assert decide('ACT == "silu" or n > 0', env) is True  # decided by its known half
    assert decide('ACT == "gelu" or n > 0', env) is None
    assert decide('ACT == "gelu" and n > 0', env) is False
    assert decide("ACT < 3", env) is None  # a str and an int do not order
    assert decide("ACT ==", env) is None  # not an expression


def test_a_use_is_dropped_only_when_a_guard_is_decided_against_it() -> None:
    source = textwrap.dedent('''\
        def f(x, KIND: tl.constexpr, n):
            if KIND == "a":
                y = fa(x)
            elif n > 0:
                y = fb(x)
            else:
                y = fc(x) if KIND == "c" else fd(x)
            return y
        ''')
    calls = [use for use in function(source).uses if use.call]

    def run(kind: str) -> list[str]:
        return [use.name for use in calls if taken(use, (("KIND", kind),))]

    assert run("a") == ["fa"]
    assert run("c") == ["fb", "fc"]  # n > 0 is undecided: fb may run
    assert run("d") == ["fb", "fd"]
    assert [use.name for use in calls if taken(use, ())] == ["fa", "fb", "fc", "fd"]


def test_a_launch_follows_only_the_branch_its_constexpr_takes(root: Path) -> None:
    assert reached(root, "act_kernel", (("ACT", "silu"), ("BLOCK", 64))) == {
        "dispatch", "silu", "SCALE"}
    assert reached(root, "act_kernel", (("ACT", "gelu_tanh"),)) == {"dispatch", "gelu_tanh"}
    assert reached(root, "act_kernel", (("ACT", "hardtanh"),)) == {"dispatch", "tanh"}
    assert reached(root, "act_kernel", (("ACT", "mish"),)) == {"dispatch", "softplus"}
    everything = {"dispatch", "SCALE", *ACTIVATIONS}
    assert reached(root, "act_kernel") == everything  # unknown: every branch, as before


def test_values_pass_down_through_calls_by_name_keyword_and_literal(root: Path) -> None:
    assert reached(root, "literal_kernel") == {"dispatch", "gelu"}  # KIND="gelu"
    # a parameter the callee assigns to is not the value passed: every branch
    assert reached(root, "rebinding_kernel", (("ACT", "relu"),)) == {
        "rebinding", "silu", "relu"}
    # a None argument is specialised by Triton: the launch records it
    assert reached(root, "bias_kernel", (("b_ptr", None),)) == set()
    assert reached(root, "bias_kernel", ()) == {"dispatch", "silu", "SCALE"}


def test_undecidable_branches_are_kept(root: Path) -> None:
    assert reached(root, "runtime_kernel", (("ACT", "silu"),)) == {
        "dispatch_by_size", "relu", "gelu", "tanh"}


def test_callee_values_defaults_and_spread_arguments() -> None:
    callee = function("def act(x, KIND: tl.constexpr = 'silu', LIMIT: tl.constexpr = 6):\n"
                      "    pass\n")
    assert callee.params == ("x", "KIND", "LIMIT") and callee.positional == 3

    def use_of(call: str) -> Use:
        return next(use for use in function(f"def k(x, ACT):\n    {call}\n").uses if use.call)

    env = (("ACT", "gelu"),)
    assert callee_env(use_of("act(x, ACT)"), callee, env) == (("KIND", "gelu"), ("LIMIT", 6))
    assert callee_env(use_of("act(x, KIND=ACT, LIMIT=3)"), callee, env) == (
        ("KIND", "gelu"), ("LIMIT", 3))
    assert callee_env(use_of("act(x)"), callee, env) == (("KIND", "silu"), ("LIMIT", 6))
    assert callee_env(use_of("act(x, y)"), callee, env) == (("LIMIT", 6),)  # y: unknown
    assert callee_env(use_of("act(*args)"), callee, env) == ()  # anything may be passed
    assert callee_env(use_of("act(x, tl.float16)"), callee, env)[0] == ("KIND", "dtype:fp16")
    assert entry_env(callee, {"KIND": "relu", "OTHER": 1}) == (("KIND", "relu"),)


def test_a_launch_that_kept_a_repr_is_not_trusted_with_strings() -> None:
    recorded = (("ACT", "silu"), ("SHAPE", "(1, 2)"), ("BLOCK", 64), ("DTYPE", "dtype:fp16"))
    assert constexpr_env(recorded, exact=True) == tuple(sorted(recorded))
    assert constexpr_env(recorded, exact=False) == (("BLOCK", 64), ("DTYPE", "dtype:fp16"))


def test_a_traceback_frame_in_jit_code_runs_with_the_launches_values(root: Path) -> None:
    fns = str(root / "actlib/fns.py")
    dispatch = parse_module((root / "actlib/fns.py").read_text()).find("dispatch")
    assert dispatch is not None
    kernel = (str(root / "actlib/kernels.py"), kernel_line(root, "act_kernel"))
    seeds = Seeds(kernels=(kernel, kernel), constexprs=((("ACT", "silu"),), (("ACT", "relu"),)),
                  frames=((fns, dispatch.line + 8),))  # in the silu branch
    found = {item.qualname for item in Reach(Project(root)).locate(seeds)
             if item.path == "actlib/fns.py"}
    assert found == {"dispatch", "silu", "relu", "SCALE"}  # both launches, not the others


def test_test_ids_name_definitions_that_then_rank_first() -> None:
    assert id_words("tests/t.py::test_act[silu-float32]") == {"silu", "float32", "act"}
    assert id_words("t.py::TestA::test_b[gelu_tanh-1e-05-True]") == {"gelu_tanh"}
    located = [Located("k.py", "act_kernel", 100.0, "launched kernel", True),
               Located("fns.py", "dispatch", 96.0, "called by act_kernel", True),
               Located("fns.py", "gelu", 92.0, "called by dispatch", True),
               Located("fns.py", "gelu_tanh", 92.0, "called by dispatch", True),
               Located("fns.py", "tanh", 92.0, "called by dispatch", True),
               Located("fns.py", "silu_kernel", 90.0, "launched", True)]
    ranked = rank_by_words(located, ["t.py::test_act[gelu_tanh-float32]"])
    assert [item.qualname for item in ranked[:3]] == ["act_kernel", "gelu_tanh", "dispatch"]
    assert {item.qualname: item.score for item in ranked}["gelu"] == 92.0  # a part is not it
    assert ranked[1].why.endswith("named by the test id")
    silu = {item.qualname: item.score for item in rank_by_words(located, ["t.py::t[silu]"])}
    assert silu["silu_kernel"] == 96.0  # a part of its name
    capped = rank_by_words(located, ["t.py::test_x[dispatch]"])
    assert capped[0].qualname == "act_kernel" and capped[1].score == 99.5  # never the top
    # a word that names many of them (chunk_* functions of a chunked library) ranks none
    chunked = [replace(item, qualname=f"chunk_{item.qualname}") for item in located]
    ranked = rank_by_words(chunked, ["t.py::test_x[chunk-gelu_tanh]"])
    assert [item.score for item in ranked if "named" in item.why] == [98.0]  # gelu_tanh only


def test_parametrized_failures_are_one_bug_that_shows_every_branch_they_took(
    root: Path,
) -> None:
    kernels = str(root / "actlib/kernels.py")
    test = root / "tests/test_act.py"
    test.parent.mkdir()
    test.write_text("def test_act(act):\n    run(act)\n")
    failures = []
    for act in ("silu", "relu"):
        launch = KernelLaunch("act_kernel", kernels, kernel_line(root, "act_kernel"),
                              (("x_ptr", "*fp32"), ("n", "i32"), ("ACT", "constexpr"),
                               ("BLOCK", "constexpr")), (("ACT", act), ("BLOCK", 64)))
        error = ErrorInfo("AssertionError", "Tensor-likes are not close!",
                          (Frame(str(test), 2, "test_act", "run(act)"),))
        failures.append(Failure(f"tests/test_act.py::test_act[{act}]", str(test), error,
                                "E   AssertionError", (launch,)))
    (group,) = group_failures(failures, Project(root))
    shown = [item.qualname for item in group.located if item.path == "actlib/fns.py"]
    assert set(shown) == {"dispatch", "silu", "relu", "SCALE"}
    assert shown[0] in ("silu", "relu")  # named by the test ids: above the dispatcher


def test_a_launch_records_the_none_arguments_triton_specialises(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    monkeypatch.syspath_prepend(str(root))
    from actlib.kernels import bias_kernel  # type: ignore[import-not-found]

    from pytest_kernelfix.capture.launches import describe_launch

    x = torch.zeros(16)
    without = describe_launch(bias_kernel, (x, None), {"BLOCK": 16})
    assert dict(without.signature)["b_ptr"] == "constexpr"
    assert without.constexprs == (("b_ptr", None), ("BLOCK", 16)) and without.exact
    with_bias = describe_launch(bias_kernel, (x, x), {"BLOCK": 16})
    assert with_bias.constexprs == (("BLOCK", 16),)


def test_a_jit_function_in_an_indented_block_is_indexed_when_reach_needs_it() -> None:
    index = parse_module(textwrap.dedent('''\
        import triton

        if triton is not None:
            @triton.jit
            def pick(x, K: tl.constexpr):
                if K == 1:
                    return one(x)
                return two(x)
        '''))
    pick = index.find("pick")
    assert pick is not None and pick.branching is not None
    assert [use.name for use in pick.branching.uses if use.call and taken(use, (("K", 2),))] == [
        "two"]
    plain = parse_module("def plain(x):\n    return x\n").find("plain")
    assert plain is not None and plain.branching is None
