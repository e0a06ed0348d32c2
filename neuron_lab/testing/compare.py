"""Run one OpInfo sample on one device, and compare a neuron run with the CPU run.

What "agree" means, strictest first (each a separate reason in the report):

- same output structure, Python values and tensor dtypes/shapes; every tensor output of a call
  with neuron inputs is on ``neuron``;
- the values: bitwise in eager mode (the host executor runs the very same kernels), within
  ``assert_close``'s float32 tolerance in adaptive mode (fused programs may reorder arithmetic);
- the metadata a user can observe: strides of dimensions longer than 1 and, for outputs that alias
  an input, which input they alias and the storage offset — a view op that copied would pass a
  value check and still break in-place semantics;
- gradients of the outputs against a fixed random cotangent (a plain ``sum`` would hide transposed
  or broadcast gradient bugs behind all-ones);
- for the in-place variant: the call returns the input itself, and the input's new value.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch.utils._pytree import tree_flatten

from ..device import tensor_data


# Reruns of the CPU reference on fresh copies, so allocation-dependent kernels show it. Only after
# a bitwise mismatch. LAPACK's gelsy (linalg.lstsq) differs in 3-17 % of runs on this machine,
# depending on where its buffers land: 8 reruns missed it often enough to make the sweep flaky
# (3-5 of 15 isolated runs failed); 64, each after a live allocation of another size, find it.
RERUNS = 64
_PADS = tuple((i * 7919 + 13) % 70001 + 1 for i in range(RERUNS))   # floats, one per rerun


class Mismatch(AssertionError):
    pass


@dataclass
class Run:
    flat: list                              # flattened outputs: tensors (on CPU) and values
    meta: list                              # per output tensor: (strides, offset, aliases, device)
    grads: list | None = None               # per leaf: CPU tensor or None
    grad_error: str | None = None           # the backward pass raised this
    inplace: dict = field(default_factory=dict)


def _storage_key(t: torch.Tensor):
    try:
        h = tensor_data.host(t) if t.device.type == "neuron" else t
        p = h.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):   # sparse and other storage-less layouts
        return None
    return p or None


def _meta(t: torch.Tensor, inputs: list) -> tuple:
    key = _storage_key(t)
    aliases = tuple(i for i, x in enumerate(inputs) if key is not None and _storage_key(x) == key)
    if t.layout != torch.strided:
        return ((), 0, aliases, t.device.type)
    strides = tuple(s for n, s in zip(t.shape, t.stride()) if n > 1) if t.numel() else ()
    return (strides, t.storage_offset() if aliases else 0, aliases, t.device.type)


def _cpu(x):
    if isinstance(x, torch.Tensor):
        x = x.detach()
        return x.cpu() if x.device.type != "cpu" else x.clone()
    return x


def _cotangent(t: torch.Tensor, i: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + i)
    c = torch.randn(t.shape, dtype=t.dtype, generator=g) if t.is_floating_point() or t.is_complex() \
        else torch.ones(t.shape, dtype=t.dtype)
    return c.to(t.device)


def run(fn, parts, process=None, grad: bool = False) -> Run:
    """Call ``fn(input, *args, **kwargs)``; gradients of the processed outputs when ``grad``."""
    inp, args, kw = parts[:3]
    inputs = [t for t in tree_flatten((inp, args, kw))[0] if isinstance(t, torch.Tensor)]
    out = fn(inp, *args, **kw)
    flat = tree_flatten(out)[0]
    r = Run(flat=[_cpu(x) for x in flat],
            meta=[_meta(x, inputs) for x in flat if isinstance(x, torch.Tensor)])
    if grad:
        leaves = [t for t in inputs if t.requires_grad]
        diff = [t for t in tree_flatten(process(out) if process else out)[0]
                if isinstance(t, torch.Tensor) and t.requires_grad]
        if leaves and diff:
            try:
                g = torch.autograd.grad(diff, leaves, [_cotangent(t, i) for i, t in enumerate(diff)],
                                        allow_unused=True)
                r.grads = [None if x is None else _cpu(x) for x in g]
            except Exception as e:  # noqa: BLE001 - compared: CPU may raise the same
                r.grad_error = f"{type(e).__name__}: {first_line(e)}"
    return r


def first_line(e: BaseException, n: int = 200) -> str:
    return (str(e).strip().splitlines() or [""])[0][:n]


def run_inplace(fn, parts) -> Run:
    """The in-place variant on a fresh copy of the input: returns it? what value does it get?"""
    inp, args, kw = parts[:3]
    with torch.no_grad():
        target = inp.detach().clone()
        res = fn(target, *args, **kw)
    r = Run(flat=[_cpu(target)], meta=[_meta(target, [])])
    r.inplace = {"returns_self": res is target}
    return r


def _close(got, want, exact: bool, what: str) -> None:
    if isinstance(want, torch.Tensor) != isinstance(got, torch.Tensor):
        raise Mismatch(f"{what}: {type(got).__name__} instead of {type(want).__name__}")
    if not isinstance(want, torch.Tensor):
        if want != got and not (want != want and got != got):
            raise Mismatch(f"{what}: {got!r} != {want!r}")
        return
    if want.layout != torch.strided:
        want, got = want.to_dense(), got.to_dense()
    try:
        kw = {"rtol": 0, "atol": 0} if exact else {}
        torch.testing.assert_close(got, want, equal_nan=True, check_device=False, **kw)
    except AssertionError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise Mismatch(f"{what}: {'; '.join(lines[:3])}") from None


def compare(cpu: Run, dev: Run, exact: bool, *, device: str | None = "neuron") -> None:
    """Raise ``Mismatch`` naming the first disagreement of the outputs (values, then metadata)."""
    if len(cpu.flat) != len(dev.flat):
        raise Mismatch(f"{len(dev.flat)} outputs instead of {len(cpu.flat)}")
    for i, (w, g) in enumerate(zip(cpu.flat, dev.flat)):
        _close(g, w, exact, f"output {i}")
    for i, (w, g) in enumerate(zip(cpu.meta, dev.meta)):
        if device is not None and g[3] != device:
            raise Mismatch(f"output {i} is on {g[3]}, not {device}")
        if g[2] != w[2]:
            raise Mismatch(f"output {i} aliases inputs {list(g[2])}, on CPU {list(w[2])}")
        if w[0] != g[0] or w[1] != g[1]:
            raise Mismatch(f"output {i} strides/offset {g[0]}/{g[1]}, on CPU {w[0]}/{w[1]}")
    if cpu.inplace != dev.inplace:
        raise Mismatch(f"in-place call: {dev.inplace}, on CPU {cpu.inplace}")


def compare_grads(cpu: Run, dev: Run, exact: bool) -> None:
    if dev.grad_error and not cpu.grad_error:
        raise Mismatch(f"backward raised {dev.grad_error}")
    if (cpu.grads is None) != (dev.grads is None):
        raise Mismatch("grad: computed on one device only")
    for i, (w, g) in enumerate(zip(cpu.grads or (), dev.grads or ())):
        if (w is None) != (g is None):
            raise Mismatch(f"grad {i}: None on one device only")
        if w is not None:
            _close(g, w, exact, f"grad {i}")


def agree(cpu: Run, dev: Run, exact: bool, rerun, *, grads: bool = False,
          device: str | None = "neuron") -> str:
    """``compare`` (or ``compare_grads``); returns a note, or raises ``Mismatch``.

    Bitwise is the rule where the CPU kernel is deterministic. On a bitwise mismatch the CPU
    reference runs again on fresh copies of its inputs (``rerun()``); if CPU disagrees with itself (batched LAPACK drivers do,
    from run to run) the neuron result is held to ``assert_close`` instead, and the note says so.
    """
    def check(a, b, ex, dev_type):
        return compare_grads(a, b, ex) if grads else compare(a, b, ex, device=dev_type)
    try:
        check(cpu, dev, exact, device)
        return ""
    except Mismatch:
        if not exact:
            raise
        for i in range(RERUNS):
            # a live allocation of another size first, so the rerun's buffers land elsewhere:
            # fresh copies alone often get the same addresses back from the allocator
            pad = torch.empty(_PADS[i])  # noqa: F841 - kept alive through the rerun
            try:
                check(cpu, rerun(), True, None)
            except Mismatch:
                check(cpu, dev, False, device)
                return "CPU kernel nondeterministic: compared with assert_close"
        raise
