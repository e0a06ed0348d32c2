"""ATen ops a fused program calls as they are, not traced into: their meta kernel refuses what
the host's kernel runs, so tracing a region that holds them fails and the whole region would run
per-op.

``aten::_grouped_mm`` (the MoE experts' matmul in Transformers' Mixtral and Qwen2-MoE): its meta
kernel carries CUDA's checks ("Expected inputs of BF16 type") while CPU's kernel computes in
float32 too. Wrapped in a custom op, inductor calls it as an extern kernel (the host's own
``_grouped_mm``) and traces the rest of the region around it; the fake kernel gives the output
sizes of the meta kernel (``_create_grouped_mm_output_tensor``), contiguous, as CPU's.
"""
from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor
_aten = torch.ops.aten


@torch.library.custom_op("neuron_lab::grouped_mm", mutates_args=())
def grouped_mm(a: Tensor, b: Tensor, offs: Optional[Tensor] = None,
               bias: Optional[Tensor] = None, out_dtype: Optional[torch.dtype] = None) -> Tensor:
    return _aten._grouped_mm(a, b, offs, bias, out_dtype)


@grouped_mm.register_fake
def _(a, b, offs=None, bias=None, out_dtype=None):
    if a.dim() == 2:                           # the output sizes of the meta kernel's helper
        size = (offs.size(0), a.size(0), b.size(1)) if b.dim() == 2 else (a.size(0), b.size(-1))
    else:
        size = (a.size(1), b.size(1)) if b.dim() == 2 else (a.size(0), a.size(1), b.size(-1))
    return a.new_empty(size, dtype=out_dtype or a.dtype)


# the ATen overload recorded -> the op the fused program calls instead
EXTERN = {_aten._grouped_mm.default: torch.ops.neuron_lab.grouped_mm.default}
