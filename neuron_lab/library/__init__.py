"""Device kernels written with ``neuron_lab.kernel`` (the NKI analogue), ready to use.

``rms_norm``: a fused RMSNorm (one forward kernel, one backward kernel, autograd) and
``FusedRMSNorm``, a drop-in for ``torch.nn.RMSNorm`` over the last dimension.
"""
from .rms_norm import FusedRMSNorm, rms_norm

__all__ = ["FusedRMSNorm", "rms_norm"]
