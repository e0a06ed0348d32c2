"""The engine's deferral hot path in C (``runtime/csrc/deferral.cpp``), and the engine as the
device's runtime interface sees it.

``Engine.launch`` (Python) is the reference: for an op that continues a known region path it
builds the op's key, looks the next trie node up and hands out one pending tensor
(``_defer_one``). The C extension does those steps on the same Python objects (the producers
map, the trie's dicts, ``QueuedOp`` records): 1.3-2 us per deferred op less than the Python
path (docs/performance.md, "Host work per op"). It also captures an op met in the middle of a
segment that no known region continues (``Engine._capture``: run it now, record it) with the
same pieces (the direct kernel's ``run_boxed_call``, else ``kernels.run_now``;
``tracking.user_frame_token``'s rule, in C; ``record.record_run``;
``repeated_suffix.observe``), and defers ops whose outputs are all new (several, a list,
none) or the caller's own tensors (in place, ``out=``: ``Engine._defer``'s loop). Every other
case (a segment's first op, a divergence, a region's end, an in-place op that changes its
tensor's metadata, an op that is not always queueable) calls
the Python engine, under its lock as before; in eager mode an op goes to the device's
``kernels.execute``.
``NEURON_LAB_NATIVE_DEFER=0`` keeps the whole path in
Python, with the same keys, regions and results (``tests/runtime/test_fastpath.py`` compares
the two).

The C path reads no attribute of the runtime's Python objects: ``configure`` hands it the
engine's segment state (``Engine.seg``, a C struct: ``segment.py``), the methods it calls back
and the tables it reads (``verdict.OP_BITS``, ``PLAIN_WHEN``); a trie node is a C struct too
(``cache.Node``), and the mode arrives through ``follow_mode``.
"""
from __future__ import annotations

import torch

from ..device import kernels, tensor_data, tracking
from ..device.dtypes import HOST_ONLY
from . import adaptive, host_scalars, output_plans, record, verdict
from .core import extension


class NativeLaunchRuntime:
    """What the device's runtime interface calls: the engine's flush, materialize, pending_bytes,
    wait_launches and boundary, and a launch that takes the C hot path."""
    __slots__ = ("launch", "flush", "materialize", "pending_bytes", "wait_launches", "boundary")

    def __init__(self, engine: adaptive.Engine, launch) -> None:
        self.launch = launch
        self.wait_launches = engine.wait_launches
        self.boundary = engine.boundary
        self.flush = engine.flush
        self.materialize = engine.materialize
        self.pending_bytes = engine.pending_bytes


def runtime_for(engine: adaptive.Engine):
    """The object to ``runtime_interface.install``: ``engine`` itself, or with its launch in C."""
    ext = extension()
    if ext is None:
        return engine
    ext.configure({
        "segment": engine.seg, "lock": engine.lock, "launch": engine.launch,
        "adaptive": engine._adaptive, "admit": engine._admit_pending, "flush": engine.flush,
        "cut_repeats": engine._cut_repeats, "start_segment": engine._start_segment,
        "op_bits": verdict.OP_BITS, "op_bits_of": verdict.op_bits,
        "plain_bit": verdict.PLAIN_BIT, "floats_bit": verdict.FLOATS_BIT,
        "direct_bit": verdict.DIRECT_BIT,
        "plain_when": verdict.PLAIN_WHEN, "no_dropout": verdict.NO_DROPOUT,
        "same_device": verdict.SAME_DEVICE,
        "host_only": HOST_ONLY, "dtype_type": torch.dtype, "layout_type": torch.layout,
        "memory_format_type": torch.memory_format, "device_type": torch.device,
        "size_type": torch.Size,
        "not_queueable": record.NotQueueable,
        "float_key": record.FLOAT,
        "rebuild": record.rebuild, "derive_plan": output_plans.derive,
        "pending_kind": output_plans.PENDING,
        "not_tensor_kind": output_plans.NOT_TENSOR, "caller_kind": output_plans.CALLER,
        "device_storage": torch._C._acc.create_empty_tensor((0,), torch.uint8).untyped_storage(),
        "pending_storage": tensor_data.pending_dense((0,), torch.uint8).untyped_storage(),
        "execute": kernels.execute,
        "run_now": kernels.run_now, "run_boxed_call": kernels._run_boxed_call,
        "host_copied": host_scalars.copied,
        "backward_callers": tracking._backward_callers,
        "record_run": record.record_run, "not_user_prefixes": tracking.NOT_USER_PREFIXES,
        "not_user_files": tracking.NOT_USER_FILES,
        "tensor": torch.Tensor,
    })
    engine.describe = ext.describe      # capture's keys too (the same keys, ~3 us less per op)
    tracking.count_native(_deferred_counts)      # the C path counts its ops per facts
    return NativeLaunchRuntime(engine, ext.launch)


def _deferred_counts() -> dict:
    """{op name: ops deferred on the C path since the last call} (``tracking.count_native``)."""
    ext = extension()
    if ext is None:
        return {}
    return {f.name: n for f, n in ext.deferred_counts().items()}


def follow_mode(adaptive: bool) -> None:
    """Tell the C path the mode knob's value (it never reads the knob): ops come to it in
    adaptive mode, to ``Engine.launch`` otherwise."""
    ext = extension()
    if ext is not None:
        ext.set_adaptive(adaptive)


def counts() -> tuple[int, int]:
    """(ops deferred on the C path, launches it passed to the Python engine); (0, 0) without it."""
    ext = extension()
    return tuple(ext.counts()) if ext is not None else (0, 0)


def captured() -> int:
    """Ops captured on the C path (run now and recorded); 0 without it."""
    ext = extension()
    return ext.captured() if ext is not None else 0
