"""CPU truth: do correct kernels pass on the CPU shim wherever they pass on a GPU?

Runs a fixed sample of the installed ``liger-kernel``'s own ops (forward, and backward
where liger has one) against torch references, with inputs in fp32, fp16 and bf16, and
under ``torch.autocast("cuda", fp16 / bf16)`` as mixed-precision training has them
(activations in the autocast dtype, parameters in fp32). Beside them, GPU code that is
not a liger op but that kernel tests lean on: bias-free ``nn.Linear`` / ``nn.Conv1d`` /
``nn.Conv2d`` made on ``device="cuda"``, modules moved there with ``.cuda()``, liger's
loss fed a bias-free ``nn.Linear``'s weight, and an autograd ``Function`` whose backward
takes its GPU path only when its saved tensors and gradient say ``cuda``. References are
leaves made on "cuda", so a gradient that comes back a CPU tensor is a mismatch, as it
would be on a GPU. It prints pass counts per column for two shims in one run:

- ``before``: the shim without its autocast, bf16 and CUDA-only-overload pieces:
  ``shim.install(autocast=False, bf16=False)``, ``torch.cuda.is_bf16_supported()`` True
  (as it then answered) and no ``out_dtype`` matmuls (CUDA tensors staying CUDA tensors,
  part of the CUDA piece, is on in both);
- ``after``: the whole shim.

Every liger op here is correct (it is released and tested on GPUs), so every failure is
the CPU's; the target is none after. ``--child gpu`` runs the same cases compiled on a
real GPU, without the shim, to confirm the tolerances hold there.

``--checkout liger=PATH`` / ``--checkout fla=PATH`` (git clones of Liger-Kernel and
flash-linear-attention) first run cases of those projects' own suites whose CPU verdict
is not a GPU's (``REAL_CASES``): clean tests that fail on the CPU and a historic bug,
put back, that passes there; the trees are made as the historic-bug benchmark makes
them (a project without a checkout is skipped)::

    .venv/bin/python benchmarks/cpu_truth_bench.py [--checkout liger=PATH] [--checkout fla=PATH]
    python benchmarks/cpu_truth_bench.py --child gpu     # on a machine with a GPU
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

#: (column, activation dtype, parameter dtype, autocast dtype or None)
CONFIGS = (
    ("fp32", "float32", "float32", None),
    ("fp16", "float16", "float16", None),
    ("bf16", "bfloat16", "bfloat16", None),
    ("autocast fp16", "float16", "float32", "float16"),
    ("autocast bf16", "bfloat16", "float32", "bfloat16"),
)
#: (atol, rtol) by the dtype the value was computed in (under autocast: the autocast
#: dtype), about what liger's GPU tests allow.
TOLERANCES = {"float32": (1e-4, 1e-4), "float16": (1e-2, 1e-2), "bfloat16": (1e-1, 5e-2)}

Pairs = list[tuple[str, Any, Any]]  # (what, liger's value, torch's value)
Op = Callable[[Any, Any], Pairs]  # (activation dtype, parameter dtype) -> pairs


def _torch() -> Any:
    import torch

    return torch


def leaf(*shape: int, dtype: Any, scale: float = 1.0) -> Any:
    torch = _torch()
    return (torch.randn(*shape, device="cuda") * scale).to(dtype).requires_grad_()


def twin(tensor: Any) -> Any:
    """The reference's copy of ``tensor``: a CUDA leaf, as the test's own tensors are."""
    return tensor.detach().to("cuda", copy=True).requires_grad_()


def grads(out: Any, ref: Any, inputs: list[Any], ref_inputs: list[Any]) -> Pairs:
    """Gradients of both sides for the same upstream gradient."""
    torch = _torch()
    upstream = torch.randn_like(ref)
    ours = torch.autograd.grad(out, inputs, upstream.to(out.dtype))
    theirs = torch.autograd.grad(ref, ref_inputs, upstream)
    return [(f"grad {i}", a, b) for i, (a, b) in enumerate(zip(ours, theirs, strict=True))]


def rms_norm(dtype: Any, param: Any) -> Pairs:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    torch = _torch()
    x, w = leaf(4, 64, dtype=dtype), leaf(64, dtype=param)
    xr, wr = twin(x), twin(w)
    out = LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False)
    wide = xr.to(torch.float32)  # transformers' LlamaRMSNorm
    ref = wr * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)).to(xr.dtype)
    return [("out", out, ref), *grads(out, ref, [x, w], [xr, wr])]


def layer_norm(dtype: Any, param: Any) -> Pairs:
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    torch = _torch()
    x, w, b = leaf(4, 64, dtype=dtype), leaf(64, dtype=param), leaf(64, dtype=param)
    xr, wr, br = twin(x), twin(w), twin(b)
    out = LigerLayerNormFunction.apply(x, w, b, 1e-5)
    ref = torch.nn.functional.layer_norm(xr, (64,), wr, br, 1e-5)
    return [("out", out, ref), *grads(out, ref, [x, w, b], [xr, wr, br])]


def swiglu(dtype: Any, param: Any) -> Pairs:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    torch = _torch()
    a, b = leaf(4, 64, dtype=dtype), leaf(4, 64, dtype=dtype)
    ar, br = twin(a), twin(b)
    out = LigerSiLUMulFunction.apply(a, b)
    ref = torch.nn.functional.silu(ar) * br
    return [("out", out, ref), *grads(out, ref, [a, b], [ar, br])]


def geglu(dtype: Any, param: Any) -> Pairs:
    from liger_kernel.ops.geglu import LigerGELUMulFunction

    torch = _torch()
    a, b = leaf(4, 64, dtype=dtype), leaf(4, 64, dtype=dtype)
    ar, br = twin(a), twin(b)
    out = LigerGELUMulFunction.apply(a, b)
    ref = torch.nn.functional.gelu(ar, approximate="tanh") * br
    return [("out", out, ref), *grads(out, ref, [a, b], [ar, br])]


def softmax(dtype: Any, param: Any) -> Pairs:
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    torch = _torch()
    x = leaf(4, 64, dtype=dtype)
    xr = twin(x)
    out = LigerSoftmaxFunction.apply(x)
    ref = torch.softmax(xr, -1)
    return [("out", out, ref), *grads(out, ref, [x], [xr])]


def cross_entropy(dtype: Any, param: Any) -> Pairs:
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

    torch = _torch()
    logits = leaf(8, 128, dtype=dtype)
    target = torch.randint(0, 128, (8,), device="cuda")
    target[3] = -100
    reference = twin(logits)  # before the call: liger writes gradients into its input
    loss = LigerCrossEntropyFunction.apply(logits, target, None)[0]
    ref = torch.nn.functional.cross_entropy(reference, target, ignore_index=-100)
    loss.backward()
    ref.backward()
    return [("loss", loss, ref), ("grad", logits.grad, reference.grad)]


def fused_linear_cross_entropy(dtype: Any, param: Any) -> Pairs:
    from liger_kernel.ops.fused_linear_cross_entropy import (
        LigerFusedLinearCrossEntropyFunction,
    )

    torch = _torch()
    x, w = leaf(8, 32, dtype=dtype), leaf(128, 32, dtype=param, scale=0.2)
    xr, wr = twin(x), twin(w)
    target = torch.randint(0, 128, (8,), device="cuda")
    loss = LigerFusedLinearCrossEntropyFunction.apply(x, w, target)[0]
    ref = torch.nn.functional.cross_entropy(torch.nn.functional.linear(xr, wr), target)
    return [("loss", loss, ref), *grads(loss, ref, [x, w], [xr, wr])]


def dyt(dtype: Any, param: Any) -> Pairs:
    from liger_kernel.ops.dyt import LigerDyTFunction

    torch = _torch()
    x, alpha = leaf(4, 64, dtype=dtype), leaf(1, dtype=param)
    gamma, beta = leaf(64, dtype=param), leaf(64, dtype=param)
    refs = [twin(t) for t in (x, alpha, gamma, beta)]
    out = LigerDyTFunction.apply(x, alpha, gamma, beta)
    ref = refs[2] * torch.tanh(refs[1] * refs[0]) + refs[3]
    return [("out", out, ref), *grads(out, ref, [x, alpha, gamma, beta], refs)]


def group_norm(dtype: Any, param: Any) -> Pairs:
    from liger_kernel.ops.group_norm import LigerGroupNormFunction

    torch = _torch()
    x, w, b = leaf(2, 8, 16, dtype=dtype), leaf(8, dtype=param), leaf(8, dtype=param)
    xr, wr, br = twin(x), twin(w), twin(b)
    out = LigerGroupNormFunction.apply(x, w, b, 8, 4, 1e-5)
    ref = torch.nn.functional.group_norm(xr, 4, wr, br, 1e-5)
    return [("out", out, ref), *grads(out, ref, [x, w, b], [xr, wr, br])]


def kl_div(dtype: Any, param: Any) -> Pairs:
    from liger_kernel.ops.kl_div import LigerKLDivLossFunction

    torch = _torch()
    log_p = torch.randn(4, 64, device="cuda").log_softmax(-1).to(dtype)
    q = torch.randn(4, 64, device="cuda").softmax(-1).to(dtype)
    out = LigerKLDivLossFunction.apply(log_p, q, "batchmean", False, 1e-10)
    return [("loss", out, torch.nn.functional.kl_div(log_p, q, reduction="batchmean"))]


def rope(dtype: Any, param: Any) -> Pairs:
    from liger_kernel.ops.rope import LigerRopeFunction

    torch = _torch()
    q = torch.randn(2, 4, 8, 16, device="cuda").to(dtype)
    k = torch.randn(2, 2, 8, 16, device="cuda").to(dtype)
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2, device="cuda").float() / 16))
    freqs = torch.arange(8, device="cuda")[None, :, None].float() * inv
    cos = torch.cat([freqs, freqs], -1).cos().to(dtype)
    sin = torch.cat([freqs, freqs], -1).sin().to(dtype)

    def rotated(t: Any) -> Any:
        return t * cos[:, None] + torch.cat([-t[..., 8:], t[..., :8]], -1) * sin[:, None]

    out_q, out_k = LigerRopeFunction.apply(q.clone(), k.clone(), cos, sin)
    return [("q", out_q, rotated(q)), ("k", out_k, rotated(k))]


def lowered(functional: Callable[..., Any], *args: Any, **options: Any) -> Any:
    """``functional`` as CUDA autocast runs a lower-precision op (linear, conv): its
    tensor inputs cast to the autocast dtype; outside autocast, as it is."""
    torch = _torch()
    if not torch.is_autocast_enabled("cuda"):
        return functional(*args, **options)
    low = torch.get_autocast_dtype("cuda")
    with torch.autocast("cuda", enabled=False):
        return functional(*(arg.to(low) for arg in args), **options)


def module_pairs(module: Any, x: Any, reference: Callable[..., Any]) -> Pairs:
    """``module(x)`` against ``reference(x, *parameters)`` on twin leaves: the output and
    the ``.grad`` of the input and of every parameter, for the same upstream gradient."""
    torch = _torch()
    params = list(module.parameters())
    refs = [twin(t) for t in (x, *params)]
    out = module(x)
    ref = reference(*refs)
    upstream = torch.randn_like(ref)
    out.backward(upstream.to(out.dtype))
    ref.backward(upstream)
    ours = [t.grad for t in (x, *params)]
    return [("out", out, ref),
            *((f"grad {i}", a, b.grad) for i, (a, b) in enumerate(zip(ours, refs, strict=True)))]


def linear(dtype: Any, param: Any) -> Pairs:
    torch = _torch()
    module = torch.nn.Linear(32, 16, bias=False, device="cuda", dtype=param)
    return module_pairs(module, leaf(4, 32, dtype=dtype),
                        lambda x, w: lowered(torch.nn.functional.linear, x, w))


def conv1d(dtype: Any, param: Any) -> Pairs:
    torch = _torch()
    module = torch.nn.Conv1d(8, 4, 3, padding=1, bias=False, device="cuda", dtype=param)
    return module_pairs(module, leaf(2, 8, 16, dtype=dtype),
                        lambda x, w: lowered(torch.nn.functional.conv1d, x, w, padding=1))


def conv2d(dtype: Any, param: Any) -> Pairs:
    torch = _torch()
    module = torch.nn.Conv2d(3, 4, 3, bias=False, device="cuda", dtype=param)
    return module_pairs(module, leaf(2, 3, 8, 8, dtype=dtype),
                        lambda x, w: lowered(torch.nn.functional.conv2d, x, w))


def moved_modules(dtype: Any, param: Any) -> Pairs:
    """Modules made on the CPU and moved with ``.cuda()``, as most model code does."""
    torch = _torch()
    functional = torch.nn.functional
    module = torch.nn.Sequential(
        torch.nn.Conv1d(8, 8, 3, padding=1, bias=False), torch.nn.Flatten(),
        torch.nn.Linear(128, 16, bias=False),
    ).to(param).cuda()

    def reference(x: Any, conv_w: Any, linear_w: Any) -> Any:
        hidden = lowered(functional.conv1d, x, conv_w, padding=1)
        return lowered(functional.linear, hidden.flatten(1), linear_w)

    return module_pairs(module, leaf(4, 8, 16, dtype=dtype), reference)


def lm_head_cross_entropy(dtype: Any, param: Any) -> Pairs:
    """liger's fused loss on a bias-free ``nn.Linear`` head, against the head and torch's
    loss: the shape of liger's own ``test_amp``."""
    from liger_kernel.transformers.fused_linear_cross_entropy import (
        LigerFusedLinearCrossEntropyLoss,
    )

    torch = _torch()
    head = torch.nn.Linear(32, 128, bias=False, dtype=param).cuda()
    with torch.no_grad():
        head.weight.mul_(0.2)
    x = leaf(8, 32, dtype=dtype)
    xr, wr = twin(x), twin(head.weight)
    target = torch.randint(0, 128, (8,), device="cuda")
    loss = LigerFusedLinearCrossEntropyLoss()(head.weight, x, target)
    ref = torch.nn.functional.cross_entropy(lowered(torch.nn.functional.linear, xr, wr), target)
    loss.backward()
    ref.backward()
    return [("loss", loss, ref), ("grad x", x.grad, xr.grad),
            ("grad w", head.weight.grad, wr.grad)]


@functools.cache
def partial_column_sums() -> Any:
    """``out[p] = sum of x * g over the rows of program p``: a Triton kernel made on first
    use, after the child has set ``TRITON_INTERPRET``."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x_ptr, g_ptr, out_ptr, n_rows, n_cols, rows_per_program, BLOCK: tl.constexpr):
        program = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < n_cols
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        end = tl.minimum((program + 1) * rows_per_program, n_rows)
        for row in range(program * rows_per_program, end):
            x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + row * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
            acc += x * g
        tl.store(out_ptr + program * n_cols + cols, acc, mask=mask)

    return kernel


def device_branch(dtype: Any, param: Any) -> Pairs:
    """``x * w`` whose backward sums the weight's gradient in one partial row per SM on a
    GPU and in one row elsewhere, as liger's norms do: the devices its backward sees must
    be the GPU's, or the GPU path is never run."""
    import triton

    torch = _torch()
    seen: list[str] = []

    class ScaleColumns(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, w: Any) -> Any:
            y = x * w
            ctx.save_for_backward(x, w, y)
            return y

        @staticmethod
        def backward(ctx: Any, grad_y: Any) -> Any:
            x, w, y = ctx.saved_tensors
            seen.extend(t.device.type for t in (x, w, y, grad_y))
            sm_count = 1
            if x.device.type == "cuda":
                sm_count = torch.cuda.get_device_properties(x.device).multi_processor_count
            grad_y = grad_y.contiguous()
            n_rows, n_cols = x.shape
            partial = torch.empty(sm_count, n_cols, dtype=torch.float32, device=w.device)
            partial_column_sums()[(sm_count,)](
                x, grad_y, partial, n_rows, n_cols, triton.cdiv(n_rows, sm_count),
                BLOCK=triton.next_power_of_2(n_cols))
            return grad_y * w, partial.sum(0).to(w.dtype)

    x, w = leaf(200, 64, dtype=dtype), leaf(64, dtype=param)
    xr, wr = twin(x), twin(w)
    out = ScaleColumns.apply(x, w).tanh()  # grad_y then comes from torch's own backward
    ref = (xr * wr).tanh()
    pairs = [("out", out, ref), *grads(out, ref, [x, w], [xr, wr])]
    if seen != ["cuda"] * 4:
        raise AssertionError(f"backward saw devices {seen} (x, w, y, grad_y); a GPU: cuda")
    return pairs


@functools.cache
def hardswish_kernels() -> tuple[Any, Any]:
    """Hard-swish and its gradient as a GPU library writes them (the gradient on the
    closed band ``[-3, 3]``, as CUDA's ``hardswish_backward``); made on first use."""
    import triton
    import triton.language as tl

    @triton.jit
    def forward(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
        y = x * tl.minimum(tl.maximum(x + 3.0, 0.0), 6.0) / 6.0
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def backward(x_ptr, dy_ptr, dx_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
        dy = tl.load(dy_ptr + offsets, mask=mask).to(tl.float32)
        dx = tl.where(x < -3.0, 0.0, tl.where(x <= 3.0, dy * (x / 3.0 + 0.5), dy))
        tl.store(dx_ptr + offsets, dx.to(dx_ptr.dtype.element_ty), mask=mask)

    return forward, backward


def hardswish(dtype: Any, param: Any) -> Pairs:
    """A Triton hard-swish against ``F.hardswish`` on inputs with values of exactly -3 and
    3, as ``randn`` activations in fp16 / bf16 have them: the reference's gradient must be
    CUDA's there."""
    import triton

    torch = _torch()
    forward, backward = hardswish_kernels()

    class HardSwish(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any) -> Any:
            y = torch.empty_like(x)
            forward[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
            ctx.save_for_backward(x)
            return y

        @staticmethod
        def backward(ctx: Any, dy: Any) -> Any:
            (x,) = ctx.saved_tensors
            dx = torch.empty_like(x)
            backward[(triton.cdiv(x.numel(), 256),)](x, dy.contiguous(), dx, x.numel(),
                                                     BLOCK=256)
            return dx

    x = leaf(8, 96, dtype=dtype, scale=3.0)
    with torch.no_grad():
        x.view(-1)[::7] = 3.0
        x.view(-1)[3::11] = -3.0
    xr = twin(x)
    out, ref = HardSwish.apply(x), torch.nn.functional.hardswish(xr)
    return [("out", out, ref), *grads(out, ref, [x], [xr])]


OPS: dict[str, Op] = {
    fn.__name__: fn
    for fn in (rms_norm, layer_norm, swiglu, geglu, softmax, cross_entropy,
               fused_linear_cross_entropy, dyt, group_norm, kl_div, rope,
               linear, conv1d, conv2d, moved_modules, lm_head_cross_entropy, device_branch,
               hardswish)
}


def check(pairs: Pairs, *, autocast: str | None) -> None:
    """Each liger value within the tolerance of the dtype it was computed in, and of the
    reference's dtype, with two allowances that hold on any device: outside autocast a
    fp16 / bf16 loss may come back in fp32 (liger returns fp32 losses by design); under
    autocast a liger op may return its input's dtype where CUDA autocast widens torch's
    reference op to fp32 (a custom autograd Function is not autocast). A reference
    *narrower* than liger's result is a cast CUDA autocast would have made: a failure.
    """
    torch = _torch()
    for what, ours, theirs in pairs:
        atol, rtol = TOLERANCES[autocast or str(theirs.dtype).removeprefix("torch.")]
        if autocast and theirs.dtype == torch.float32 and ours.dtype != theirs.dtype:
            theirs = theirs.to(ours.dtype)
        loss = what == "loss" and ours.dtype == torch.float32 and not autocast
        try:
            torch.testing.assert_close(ours, theirs, atol=atol, rtol=rtol, check_dtype=not loss)
        except AssertionError as error:
            raise AssertionError(f"{what}: {error}") from None


def run_case(op: str, config: tuple[str, str, str, str | None], seed: int) -> dict[str, Any]:
    torch = _torch()
    torch.manual_seed(seed)
    _, activations, parameters, autocast = config
    dtype, param = getattr(torch, activations), getattr(torch, parameters)
    started = time.perf_counter()
    try:
        if autocast is None:
            check(OPS[op](dtype, param), autocast=None)
        else:
            with torch.autocast("cuda", dtype=getattr(torch, autocast)):
                pairs = OPS[op](dtype, param)
            check(pairs, autocast=autocast)
        error = ""
    except Exception as exc:  # a failing case is the data, not a crash
        error = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
    return {"op": op, "error": error, "seconds": time.perf_counter() - started}


def _install_old_shim() -> None:
    """The shim before this round: no autocast or bf16 emulation, bf16 still announced,
    CPU-less ``out_dtype`` matmuls raising."""
    import torch

    from pytest_kernelfix import shim
    from pytest_kernelfix.shim import cuda_ops

    shim.install(autocast=False, bf16=False)
    torch.cuda.is_bf16_supported = lambda including_emulation=True: True
    cuda_ops.needs_emulation = lambda func, kwargs, args=(): False


def child(mode: str) -> None:
    """Run every case in this process with the shim of ``mode``; one JSON line each."""
    if mode in ("before", "after"):
        os.environ["TRITON_INTERPRET"] = "1"  # before liger's kernels are imported
        from pytest_kernelfix import shim

        if mode == "after":
            shim.install()
        else:
            _install_old_shim()
    for index, config in enumerate(CONFIGS):
        for number, op in enumerate(OPS):
            result = run_case(op, config, seed=100 * index + number)
            print(json.dumps({"mode": mode, "column": config[0], **result}), flush=True)


def run_child(mode: str) -> tuple[list[dict[str, Any]], float]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-W", "ignore", __file__, "--child", mode],
                          capture_output=True, text=True, check=False)
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or len(rows) != len(CONFIGS) * len(OPS):
        raise SystemExit(f"the {mode} run stopped: {done.stderr[-3000:]}")
    return rows, time.perf_counter() - started


def table(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    modes = list(results)
    lines = ["| inputs | cases | " + " | ".join(f"pass {mode}" for mode in modes) + " |",
             "|---|---:|" + "---:|" * len(modes)]
    for column, *_ in CONFIGS:
        counts = [sum(not r["error"] for r in results[mode] if r["column"] == column)
                  for mode in modes]
        cases = sum(r["column"] == column for r in results[modes[0]])
        lines.append(f"| {column} | {cases} | " + " | ".join(map(str, counts)) + " |")
    totals = [sum(not r["error"] for r in results[mode]) for mode in modes]
    lines.append(f"| all | {len(results[modes[0]])} | " + " | ".join(map(str, totals)) + " |")
    return lines


#: Real suites whose verdict on the CPU was not a GPU's, met while mining historic bugs
#: (the fla conv and log-linear ones pass since the scalars piece reads integer masks as
#: booleans and makes loop indices tensors):
#: (what, project, fix commit put back or None for the clean tree, pytest arguments,
#: what a GPU gives, why the CPU differs).
REAL_CASES = (
    ("liger GEGLU MLP vs transformers' LlamaMLP, bf16, clean tree", "liger", None,
     ("test/transformers/test_geglu.py::test_correctness[dtype1-0.01-0.01-9-41-341-4231]",),
     "pass",
     "bf16 MLP outputs and weight gradients compared with atol 1e-2: the reference's own "
     "bf16 GEMMs round and sum differently on the CPU than cuBLAS does"),
    ("liger cross entropy true-class gradient in bf16/fp16, fix be1cdc17 reverted", "liger",
     "be1cdc17",
     ("test/transformers/test_cross_entropy.py", "-k", "true_class_grad_confident"),
     "fail",
     "the regression loses the true-class gradient to rounding in the low-precision "
     "buffer; the test's own low-precision tolerances hide it on the CPU"),
    ("fla causal conv1d backward with a cache, fp32, clean tree", "fla", None,
     ("tests/modules/test_conv.py::test_conv_cache_backward"
      "[B1_T1_D64_W3_has_biasTrue_has_residualTrue_activationswish_torch.float32]",),
     "pass",
     "the Triton interpreter refuses a load mask of an integer dtype "
     "(ValueError: mask has unsupported dtype), which the GPU compiler accepts"),
    ("fla log-linear attention, partial last chunk, fp32, clean tree", "fla", None,
     ("tests/ops/test_log_linear_attn.py::test_chunk_partial_last_chunk"
      "[B1-T70-H4-D64-torch.float32]",),
     "pass",
     "a loop index is a Python int on the interpreter, a tensor when compiled: "
     "`i.to(tl.int64)` raises AttributeError: 'int' object has no attribute 'to'"),
    ("fla GRPO loss with old log-probabilities, fp32, clean tree", "fla", None,
     ("tests/modules/test_grpo.py::test_grpo_loss_with_old_logps[unclipped-dtype0]",),
     "pass",
     "torch.compile'd code on the shim's CUDA tensors: dynamo's CUDA device interface "
     "calls torch._C._cuda_getDevice, which a CPU build of torch lacks"),
)


def real_cases(checkouts: dict[str, str], work: str) -> None:
    """Run the real suites' cases (projects without a checkout are skipped) and say
    whether the CPU gives a GPU's verdict."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import historic_bench

    projects, _ = historic_bench.load()
    print("| real suite case | a GPU | the CPU shim | seconds |")
    print("|---|---|---|---:|")
    for what, name, fix, selection, gpu, why in REAL_CASES:
        checkout = checkouts.get(name)
        if checkout is None or not Path(checkout, ".git").exists():
            print(f"| {what} | {gpu} | skipped: no checkout of {name} | |")
            continue
        project = projects[name]
        tree = historic_bench.clean_tree(project, Path(checkout), Path(work))
        if fix is not None:  # the historic bugs put back here are liger's cross entropy
            files = ("src/liger_kernel/ops/cross_entropy.py",)
            bug = historic_bench.HistoricBug(name=f"cpu-truth-{fix}", project=name, fix=fix,
                                             files=files, tests=(), description=why)
            tree = historic_bench.bugged_tree(bug, tree, Path(checkout), Path(work))
        run = historic_bench.run_plain(project, tree, selection)
        cpu = "pass" if run.failed == 0 and run.passed else f"fail ({run.failed} failed)"
        print(f"| {what} | {gpu} | {cpu} | {run.seconds:.0f} |")
        if (cpu == "pass") != (gpu == "pass"):
            print(f"|   why: {why} | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=("before", "after", "gpu"))
    parser.add_argument("--only", choices=("before", "after"))
    parser.add_argument("--checkout", action="append", default=[], metavar="PROJECT=PATH",
                        help="also run the real suites' cases of this project (liger, fla)")
    parser.add_argument("--work", default="/tmp/kernelfix-cpu-truth",
                        help="where the real suites' trees are made")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    if args.checkout:
        real_cases(dict(value.split("=", 1) for value in args.checkout), args.work)
        print()
    modes = [args.only] if args.only else ["before", "after"]
    results: dict[str, list[dict[str, Any]]] = {}
    for mode in modes:
        results[mode], seconds = run_child(mode)
        print(f"{mode}: {len(results[mode])} cases in {seconds:.1f} s")
    print()
    print("\n".join(table(results)))
    for mode in modes:
        failures = [r for r in results[mode] if r["error"]]
        print(f"\nfailures {mode}: {len(failures)}")
        for r in failures:
            print(f"  {r['column']:>13} {r['op']:<27} {r['error'][:150]}")


if __name__ == "__main__":
    main()
