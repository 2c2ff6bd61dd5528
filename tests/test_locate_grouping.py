"""Capture records, grouping into bugs, editable files, context, redaction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rerun_helpers import write_files

from pytest_kernelfix.capture.errors import ErrorInfo, Frame, describe_exception
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.capture.logs import truncate_log
from pytest_kernelfix.capture.records import Failure, PassedTest, read_record, report_record
from pytest_kernelfix.locate.context import build_context
from pytest_kernelfix.locate.grouping import (
    BugGroup,
    editable_files,
    group_failures,
    regression_nodeids,
)
from pytest_kernelfix.project import Project
from pytest_kernelfix.redact import MARKER, redact


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "gelu.py").write_text("def gelu_kernel():\n    y = tl.tanh(x)\n")
    (tmp_path / "kernels" / "softmax.py").write_text("def softmax_kernel():\n    pass\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_gelu.py").write_text("def test_gelu():\n    gelu()\n")
    (tmp_path / "tests" / "helpers.py").write_text("def reference():\n    pass\n")
    (tmp_path / "conftest.py").write_text("")
    venv = tmp_path / ".venv" / "lib"
    venv.mkdir(parents=True)
    (tmp_path / ".venv" / "pyvenv.cfg").write_text("")
    (venv / "dep.py").write_text("")
    return tmp_path


def failure(root: Path, nodeid: str, message: str, *, frames: list[Frame] | None = None,
            launches: tuple[KernelLaunch, ...] = ()) -> Failure:
    test_path = str(root / "tests" / "test_gelu.py")
    frames = frames if frames is not None else [
        Frame(test_path, 2, "test_gelu", "gelu()"),
        Frame(str(root / "kernels" / "gelu.py"), 2, "gelu_kernel", "y = tl.tanh(x)"),
    ]
    return Failure(nodeid, test_path, ErrorInfo("AttributeError", message, tuple(frames)),
                   "longrepr text", launches)


def test_test_files_are_recognised() -> None:
    is_test_file = Project(Path("/project")).is_test_file
    assert is_test_file("tests/test_x.py")
    assert is_test_file("pkg/x_test.py")
    assert is_test_file("conftest.py")
    assert is_test_file("tests/helpers.py")  # a reference beside the tests is not editable
    assert not is_test_file("kernels/gelu.py")
    assert not is_test_file("testing_utils.py")


def test_editable_files_leave_out_tests_conftest_and_environments(project: Path) -> None:
    frames = [
        Frame(str(project / "tests" / "test_gelu.py"), 2, "test_gelu"),
        Frame(str(project / "tests" / "helpers.py"), 2, "reference"),
        Frame(str(project / "conftest.py"), 1, "fixture"),
        Frame(str(project / ".venv" / "lib" / "dep.py"), 1, "dep"),
        Frame("/usr/lib/python3/site-packages/triton/jit.py", 1, "run"),
        Frame(str(project / "kernels" / "gelu.py"), 2, "gelu_kernel"),
    ]
    launch = KernelLaunch("softmax_kernel", str(project / "kernels" / "softmax.py"), 1)
    found = editable_files(failure(project, "t::a", "boom", frames=frames, launches=(launch,)),
                           Project(project))
    assert found == ("kernels/gelu.py", "kernels/softmax.py")


def test_a_virtualenv_is_found_under_a_linked_rootdir(project: Path, tmp_path: Path) -> None:
    """Launch sites and the integrity check see the real path of a file, the session the
    rootdir it was given: both name the same virtualenv."""
    linked = tmp_path.parent / f"{tmp_path.name}-link"
    linked.symlink_to(project)
    real = str(project / ".venv" / "lib" / "dep.py")
    assert Project(linked).in_environment(real)
    assert Project(linked).in_environment(str(linked / ".venv" / "lib" / "dep.py"))
    assert not Project(linked).in_environment(str(project / "kernels" / "gelu.py"))


def test_parametrized_failures_of_one_bug_form_one_group(project: Path) -> None:
    failures = [
        failure(project, f"tests/test_gelu.py::test_gelu[{n}]",
                f"Mismatched elements: {n} / 1000 ({n / 10}%)")
        for n in (3, 17, 250)
    ]
    failures.append(failure(project, "tests/test_gelu.py::test_other", "a different error"))
    groups = group_failures(failures, Project(project))
    assert [len(g.failures) for g in groups] == [3, 1]
    first = groups[0]
    assert first.editable == ("kernels/gelu.py",)
    assert first.kernel == "gelu_kernel"
    assert first.id.startswith("gelu_kernel-attributeerror-")
    assert first.id != groups[1].id
    # stable across runs: the id depends on the bug, not on the order or the run
    again = group_failures(list(reversed(failures[:3])), Project(project))
    assert again[0].id == first.id


def test_regression_set_is_passed_tests_that_launched_an_editable_kernel(project: Path) -> None:
    group = group_failures([failure(project, "t::a", "x")], Project(project))[0]
    gelu = KernelLaunch("gelu_kernel", str(project / "kernels" / "gelu.py"), 1)
    other = KernelLaunch("softmax_kernel", str(project / "kernels" / "softmax.py"), 1)
    passed = [PassedTest("t::uses_gelu", (gelu,)), PassedTest("t::uses_softmax", (other,)),
              PassedTest("t::no_kernel")]
    assert regression_nodeids(group, passed, Project(project)) == ("t::uses_gelu",)


def test_one_kernel_launched_from_two_wrappers_counts_each_wrapper(tmp_path: Path) -> None:
    """Launch records of one kernel are equal whatever their sites: the wrapper a test
    launched from must still decide whether that test guards the bug's files."""
    for name in ("kernels/k.py", "ops/wrap_a.py", "ops/wrap_b.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("def f():\n    pass\n")
    kernel = str(tmp_path / "kernels" / "k.py")
    via_a = KernelLaunch("k", kernel, 1, sites=((str(tmp_path / "ops/wrap_a.py"), 2, "f"),))
    via_b = KernelLaunch("k", kernel, 1, sites=((str(tmp_path / "ops/wrap_b.py"), 2, "f"),))
    assert via_a == via_b  # the sites do not take part in equality
    group = BugGroup("g", "k", "sig", ("ops/wrap_b.py",), ())
    passed = [PassedTest("t::a", (via_a,)), PassedTest("t::b", (via_b,))]
    assert regression_nodeids(group, passed, Project(tmp_path)) == ("t::b",)


def test_launch_sites_and_reach_make_other_modules_editable(tmp_path: Path) -> None:
    """A numerics bug: no frame but the test's; the kernel, its jit helper, the wrapper
    in another package and its block-size helper are all where the fault may be."""
    files = {
        "lib/__init__.py": "", "lib/kernels/__init__.py": "", "lib/ops/__init__.py": "",
        "lib/kernels/act.py": "import triton\n\n\n@triton.jit\ndef silu(x):\n    return x\n",
        "lib/kernels/k.py": "import triton\nfrom .act import silu\n\n\n@triton.jit\n"
                            "def k(x_ptr):\n    silu(x_ptr)\n",
        "lib/utils.py": "def block(n):\n    return n\n",
        "lib/ops/wrap.py": "from lib.kernels.k import k\nfrom lib.utils import block\n\n\n"
                           "def run(x):\n    b = block(4)\n    k[(b,)](x)\n",
        "tests/test_k.py": "def test_k():\n    run(1)\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    test = str(tmp_path / "tests/test_k.py")
    wrap = str(tmp_path / "lib/ops/wrap.py")
    launch = KernelLaunch("k", str(tmp_path / "lib/kernels/k.py"), 6,
                          sites=((wrap, 7, "run"), (test, 2, "test_k")))
    bug = Failure("tests/test_k.py::test_k", test,
                  ErrorInfo("AssertionError", "not close", (Frame(test, 2, "test_k"),)),
                  "log", (launch,))
    project = Project(tmp_path)
    (group,) = group_failures([bug], project)
    # the files of what reach pins, by tier: the launching function's, the kernel's, the
    # kernel's helper's and the block size helper's
    assert group.editable == ("lib/ops/wrap.py", "lib/kernels/k.py", "lib/kernels/act.py",
                              "lib/utils.py")
    located = [(i.path, i.qualname) for i in group.located]
    # the launching function, then the launched kernel, then what they call
    assert located[:2] == [("lib/ops/wrap.py", "run"), ("lib/kernels/k.py", "k")]
    assert set(located[2:4]) == {("lib/kernels/act.py", "silu"), ("lib/utils.py", "block")}
    # a passing test whose kernel calls the same jit helper is rerun with every candidate
    other = KernelLaunch("k2", str(tmp_path / "lib/kernels/k2.py"), 5)
    (tmp_path / "lib/kernels/k2.py").write_text(
        "import triton\nfrom .act import silu\n\n\n@triton.jit\ndef k2(x):\n    silu(x)\n")
    unrelated = KernelLaunch("k3", str(tmp_path / "lib/kernels/k3.py"), 1)
    (tmp_path / "lib/kernels/k3.py").write_text("def k3():\n    pass\n")
    passed = [PassedTest("t::shares_the_helper", (other,)), PassedTest("t::other", (unrelated,))]
    assert regression_nodeids(group, passed, project) == ("t::shares_the_helper",)


def test_report_record_round_trips_through_json(project: Path) -> None:
    launch = KernelLaunch("gelu_kernel", str(project / "kernels" / "gelu.py"), 1,
                          (("x", "*fp32"), ("BLOCK", "constexpr")), (("BLOCK", 128),))
    error = failure(project, "n", "boom").error
    record = report_record(kernel=True, test_path=str(project / "tests" / "test_gelu.py"),
                           launches=(launch,), error=error, root=project)
    restored = read_record("n", json.loads(json.dumps(record)), "long")
    assert isinstance(restored, Failure)
    assert restored.error == error
    assert restored.launches == (launch,)
    hashed = dict(restored.hashes)
    assert str(project / "kernels" / "gelu.py") in hashed  # taken for the stale check
    passed = read_record("n", report_record(kernel=True, test_path="t", launches=(launch,),
                                            error=None, root=project), "")
    assert passed == PassedTest("n", (launch,))


def test_describe_exception_unwraps_interpreter_errors() -> None:
    class InterpreterError(Exception):
        pass

    def kernel() -> None:
        raise AttributeError("module 'triton.language' has no attribute 'tanh'")

    try:
        try:
            kernel()
        except AttributeError as inner:
            raise InterpreterError(repr(inner)) from inner
    except InterpreterError as outer:
        info = describe_exception(outer)
    assert info.type == "AttributeError"
    assert info.headline == "AttributeError: module 'triton.language' has no attribute 'tanh'"
    assert info.frames[-1].name == "kernel"  # the innermost frame is the kernel line
    assert "raise AttributeError" in info.frames[-1].line


def test_signature_ignores_numbers_and_addresses() -> None:
    a = ErrorInfo("AssertionError", "Mismatched elements: 3 / 100 (3.0%) at 0x7f00aa")
    b = ErrorInfo("AssertionError", "Mismatched elements: 95 / 1000 (9.5%) at 0x7f11bb")
    assert a.signature() == b.signature()
    assert a.signature() != ErrorInfo("ValueError", a.message).signature()


def test_truncate_log_keeps_head_and_tail() -> None:
    text = "\n".join(f"line {i}" for i in range(1000))
    cut = truncate_log(text, head=5, tail=10)
    assert cut.startswith("line 0\n")
    assert cut.endswith("line 999")
    assert "[985 lines cut]" in cut
    assert truncate_log("short") == "short"
    huge_line = "x" * 5000
    assert len(truncate_log(huge_line)) < 1000


def test_redaction_of_env_secrets_and_key_shapes() -> None:
    env = {"OPENAI_API_KEY": "abcdef123456", "MY_TOKEN": "tok-987654", "HOME": "/root",
           "SOME_KEY_PATH": "/etc/keys", "TOKENIZERS_PARALLELISM": "false"}
    text = ("key=abcdef123456 tok-987654 sk-proj-ABCDEFGHIJKLMNOPQRST ghp_" + "a" * 36 +
            " AKIAABCDEFGHIJKLMNOP Bearer eyJhbGciOiJIUzI1NiJ9xyz /etc/keys false /root")
    out = redact(text, env)
    assert "abcdef123456" not in out and "tok-987654" not in out
    assert "sk-proj" not in out and "ghp_" not in out and "AKIA" not in out
    assert "eyJhbGci" not in out
    assert out.count(MARKER) == 6
    assert "/etc/keys false /root" in out  # paths and flags in secret-named vars stay


def test_context_is_redacted_and_states_the_real_error(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVICE_API_KEY", "supersecretvalue42")
    (project / "tests" / "test_gelu.py").write_text("KEY = 'supersecretvalue42'\n")
    bug = failure(project, "tests/test_gelu.py::test_gelu", "no attribute 'tanh'")
    bug = Failure(bug.nodeid, bug.test_path, bug.error,
                  "Traceback ... token supersecretvalue42 ...", bug.launches)
    where = Project(project)
    context = build_context(group_failures([bug], where)[0], where, device="interpret")
    assert context.editable[0].path == "kernels/gelu.py"
    assert context.tests[0].path == "tests/test_gelu.py"
    everything = context.error_log + context.tests[0].text
    assert "supersecretvalue42" not in everything
    assert "Error: AttributeError: no attribute 'tanh'" in context.error_log
    assert "Raised at: kernels/gelu.py:2 in gelu_kernel" in context.error_log
    assert context.kernel_lines == ("kernels/gelu.py:2 in gelu_kernel: y = tl.tanh(x)",)


def test_a_compilation_error_is_headed_by_the_compilers_own_words() -> None:
    """On a GPU the compiler raises CompilationError("at 9:25: <source>" + the error):
    the headline, the signature and the bug id must name the error, not the position."""
    import ast

    from triton.compiler.errors import CompilationError

    source = "def k(x):\n    y = tl.tanh(x)\n"
    node = ast.parse(source).body[0].body[0].value  # type: ignore[attr-defined]
    error = CompilationError(source, node, "AttributeError(\"module 'triton.language' has no "
                                           "attribute 'tanh'\")")
    info = describe_exception(error)
    assert info.headline == ("CompilationError: AttributeError(\"module 'triton.language' has "
                             "no attribute 'tanh'\")")
    assert "at 2:8:" in info.message and "y = tl.tanh(x)" in info.message


# -- one root cause, one bug -----------------------------------------------------------

HELPER = "import triton\n\n\n@triton.jit\ndef scaled(x, factor):\n    return x * factor\n"
KERNEL_USING_HELPER = (
    "import triton\nfrom lib.common import scaled\n\n\n@triton.jit\ndef {name}(x, factor):\n"
    "    return scaled(x, factor)\n\n\ndef run_{name}(x):\n    {name}[(1,)](x, 2.0)\n")


@pytest.fixture
def shared_helper(tmp_path: Path) -> Path:
    """Three kernels in three modules, each calling the jit helper of lib/common.py; the
    test module checks their values."""
    files = {"lib/__init__.py": "", "lib/common.py": HELPER,
             "tests/test_k.py": "def test_k():\n    pass\n"}
    files.update({f"lib/{name}.py": KERNEL_USING_HELPER.format(name=name)
                  for name in ("k0", "k1", "k2")})
    return write_files(tmp_path, files)


def kernel_failure(root: Path, name: str, *, raised: bool, nodeid: str = "",
                   message: str = "Tensor-likes are not close!") -> Failure:
    """A test of kernel ``name`` (lib/<name>.py): its check failed (``raised`` False),
    or the shared helper raised while the kernel ran."""
    test = str(root / "tests" / "test_k.py")
    kernel = str(root / "lib" / f"{name}.py")
    frames = [Frame(test, 2, "test_k", "check()")]
    if raised:
        frames += [Frame(kernel, 7, name, "return scaled(x, factor)"),
                   Frame(str(root / "lib" / "common.py"), 6, "scaled", "return x * factor")]
    launch = KernelLaunch(name, kernel, 6, sites=((kernel, 11, f"run_{name}"),))
    return Failure(nodeid or f"tests/test_k.py::test_k[{name}]", test,
                   ErrorInfo("AttributeError" if raised else "AssertionError", message,
                             tuple(frames)), "log", (launch,))


def test_kernels_failing_in_one_shared_helper_are_one_bug(shared_helper: Path) -> None:
    """The error was raised in the helper: one bug, whichever kernel reached it, named
    the same whatever order the failures arrived in, the helper's file first."""
    project = Project(shared_helper)
    bugs = [kernel_failure(shared_helper, name, raised=True, message="no attribute 'mul'")
            for name in ("k2", "k0", "k1")]
    (group,) = group_failures(bugs, project)
    assert len(group.failures) == 3
    assert group.editable[0] == "lib/common.py"
    assert set(group.editable) == {"lib/common.py", "lib/k0.py", "lib/k1.py", "lib/k2.py"}
    assert group.first.nodeid == "tests/test_k.py::test_k[k0]"  # the smallest file set leads
    (again,) = group_failures(list(reversed(bugs)), project)
    assert again.id == group.id
    other = kernel_failure(shared_helper, "k0", raised=True, message="another error",
                           nodeid="t::other")
    assert len(group_failures([*bugs, other], project)) == 2  # another error, another bug


def test_wrong_values_from_kernels_sharing_a_helper_no_passing_test_reaches(
        shared_helper: Path) -> None:
    """No frame names the fault: the kernels' shared jit helper does, unless a passing
    test's kernel reaches it (then the helper works, and each kernel is its own bug)."""
    project = Project(shared_helper)
    bugs = [kernel_failure(shared_helper, name, raised=False) for name in ("k0", "k1", "k2")]
    solo = shared_helper / "lib" / "solo.py"
    solo.write_text("import triton\n\n\n@triton.jit\ndef solo(x):\n    pass\n")
    elsewhere = PassedTest("t::solo", (KernelLaunch("solo", str(solo), 5),))
    (group,) = group_failures(bugs, project, passed=[elsewhere])
    assert group.editable[0] == "lib/common.py"
    assert {"lib/k0.py", "lib/k1.py", "lib/k2.py"} <= set(group.editable)
    (shared_helper / "lib" / "k3.py").write_text(KERNEL_USING_HELPER.format(name="k3"))
    passing = PassedTest("t::k3", (KernelLaunch("k3", str(shared_helper / "lib" / "k3.py"), 6),))
    assert len(group_failures(bugs, project, passed=[elsewhere, passing])) == 3


def test_wrong_values_with_no_launch_that_worked_are_not_joined_on_a_guess(
        shared_helper: Path) -> None:
    """Every test failed (``--lf``, a suite where all is red): nothing says the shared
    helper rather than each kernel is at fault, so each kernel stays its own bug."""
    bugs = [kernel_failure(shared_helper, name, raised=False) for name in ("k0", "k1", "k2")]
    assert len(group_failures(bugs, Project(shared_helper))) == 3
    assert len(group_failures(bugs, Project(shared_helper),
                              passed=[PassedTest("t::no_launch", ())])) == 3


def test_one_kernel_reached_through_two_wrappers_is_one_bug(tmp_path: Path) -> None:
    files = {
        "kernels/k.py": "import triton\n\n\n@triton.jit\ndef k(x):\n    pass\n",
        "ops/wrap_a.py": "from kernels.k import k\n\n\ndef a(x):\n    k[(1,)](x)\n",
        "ops/wrap_b.py": "from kernels.k import k\n\n\ndef b(x):\n    k[(1,)](x)\n",
        "tests/test_ops.py": "def test_a():\n    pass\n",
    }
    write_files(tmp_path, files)
    kernel, test = str(tmp_path / "kernels" / "k.py"), str(tmp_path / "tests" / "test_ops.py")
    bugs = [Failure(f"tests/test_ops.py::test_{name}", test,
                    ErrorInfo("AssertionError", "Tensor-likes are not close!",
                              (Frame(test, 2, f"test_{name}"),)), "log",
                    (KernelLaunch("k", kernel, 5,
                                  sites=((str(tmp_path / f"ops/wrap_{name}.py"), 5, name),)),))
            for name in ("a", "b")]
    (group,) = group_failures(bugs, Project(tmp_path))
    assert group.nodeids == ("tests/test_ops.py::test_a", "tests/test_ops.py::test_b")
    assert group.editable[0] == "kernels/k.py"
    assert {"ops/wrap_a.py", "ops/wrap_b.py"} <= set(group.editable)


def test_a_kernel_file_in_another_encoding_is_named_with_its_encoding(project: Path) -> None:
    (project / "kernels" / "gelu.py").write_bytes(
        b"# -*- coding: latin-1 -*-\n# caf\xe9\ndef gelu_kernel():\n    y = tl.tanh(x)\n")
    frames = [Frame(str(project / "tests" / "test_gelu.py"), 2, "test_gelu", "gelu()"),
              Frame(str(project / "kernels" / "gelu.py"), 4, "gelu_kernel", "y = tl.tanh(x)")]
    (group,) = group_failures([failure(project, "t::a", "boom", frames=frames)],
                              Project(project))
    assert group.editable == ()
    (why,) = group.unreadable
    assert why.startswith("kernels/gelu.py is encoded as latin-1 (its coding declaration), "
                          "not UTF-8 (byte 0xe9 at offset 31)")


def test_wrong_values_from_launches_one_helper_sizes_are_one_bug(tmp_path: Path) -> None:
    """Two kernels in two modules, each launched by its own wrapper with the block size a
    shared Python helper computes: the helper is the shared suspect (the wrappers are
    each kernel's own), unless a passing test's launch goes through it."""
    files = {"lib/__init__.py": "", "lib/utils.py": "def block(n):\n    return n\n",
             "tests/test_k.py": "def test_k():\n    pass\n"}
    for name in ("ka", "kb", "kc"):
        files[f"lib/{name}.py"] = (
            f"import triton\nfrom lib.utils import block\n\n\n@triton.jit\ndef {name}(x):\n"
            f"    pass\n\n\ndef run_{name}(x):\n    b = block(4)\n    {name}[(b,)](x)\n")
    write_files(tmp_path, files)
    test = str(tmp_path / "tests" / "test_k.py")

    def launch(name: str) -> KernelLaunch:
        module = str(tmp_path / "lib" / f"{name}.py")
        return KernelLaunch(name, module, 6, sites=((module, 12, f"run_{name}"),
                                                    (test, 2, "test_k")))

    bugs = [Failure(f"tests/test_k.py::test_{name}", test,
                    ErrorInfo("AssertionError", "Tensor-likes are not close!",
                              (Frame(test, 2, "test_k"),)), "log", (launch(name),))
            for name in ("ka", "kb")]
    project = Project(tmp_path)
    solo = tmp_path / "lib" / "solo.py"
    solo.write_text("import triton\n\n\n@triton.jit\ndef solo(x):\n    pass\n")
    elsewhere = PassedTest("tests/test_k.py::test_solo", (KernelLaunch("solo", str(solo), 5),))
    (group,) = group_failures(bugs, project, passed=[elsewhere])
    assert group.editable[0] == "lib/utils.py"
    assert {"lib/ka.py", "lib/kb.py"} <= set(group.editable)
    assert len(group_failures(bugs, project)) == 2  # no launch worked: no contrast
    passing = PassedTest("tests/test_k.py::test_kc", (launch("kc"),))
    assert len(group_failures(bugs, project, passed=[elsewhere, passing])) == 2


def test_a_python_error_in_a_wrapper_names_the_bug_after_the_wrapper(tmp_path: Path) -> None:
    """The wrapper launched its kernel, then raised: the bug is the wrapper's. A launch
    refused at the wrapper's launch line is the kernel's; a check helper of the project
    that raised the test's AssertionError is no wrapper."""
    write_files(tmp_path, {
        "ops/kern.py": "import triton\n\n\n@triton.jit\ndef col_kernel(x):\n    pass\n",
        "ops/wrap.py": ("from ops.kern import col_kernel\n\n\nclass Col:\n"
                        "    def forward(self, x, dtype):\n        col_kernel[(1,)](x)\n"
                        "        return total\n\n\ndef close(a, b):\n    assert a == b\n"),
        "tests/test_col.py": "def test_col():\n    Col().forward(x, 1)\n    close(1, 2)\n",
    })
    test, wrap = str(tmp_path / "tests" / "test_col.py"), str(tmp_path / "ops" / "wrap.py")
    launch = KernelLaunch("col_kernel", str(tmp_path / "ops" / "kern.py"), 5,
                          sites=((wrap, 6, "forward"),))
    call = Frame(test, 2, "test_col", "Col().forward(x, 1)")

    def named(kind: str, *frames: Frame) -> str:
        broken = Failure("tests/test_col.py::test_col", test,
                         ErrorInfo(kind, "boom", (call, *frames)), "log", (launch,))
        (group,) = group_failures([broken], Project(tmp_path))
        assert group.id.startswith(f"{group.kernel.lower().replace('.', '-')}-")
        return group.kernel

    assert named("NameError", Frame(wrap, 7, "forward", "return total")) == "Col.forward"
    assert named("TypeError", Frame(wrap, 6, "forward", "col_kernel[(1,)](x)"),
                 Frame("/site-packages/triton/runtime/jit.py", 9, "run")) == "col_kernel"
    checked = Frame(test, 3, "test_col", "close(1, 2)")
    assert named("AssertionError", checked, Frame(wrap, 11, "close", "assert a == b")) == (
        "col_kernel")
