"""The ``neuron`` kernels of PyTorch's collective ops (``c10d::allreduce_``, ``broadcast_``...).

Every collective in ``torch.distributed`` — ``dist.all_reduce``, DDP's bucketed all-reduce in
C++, the functional collectives under DTensor and FSDP2 — reaches the dispatcher as one of the
``c10d::*`` ops, dispatched on the device of its tensors. PyTorch's own PrivateUse1 kernels ask
the process group for the backend registered for the device and hand it the device tensors; a
backend that keeps its bytes on a host executor cannot take those. These kernels replace them
for ``neuron`` (registered for PrivateUse1 only, as PyTorch's ``_meta_registrations`` does for
Meta), and each does, in order:

1. **Region boundary**: flush the adaptive queue (reason ``"collective"``), as a collective is
   on TorchNeuron: every deferred value the collective reads is computed first.
2. **Agreement**: the ranks check that they all issue this collective with the same dtype and
   element count (``checks.agree``; a mismatch raises on every rank instead of gloo aborting).
3. **Host views**: each ``neuron`` tensor argument becomes its host view, a tensor sharing the
   device tensor's bytes (``tensor_data.host``). No copy: a collective that writes (all-reduce,
   recv, an all-gather's output) writes the device tensor's own bytes, so in-place semantics hold.
4. **Transport**: the same op runs on the host views, dispatched to the host executor's kernel,
   which hands them to the process group's backend for the host device — gloo for the CPU
   executor. The group's ``neuron`` backend (``process_group.py``) is that same gloo instance and is
   registered for the host device on first use if the group lacks one. The op's own arguments
   (the opaque ``ReduceOp``, ``async_op``, timeout) pass through untouched, so every reduction
   and option behaves as gloo's does on CPU tensors, errors included.
5. **Work**: the result is an asynchronous ``Work`` whose future completes when gloo's does and
   carries the ``neuron`` tensors (DDP's reducer reads the bucket from it); its completion
   records the collective's bytes and seconds in the device's counters
   (``tracking.record_collective``, event ``collective``). With ``async_op=False`` the kernel
   waits for gloo before returning, so a failure raises there (``checks.transport_error``).

Functional collectives (DTensor, tensor parallel) reach these kernels through
``functional.py``, which in adaptive mode waits for them before returning (see its header).

Bytes follow nccl-tests' "size": the larger of the bytes a rank passes in and gets out (the
buffer of an all-reduce, the gathered output of an all-gather, the input of a reduce-scatter).
"""
from __future__ import annotations

import time
import warnings

import torch

from .. import runtime
from . import checks
from .checks import tensors_in
from ..device import tensor_data, tracking
from ..device.executor import host_device

C = torch._C._distributed_c10d
_NEURON = "neuron"

# op name -> (what the user calls it, does it return (first argument, work) or work alone)
OPS: dict[str, tuple[str, bool]] = {
    "allreduce_": ("all_reduce", True),
    "allreduce_coalesced_": ("all_reduce_coalesced", False),
    "allgather_": ("all_gather", True),
    "_allgather_base_": ("all_gather_into_tensor", True),
    "allgather_coalesced_": ("all_gather_coalesced", False),
    "allgather_into_tensor_coalesced_": ("all_gather_into_tensor_coalesced", False),
    "reduce_scatter_": ("reduce_scatter", True),
    "_reduce_scatter_base_": ("reduce_scatter_tensor", True),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter_tensor_coalesced", False),
    "broadcast_": ("broadcast", True),
    "reduce_": ("reduce", False),
    "gather_": ("gather", False),
    "scatter_": ("scatter", True),
    "alltoall_": ("all_to_all", True),
    "alltoall_base_": ("all_to_all_single", False),
    "barrier": ("barrier", False),
    "send": ("send", False),
    "recv_": ("recv", False),
    "recv_any_source_": ("recv_any_source", False),
}

USER_NAMES = {name: user for name, (user, _) in OPS.items()}
_libs: list = []
_raising_work = None    # the native ``neuron_lab_c10d::work_from_future`` (set by ``register``)


def _to_host(a):
    """Host view of a neuron tensor (nested lists too); anything else unchanged."""
    if isinstance(a, torch.Tensor):
        return tensor_data.host(a) if a.device.type == _NEURON else a
    if isinstance(a, (list, tuple)):
        return type(a)(_to_host(x) for x in a)
    return a


def _nbytes(a) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(a))


def _payload(name: str, args) -> int:
    """nccl-tests' size: the larger of what goes in and what comes out (see module header)."""
    if name in ("barrier", "recv_any_source_") or not args:
        return 0
    if name in ("allgather_", "_allgather_base_", "allgather_coalesced_",
                "allgather_into_tensor_coalesced_", "reduce_scatter_", "_reduce_scatter_base_",
                "reduce_scatter_tensor_coalesced_", "alltoall_", "alltoall_base_",
                "gather_", "scatter_"):
        return max(_nbytes(args[0]), _nbytes(args[1]))
    return _nbytes(args[0])


def ensure_host_backend(pg_obj) -> None:
    """The group must have a backend for the host device: the kernels run the op there. A group
    made by ``init_process_group()`` on a neuron machine has one for ``neuron`` only (PyTorch
    picks the accelerator's backend alone, and takes gloo as the group's default type); its
    ``neuron`` backend is a gloo instance, which serves the host device as well, so it is
    registered for it — as gloo when the group's default type is gloo — and CPU tensors then
    work on the group too."""
    pg = C.ProcessGroup.unbox(pg_obj) if isinstance(pg_obj, torch.ScriptObject) else pg_obj
    host = host_device().type
    types = {d.type for d in pg._device_types}
    if host in types or _NEURON not in types:
        return
    backend = pg._get_backend(torch.device(_NEURON))
    kind = C.ProcessGroup.BackendType.GLOO if pg.name() == "gloo" else \
        C.ProcessGroup.BackendType.CUSTOM
    pg._register_backend(torch.device(host), kind, backend)


def _group_of(name: str, args):
    for a in args:
        if isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type()):
            return a
    raise RuntimeError(f"neuron: c10d::{name} was called without a process group")


def _kernel(name: str):
    op = getattr(torch.ops.c10d, name).default
    user_name, returns_first = OPS[name]
    sync_at = next((i for i, a in enumerate(op._schema.arguments) if a.name == "async_op"), None)

    def kernel(*args):
        runtime.current().flush("collective")
        group = _group_of(name, args)
        ensure_host_backend(group)
        checks.agree(name, USER_NAMES, args, group)
        host_args = tuple(_to_host(a) for a in args)
        done = Completion(user_name, args[0] if args else None, _payload(name, args))
        try:
            out = op(*host_args)
            inner = C.Work.unbox(out[1] if returns_first else out)
            if sync_at is not None and sync_at < len(args) and not args[sync_at]:
                inner.wait()       # async_op=False: errors raise here, named (see ``checks``)
        except RuntimeError as e:
            raise checks.transport_error(user_name, e) from e
        work = done.work(inner)
        return (args[0], work) if returns_first else work

    kernel.__name__ = f"neuron_{name}"
    return kernel


class Completion:
    """What the ``neuron`` side of one collective does when gloo's completes: record its bytes
    and seconds once (``tracking.record_collective``) and hand back the ``neuron`` tensors
    (DDP's reducer reads its bucket from the work's future).

    The returned ``Work`` is built in C++, not a Python subclass (a subclass crossing the
    dispatcher loses its Python half, and its ``wait`` then never returns): over gloo's future
    where gloo gives one, the native ``RaisingFutureWork`` (``device/csrc/c10d_work.cpp``: like
    PyTorch's ``_create_work_from_future``, whose ``wait()`` swallows a failed collective, but
    raising it as gloo's own work does); else a ``PythonCallbackWork`` whose ``wait(timeout)``
    waits on gloo's work (gloo's reduce-scatter, send and recv have no future)."""

    def __init__(self, op: str, result, nbytes: int):
        self.op, self.result, self.nbytes = op, result, nbytes
        self.start = time.perf_counter()
        self.recorded = False

    def values(self) -> list:
        r = self.result
        if r is None:
            return []
        return [r] if isinstance(r, torch.Tensor) else list(tensors_in(r))

    def record(self) -> None:
        if not self.recorded:
            self.recorded = True
            tracking.record_collective(self.op, self.nbytes, time.perf_counter() - self.start)

    def work(self, inner):
        """The boxed ``Work`` to return for gloo's ``inner``."""
        try:
            fut = inner.get_future()
        except RuntimeError:                 # "Work::getFuture not implemented" (gloo)
            def wait(timeout):
                try:
                    ok = inner.wait(timeout) if timeout else inner.wait()
                except RuntimeError as e:
                    raise checks.transport_error(self.op, e) from e
                self.record()
                return ok
            return C.PythonCallbackWork(wait).boxed()

        def finish(f):
            try:
                f.value()                    # re-raises gloo's error (timeout, peer gone...)
            except RuntimeError as e:
                raise checks.transport_error(self.op, e) from e
            self.record()
            return self.values()

        done = fut.then(finish)
        if _raising_work is not None:
            return _raising_work(done)
        return C._create_work_from_future(done).boxed()


def register() -> None:
    """Install the kernels for PrivateUse1 (idempotent)."""
    global _raising_work
    if _libs:
        return
    from ..device import native
    native.load()                # registers neuron_lab_c10d (csrc/c10d_work.cpp)
    _raising_work = torch.ops.neuron_lab_c10d.work_from_future
    lib = torch.library.Library("c10d", "IMPL")
    with warnings.catch_warnings():   # "Overriding a previously registered kernel": intended
        warnings.simplefilter("ignore")
        for name in OPS:
            lib.impl(name, _kernel(name), "PrivateUse1")
    _libs.append(lib)


__all__ = ["register", "ensure_host_backend", "OPS"]
