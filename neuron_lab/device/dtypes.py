"""Trainium's dtype rules.

Trainium2 computes in BF16/FP16/FP32 (FP8 in beta) and integer/bool types; it has no float64 and
no complex. Tensors of those dtypes may exist on the ``neuron`` device (the emulator keeps them),
but every op that touches one is a *fallback*: it runs on the host and is recorded, or raises or
warns according to ``neuron_lab.set_fallback`` (``NEURON_LAB_FALLBACK``).
"""
from __future__ import annotations

import torch

HOST_ONLY = frozenset({torch.float64, torch.complex64, torch.complex128, torch.complex32})

SUPPORTED = frozenset({
    torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool,
})


def reason_for(dtype: torch.dtype) -> str:
    return f"{str(dtype).replace('torch.', '')} is not supported by Trainium"


def fix_for(dtype: torch.dtype) -> str:
    if dtype.is_complex:
        return "keep real and imaginary parts as separate float32 tensors (torch.view_as_real)"
    return "cast to float32 with .float() (or .to(torch.bfloat16))"
