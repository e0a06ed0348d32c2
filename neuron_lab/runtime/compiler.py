"""Fused programs: a region's records -> an FX graph of ATen ops -> torch inductor.

The graph is built straight from the records (no tracing: the records already are the program):
one placeholder per distinct region input, one ``call_function`` per op (in-place ops stay
in-place; AOTAutograd functionalizes them and writes input mutations back into the caller's
tensors), and outputs for the region's values that were alive when it was compiled. Inductor
compiles it for the executor device (C++/OpenMP kernels on CPU, Triton on CUDA).

``programs.py`` compiles the graph (``compile_program``; ``Specialized`` for floats compiled in
as constants). ``Plan`` is what a launch (``fused.py``) needs besides the program: where each
input comes from (op index and argument path), the aliasing pattern of inputs at compile time
(a launch whose inputs alias differently runs per-op instead), and which (op, output) pairs the
program returns.

Float arguments that are data (``record.FLOAT`` in the key: pointwise/foreach/optimizer ops)
are not part of the region's key, so an optimizer step whose bias corrections change every step
stays one region. How the program gets them:

- **Constant floats are specialized.** If a region's floats were the same at every launch
  before its compile (``policy`` notes them: ``x * 1.01``, ``clamp_min(-2.0)``, an EMA decay),
  they are baked into the graph as constants (``Specialized``, ``chosen``) and guarded at every
  launch: the kernel then needs no scalar loads (floats as data are read inside the vector
  loop, which makes a memory-bound elementwise chain markedly slower). A launch whose
  floats differ raises ``fused.FloatsChanged``: the policy runs it per-op and compiles the
  region again with its floats as data.
- **Changing floats are data**: packed in one float64 host tensor, the program's first input,
  each read inside the graph with ``select`` + ``item()`` (an unbacked SymFloat, which is how
  Dynamo passes unspecialized floats to inductor). The same program serves every optimizer step.
- Some ops cannot take a float as data: ``lerp``'s decomposition branches on its weight
  (``weight >= 0.5``, a guard on an unbacked value), ``nan_to_num``'s schema wants a plain float.
  When compiling with unbacked floats fails, the region is compiled with its floats specialized
  to the launch that compiled it (``Specialized``, not ``chosen``); a launch whose floats differ
  runs per-op, with correct results either way.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
from torch import fx

from ..device import tensor_data
from ..device.executor import host_device
from . import core
from .extern_ops import EXTERN
from .output_plans import contiguous_strides
from .record import Ref

Tensor = torch.Tensor


@dataclass(frozen=True)
class Plan:
    occurrences: tuple   # ((op index, arg path), ...) of region inputs, in order of appearance
    pattern: tuple       # input slot of each occurrence (equal slots = same tensor)
    n_inputs: int
    outputs: tuple       # ((op index, output index), ...) returned by the program
    scalars: tuple = ()  # ((op index, arg path), ...) of the floats packed in the first input

    @property
    def outputs_set(self) -> frozenset:
        return frozenset(self.outputs)


def arg_at(rec, path):
    """The argument of record ``rec`` at ``path`` ((position or kwarg name, list index or None))."""
    where, sub = path
    a = rec.args[where] if type(where) is int else rec.kwargs[where]
    return a if sub is None else a[sub]


def scalar_values_py(scalars, records: list) -> list:
    """The region's data floats, in plan order (once per launch for every float of the
    region). ``scalar_values`` is its C implementation (csrc/record.cpp) where the extension is
    built."""
    return [(records[i].args[w] if type(w) is int else records[i].kwargs[w])
            if sub is None else arg_at(records[i], (w, sub)) for i, (w, sub) in scalars]


scalar_values = core.implementation("scalar_values", scalar_values_py)


def packed_scalars_py(scalars, records: list) -> Tensor:
    """The region's data floats, in plan order, as the program's first input. ``packed_scalars``
    is its C implementation (one C loop instead of a Python call per float)."""
    return torch.tensor(scalar_values(scalars, records), dtype=torch.float64)


packed_scalars = core.implementation("packed_scalars", packed_scalars_py)


def data_floats(records: list) -> list:
    """Every data float of ``records`` in the order ``build`` packs them (without a plan)."""
    out: list = []

    def walk(a) -> None:
        t = type(a)
        if t is float:
            out.append(a)
        elif t is list or t is tuple:
            for x in a:
                walk(x)
    for rec in records:
        if rec.facts.floats_are_data:
            for a in rec.args:
                walk(a)
            if rec.kwargs:
                for v in rec.kwargs.values():
                    walk(v)
    return out


# ``_foreach_X[_].ScalarList`` -> (overload of ``X[_]`` per tensor, the name its scalar takes or
# None for the last positional argument). The per-tensor op is what CPU's foreach kernel runs
# for each tensor (its slow path), so the semantics are the same.
_PER_TENSOR = {"add": ("Scalar", None), "sub": ("Scalar", None), "mul": ("Scalar", None),
               "div": ("Scalar", None), "addcdiv": ("default", "value"),
               "addcmul": ("default", "value")}


_CAT, _CLONE = torch.ops.aten.cat.default, torch.ops.aten.clone.default


def _size_dtype(a, records: list) -> tuple:
    """(size, dtype) of a record's tensor argument: a queued output (Ref) or a region input."""
    if type(a) is Ref:
        m = records[a.pos].metas[a.k]
        return tuple(m.size), m.dtype
    return tuple(a.shape), a.dtype


def cat_of_one(rec, records: list):
    """For a ``cat`` whose tensors but one are empty, the index of that one, if eager gives a
    contiguous result; else None. Inductor's decomposition of such a ``cat`` is ``clone()``,
    which keeps a non-contiguous input's strides where eager's ``cat`` returns a contiguous
    tensor (Transformers' ``DynamicCache.update``: the empty cache and transposed keys), and a
    later op recorded with eager's strides (``_reshape_alias``) then fails to trace. ``build``
    writes it as a contiguous ``clone``."""
    tensors = rec.args[0]
    dim = rec.args[1] if len(rec.args) > 1 else (rec.kwargs or {}).get("dim", 0)
    m = rec.metas[0]
    if m is None or not m.size or tuple(m.stride) != contiguous_strides(m.size):
        return None
    dim %= len(m.size)
    found = [_size_dtype(a, records) for a in tensors]
    kept = [j for j, (sz, _) in enumerate(found)
            if not (len(sz) == 1 and sz[0] == 0) and not (dim < len(sz) and sz[dim] == 0)]
    if len(kept) != 1 or len(tensors) < 2 or found[kept[0]][1] != m.dtype:
        return None                                  # a dtype promotion: leave it to cat
    return kept[0]


def scalar_list_per_tensor(g: fx.Graph, target, args: tuple, kwargs: dict) -> list | None:
    """A foreach op with one scalar per tensor (``_foreach_div_.ScalarList``: AdamW's bias
    corrections, ``_foreach_addcdiv_.ScalarList``: its step sizes) as one ATen op per tensor in
    ``g``; its output nodes (none for an in-place op), or None for any other op. Inductor lowers
    such a foreach op only when its scalars are constants: with the scalars as data (graph
    values) it called the ATen kernel, which wrote every result to memory between the fused
    kernels around it (an AdamW program then ran slower than its per-op replay)."""
    overload = getattr(target, "_overloadname", None)
    name = getattr(target, "__name__", "")
    if overload != "ScalarList" or kwargs or not name.startswith("_foreach_"):
        return None
    base = name[len("_foreach_"):].split(".")[0]
    entry = _PER_TENSOR.get(base.rstrip("_"))
    if entry is None:
        return None
    per, scalar_name = entry
    op = getattr(getattr(torch.ops.aten, base), per)
    *lists, scalars = args
    outs = []
    for i, sc in enumerate(scalars):
        tensors = tuple(lst[i] for lst in lists)
        outs.append(g.call_function(op, tensors, {scalar_name: sc}) if scalar_name
                    else g.call_function(op, (*tensors, sc)))
    return [] if base.endswith("_") else outs


def build(records: list, required: set) -> tuple[fx.Graph, Plan, list]:
    """FX graph + plan + example inputs for ``records``; ``required``: {(op, out)} to return.
    The graph becomes a GraphModule (its Python code generated: ~5 ms for a 70-op region) on
    the compile worker's thread (``worker.py``), not on the user's."""
    g = fx.Graph()
    slots: dict[int, int] = {}
    placeholders: list[fx.Node] = []
    examples: list[Tensor] = []
    occurrences, pattern = [], []
    scalars: list = []                   # (op index, arg path) of data floats
    node_outs: list[list] = []
    hdev = host_device()
    packed = g.placeholder("scalars")    # the first input; erased if the region has none

    def conv(a, i, path, floats=False):
        if type(a) is Ref:
            return node_outs[a.pos][a.k]
        if isinstance(a, Tensor):
            sid = slots.get(id(a))
            if sid is None:
                sid = slots[id(a)] = len(slots)
                placeholders.append(g.placeholder(f"in{sid}"))
                # the example: the input's layout on a storage of its own, without values
                # (the compile fakes it)
                h = tensor_data.host(a)
                examples.append(torch.empty_strided(h.shape, h.stride(), dtype=h.dtype,
                                                    device=h.device))
            occurrences.append((i, path))
            pattern.append(sid)
            return placeholders[sid]
        if type(a) is float and floats:
            scalars.append((i, path))
            sel = g.call_function(torch.ops.aten.select.int, (packed, 0, len(scalars) - 1))
            return g.call_function(torch.ops.aten._local_scalar_dense.default, (sel,))
        if type(a) is list or type(a) is tuple:
            return type(a)(conv(x, i, (path[0], j), floats) for j, x in enumerate(a))
        if type(a) is torch.device and a.type == "neuron":
            return hdev
        return a

    for i, rec in enumerate(records):
        fl = rec.facts.floats_are_data
        args = tuple(conv(a, i, (k, None), fl) for k, a in enumerate(rec.args))
        kwargs = {k: conv(v, i, (k, None), fl) for k, v in (rec.kwargs or {}).items()}
        per_tensor = scalar_list_per_tensor(g, rec.facts.target, args, kwargs)
        if per_tensor is not None:
            node_outs.append(per_tensor)
            continue
        one = cat_of_one(rec, records) if rec.facts.target is _CAT else None
        if one is not None:
            node = g.call_function(_CLONE, (args[0][one],),
                                   {"memory_format": torch.contiguous_format})
        else:
            target = rec.facts.target
            node = g.call_function(EXTERN.get(target, target), args, kwargs)
        if rec.structure == "t":
            outs = [node]
        elif rec.structure[0] == "tuple":    # tensors, and Nones (convolution_backward's mask)
            if any(s != "t" and s != ("v", None) for s in rec.structure[1]):
                raise NotImplementedError(f"{rec.facts.name}: mixed tuple returns")
            outs = [g.call_function(operator.getitem, (node, k)) if s == "t" else None
                    for k, s in enumerate(rec.structure[1])]
        else:
            outs = [g.call_function(operator.getitem, (node, k)) for k in range(len(rec.metas))]
        node_outs.append(outs)
    outputs = tuple(sorted(required))
    g.output(tuple(node_outs[i][k] for i, k in outputs))
    if scalars:
        examples.insert(0, packed_scalars(scalars, records))
    else:
        g.erase_node(packed)
    plan = Plan(tuple(occurrences), tuple(pattern), len(placeholders), outputs, tuple(scalars))
    return g, plan, examples


def largest_numel(records: list) -> int:
    return max((_numel(m.size) for r in records for m in r.metas if m is not None), default=0)


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
