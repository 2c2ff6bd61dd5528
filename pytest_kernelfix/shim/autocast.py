"""CUDA autocast for the tensors the CUDA piece keeps on the CPU.

Under the shim ``torch.autocast("cuda")`` turns CUDA autocast on (``torch.cuda`` says a
GPU is there), so a kernel library that asks ``torch.is_autocast_enabled`` returns what
it would on a GPU. The torch reference ops, though, run on CPU tensors, which CUDA
autocast never casts: references come out in fp32 where a GPU gives fp16, and mixed
inputs fail (``mat1 and mat2 must have the same dtype``). CPU autocast is no substitute:
its op lists differ from CUDA's.

This piece applies CUDA's cast policies, per op, to the tensors the CUDA piece marks as
CUDA tensors, from the CUDA piece's ``TorchFunctionMode`` (which sees every torch call).
The op lists follow ``aten/src/ATen/autocast_mode.h`` and the "Autocast Op Reference" of
the torch docs; ``tests/test_shim_autocast.py`` checks them against the ops the installed
torch registers for ``AutocastCUDA``, so a torch that adds one is noticed.

Limit: the mode sees the outermost torch call only. Python-level composites the docs
name (``cross_entropy``, ``normalize``, ``softmin``, ``interpolate``...) are listed here;
a C++ composite that calls a listed op internally (``pairwise_distance`` calls ``norm``)
and torch calls made inside a Python composite not listed here are not cast.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

LOWER = "lower_precision_fp"  # cast floating inputs to the autocast dtype (fp16 by default)
FP32 = "fp32"  # cast floating inputs to fp32
FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"  # fp32 unless a dtype is given or input 0 is not
FP32_APPEND_DTYPE = "fp32_append_dtype"  # fp32 output when input 0 is eligible (norm)
PROMOTE = "promote"  # run at the widest floating type among the inputs
BANNED = "banned"  # raises under CUDA autocast

#: aten ops with an ``AutocastCUDA`` kernel, by policy (overloads share their base name).
ATEN_POLICIES: Mapping[str, str] = {
    **dict.fromkeys((
        "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
        "conv_transpose2d", "conv_transpose3d", "convolution", "cudnn_convolution",
        "cudnn_convolution_transpose", "prelu", "addmm", "addmv", "addr", "matmul", "einsum",
        "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
        "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell",
        "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
        "scaled_dot_product_attention",
    ), LOWER),
    **dict.fromkeys((
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
        "reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm",
        "native_layer_norm", "group_norm", "rms_norm", "frobenius_norm", "nuclear_norm",
        "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
        "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss",
        "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
        "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
        "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
        "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
        "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
        "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
        "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
    ), FP32),
    **dict.fromkeys((
        "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
        "linalg_matrix_norm", "sum",
    ), FP32_SET_OPT_DTYPE),
    "norm": FP32_APPEND_DTYPE,
    **dict.fromkeys((
        "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
        "index_put", "tensordot", "scatter_add",
    ), PROMOTE),
    "binary_cross_entropy": BANNED,
}

#: Python-level entry points whose name is not the aten op they end in, or composites
#: the docs list (``__rdiv__`` is ``reciprocal`` then a multiply; ``cross_entropy`` is
#: ``log_softmax`` + ``nll_loss``; ``softmin`` is ``softmax`` of the negation...).
PYTHON_POLICIES: Mapping[str, str] = {
    "__matmul__": LOWER,
    "__rmatmul__": LOWER,
    "multi_dot": LOWER,
    "vecdot": LOWER,
    "__pow__": FP32,
    "__rpow__": FP32,
    "__rdiv__": FP32,
    "__rtruediv__": FP32,
    "cross_entropy": FP32,
    "softmin": FP32,
    "normalize": FP32,
    "vector_norm": FP32_SET_OPT_DTYPE,
    "matrix_norm": FP32_SET_OPT_DTYPE,
    "grid_sample": PROMOTE,
    "interpolate": FP32,
    "upsample": FP32,
    "upsample_nearest": FP32,
    "upsample_bilinear": FP32,
}

POLICIES: Mapping[str, str] = {**ATEN_POLICIES, **PYTHON_POLICIES}

#: ``interpolate`` modes that run an ``upsample_*`` op (``area`` pools instead).
_UPSAMPLING_MODES = frozenset({"nearest", "linear", "bilinear", "bicubic", "trilinear",
                               "nearest-exact"})

BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using "
    "torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast."
)

_state: dict[str, Any] = {}


def policy_of(func: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The CUDA autocast policy of a torch call, or "" when autocast leaves it alone.

    In-place variants (``exp_``) and calls with ``out=`` or ``out_dtype=`` are not
    autocast, as on a GPU.
    """
    name = getattr(func, "__name__", "")
    policy = POLICIES.get(name, "")
    if not policy or kwargs.get("out") is not None or kwargs.get("out_dtype") is not None:
        return ""  # out_dtype selects an overload (mm.dtype...) autocast does not register
    if name in ("interpolate", "upsample"):
        mode = kwargs.get("mode", args[3] if len(args) > 3 else "nearest")
        return policy if mode in _UPSAMPLING_MODES else ""
    return policy


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [tensor for item in value for tensor in _tensors(item)]
    return []


def _cast(value: Any, dtype: Any, eligible: Callable[[Any], bool]) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if eligible(value) and value.dtype != dtype else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(item, dtype, eligible) for item in value)
    return value


def _widest(values: list[Any], lower: Any, eligible: Callable[[Any], bool]) -> Any:
    """CUDA autocast's ``promote_type``: fp32 wins, fp64 is ignored, fp16 + bf16 is an error."""
    import torch

    current = lower
    for tensor in values:
        if not eligible(tensor) or tensor.dtype == torch.float64:
            continue
        if torch.float32 in (current, tensor.dtype):
            current = torch.float32
        elif current != tensor.dtype:
            raise RuntimeError("Unexpected floating ScalarType in at::autocast::prioritize")
    return current


def autocast_inputs(
    func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], eligible: Callable[[Any], bool]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` cast as CUDA autocast casts them for ``func``.

    ``eligible`` says which tensors CUDA autocast would see (the CUDA piece's tensors);
    fp64 and non-floating tensors are never cast. Call only while CUDA autocast is on.
    """
    __tracebackhide__ = True  # a refused cast is the torch call's error, as on a GPU
    import torch

    policy = policy_of(func, args, kwargs)
    if not policy:
        return args, kwargs

    def castable(tensor: Any) -> bool:
        return bool(eligible(tensor) and tensor.is_floating_point()
                    and tensor.dtype != torch.float64)

    if policy == BANNED:
        if any(castable(t) for t in _tensors([*args, *kwargs.values()])):
            raise RuntimeError(BANNED_MESSAGE)
        return args, kwargs
    if policy in (FP32_SET_OPT_DTYPE, FP32_APPEND_DTYPE):
        explicit = any(isinstance(v, torch.dtype) for v in (*args, *kwargs.values()))
        if explicit or not args or not isinstance(args[0], torch.Tensor) or not castable(args[0]):
            return args, kwargs
        return (args[0].to(torch.float32), *args[1:]), kwargs
    if policy == LOWER:
        dtype = torch.get_autocast_dtype("cuda")
    elif policy == FP32:
        dtype = torch.float32
    else:
        tensors = _tensors([*args, *kwargs.values()])
        dtype = _widest(tensors, torch.get_autocast_dtype("cuda"), castable)
    cast_args = tuple(_cast(value, dtype, castable) for value in args)
    cast_kwargs = {key: _cast(value, dtype, castable) for key, value in kwargs.items()}
    return cast_args, cast_kwargs


def enabled() -> bool:
    """Installed, and CUDA autocast is on in this thread."""
    is_enabled = _state.get("is_enabled")
    return bool(is_enabled is not None and is_enabled("cuda"))


def install() -> None:
    import torch

    _state["is_enabled"] = torch.is_autocast_enabled


def uninstall() -> None:
    _state.clear()


def installed() -> bool:
    return bool(_state)
