"""The device's kernels: one generic PrivateUse1 kernel per ATen op (the transfer ops and the
ops with a host output of their own: ``transfers``).

Lookup order for an op called on ``neuron`` tensors (the dispatcher's, written down):
1. a CompositeImplicitAutograd decomposition, if the op has one and CPU has no kernel of its own
   (we register nothing for those, so autograd and decompositions behave as for any backend);
2. our kernel, registered for every other ``aten`` op with a CPU, CompositeExplicitAutograd or
   CompositeExplicitAutogradNonFunctional kernel — registering the composite ones too keeps view
   ops and ``*_scatter`` on our path, so they run on host data as on CPU;
3. a boxed PrivateUse1 fallback for anything else (non-aten namespaces), same generic path.

The generic kernel ``execute`` = unwrap (host views of neuron tensors; device checks) ->
policy (Trainium dtype rules, RNG and data-dependent ops recorded) -> admission (the output
bytes known from the arguments are checked against the capacity before the host allocates, see
``sizing``) -> run the op on the host executor -> account memory (OOM before any result
escapes) -> wrap results (in-place/``out=`` return the caller's own tensor, everything else a
new device tensor). A runtime installed through ``runtime_interface`` may queue ops instead; its
per-op replay calls ``execute``.
"""
from __future__ import annotations

import torch

from . import config, dtypes, hooks, memory, runtime_interface, sizing, tensor_data, tracking
from .executor import host_device
from .op_facts import OpFacts, draws_random

Tensor = torch.Tensor
_NEURON = "neuron"
_HOST_ONLY = dtypes.HOST_ONLY
_executed = tracking.executed



class DeviceMismatch(RuntimeError):
    pass


class UnsupportedDtypeError(RuntimeError):
    """A Trainium-unsupported dtype under ``set_fallback("error")``. A RuntimeError, not a
    TypeError: Python's binary operators turn a TypeError from ``Tensor.__add__`` into
    "unsupported operand type(s)", which would hide this message."""


def _mismatch(f: OpFacts, t: Tensor) -> RuntimeError:
    return DeviceMismatch(
        f"Expected all tensors to be on the same device, but found at least two devices, "
        f"neuron:0 and {t.device}! (when checking arguments for {f.name}). "
        f"Move the tensor with .to('neuron') (or the other one with .cpu()).")


def _unwrap_list(f: OpFacts, seq, found: list) -> list:
    out = []
    for a in seq:
        if isinstance(a, Tensor):
            if a.is_cpu:
                if a.dim() and not f.mixed_ok:
                    raise _mismatch(f, a)
            elif a.device.type == _NEURON:
                found.append(a.dtype)
                a = tensor_data.host(a)
        out.append(a)
    return out


def _written(f: OpFacts, t: Tensor, args) -> bool:
    """Is host tensor ``t`` an argument the op writes? A 0-dim CPU tensor may be an *input* on
    neuron (a CPU scalar, as on CUDA) but never an output."""
    return any(i < len(args) and args[i] is t for i in f.mutates)


def unwrap(f: OpFacts, args, kwargs, found: list):
    """Host-side args/kwargs; appends the dtypes of neuron tensors seen to ``found``."""
    hargs = []
    for a in args:
        if isinstance(a, Tensor):
            if a.is_cpu:
                if (a.dim() or f.mutates and _written(f, a, args)) and not f.mixed_ok:
                    raise _mismatch(f, a)
            else:
                found.append(a.dtype)
                try:
                    d = a._d
                except AttributeError:
                    d = tensor_data._recover(a)
                a = d if d is not None else runtime_interface.materialize(a)
        elif type(a) is list or type(a) is tuple:
            a = _unwrap_list(f, a, found)
        hargs.append(a)
    if kwargs:
        hk = {}
        for k, v in kwargs.items():
            if isinstance(v, Tensor):
                if not v.is_cpu:
                    found.append(v.dtype)
                    v = tensor_data.host(v)
                elif (v.dim() or k in f.written_kw) and not f.mixed_ok:
                    raise _mismatch(f, v)   # out=cpu_tensor: CUDA raises too, never writes it
            elif type(v) is list:
                v = _unwrap_list(f, v, found)
            elif k == "device" and v is not None:
                v = torch.device(v)
                if v.type == _NEURON:
                    if v.index not in (None, 0):
                        raise bad_index(v)
                    v = host_device()
            hk[k] = v
        return hargs, hk
    return hargs, kwargs


def bad_index(dev) -> RuntimeError:
    return RuntimeError(
        f"neuron: invalid device {dev}: this machine has 1 neuron device (neuron:0); "
        f"use device='neuron' or 'neuron:0'")


RANDOM_ON_HOST = "random number generation runs on the host generator"   # a fallback's reason


def _policy(f: OpFacts, dts, rnd: bool) -> None:
    """Trainium rules: host-only dtypes and RNG ops are fallbacks (recorded, maybe raise/warn)."""
    for dt in dts:
        if dt in _HOST_ONLY:
            mode = config.FALLBACK.get()
            if mode == "error":
                loc, _ = tracking.user_location(2)   # from execute outwards
                raise UnsupportedDtypeError(
                    f"neuron: {f.name} on {str(dt).replace('torch.', '')} is not supported on "
                    f"device neuron:0 (Trainium has no {str(dt).replace('torch.', '')}), at {loc}. "
                    f"Fix: {dtypes.fix_for(dt)}, or neuron_lab.set_fallback('host') to run it on "
                    f"the host.")
            loc = tracking.record_fallback(f.name, dtypes.reason_for(dt))
            if mode == "warn":
                tracking.warn_once(f.name, loc, f"neuron: {f.name} on {dt} falls back to the host "
                                               f"at {loc}; {dtypes.fix_for(dt)}")
            return
    if rnd:
        tracking.record_fallback(f.name, RANDOM_ON_HOST)


def _out_dtype(kwargs) -> list:
    dt = kwargs.get("dtype") if kwargs else None
    return [dt] if dt is not None else []


def bool_indexing(f: OpFacts, args) -> bool:
    """``x[mask]``: ``aten::index`` with a boolean index has a data-dependent output shape."""
    return f.base == "index" and len(args) > 1 and any(
        isinstance(i, Tensor) and i.dtype in (torch.bool, torch.uint8) for i in args[1])


def _unwrap_plain(args) -> list | None:
    """Host arguments of a ``plain`` op's call, or None when the call needs the general path
    (a host-only dtype, a CPU tensor that is not a 0-dim scalar, a list argument)."""
    hargs = []
    for a in args:
        if isinstance(a, Tensor):
            if a.is_cpu:
                if a.dim():
                    return None
            elif a.dtype in _HOST_ONLY:
                return None
            else:
                a = tensor_data.host(a)
        elif type(a) is list or type(a) is tuple:
            return None
        hargs.append(a)
    return hargs


def execute(f: OpFacts, args, kwargs):
    """Run one op now, on the host executor (the eager path). Most calls (``OpFacts.plain``:
    positional arguments, no per-call checks, one new tensor) take the short path."""
    if f.plain and not kwargs:
        hargs = _unwrap_plain(args)
        if hargs is not None:
            _executed[f.name] += 1
            try:
                out = f.call(*hargs)
            except RuntimeError as e:
                raise_host_error(e, f, args)
            if type(out) is Tensor:
                hs = out.untyped_storage()
                memory.track(hs, f.name)
                return tensor_data.wrap(out, hs)
            return wrap_result(f, out, args, kwargs)
    found: list = []
    hargs, hkwargs = unwrap(f, args, kwargs, found)
    rnd = False
    if f.per_call:                               # index, data-dependent or random ops
        if f.base == "index" and bool_indexing(f, args):
            tracking.record_sync("data-dependent")
        if f.data_dependent:
            tracking.record_sync("data-dependent" if f.base != "_local_scalar_dense" else "item")
        rnd = f.random and draws_random(f, args, kwargs)
    if rnd or (kwargs and "dtype" in kwargs) or not _HOST_ONLY.isdisjoint(found):
        _policy(f, found + _out_dtype(kwargs), rnd)
        if rnd:
            hargs, hkwargs = hooks.host_generators(f.name, hargs, hkwargs)
    _executed[f.name] += 1
    if f.sizer is not None:
        _admit(f, args, kwargs)
    try:
        out = f.call(*hargs, **hkwargs)
    except RuntimeError as e:
        err = _host_error(e, f, found)
        if err is None:
            raise
        raise err from None
    if type(out) is Tensor and f.fresh:          # the common case: one new tensor
        hs = out.untyped_storage()
        memory.track(hs, f.name)
        return tensor_data.wrap(out, hs)
    return wrap_result(f, out, args, kwargs)


execute_py = execute     # the reference; ``execute`` becomes the C short path when it is built


def use_native(ext) -> None:
    """Route ``execute`` through the native extension's short path (``csrc/kernel.cpp``): the
    same steps as the plain case above, in C; every other call, and every error, comes back to
    ``execute_py``. Called at registration, before the runtime and the kernels bind it."""
    global execute
    ext.configure_execute({
        "execute": execute_py, "host": tensor_data.host, "host_error": raise_host_error,
        "track": memory.track, "wrap": tensor_data.wrap, "wrap_result": wrap_result,
        "executed": _executed, "create": torch._C._acc.create_empty_tensor,
        "host_only": _HOST_ONLY, "tensor": Tensor})
    execute = ext.execute


_run_here = None      # the native direct kernel's run_here and run_boxed_call, when its ops are
_run_boxed_call = None    # registered


def use_direct(ext) -> None:
    """``run_now`` runs ``OpFacts.direct`` ops on the native direct kernel (``csrc/direct.cpp``)."""
    global _run_here, _run_boxed_call
    _run_here, _run_boxed_call = ext.run_here, ext.run_boxed_call


def run_now(f: OpFacts, args, kwargs):
    """Run one op now, as eager mode would, for a runtime that records it as it runs (the
    adaptive engine's capture): on the direct kernel where it takes the call (no Python per
    op: ~2-4 us less than ``execute``), else ``execute``. Same results either way. Only ops
    whose PrivateUse1 kernel is the direct kernel (``OpFacts.direct_kernel``): any other op
    would reach the generic kernel, and so the runtime, again. The call the direct kernel passed
    to the runtime (``args`` is its argument tuple) runs on the arguments the dispatcher passed
    (``run_boxed_call``: no second parsing and dispatch); any other, through the op's binding."""
    if f.direct_kernel:
        out = _run_boxed_call(args)
        if out is None:
            out = _run_here(f.call, args, kwargs)
        if out is not None:
            return out
    return execute(f, args, kwargs)


def raise_host_error(e: RuntimeError, f: OpFacts, args) -> None:
    """Raise the device's error for host kernel error ``e`` of a plain call (the short path's
    ``except RuntimeError``, in Python above and in C), or ``e`` itself."""
    err = _host_error(e, f, [a.dtype for a in args if isinstance(a, Tensor) and not a.is_cpu])
    if err is None:
        raise e
    raise err from None


def _host_error(e: RuntimeError, f: OpFacts, found: list) -> Exception | None:
    """The device's error for host kernel error ``e`` (``found``: the neuron arguments' dtypes),
    or None to raise ``e`` as it is."""
    oom = sizing.host_oom(e, f.name, memory.capacity(), memory.memory_allocated())
    if oom is not None:
        return oom
    if type(e) is NotImplementedError and "not implemented for" in str(e):
        return NotImplementedError(
            f"neuron: {f.name} is not implemented for {', '.join(sorted({str(d)[6:] for d in found}))} "
            f"on device neuron:0 (the host executor's kernel lacks this dtype: {e}). "
            f"Fix: cast the inputs to float32 (.float()) for this op, then back")
    if type(e) is NotImplementedError and str(e).startswith("Could not run"):
        return NotImplementedError(
            f"neuron: {f.name} has no kernel on device neuron:0: PyTorch calls it for "
            f"accelerators only (CUDA has it), and the host executor (CPU) lacks it. Fix: run "
            f"this module on the CPU (module.cpu(), inputs .cpu()), or use a layer that does "
            f"not need it")
    return None


def _admit(f: OpFacts, args, kwargs) -> None:
    """Check the capacity for the bytes ``f`` will allocate, before the host allocates them."""
    try:
        n = f.sizer(args, kwargs)
    except (TypeError, ValueError, AttributeError, OverflowError, IndexError):
        return          # arguments the prediction does not understand: checked after the op
    if n and memory.counted() + n > memory.capacity():
        memory.check(n, f.name)


def _wrap_value(f: OpFacts, h, alias, args, kwargs):
    if alias is not None and alias[1]:           # in-place / out=: the caller's own tensor
        where = alias[0]
        orig = args[where] if type(where) is int and where < len(args) else kwargs.get(where)
        if alias[2] or not isinstance(orig, Tensor) or orig.is_cpu:
            return orig
        # any in-place op may resize its self (CPU's addbmm_ on a broadcastable self does)
        if orig.shape != h.shape or f.restride and (orig.stride() != h.stride()
                                                    or orig.storage_offset() != h.storage_offset()):
            regrow(f.name, h, orig)
            tensor_data.restride(orig, h)
        return orig
    if alias is not None and not alias[2]:       # a view of an argument: shares its storage
        where = alias[0]
        base = args[where] if type(where) is int and where < len(args) else kwargs.get(where)
        if isinstance(base, Tensor) and base.device.type == _NEURON:
            return tensor_data.view_of(base, h)
    return tensor_data.wrap(h)


def regrow(op: str, h: Tensor, s: Tensor) -> None:
    """Account a host storage an op grew in place (``resize_``, ``out=``). Past the capacity,
    undo it — shrink the storage back, restore ``h`` to device tensor ``s``'s metadata — and raise,
    so the tensor is unchanged. (A CPU resize replaces the storage's bytes: the native counter has
    already uncounted the old ones; the device tensor's storage still has the old size.)"""
    st = h.untyped_storage()
    old = memory.counted_bytes(st)
    if old is None:
        old = s.untyped_storage().nbytes()
    try:
        memory.track(st, op)
    except torch.OutOfMemoryError:
        st.resize_(old)
        h.set_(st, s.storage_offset(), s.shape, s.stride())
        memory.track(st)
        raise


def wrap_result(f: OpFacts, out, args, kwargs):
    """Host results -> device results; new storages are counted (OOM raised before wrapping)."""
    if f.has_device_kw and kwargs:
        dev = kwargs.get("device")
        if dev is not None and torch.device(dev).type != _NEURON:
            if isinstance(out, Tensor):        # e.g. _to_copy(..., device='cpu'): a host read
                tracking.record_sync("cpu")
                tracking.record_transfer("d2h", out.numel() * out.element_size())
            return out
        if dev is not None and args and isinstance(args[0], Tensor) and args[0].is_cpu \
                and isinstance(out, Tensor):   # _to_copy(cpu_tensor, device='neuron'): .to()
            tracking.record_transfer("h2d", out.numel() * out.element_size())
    t = type(out)
    if t is Tensor:
        if f.zero_tensor:   # tensors need bytes: C++ shallow copies re-read them from storage
            out = torch.zeros(out.shape, dtype=out.dtype, device=out.device)
        if not (f.ret_alias[0] and f.ret_alias[0][1]):
            memory.track(out.untyped_storage(), f.name)
        return _wrap_value(f, out, f.ret_alias[0], args, kwargs)
    if t is tuple or t is list:
        _account(f, out)
        if t is list:   # TensorList returns (split, unbind, _foreach_*): fresh device tensors
            return [tensor_data.wrap(h) if isinstance(h, Tensor) else h for h in out]
        return tuple(_wrap_value(f, h, f.ret_alias[i] if i < len(f.ret_alias) else None, args, kwargs)
                     if isinstance(h, Tensor) else h for i, h in enumerate(out))
    return out


def _account(f: OpFacts, outs) -> None:
    new = {}
    for h in outs:
        if isinstance(h, Tensor):
            st = h.untyped_storage()
            if not memory.is_counted(st):
                new[id(st)] = st
    if new:
        memory.check(sum(s.nbytes() for s in new.values()), f.name)
        for st in new.values():
            memory.track(st)
