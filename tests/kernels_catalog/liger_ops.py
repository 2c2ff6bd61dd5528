"""Run real liger-kernel ops on the Triton interpreter and compare them with torch.

Test data for ``tests/test_liger.py``, run as a script in a fresh interpreter::

    python liger_ops.py            # shim installed, tensors on device="cuda"
    python liger_ops.py --no-shim  # plain interpreter, tensors on the CPU

It prints one JSON object: op name -> "ok" or the error, plus "_launches": the Triton
kernels each op launched (an op that silently fell back to torch would launch none),
and with the shim "_gate": each distinct launch compiled for an H100 by the gate.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from pytest_kernelfix.capture.launches import KernelLaunch, LaunchRecorder

DEVICE = "cuda"  # main() switches to "cpu" without the shim
close = torch.testing.assert_close


def leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE, requires_grad=True)


def twin(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone().requires_grad_(t.requires_grad)


def check_grads(
    ours: torch.Tensor, ref: torch.Tensor, inputs: list[torch.Tensor],
    ref_inputs: list[torch.Tensor], tol: float = 1e-4,
) -> None:
    grad = torch.randn_like(ref)
    for got, want in zip(
        torch.autograd.grad(ours, inputs, grad), torch.autograd.grad(ref, ref_inputs, grad),
        strict=True,
    ):
        close(got, want, rtol=tol, atol=tol)


def rms_norm() -> None:
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    x, w = leaf(4, 64), leaf(64)
    xr, wr = twin(x), twin(w)
    y = LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False)
    ref = xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6) * wr
    close(y, ref)
    check_grads(y, ref, [x, w], [xr, wr])


def swiglu() -> None:
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    a, b = leaf(4, 64), leaf(4, 64)
    ar, br = twin(a), twin(b)
    y = LigerSiLUMulFunction.apply(a, b)
    ref = F.silu(ar) * br
    close(y, ref)
    check_grads(y, ref, [a, b], [ar, br])


def geglu() -> None:
    from liger_kernel.ops.geglu import LigerGELUMulFunction

    a, b = leaf(4, 64), leaf(4, 64)
    ar, br = twin(a), twin(b)
    y = LigerGELUMulFunction.apply(a, b)
    ref = F.gelu(ar, approximate="tanh") * br
    close(y, ref)
    check_grads(y, ref, [a, b], [ar, br])


def layer_norm() -> None:
    from liger_kernel.ops.layer_norm import LigerLayerNormFunction

    x, w, b = leaf(4, 64), leaf(64), leaf(64)
    xr, wr, br = twin(x), twin(w), twin(b)
    y = LigerLayerNormFunction.apply(x, w, b, 1e-5)
    ref = F.layer_norm(xr, (64,), wr, br, 1e-5)
    close(y, ref)
    check_grads(y, ref, [x, w, b], [xr, wr, br])


def cross_entropy() -> None:
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

    logits = leaf(8, 128)
    target = torch.randint(0, 128, (8,), device=DEVICE)
    target[3] = -100  # an ignored token
    ref_logits = twin(logits)  # before the call: liger writes gradients into its input
    loss = LigerCrossEntropyFunction.apply(logits, target, None)[0]
    ref = F.cross_entropy(ref_logits, target, ignore_index=-100)
    close(loss, ref)
    loss.backward()
    ref.backward()
    close(logits.grad, ref_logits.grad)


def cross_entropy_softcap() -> None:
    from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction

    logits = torch.randn(8, 128, device=DEVICE) * 40
    target = torch.randint(0, 128, (8,), device=DEVICE)
    ref = F.cross_entropy(30.0 * torch.tanh(logits / 30.0), target)
    loss = LigerCrossEntropyFunction.apply(logits, target, None, -100, 0.0, 0.0, "mean", 30.0)
    close(loss[0], ref)


def dyt() -> None:
    from liger_kernel.ops.dyt import LigerDyTFunction

    x, alpha, gamma, beta = leaf(4, 64), leaf(1), leaf(64), leaf(64)
    refs = [twin(t) for t in (x, alpha, gamma, beta)]
    y = LigerDyTFunction.apply(x, alpha, gamma, beta)
    ref = refs[2] * torch.tanh(refs[1] * refs[0]) + refs[3]
    close(y, ref)
    check_grads(y, ref, [x, alpha, gamma, beta], refs)


def softmax() -> None:
    from liger_kernel.ops.softmax import LigerSoftmaxFunction

    x = leaf(4, 64)
    xr = twin(x)
    y = LigerSoftmaxFunction.apply(x)
    ref = torch.softmax(xr, -1)
    close(y, ref)
    check_grads(y, ref, [x], [xr])


def group_norm() -> None:
    from liger_kernel.ops.group_norm import LigerGroupNormFunction

    x, w, b = leaf(2, 8, 16), leaf(8), leaf(8)
    xr, wr, br = twin(x), twin(w), twin(b)
    y = LigerGroupNormFunction.apply(x, w, b, 8, 4, 1e-5)
    ref = F.group_norm(xr, 4, wr, br, 1e-5)
    close(y, ref)
    check_grads(y, ref, [x, w, b], [xr, wr, br])


def kl_div() -> None:
    from liger_kernel.ops.kl_div import LigerKLDivLossFunction

    p = torch.randn(4, 64, device=DEVICE).log_softmax(-1)
    q = torch.randn(4, 64, device=DEVICE).softmax(-1)
    y = LigerKLDivLossFunction.apply(p, q, "batchmean", False, 1e-10)
    close(y, F.kl_div(p, q, reduction="batchmean"))


def rope() -> None:
    from liger_kernel.ops.rope import LigerRopeFunction

    q, k = torch.randn(2, 4, 8, 16, device=DEVICE), torch.randn(2, 2, 8, 16, device=DEVICE)
    inv = 1.0 / (10000 ** (torch.arange(0, 16, 2, device=DEVICE).float() / 16))
    freqs = torch.arange(8, device=DEVICE)[None, :, None].float() * inv
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()

    def rotated(t: torch.Tensor) -> torch.Tensor:
        return t * cos[:, None] + torch.cat([-t[..., 8:], t[..., :8]], -1) * sin[:, None]

    out_q, out_k = LigerRopeFunction.apply(q.clone(), k.clone(), cos, sin)
    close(out_q, rotated(q))
    close(out_k, rotated(k))


OPS: dict[str, Callable[[], None]] = {
    fn.__name__: fn
    for fn in (
        rms_norm, swiglu, geglu, layer_norm, cross_entropy, cross_entropy_softcap, dyt,
        softmax, group_norm, kl_div, rope,
    )
}


def main() -> None:
    global DEVICE
    os.environ["TRITON_INTERPRET"] = "1"  # before liger's kernels are imported (in the ops)
    if "--no-shim" in sys.argv:
        DEVICE = "cpu"
    else:
        from pytest_kernelfix import shim

        shim.install()
    torch.manual_seed(0)
    recorder = LaunchRecorder()
    results: dict[str, object] = {}
    launches: dict[str, list[str]] = {}
    kernels: dict[KernelLaunch, Any] = {}
    with recorder.recording():
        for name, op in OPS.items():
            recorder.reset()
            try:
                op()
                results[name] = "ok"
            except Exception as exc:  # reported to the test, not raised
                results[name] = f"{type(exc).__name__}: {exc}"[:500]
            launches[name] = sorted({launch.name for launch in recorder.launches()})
            kernels.update(recorder.kernels)
    results["_launches"] = launches
    if DEVICE == "cuda":
        results["_gate"] = gate_all(kernels)
    print(json.dumps(results))


def gate_all(kernels: dict[KernelLaunch, Any]) -> list[dict[str, Any]]:
    import tempfile

    from pytest_kernelfix.rerun.probes.gate import compile_launches, parse_target

    with tempfile.TemporaryDirectory() as cache_dir:
        verdicts = compile_launches(kernels, parse_target("cuda:90"), cache_dir=cache_dir)
    return [verdict.to_json() for verdict in verdicts]


if __name__ == "__main__":
    main()
