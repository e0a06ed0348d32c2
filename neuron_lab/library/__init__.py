"""Device kernels written with ``neuron_lab.kernel`` (the NKI analogue), ready to use.

``rms_norm``: a fused RMSNorm (one forward kernel, one backward kernel, autograd) and
``FusedRMSNorm``, a drop-in for ``torch.nn.RMSNorm`` over the last dimension.
``flash_attention``: FlashAttention (online softmax over tiles, backward by recompute; causal,
sliding window, GQA/MQA, dropout, packed variable-length sequences), flash_attention.py.
``moe``: mixture-of-experts stages, one kernel each (route, permute, grouped GEMM, unpermute).
Transformers: ``attn_implementation="neuron_attention"`` and ``experts_implementation=
"neuron_moe"`` are registered once Transformers' models are imported (transformers_hooks.py).
Each kernel's bytes and FLOPs are known to the cost model (kernel_costs.py).
"""
from . import kernel_costs as _kernel_costs
from . import moe
from . import transformers_hooks as _transformers_hooks
from .flash_attention import flash_attention
from .rms_norm import FusedRMSNorm, rms_norm

_kernel_costs._register()
_transformers_hooks.install()

__all__ = ["FusedRMSNorm", "rms_norm", "flash_attention", "moe"]
