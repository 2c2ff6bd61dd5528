"""A kernel library laid out the way real Triton libraries are, written for these tests.

The shapes are the ones real libraries have and simpler benchmarks miss (issue 25):

- ``fusedlib/ops/act_kernels.py`` (over 900 lines): documented ``@triton.jit``
  activations and their gradients, and two dispatchers that pick one with ``if`` chains
  on a ``tl.constexpr`` string, some with ``elif`` and some without, each assigning
  ``output = helper(x)`` rather than returning;
- ``fusedlib/ops/matmul_kernels.py``: a kernel under ``@triton.autotune`` and
  ``@triton.heuristics`` over ``@triton.jit``, a long docstring, calling the dispatcher
  through a relative import with positional arguments (``None`` among them);
- ``fusedlib/ops/layer.py``: a ``torch.autograd.Function`` whose ``forward`` launches
  that kernel and whose ``backward`` sizes a per-program partial-gradient buffer with a
  helper of ``fusedlib/ops/utils.py`` and launches the backward kernels; a wrapper that
  checks its input; a wrapper whose ``bias`` path is the only one that sets a name;
- ``tests/test_layer.py``: tests whose ids name the activation, a helper of the test
  module holding a forward check and a gradient check, a test that expects an error.

:func:`write` lays it out under a directory; :data:`BUGS` are faults, each a (file,
good text, bad text) replacement, as real fix commits reverted would put them back.
"""

from __future__ import annotations

import json
from pathlib import Path

#: (name, forward body, gradient body): elementwise activations on fp32 blocks.
ACTS = (
    ("relu", "return tl.maximum(x, 0.0)", "return tl.where(x > 0.0, dy, 0.0)"),
    ("leaky_relu", "return tl.where(x >= 0.0, x, x * param)",
     "return tl.where(x >= 0.0, dy, dy * param)"),
    ("sigmoid", "return tl.sigmoid(x)", "s = tl.sigmoid(x)\nreturn dy * s * (1.0 - s)"),
    ("tanh", "return 2.0 * tl.sigmoid(2.0 * x) - 1.0",
     "t = 2.0 * tl.sigmoid(2.0 * x) - 1.0\nreturn dy * (1.0 - t * t)"),
    ("silu", "return x * tl.sigmoid(x)",
     "s = tl.sigmoid(x)\nreturn dy * s * (1.0 + x * (1.0 - s))"),
    ("gelu", "return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))",
     "cdf = 0.5 * (1.0 + tl.erf(x * 0.7071067811865476))\n"
     "pdf = tl.exp(-0.5 * x * x) * 0.3989422804014327\nreturn dy * (cdf + x * pdf)"),
    ("softplus", "return tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))",
     "return tl.where(x > 20.0, dy, dy * tl.sigmoid(x))"),
    ("softsign", "return x / (1.0 + tl.abs(x))",
     "d = 1.0 + tl.abs(x)\nreturn dy / (d * d)"),
    ("hard_sigmoid", "return tl.minimum(tl.maximum(x / 6.0 + 0.5, 0.0), 1.0)",
     "return tl.where((x > -3.0) & (x < 3.0), dy / 6.0, 0.0)"),
    ("mish", "sp = tl.log(1.0 + tl.exp(tl.minimum(x, 20.0)))\n"
             "return x * (2.0 * tl.sigmoid(2.0 * sp) - 1.0)",
     "sp = tl.log(1.0 + tl.exp(tl.minimum(x, 20.0)))\nt = 2.0 * tl.sigmoid(2.0 * sp) - 1.0\n"
     "return dy * (t + x * tl.sigmoid(x) * (1.0 - t * t))"),
    ("elu", "return tl.where(x > 0.0, x, tl.exp(tl.minimum(x, 0.0)) - 1.0)",
     "return tl.where(x > 0.0, dy, dy * tl.exp(tl.minimum(x, 0.0)))"),
    ("relu6", "return tl.minimum(tl.maximum(x, 0.0), 6.0)",
     "return tl.where((x > 0.0) & (x < 6.0), dy, 0.0)"),
)
#: Documentation lines that every helper carries, as real activation modules do.
_PARAMS = ["x: Input block, already loaded (not a pointer).",
           "param: The activation's parameter (the slope of leaky ReLU); others ignore it."]


def _helper(name: str, suffix: str, signature: str, body: str, what: str) -> str:
    doc = [f"{what} of {name.replace('_', ' ')}, elementwise.", "", "Args:"]
    doc += [f"    {line}" for line in _PARAMS] + ["", "Returns:", f"    The {what.lower()}."]
    doc += ["", "Notes:"] + [f"    Computed in fp32; note {i} on how the kernels use it."
                            for i in range(18)]
    lines = ["@triton.jit", f"def {name}{suffix}({signature}):", '    """']
    lines += [f"    {line}".rstrip() for line in doc] + ['    """']
    lines += [f"    {line}" for line in body.splitlines()]
    return "\n".join(lines) + "\n"


def _dispatcher(name: str, signature: str, suffix: str, args: str) -> str:
    lines = ["@triton.jit", f"def {name}({signature}):",
             '    """Applies the activation named by ``act``: Triton folds the branches',
             "    on the constexpr, so a launch compiles one.", '    """']
    for index, (act, _, _) in enumerate(ACTS):
        keyword = "if" if index % 3 == 0 else "elif"  # chains with and without elif
        lines += [f"    {keyword} act == '{act}':", "        x = x.to(tl.float32)",
                  f"        output = {act}{suffix}({args})"]
    lines += ["    if dropout:", "        output = output * seed_scale(seed)", "    return output"]
    return "\n".join(lines) + "\n"


ACT_KERNELS = "\n\n".join([
    '"""Activations for the fused kernels: one documented jit function per activation and\n'
    'its gradient, and the dispatchers on a constexpr name."""\n\n'
    "import triton\nimport triton.language as tl\n\nfrom .utils import seed_scale\n",
    *[_helper(name, "", "x, param", forward, "Forward") for name, forward, _ in ACTS],
    *[_helper(name, "_grad", "x, dy, param", grad, "Gradient") for name, _, grad in ACTS],
    _dispatcher("apply_act", "x, drop_p, seed, param, act: tl.constexpr, "
                "dropout: tl.constexpr", "", "x, param"),
    _dispatcher("apply_act_grad", "dy, x, drop_p, seed, param, act: tl.constexpr, "
                "dropout: tl.constexpr", "_grad", "x, dy, param"),
])

_KERNEL_DOC = "\n".join(['    """Fused product of a block of rows with the weight, then the '
                         'activation.', "", "    Args:"]
                        + [f"        arg{i}: one of the pointers, sizes or strides, described "
                           f"here line by line ({i})." for i in range(30)] + ['    """'])

MATMUL_KERNELS = f'''\
"""The fused matmul and activation, forward and backward."""

import triton
import triton.language as tl

from .act_kernels import apply_act, apply_act_grad


def matmul_configs():
    return [triton.Config({{"BLOCK_M": 16, "BLOCK_N": 16}}, num_warps=4),
            triton.Config({{"BLOCK_M": 32, "BLOCK_N": 16}}, num_warps=4)]


@triton.autotune(configs=matmul_configs(), key=["M", "N", "K"])
@triton.heuristics({{"EVEN_N": lambda args: args["N"] % args["BLOCK_N"] == 0}})
@triton.jit
def matmul_act_kernel(x_ptr, w_ptr, out_ptr, pre_ptr, M, N, K, param,
                      act: tl.constexpr, save_pre: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr):
{_KERNEL_DOC}
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K):
        a = tl.load(x_ptr + rows * K + k, mask=rows < M, other=0.0)
        b = tl.load(w_ptr + k * N + cols, mask=cols < N, other=0.0)
        acc += a[:, None] * b[None, :]
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    offsets = rows[:, None] * N + cols[None, :]
    if act is not None:
        if save_pre:
            tl.store(pre_ptr + offsets, acc, mask=mask)
        acc = apply_act(acc, None, None, param, act, False)
    tl.store(out_ptr + offsets, acc, mask=mask)


@triton.autotune(configs=[triton.Config({{"BLOCK": 64}}, num_warps=4)], key=["size"])
@triton.jit
def act_kernel(x_ptr, out_ptr, size, param, act: tl.constexpr, BLOCK: tl.constexpr):
    """The activation alone, elementwise."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < size
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, apply_act(x, None, None, param, act, False), mask=mask)


@triton.autotune(configs=[triton.Config({{"BLOCK": 64}}, num_warps=4)], key=["size"])
@triton.jit
def act_grad_kernel(dy_ptr, pre_ptr, dx_ptr, size, param, act: tl.constexpr,
                    BLOCK: tl.constexpr):
{_KERNEL_DOC}
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < size
    dy = tl.load(dy_ptr + offsets, mask=mask)
    pre = tl.load(pre_ptr + offsets, mask=mask)
    tl.store(dx_ptr + offsets, apply_act_grad(dy, pre, None, None, param, act, False),
             mask=mask)


@triton.jit
def column_sum_kernel(g_ptr, partial_ptr, M, N, rows_per_program, BLOCK_N: tl.constexpr):
    """Sums the rows one program owns into its row of the partial buffer."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    start = pid * rows_per_program
    for row in range(start, tl.minimum(start + rows_per_program, M)):
        acc += tl.load(g_ptr + row * N + cols, mask=cols < N, other=0.0)
    tl.store(partial_ptr + pid * N + cols, acc, mask=cols < N)
'''

UTILS = '''\
"""Sizes and small helpers shared by the ops."""

import triton
import triton.language as tl


def program_count(rows):
    """How many programs share the rows of a reduction: at most 3, each a slice."""
    return max(1, min(3, rows))


def block_for(n):
    return triton.next_power_of_2(n)


@triton.jit
def seed_scale(seed):
    return 1.0
'''

LAYER = '''\
"""The fused layer: ``act(x @ w + b)`` with its gradients, launched through Triton."""

import math

import torch
import triton

from .matmul_kernels import act_grad_kernel, act_kernel, column_sum_kernel, matmul_act_kernel
from .utils import block_for, program_count

ACTIVATIONS = ("relu", "leaky_relu", "sigmoid", "tanh", "silu", "gelu", "softplus",
               "softsign", "hard_sigmoid", "mish", "elu", "relu6")


def bias_grad(grad, dtype=None):
    """The bias's gradient: a column sum, one partial row per program."""
    M, N = grad.shape
    programs = program_count(M)
    partial = torch.empty((programs, N), dtype=torch.float32, device=grad.device)
    per_program = math.ceil(M / programs)
    column_sum_kernel[(programs,)](grad, partial, M, N, per_program, BLOCK_N=block_for(N))
    if dtype is None:
        total = partial.sum(dim=0)
    else:
        total = partial.sum(dim=0).to(dtype)
    return total


def activate(pre, act, param):
    out = torch.empty_like(pre)
    size = pre.numel()
    grid = lambda meta: (triton.cdiv(size, meta["BLOCK"]),)
    act_kernel[grid](pre, out, size, param, act)
    return out


class MatmulAct(torch.autograd.Function):
    """``act(x @ w + b)``; ``backward`` returns one gradient per input of ``forward``."""

    @staticmethod
    def forward(ctx, x, w, b, act, param):
        M, K = x.shape
        N = w.shape[1]
        out = torch.empty((M, N), dtype=torch.float32, device=x.device)
        pre = torch.empty_like(out)
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))
        matmul_act_kernel[grid](x, w, out, pre, M, N, K, param, act, True)
        if b is not None:
            pre = pre + b
            out = activate(pre, act, param)
        ctx.save_for_backward(x, w, pre)
        ctx.act, ctx.param, ctx.has_bias = act, param, b is not None
        return out

    @staticmethod
    def backward(ctx, dout):
        x, w, pre = ctx.saved_tensors
        dout = dout.contiguous()
        size = dout.numel()
        dpre = torch.empty_like(dout)
        grid = lambda meta: (triton.cdiv(size, meta["BLOCK"]),)
        act_grad_kernel[grid](dout, pre, dpre, size, ctx.param, ctx.act)
        db = bias_grad(dpre) if ctx.has_bias else None
        return dpre @ w.t(), x.t() @ dpre, db, None, None


def matmul_act(x, w, act, b=None, param=0.01):
    """The layer's entry point: checks the activation's name, then launches."""
    if act not in ACTIVATIONS:
        raise ValueError(f"unknown activation {act!r}")
    return MatmulAct.apply(x.contiguous(), w.contiguous(), b, act, param)
''' + "".join(f'''

def describe_{i}(layer):
    """How a layer is printed, variant {i}."""
    return f"{{type(layer).__name__}}({i})"
''' for i in range(12))

TESTS = '''\
import pytest
import torch
import torch.nn.functional as F

from fusedlib.ops.layer import matmul_act

REFERENCES = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "sigmoid": torch.sigmoid,
              "tanh": torch.tanh, "softplus": F.softplus}


@pytest.mark.parametrize("act", sorted(REFERENCES))
def test_forward(act):
    x, w = torch.randn(20, 8), torch.randn(8, 24)
    torch.testing.assert_close(matmul_act(x, w, act), REFERENCES[act](x @ w),
                               rtol=1e-4, atol=1e-4)


def _check_once(act, bias):
    x = torch.randn(20, 8, requires_grad=True)
    w = torch.randn(8, 24, requires_grad=True)
    b = torch.randn(24, requires_grad=True) if bias else None
    xr, wr = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    br = b.detach().clone().requires_grad_(True) if bias else None
    out = matmul_act(x, w, act, b)
    ref = REFERENCES[act](xr @ wr + (br if bias else 0.0))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    g = torch.randn_like(out)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-4)
    if bias:
        torch.testing.assert_close(b.grad, br.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", ["gelu", "silu"])
@pytest.mark.parametrize("bias", [False, True])
def test_gradients(act, bias):
    _check_once(act, bias)


def test_an_unknown_activation_is_refused():
    with pytest.raises(ValueError):
        matmul_act(torch.randn(4, 8), torch.randn(8, 4), "swishy")
'''

FILES = {
    "fusedlib/__init__.py": "",
    "fusedlib/ops/__init__.py": "",
    "fusedlib/ops/act_kernels.py": ACT_KERNELS,
    "fusedlib/ops/matmul_kernels.py": MATMUL_KERNELS,
    "fusedlib/ops/utils.py": UTILS,
    "fusedlib/ops/layer.py": LAYER,
    "tests/test_layer.py": TESTS,
}

_ENTRY = '    """The layer\'s entry point: checks the activation\'s name, then launches."""\n'
_GELU = "    return 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))"
_GELU_GRAD = "    return dy * (cdf + x * pdf)"

#: Faults as real fixes reverted would put them back: (file, good text, bad text).
BUGS = {
    # a helper behind the dispatcher, named by the failing tests' ids
    "gelu": ("fusedlib/ops/act_kernels.py", _GELU,
             "    return 0.5 * x * (1.0 + tl.erf(x * 0.5))"),
    # its gradient: only a gradient check fails
    "gelu-grad": ("fusedlib/ops/act_kernels.py", _GELU_GRAD,
                  "    return dy * (cdf - x * pdf)"),
    # backward returns one gradient too few: the autograd engine raises
    "gradient-count": ("fusedlib/ops/layer.py",
                       "        return dpre @ w.t(), x.t() @ dpre, db, None, None",
                       "        return dpre @ w.t(), x.t() @ dpre, db, None"),
    # the rows each program of the partial-gradient reduction owns, rounded down: the
    # last rows are never summed
    "partial-rows": ("fusedlib/ops/layer.py", "    per_program = math.ceil(M / programs)\n",
                     "    per_program = M // programs\n"),
    # a name set only on one path: UnboundLocalError in the launching wrapper
    "unbound": ("fusedlib/ops/layer.py",
                "    if dtype is None:\n        total = partial.sum(dim=0)\n    else:\n"
                "        total = partial.sum(dim=0).to(dtype)\n",
                "    if dtype is not None:\n        total = partial.sum(dim=0).to(dtype)\n"),
    # the wrapper no longer refuses bad input: "DID NOT RAISE"
    "no-check": ("fusedlib/ops/layer.py", _ENTRY + '    if act not in ACTIVATIONS:\n'
                 '        raise ValueError(f"unknown activation {act!r}")\n', _ENTRY),
}


def write(root: Path, bug: str = "") -> str:
    """The library under ``root``, with ``bug`` (a key of BUGS) put in; the fault as
    JSON (``file``, ``bad``, ``good``) for a fixer that answers with the true fix."""
    files = dict(FILES)
    fault = {}
    if bug:
        path, good, bad = BUGS[bug]
        assert files[path].count(good) == 1, bug
        files[path] = files[path].replace(good, bad)
        fault = {"file": path, "good": good, "bad": bad}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return json.dumps(fault)
