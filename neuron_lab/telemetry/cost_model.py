"""A Trainium cost model: what a launch would cost on the chip, as a labelled *model*.

No Trainium is reachable from here, so the question "what would this loop cost on trn2?" is
answered with a roofline: a launch (one op run per-op, or one fused region) takes

    modelled_s = launch_overhead_s + max(bytes_moved / hbm_bytes_per_s, flops / peak_flops[dtype])

``ChipParams`` holds the numbers. Published ones carry their source; the rest are listed in
``assumptions`` and are ours (per-launch overhead, collective latency, the FLOP count of a
non-matmul op). Bytes moved: every tensor an op reads and writes goes through HBM once; in a
fused region only the region's inputs and the outputs nothing inside it consumes do (what fusion
saves), each input counted once per use (an upper bound when one tensor feeds several ops).
FLOPs: PyTorch's own formulas (``torch.utils.flop_counter``) for matmul, convolution and
attention; one FLOP per output element for everything else.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch.utils.flop_counter import flop_registry

from ..device import chips as _chips

GiB = 1 << 30
_NEURON_ARCH = ("AWS Neuron documentation, Trainium2 architecture "
                "(awsdocs-neuron.readthedocs-hosted.com: arch/neuron-hardware/trainium2)")
_TRN3 = ("AWS Trainium3 announcement and Neuron documentation (Trainium3 chip: 144 GB HBM3e, "
         "4.9 TB/s)")


@dataclass(frozen=True)
class ChipParams:
    """One chip's parameters. ``peak_flops`` is dense FLOP/s by dtype name."""
    chip: str
    hbm_bytes: int
    hbm_bytes_per_s: float
    peak_flops: dict
    launch_overhead_s: float
    collective_latency_s: float
    sources: dict = field(default_factory=dict)        # parameter -> where it was published
    assumptions: dict = field(default_factory=dict)    # parameter -> why this value (ours)


_ASSUMED = {
    "launch_overhead_s": "assumed 15 us per launch (host enqueue + kernel start on the "
                         "NeuronCores); the Neuron docs publish no single figure",
    "collective_latency_s": "assumed 10 us fixed latency per collective, plus its bytes "
                            "at HBM bandwidth",
    "non_matmul_flops": "assumed 1 FLOP per output element for ops PyTorch has no FLOP formula for",
    "fused_bytes": "a fused region moves its inputs (once per use) and the outputs no op inside "
                   "it consumes; intermediates stay on chip",
}

CHIPS = {
    "trn2": ChipParams(
        chip="trn2", hbm_bytes=_chips.CHIPS["trn2"].hbm_bytes,
        hbm_bytes_per_s=_chips.CHIPS["trn2"].hbm_bytes_per_s,
        peak_flops={"bfloat16": 667e12, "float16": 667e12, "float32": 181e12,
                    "float8_e4m3fn": 1299e12, "float8_e5m2": 1299e12},
        launch_overhead_s=15e-6, collective_latency_s=10e-6,
        sources={"hbm_bytes": _NEURON_ARCH + ": 96 GiB HBM per chip",
                 "hbm_bytes_per_s": _NEURON_ARCH + ": 2.9 TB/s",
                 "peak_flops": _NEURON_ARCH + ": 667 BF16/FP16, 181 FP32, 1299 FP8 dense TFLOP/s"},
        assumptions=dict(_ASSUMED)),
    "trn3": ChipParams(
        chip="trn3", hbm_bytes=_chips.CHIPS["trn3"].hbm_bytes,
        hbm_bytes_per_s=_chips.CHIPS["trn3"].hbm_bytes_per_s,
        peak_flops={"bfloat16": 667e12, "float16": 667e12, "float32": 181e12,
                    "float8_e4m3fn": 1299e12, "float8_e5m2": 1299e12},
        launch_overhead_s=15e-6, collective_latency_s=10e-6,
        sources={"hbm_bytes": _TRN3, "hbm_bytes_per_s": _TRN3},
        assumptions={**_ASSUMED, "peak_flops": "assumed equal to trn2's (no per-dtype dense "
                                               "figure in the sources used here)"}),
}


def _itemsize(dtype) -> int:
    return torch.empty((), dtype=dtype, device="meta").element_size() if dtype is not None else 0


_ITEMSIZE: dict = {}


def nbytes(shape, dtype) -> int:
    size = _ITEMSIZE.get(dtype)
    if size is None:
        size = _ITEMSIZE[dtype] = _itemsize(dtype)
    return math.prod(shape) * size


@dataclass(frozen=True)
class Cost:
    """What one launch does: bytes through HBM, FLOPs, and the dtype that sets the peak."""
    bytes: int
    flops: float
    dtype: str = "float32"


class CostModel:
    """``cost_model("trn2")``: the chip's parameters and the roofline over them."""

    def __init__(self, params: ChipParams) -> None:
        self.params = params

    @property
    def chip(self) -> str:
        return self.params.chip

    def peak(self, dtype: str) -> float:
        p = self.params.peak_flops
        return p.get(dtype, p["float32"])

    def launch_s(self, cost: Cost) -> float:
        """Modelled seconds of one launch: overhead plus the slower of memory and compute."""
        p = self.params
        return p.launch_overhead_s + max(cost.bytes / p.hbm_bytes_per_s,
                                         cost.flops / self.peak(cost.dtype))

    def collective_s(self, nbytes_: int) -> float:
        return self.params.collective_latency_s + nbytes_ / self.params.hbm_bytes_per_s

    def describe(self) -> dict:
        p = self.params
        return {"chip": p.chip, "hbm_bytes": p.hbm_bytes, "hbm_bytes_per_s": p.hbm_bytes_per_s,
                "peak_flops": dict(p.peak_flops), "launch_overhead_s": p.launch_overhead_s,
                "collective_latency_s": p.collective_latency_s, "sources": dict(p.sources),
                "assumptions": dict(p.assumptions), "label": "a model, not a measurement"}

    def __repr__(self) -> str:
        p = self.params
        return (f"CostModel({p.chip}: {p.hbm_bytes / GiB:.0f} GiB HBM at "
                f"{p.hbm_bytes_per_s / 1e12:.1f} TB/s, {p.peak_flops['bfloat16'] / 1e12:.0f} BF16 / "
                f"{p.peak_flops['float32'] / 1e12:.0f} FP32 TFLOP/s, "
                f"{p.launch_overhead_s * 1e6:.0f} us/launch [assumed])")


def cost_model(chip: str | None = None) -> CostModel:
    """The modelled Trainium chip (``"trn2"`` or ``"trn3"``; None: the chip this process models,
    ``NEURON_LAB_CHIP`` / ``neuron_lab.set_chip``, device/chips.py)."""
    if chip is None:
        chip = _chips.current().key
    try:
        return CostModel(CHIPS[chip])
    except KeyError:
        raise ValueError(f"neuron_lab.cost_model: unknown chip {chip!r}; "
                         f"known: {', '.join(sorted(CHIPS))}") from None


# --- FLOPs and bytes of one op -------------------------------------------------------------

def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def op_flops(func, args, kwargs, outs) -> float:
    """FLOPs of one aten op call; ``args`` hold tensors (any device, meta included) or values."""
    formula = flop_registry.get(getattr(func, "overloadpacket", func))
    if formula is not None:
        try:
            out = outs[0] if len(outs) == 1 else tuple(outs)
            return float(formula(*args, **(kwargs or {}), out_val=out))
        except Exception:          # a formula that wants an argument form we do not pass
            pass
    return float(sum(o.numel() for o in outs if isinstance(o, torch.Tensor)))


def tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in tensors(e)]
    if isinstance(x, dict):
        return [t for e in x.values() for t in tensors(e)]
    return []


# Kernels that count their own bytes (a tiled kernel re-reads its inputs): op overload packet
# -> fn(args, kwargs, out) -> Cost. Filled from outside (neuron_lab/library/kernel_costs.py).
KERNEL_COSTS: dict = {}


def op_cost(func, args, kwargs, out) -> Cost:
    """The cost of running one op as its own launch: every input read and output written (or
    what a kernel registered in ``KERNEL_COSTS`` says it moves)."""
    own = KERNEL_COSTS.get(getattr(func, "overloadpacket", func))
    if own is not None:
        return own(args, kwargs, out)
    ins = tensors(args) + tensors(kwargs)
    outs = tensors(out)
    moved = sum(nbytes(t.shape, t.dtype) for t in ins + outs)
    dt = next((t.dtype for t in ins if t.is_floating_point()), None) or \
        next((t.dtype for t in outs if t.is_floating_point()), torch.float32)
    return Cost(moved, op_flops(func, args, kwargs, outs), _dtype_name(dt))
