"""``neuron_lab.kernel``: writing a custom kernel for the device (the NKI analogue).

A kernel is a ``torch.library.custom_op`` whose body computes on *host buffers*: the emulated
device's memory, i.e. the host executor's tensors behind the neuron tensors it is called with
(on Trainium, NKI code reads and writes the chip's SBUF/HBM; here the bytes live on the host).
What ``kernel`` adds to ``custom_op``:

- the body is registered for the host executor's device type (``cpu``, or ``cuda`` with
  ``NEURON_LAB_EXECUTOR=cuda``), so calling the op on host tensors runs the body directly —
  the reference check in a tutorial is one call;
- on ``neuron`` the op gets the device's *generic kernel* (``registry._kernel``), the same
  path every ATen op takes: unwrap to host buffers, run the body, account memory, wrap. So in
  ``eager`` mode it runs at once; in ``adaptive`` mode it is an ordinary op of a region —
  captured, replayed per-op, and, in a fused program, an **opaque node**: inductor cannot see
  inside the body, so it calls it as an extern kernel between the fused parts (its fake
  implementation gives the output metadata while tracing). Declared mutations (``mutates_args``)
  are in the schema, so the runtime orders them like any in-place op. If a region holding it
  fails to compile, it runs per-op (the runtime's rule for any region);
- under ``torch.compile`` it is one graph node (dynamo never traces custom ops' bodies);
- an exception raised inside the body gets a note naming the kernel, the line in the body and
  the user's line that called it (in adaptive mode the runtime also names the line that issued
  the deferred call).

``CustomOpDef``'s own API is unchanged: ``register_fake``, ``register_autograd``,
``register_kernel``, calling it. A ``torch.library.custom_op(..., device_types="neuron")`` needs
none of this: its body receives neuron tensors and calls device ops. A custom op with only a
CPU kernel runs on the host and is recorded in ``fallback_ops()`` ("no neuron kernel", see
``registry._fallback``).
"""
from __future__ import annotations

import functools
import traceback
from typing import Callable, Iterable

import torch

from . import tracking
from .executor import host_device

_libs: list = []


def _noted(name: str, body: Callable) -> Callable:
    @functools.wraps(body)
    def host_body(*args, **kwargs):
        try:
            return body(*args, **kwargs)
        except Exception as e:
            frames = traceback.extract_tb(e.__traceback__)
            inner = next((fr for fr in reversed(frames)
                          if fr.filename == body.__code__.co_filename), None)
            where = f"{inner.filename.rsplit('/', 1)[-1]}:{inner.lineno}" if inner else "?"
            loc, src = tracking.user_location(2)
            e.add_note(f"neuron_lab: raised inside custom kernel {name} at {where} (its body, "
                       f"running on the host buffers of neuron:0), called from {loc}"
                       + (f": {src}" if src else ""))
            raise
    return host_body


def kernel(name: str, fn: Callable | None = None, /, *, mutates_args: str | Iterable[str],
           schema: str | None = None):
    """Define a device kernel ``name`` ("namespace::op") whose body computes on host buffers.

    Same arguments as ``torch.library.custom_op`` (``mutates_args`` names every argument the
    body writes, or ``"unknown"``; ``schema`` when the annotations cannot say it). Returns the
    ``CustomOpDef``: add ``register_fake`` (needed for ``torch.compile`` and fused regions) and,
    for training, ``register_autograd``::

        @neuron_lab.kernel("mylib::scale_add", mutates_args=())
        def scale_add(x: torch.Tensor, y: torch.Tensor, a: float) -> torch.Tensor:
            return x * a + y                     # x, y: host tensors

        @scale_add.register_fake
        def _(x, y, a):
            return torch.empty_like(x)
    """
    def define(body: Callable):
        host_types = tuple(dict.fromkeys(("cpu", host_device().type)))
        # inferred from the body itself: its module's globals resolve string annotations
        sch = schema or torch.library.infer_schema(body, mutates_args=mutates_args)
        op = torch.library.custom_op(name, _noted(name, body), mutates_args=mutates_args,
                                     device_types=host_types, schema=sch)
        ns, opname = name.split("::", 1)
        from .registry import _kernel     # registry imports this module's users, not this one
        lib = torch.library.Library(ns, "IMPL")
        lib.impl(opname, _kernel(op._opoverload), "PrivateUse1")
        _libs.append(lib)
        return op
    return define if fn is None else define(fn)
