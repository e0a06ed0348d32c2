"""``torch.autocast('neuron', dtype=torch.bfloat16)``: CUDA's autocast policy, op for op.

PyTorch ships autocast kernels for CUDA/CPU/XPU/MPS/... but none for the PrivateUse1 autocast key,
so every op would fail with "Could not run ... 'Autocastneuron' backend". A C++ PrivateUse1
backend registers ``KERNEL_PRIVATEUSEONE`` over the op lists in ``ATen/autocast_mode.h`` (the
lists CUDA uses); these are those lists, with the same four policies:

- ``LOWER_PRECISION`` (matmuls, convolutions, RNN cells, attention): floating inputs cast to the
  autocast dtype;
- ``FP32`` (pointwise ops that lose range, norms, losses, upsampling): floating inputs cast to
  float32, so a loss computed under autocast is float32 as on CUDA and CPU;
- ``FP32_SET_OPT_DTYPE`` (softmax, log_softmax, sum, cumsum, prod, vector/matrix norms): when the
  first argument is floating and no ``dtype`` was given, ``dtype=torch.float32``;
- ``PROMOTE`` (addcmul, addcdiv, index_put, scatter_add, ...): inputs cast to the widest floating
  dtype among them.

float64 inputs are never cast (as in PyTorch). Every other op falls through.
"""
from __future__ import annotations

import torch

LOWER_PRECISION = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu",
    "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm",
    "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
    "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss",
    "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss", "multilabel_margin_loss",
    "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
    "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum",
    "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum",
    "sum.dim_IntList",
)
PROMOTE = ("addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
           "index_put", "tensordot", "scatter_add")
_KEY = "AutocastPrivateUse1"
_libs: list = []
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


def _eligible(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != torch.float64


def _cast(x, dtype):
    if _eligible(x):
        return x.to(dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _to(dtype_of):
    """A kernel casting eligible inputs to ``dtype_of(args, kwargs)`` (None: no cast)."""
    def make(op):
        def kernel(*args, **kwargs):
            dtype = dtype_of(args, kwargs)
            with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
                if dtype is None:
                    return op(*args, **kwargs)
                return op(*_cast(args, dtype), **{k: _cast(v, dtype) for k, v in kwargs.items()})
        return kernel
    return make


def _widest(args, kwargs):
    best = None
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                best = t.dtype if best is None else torch.promote_types(best, t.dtype)
    return best


def _set_opt_dtype(op):
    names = [a.name for a in op._schema.arguments]
    where = names.index("dtype")

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            given = args[where] if len(args) > where else kwargs.get("dtype")
            if given is None and args and _eligible(args[0]):
                if len(args) > where:
                    args = (*args[:where], torch.float32, *args[where + 1:])
                else:
                    kwargs = dict(kwargs, dtype=torch.float32)
            return op(*args, **kwargs)
    return kernel


_POLICIES = (
    (LOWER_PRECISION, _to(lambda a, k: torch.get_autocast_dtype("neuron"))),
    (FP32, _to(lambda a, k: torch.float32)),
    (FP32_SET_OPT_DTYPE, _set_opt_dtype),
    (PROMOTE, _to(_widest)),
)


def register() -> None:
    lib = torch.library.Library("aten", "IMPL")
    fb = torch.library.Library("_", "IMPL")
    fb.fallback(torch.library.fallthrough_kernel, dispatch_key=_KEY)
    for names, make in _POLICIES:
        for name in names:
            base, _, overload = name.partition(".")
            op = getattr(getattr(torch.ops.aten, base, None), overload or "default", None)
            if op is None:
                continue
            lib.impl(name if overload else base, make(op), _KEY)
    _libs.extend([lib, fb])
