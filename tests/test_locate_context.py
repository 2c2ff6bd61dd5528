"""What the model is shown: a clean error log, focused views of long modules, a budget.

The log in ``logs/interpreter_wrapped.txt`` is pytest's own output for a kernel that
calls ``tl.tanh`` under the interpreter, recorded with the plugin installed (its launch
wrapper is in the traceback) and with machine paths replaced by ``/home/dev/proj``.
"""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

from pytest_kernelfix.capture.errors import ErrorInfo, Frame
from pytest_kernelfix.capture.launches import KernelLaunch
from pytest_kernelfix.capture.logs import clean_log
from pytest_kernelfix.capture.records import Failure
from pytest_kernelfix.engine.files import apply_proposal
from pytest_kernelfix.engine.parse import Modification
from pytest_kernelfix.fixers.base import ProposalRequest
from pytest_kernelfix.fixers.prompting import prompt_chars, render_messages
from pytest_kernelfix.locate.context import (
    PROMPT_BUDGET,
    BugContext,
    Shape,
    SourceFile,
    build_context,
    current_kernel_lines,
    fit,
    fit_views,
    map_line,
    render_source,
    rendered_size,
)
from pytest_kernelfix.locate.grouping import group_failures
from pytest_kernelfix.locate.names import name_lines
from pytest_kernelfix.locate.reach import (
    TIER_FIRST,
    TIER_HELPER,
    TIER_KERNEL,
    TIER_REST,
    Located,
    Reach,
    Seeds,
)
from pytest_kernelfix.project import Project
from pytest_kernelfix.session.asking import NOTE_ROOM, fill_budget, prompt_size

LOG = (Path(__file__).parent / "logs" / "interpreter_wrapped.txt").read_text()
ROOT = "/home/dev/proj"
PLUGIN = f"{ROOT}/.venv/lib/python3.11/site-packages/pytest_kernelfix"


def test_the_log_keeps_one_copy_of_the_wrapped_traceback_without_machinery() -> None:
    absolute = LOG.replace("\nkernels/ops.py:19: in scale", f"\n{ROOT}/kernels/ops.py:19: in scale")
    cleaned = clean_log(absolute, [ROOT])
    assert LOG.count("def __call__(self, *args_dev, **kwargs):") == 2  # the raw log repeats it
    assert "def __call__" not in cleaned and "interpreter.py" not in cleaned
    assert "launches.py" not in cleaned and "pytest_kernelfix" not in cleaned
    assert "jit.py" not in cleaned and ROOT not in cleaned
    assert cleaned.count("E       AttributeError: module 'triton.language' has no attribute "
                         "'tanh'") == 1
    assert ">       y = x * factor + tl.tanh(x) * 0" in cleaned
    assert "kernels/ops.py:12: AttributeError" in cleaned
    assert "kernels/ops.py:19: in scale" in cleaned  # the wrapper frame, relative
    assert "tests/test_ops.py:10:" in cleaned
    assert "The above exception was the direct cause of the following exception:" in cleaned
    assert cleaned.rstrip().endswith("InterpreterError: AttributeError(\"module "
                                     "'triton.language' has no attribute 'tanh'\")")
    assert len(cleaned) < len(LOG) / 2


def test_native_tracebacks_and_site_packages_paths_are_cleaned_too() -> None:
    native = textwrap.dedent(f"""\
        Traceback (most recent call last):
          File "{ROOT}/tests/test_x.py", line 3, in test_x
            scale(x)
          File "{PLUGIN}/launches.py", line 9, in run
            return original(kernel, *args, **kwargs)
          File "/usr/lib/python3/site-packages/triton/runtime/interpreter.py", line 1, in run
            return GridExecutor(...)
          File "{ROOT}/kernels/ops.py", line 12, in scale_kernel
            y = tl.tanh(x)
        AttributeError: no tanh
        compiling /usr/lib/python3/site-packages/torch/_tensor.py
        """)
    cleaned = clean_log(native, [ROOT])
    assert 'File "tests/test_x.py", line 3' in cleaned
    assert 'File "kernels/ops.py", line 12' in cleaned
    assert "launches.py" not in cleaned and "GridExecutor" not in cleaned
    assert "compiling site-packages/torch/_tensor.py" in cleaned


def _module(functions: int, body_lines: int = 4) -> str:
    parts = ["import triton", "import triton.language as tl", "", "BLOCK_N = 128", ""]
    for i in range(functions):
        parts += ["", "@triton.jit", f"def helper_{i}(x):"]
        parts += [f"    x = x + {j}  # step {j} of helper {i}" for j in range(body_lines)]
        parts += ["    return x", ""]
    parts += ["", "@triton.jit", "def the_kernel(x_ptr, n, BLOCK: tl.constexpr):",
              "    offs = tl.arange(0, BLOCK_N)",
              "    x = tl.load(x_ptr + offs, mask=offs < n)",
              "    tl.store(x_ptr + offs, helper_3(x) * 2, mask=offs < n)", ""]
    return "\n".join(parts)


def test_a_long_module_is_shown_focused_with_line_numbers_and_an_outline() -> None:
    text = _module(40)
    view = render_source("kernels/big.py", text, ["the_kernel", "helper_3"])
    assert view.focused and view.shown == ("the_kernel", "helper_3")
    kernel_line = text.splitlines().index("def the_kernel(x_ptr, n, BLOCK: tl.constexpr):") + 1
    assert f"-{kernel_line + 3} ---" in view.content  # the span header ends at its last line
    assert "def the_kernel" in view.content and "def helper_3(x):" in view.content
    assert "BLOCK_N = 128" in view.content  # the constant the kernel reads
    assert "import triton.language as tl" in view.content
    assert "def helper_7(x):" not in view.content
    assert any(line.endswith("@triton.jit def helper_7(x)") for line in view.outline)
    assert len(view.content) < len(text) / 5
    # edits still apply to the whole file, also where the view does not show it
    edit = Modification("    x = x + 2  # step 2 of helper 7",
                        "    x = x - 2  # step 2 of helper 7")
    applied = apply_proposal([edit], {"kernels/big.py": text})
    assert applied.errors == () and "x = x - 2  # step 2 of helper 7" in applied.files[
        "kernels/big.py"]


def _project(root: Path, functions: int) -> tuple[Project, Failure]:
    (root / "kernels").mkdir()
    (root / "kernels" / "big.py").write_text(_module(functions, body_lines=12))
    (root / "tests").mkdir()
    test = root / "tests" / "test_big.py"
    test.write_text("def test_big():\n    run_it()\n" + "\n".join(
        f"\n\ndef test_other_{i}():\n    assert True  # filler line {i}" for i in range(400)))
    text = (root / "kernels" / "big.py").read_text()
    kernel_line = text.splitlines().index("def the_kernel(x_ptr, n, BLOCK: tl.constexpr):") + 1
    launch = KernelLaunch("the_kernel", str(root / "kernels" / "big.py"), kernel_line)
    error = ErrorInfo("AssertionError", "Tensor-likes are not close!",
                      (Frame(str(test), 2, "test_big", "run_it()"),))
    failure = Failure("tests/test_big.py::test_big", str(test), error,
                      "E   AssertionError: Tensor-likes are not close!\n" * 400, (launch,))
    return Project(root), failure


def test_the_first_prompt_stays_under_the_budget_whatever_the_module_size(tmp_path: Path) -> None:
    project, failure = _project(tmp_path, functions=250)
    assert len((tmp_path / "kernels" / "big.py").read_text()) > 100_000
    (group,) = group_failures([failure], project)
    context = build_context(group, project, device="interpret")
    request = ProposalRequest(context, 1, context.editable)
    size = prompt_chars(request)
    assert size < PROMPT_BUDGET, size
    (big,) = context.editable
    assert big.focused and big.shown[0] == "the_kernel" and "helper_3" in big.shown
    user = render_messages(request)[1]["content"]
    assert "def the_kernel" in user and "def helper_3(x):" in user
    assert "Not shown above" in user and "kernels/big.py:NAME" in user
    assert context.tests[0].focused and "def test_big():" in context.tests[0].content
    assert "test_other_300" not in context.tests[0].content


def test_a_short_module_is_shown_whole_byte_for_byte(tmp_path: Path) -> None:
    project, failure = _project(tmp_path, functions=2)
    (group,) = group_failures([failure], project)
    (source,) = build_context(group, project, device="interpret").editable
    assert not source.focused
    assert source.content == (tmp_path / "kernels" / "big.py").read_text()


def test_later_rounds_show_the_current_kernel_lines() -> None:
    before = "a = 1\nb = 2\ny = tl.tanh(x)\nz = 3\n"
    after = "a = 1\nb = 2\nt = 1\ny = 2 * tl.sigmoid(2 * x) - 1\nz = 3\n"
    assert map_line(before, after, 4) == (5, False)
    assert map_line(before, after, 3)[1] is True
    frame = Frame("kernels/k.py", 3, "k", "y = tl.tanh(x)")
    context = BugContext("g", ("t::t",), ErrorInfo("E", "m"), "log",
                         (SourceFile("kernels/k.py", before),),
                         kernel_lines=("kernels/k.py:3 in k: y = tl.tanh(x)",),
                         kernel_frames=(frame,))
    assert current_kernel_lines(context, context.editable) == context.kernel_lines
    (line,) = current_kernel_lines(context, (SourceFile("kernels/k.py", after),))
    assert "tl.tanh" not in line and "2 * tl.sigmoid(2 * x) - 1" in line
    assert "(changed by an earlier round)" in line


def test_a_kernel_longer_than_the_budget_is_cut_and_still_fits(tmp_path: Path) -> None:
    project, failure = _project(tmp_path, functions=2)
    body = "".join(f"    x = x + {i}  # a long kernel, line {i}\n" for i in range(1500))
    text = (tmp_path / "kernels" / "big.py").read_text().replace(
        "    offs = tl.arange(0, BLOCK_N)\n", "    offs = tl.arange(0, BLOCK_N)\n" + body)
    (tmp_path / "kernels" / "big.py").write_text(text)
    (group,) = group_failures([failure], project)
    context = build_context(group, project, device="interpret")
    assert prompt_chars(ProposalRequest(context, 1, context.editable)) < PROMPT_BUDGET
    (big,) = context.editable
    assert big.shown == ("the_kernel",) and "def the_kernel(" in big.content
    # the middle of the kernel is cut, its head and its final store kept, and the outline
    # says which lines are missing and how to ask for them
    assert "line 3\n" in big.content and "line 700\n" not in big.content
    assert "tl.store(x_ptr + offs, helper_3(x) * 2, mask=offs < n)" in big.content
    (cut,) = [line for line in big.outline if "cut for length" in line]
    first, last = (int(n) for n in cut.split(":")[0].split("-"))
    lines = text.splitlines()
    assert "line 700\n" in "\n".join(lines[first - 1:last])
    assert f"# --- lines {last + 1}-" in big.content and f"lines {first}-{last} cut" in big.content
    assert 'part of the_kernel' in cut and '"need": ["kernels/big.py:the_kernel"]' in cut


#: A norm module the way real ones start: a long import header and constants, then the
#: kernel, its launching wrapper and more definitions; the block size comes from utils.
NORM_HEADER = "\n".join(
    ["import math", "import operator", "", "import torch", "import triton",
     "import triton.language as tl", ""]
    + [f"from kernels.utils import helper_{i}  # used elsewhere in the module" for i in range(24)]
    + ["from kernels.utils import alloc_output, calculate_settings", ""]
    + [f"_MODE_{i}: tl.constexpr = tl.constexpr({i})  # casting mode {i}" for i in range(8)]
)
NORM = NORM_HEADER + '''


@triton.jit
def norm_kernel(y_ptr, x_ptr, n_cols, eps, MODE: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offsets = tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_cols
    x = tl.load(x_ptr + row * n_cols + offsets, mask=mask, other=0.0).to(tl.float32)
    if MODE == _MODE_1:
        x = x * 1.0
    elif MODE == _MODE_2:
        x = x * 1.0
    mean_square = tl.sum(x * x, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(mean_square + eps)
    tl.store(y_ptr + row * n_cols + offsets, x * rstd, mask=mask)


def norm_forward(x, eps, mode):
    shape = x.shape
    x = x.reshape(-1, shape[-1])
    n_rows, n_cols = x.shape
    BLOCK_SIZE, num_warps = calculate_settings(n_cols)
    y = alloc_output(x)
    norm_kernel[(n_rows,)](
        y, x, n_cols, eps, mode,
        BLOCK_SIZE=BLOCK_SIZE,
        num_warps=num_warps,
    )
    return y.view(*shape)
''' + "".join(f"\n\ndef unrelated_{i}(x):\n    y = x + {i}\n    return y * {i}\n"
              for i in range(30))

UTILS = '''\
import torch
import triton


def calculate_settings(n):
    BLOCK_SIZE = triton.next_power_of_2(n)
    num_warps = 4 if BLOCK_SIZE < 2048 else 8
    return BLOCK_SIZE, num_warps


def alloc_output(x):
    return torch.empty_like(x)
''' + "".join(f"\n\ndef helper_{i}(x):\n    y = x - {i}\n    return y / {i + 1}\n"
              for i in range(30))


def _norm_project(root: Path) -> tuple[Project, tuple[Located, ...]]:
    (root / "kernels").mkdir()
    (root / "kernels" / "norm.py").write_text(NORM)
    (root / "kernels" / "utils.py").write_text(UTILS)
    norm = root / "kernels" / "norm.py"
    lines = NORM.splitlines()
    kernel = next(n for n, line in enumerate(lines, 1) if line.startswith("def norm_kernel"))
    launch = next(n for n, line in enumerate(lines, 1) if "norm_kernel[(n_rows,)]" in line)
    project = Project(root)
    seeds = Seeds(kernels=((str(norm), kernel),), sites=(((str(norm), launch, "norm_forward"),),),
                  constexprs=((("MODE", 0), ("BLOCK_SIZE", 64)),))
    return project, Reach(project).locate(seeds)


def test_the_launching_function_and_its_block_size_helper_are_pinned(tmp_path: Path) -> None:
    _, located = _norm_project(tmp_path)
    tiers = {item.qualname: item.tier for item in located}
    assert tiers["norm_forward"] == TIER_FIRST and tiers["norm_kernel"] == TIER_KERNEL
    assert tiers["calculate_settings"] == TIER_HELPER
    assert tiers["alloc_output"] == TIER_REST  # what allocates y is found, not pinned
    pinned = {item.qualname for item in located if item.pinned}
    assert pinned == {"norm_forward", "norm_kernel", "calculate_settings"}
    assert "alloc_output" in {item.qualname for item in located}


def test_the_launching_function_is_shown_in_full_before_imports_and_constants(
    tmp_path: Path,
) -> None:
    _, located = _norm_project(tmp_path)
    texts = {"kernels/norm.py": NORM, "kernels/utils.py": UTILS}
    wanted = {"kernels/norm.py": ["norm_forward", "norm_kernel"],
              "kernels/utils.py": ["calculate_settings"]}

    def size(shape: Shape) -> int:
        return sum(rendered_size(render_source(path, texts[path], symbols, shape=shape))
                   for path, symbols in wanted.items())

    lean, full = size(Shape(header=False, constants=False)), size(Shape())
    limit = (lean + full) // 2  # room for the definitions, not for the header too
    focus, views = fit_views(located, texts, limit)
    assert sum(rendered_size(view) for view in views.values()) <= limit
    norm, utils = views["kernels/norm.py"], views["kernels/utils.py"]
    assert norm.shown[:2] == ("norm_forward", "norm_kernel")
    assert "def norm_forward(x, eps, mode):" in norm.content
    assert "    return y.view(*shape)" in norm.content  # in full
    assert "calculate_settings" in utils.shown
    assert "    BLOCK_SIZE = triton.next_power_of_2(n)" in utils.content
    assert "import operator" not in norm.content  # the header gave way
    lines = NORM.splitlines()
    imports = max(n for n, line in enumerate(lines, 1) if line.startswith("from kernels"))
    assert norm.outline[0] == f"1-{imports}: imports"
    assert "_MODE_1: tl.constexpr = tl.constexpr(1)" in norm.content  # read, and it fits
    assert focus["kernels/norm.py"][:2] == ("norm_forward", "norm_kernel")
    # tighter: the constants give way too, each left as one outline line
    _, views = fit_views(located, texts, lean + 100)
    norm = views["kernels/norm.py"]
    assert "    return y.view(*shape)" in norm.content and "_MODE_1: tl" not in norm.content
    mode_1 = next(n for n, line in enumerate(lines, 1) if line.startswith("_MODE_1"))
    assert f"{mode_1}: _MODE_1 = tl.constexpr(1)" in norm.outline
    assert "def calculate_settings(n):" in views["kernels/utils.py"].content
    # tighter still: the helper that sizes the launch goes before any launched kernel or
    # launching function is cut; a module none of whose definitions is shown is no
    # import header alone
    bare = Shape(header=False, constants=False)
    outline = rendered_size(render_source("kernels/utils.py", UTILS, [], shape=bare))
    both = rendered_size(render_source("kernels/norm.py", NORM, wanted["kernels/norm.py"],
                                       shape=bare))
    focus, views = fit_views(located, texts, both + outline)
    assert focus["kernels/norm.py"] == ("norm_forward", "norm_kernel")
    assert focus["kernels/utils.py"] == ()
    assert "import" not in views["kernels/utils.py"].content
    assert "tl.store(y_ptr + row * n_cols + offsets, x * rstd, mask=mask)" in views[
        "kernels/norm.py"].content
    # last, code is cut, never silently: the launcher keeps its head, its launch and its
    # tail, and the kernel is cut last
    kernel = rendered_size(render_source("kernels/norm.py", NORM, ["norm_kernel"], shape=bare))
    focus, views = fit_views(located, texts, kernel + outline)
    norm = views["kernels/norm.py"]
    assert norm.shown == ("norm_forward", "norm_kernel")
    assert "def norm_forward(x, eps, mode):" in norm.content
    assert "    return y.view(*shape)" in norm.content
    assert "tl.store(y_ptr + row * n_cols + offsets" in norm.content
    # tighter than the kernel alone: the launcher goes to the outline, and the kernel stays
    focus, views = fit_views(located, texts, kernel - 600)
    norm = views["kernels/norm.py"]
    assert norm.shown == ("norm_kernel",)
    assert "tl.store(y_ptr + row * n_cols + offsets" in norm.content
    # in the last tier, the launching function would give way to the header instead
    unpinned = [replace(item, tier=TIER_REST) for item in located]
    _, views = fit_views(unpinned, texts, limit)
    assert "def norm_forward(x, eps, mode):" not in views["kernels/norm.py"].content
    assert "import operator" in views["kernels/norm.py"].content


def test_a_cut_keeps_the_line_that_raised_and_the_launch(tmp_path: Path) -> None:
    """A 300-line launching wrapper that raised half-way, and its kernel: cut for length,
    the wrapper still shows its head, the line that raised, the launch and its tail."""
    body = "".join(f"    step_{i} = prepare(x, {i})\n" for i in range(300))
    text = ("import triton\n\n\n@triton.jit\ndef kernel(x_ptr):\n    pass\n\n\n"
            "def wrapper(x):\n" + body.replace("    step_150 = prepare(x, 150)\n",
                                               "    probs = torch.gather(x, -1, target)\n")
            + "    kernel[(1,)](x)\n    return x\n")
    lines = text.splitlines()
    raised = lines.index("    probs = torch.gather(x, -1, target)") + 1
    launch = lines.index("    kernel[(1,)](x)") + 1
    located = [Located("ops/w.py", "wrapper", 98.0, "raised the error", tier=TIER_FIRST),
               Located("ops/w.py", "kernel", 100.0, "launched kernel", True, TIER_KERNEL)]
    fitted = fit(located, {"ops/w.py": text}, 3_000, anchors={"ops/w.py": [raised, launch]})
    view = fitted.views["ops/w.py"]
    assert rendered_size(view) <= 3_100
    assert "def wrapper(x):" in view.content and "    return x" in view.content
    assert "probs = torch.gather(x, -1, target)" in view.content
    assert "kernel[(1,)](x)" in view.content
    assert "step_100 =" not in view.content and "step_200 =" not in view.content
    cuts = [line for line in view.outline if "cut for length" in line]
    assert len(cuts) == 2 and all("part of wrapper" in line for line in cuts)


#: A short wrapper module the way autograd wrappers are written: a few imports, then a
#: Function whose two methods are all there is to it (both found).
WRAP = '''\
import torch

from kernels.norm import norm_forward


class NormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, eps):
        ctx.eps = eps
        return norm_forward(x, eps, 0)

    @staticmethod
    def backward(ctx, dy):
        return dy * ctx.eps, None
'''


def test_a_short_module_mostly_found_keeps_its_imports_longer_than_a_long_one_its_code(
    tmp_path: Path,
) -> None:
    _, located = _norm_project(tmp_path)
    located = (*located, *(Located("kernels/wrap.py", name, 9.0, "gradient path", tier=TIER_FIRST)
                           for name in ("NormFunction.forward", "NormFunction.backward")))
    texts = {"kernels/norm.py": NORM, "kernels/utils.py": UTILS, "kernels/wrap.py": WRAP}
    whole = fit_views(located, texts, 100_000)[1]
    assert not whole["kernels/wrap.py"].focused
    full = sum(rendered_size(view) for view in whole.values())
    # a little short: the long modules give way (their headers), the short one stays whole
    _, views = fit_views(located, texts, full - 1_500)
    assert not views["kernels/wrap.py"].focused
    assert "from kernels.norm import norm_forward" in views["kernels/wrap.py"].content
    assert "import operator" not in views["kernels/norm.py"].content
    # far short: it is focused too, its methods still in full
    _, views = fit_views(located, texts, 2_500)
    wrap = views["kernels/wrap.py"]
    assert wrap.focused and "return dy * ctx.eps, None" in wrap.content


def _long_wrapper(steps: int = 120) -> str:
    """A launch wrapper of some 280 lines that binds ``acc`` on one branch only, in its
    middle, and reads it at its end, long after its launch."""
    head = "".join(f"    prep_{i} = x.shape[0] * {i} + {i}  # preparing the launch\n"
                   for i in range(steps // 2))
    tail = "".join(f"    post_{i} = prep_{i % 10} - {i}  # after the launch, step {i}\n"
                   for i in range(steps))
    return ("import torch\nimport triton\n\n\n@triton.jit\ndef scale_kernel(x_ptr):\n"
            "    pass\n\n\ndef scaled_sum(x, dtype=None):\n" + head
            + "    scale_kernel[(1,)](x)\n" + head.replace("prep_", "more_")
            + "    if dtype is None:\n        acc = torch.zeros(4)\n        mode = 'plain'\n"
            + "    else:\n        mode = 'cast'\n"
            + tail + "    return acc.sum() + post_0\n")


def test_a_cut_for_an_error_about_a_name_keeps_its_lines_and_branches() -> None:
    """An UnboundLocalError read at the end of a long wrapper: the cut keeps the if/else
    in its middle (where the name is bound on one branch only) as well as its head, the
    line that raised and the launch, and the outline says which lines are missing."""
    text = _long_wrapper()
    lines = text.splitlines()
    raised = lines.index("    return acc.sum() + post_0") + 1
    launch = lines.index("    scale_kernel[(1,)](x)") + 1
    located = [Located("ops/w.py", "scaled_sum", 98.0, "raised the error", tier=TIER_FIRST),
               Located("ops/w.py", "scale_kernel", 100.0, "launched kernel", True, TIER_KERNEL)]
    story = "    if dtype is None:\n        acc = torch.zeros(4)\n        mode = 'plain'\n" \
            "    else:\n        mode = 'cast'\n"
    anchors = {"ops/w.py": [raised, launch]}
    plain = fit(located, {"ops/w.py": text}, 4_000, anchors=anchors, kernels_last=False)
    assert story not in plain.views["ops/w.py"].content  # the middle is what a cut drops
    marked = {"ops/w.py": name_lines(text, raised, ["acc"])}
    view = fit(located, {"ops/w.py": text}, 4_000, anchors=anchors, kernels_last=False,
               marked=marked).views["ops/w.py"]
    assert rendered_size(view) <= 4_100
    assert story in view.content
    assert "def scaled_sum(x, dtype=None):" in view.content
    assert "    return acc.sum() + post_0" in view.content
    assert "    scale_kernel[(1,)](x)" in view.content
    assert "post_60 =" not in view.content
    assert view.cut == ("scaled_sum",)
    (said,) = [line for line in view.outline if "cut for length" in line]  # one line for all
    assert said.count("-") >= 3 and "parts of scaled_sum" in said
    assert '"need": ["ops/w.py:scaled_sum"] shows it whole' in said
    gone = [int(part.split("-")[0]) for part in said.split(":")[0].split(", ")]
    assert any(lines[number - 1].startswith("    post_") for number in gone)


def test_a_wrapper_that_raised_keeps_its_lines_while_a_kernel_in_another_file_is_cut(
    tmp_path: Path,
) -> None:
    """The raising wrapper and the kernel it launched live in two files: under the budget
    the kernel is cut first, whichever view is larger, and the wrapper keeps the branch
    that binds the name; the bug is named after the wrapper."""
    (tmp_path / "ops").mkdir()
    wrapper = _long_wrapper(60).replace(
        "@triton.jit\ndef scale_kernel(x_ptr):\n    pass\n",
        "from ops.kern import scale_kernel\n").replace("import triton\n", "")
    kernel = "import triton\n\n\n@triton.jit\ndef scale_kernel(x_ptr):\n" + "".join(
        f"    v_{i} = {i}  # a long kernel body, line {i} of it\n" for i in range(400))
    (tmp_path / "ops" / "w.py").write_text(wrapper)
    (tmp_path / "ops" / "kern.py").write_text(kernel)
    (tmp_path / "tests").mkdir()
    test = tmp_path / "tests" / "test_w.py"
    test.write_text("def test_w():\n    scaled_sum(x, dtype=1)\n")
    lines = wrapper.splitlines()
    raised = lines.index("    return acc.sum() + post_0") + 1
    launch = lines.index("    scale_kernel[(1,)](x)") + 1
    w, k = str(tmp_path / "ops" / "w.py"), str(tmp_path / "ops" / "kern.py")
    error = ErrorInfo("UnboundLocalError", "cannot access local variable 'acc' where it is "
                      "not associated with a value", (
                          Frame(str(test), 2, "test_w", "scaled_sum(x, dtype=1)"),
                          Frame(w, raised, "scaled_sum", "return acc.sum() + post_0")))
    failure = Failure("tests/test_w.py::test_w", str(test), error, "E   UnboundLocalError",
                      (KernelLaunch("scale_kernel", k, 5, sites=((w, launch, "scaled_sum"),)),))
    project = Project(tmp_path)
    (group,) = group_failures([failure], project)
    assert group.kernel == "scaled_sum" and group.id.startswith("scaled_sum-unboundlocalerror-")
    context = build_context(group, project, device="interpret", budget=19_000)
    views = {source.path: source for source in context.editable}
    assert "    else:\n        mode = 'cast'\n" in views["ops/w.py"].content
    assert "ops/kern.py" in {path for path, source in views.items() if source.cut}
    assert rendered_size(views["ops/w.py"]) > rendered_size(views["ops/kern.py"])


def test_the_launched_kernel_is_whole_before_the_test_source_gets_room(tmp_path: Path) -> None:
    """A test module whose failing test is long and calls helpers, and a kernel that only
    fits whole if the test source keeps the failing test alone, cut short: it does."""
    project, failure = _project(tmp_path, functions=2)
    text = (tmp_path / "kernels" / "big.py").read_text().replace(
        "    offs = tl.arange(0, BLOCK_N)\n", "    offs = tl.arange(0, BLOCK_N)\n" + "".join(
            f"    x = x + {i}  # a long kernel, line {i}\n" for i in range(300)))
    (tmp_path / "kernels" / "big.py").write_text(text)
    test = tmp_path / "tests" / "test_big.py"
    test.write_text("import torch\n\n\ndef check(a, b):\n    assert torch.allclose(a, b)\n"
                    + "".join(f"\n\ndef helper_{i}():\n    return {i}  # a helper\n"
                              for i in range(40))
                    + "\n\ndef test_big():\n" + "".join(f"    y_{i} = helper_{i}()\n"
                                                       for i in range(40))
                    + "    run_it()\n    check(y_0, y_1)\n"
                    + "\nimport os  # an import between the tests: not part of the header\n"
                    + "".join(f"\n\ndef test_other_{i}():\n    assert True  # line {i}\n"
                              for i in range(100)))
    (group,) = group_failures([failure], project)
    context = build_context(group, project, device="interpret", budget=26_000)
    (big,) = context.editable
    assert "the_kernel" in big.shown and "the_kernel" not in big.cut
    assert "x = x + 150  # a long kernel, line 150" in big.content
    (shown_test,) = context.tests
    assert "def test_big():" in shown_test.content and "def helper_3():" not in shown_test.content
    assert "test_other_50" not in shown_test.content
    assert rendered_size(shown_test) <= 1_700


def test_the_budget_the_template_leaves_goes_to_the_helper_that_sizes_the_launch(
    tmp_path: Path,
) -> None:
    """build_context reserves an estimate for the templates' own text; the prompt they
    render leaves some of it unused. Sized by the rendered prompt, the context gets that
    room back: ``calculate_settings``, an outline line before, is shown whole, and the
    prompt stays within the budget less the room kept for notes."""
    text = NORM.replace("    mean_square = tl.sum(x * x, axis=0) / n_cols\n",
                        "    mean_square = tl.sum(x * x, axis=0) / n_cols\n" + "".join(
                            f"    x = x * 1.0  # scaling step {i} of the row, as it was\n"
                            for i in range(40)))
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "norm.py").write_text(text)
    (tmp_path / "kernels" / "utils.py").write_text(UTILS)
    (tmp_path / "tests").mkdir()
    test = tmp_path / "tests" / "test_norm.py"
    test.write_text("def test_norm():\n    y = norm_forward(x, 1e-6, 0)\n"
                    "    assert torch.allclose(y, ref)\n")
    lines = text.splitlines()
    kernel = next(n for n, line in enumerate(lines, 1) if line.startswith("def norm_kernel"))
    launch = next(n for n, line in enumerate(lines, 1) if "norm_kernel[(n_rows,)]" in line)
    norm = str(tmp_path / "kernels" / "norm.py")
    failure = Failure("tests/test_norm.py::test_norm", str(test), ErrorInfo(
        "AssertionError", "assert False", (Frame(str(test), 3, "test_norm"),)),
        "E   AssertionError\n" * 50, (KernelLaunch(
            "norm_kernel", norm, kernel, constexprs=(("MODE", 0), ("BLOCK_SIZE", 64)),
            sites=((norm, launch, "norm_forward"),)),))
    project = Project(tmp_path)
    (group,) = group_failures([failure], project)
    budget = 14_000  # the default's proportions, at a size this module tells apart

    def build(given: int) -> BugContext:
        return build_context(group, project, device="interpret", budget=given)

    measure = prompt_size(None)
    plain, sized = build(budget), fill_budget(build, measure, budget)
    utils = {source.path: source for source in plain.editable}["kernels/utils.py"]
    assert "calculate_settings" not in utils.shown
    assert measure(plain) < budget - NOTE_ROOM - 1_000  # the estimate left that unused
    utils = {source.path: source for source in sized.editable}["kernels/utils.py"]
    assert utils.shown == ("calculate_settings",) and not utils.cut
    assert "    num_warps = 4 if BLOCK_SIZE < 2048 else 8" in utils.content
    assert measure(plain) < measure(sized) <= budget - NOTE_ROOM
    (norm_view,) = [source for source in sized.editable if source.path == "kernels/norm.py"]
    assert not norm_view.cut and "def norm_forward(x, eps, mode):" in norm_view.content
