"""Per-op facts read once from the op's schema: the dispatch table is data.

``OpFacts`` says, for one ``OpOverload``: which returns alias which arguments (in-place and
``out=`` returns hand back the caller's own tensor; view returns get a new device tensor over the
host view), whether the op may change a tensor's metadata in place, whether it draws random numbers,
whether its output shape depends on data (a sync point), whether it may mix devices, and
whether its float arguments are *data* (``floats_are_data``): for pointwise, foreach and fused
optimizer ops a Python float changes the values computed, never the output's shape, strides or
dtype, so the adaptive runtime can leave the value out of the op's key and pass it to a fused
program at each launch (an optimizer's step-dependent bias corrections, a scheduled lr).
"""
from __future__ import annotations

import torch

from . import host_gaps, sizing

# Ops whose output *shape* depends on tensor values: the host must see the data (sync point).
DATA_DEPENDENT = frozenset({
    "nonzero", "nonzero_static", "masked_select", "unique_dim", "unique_consecutive", "_unique",
    "_unique2", "unique_dim_consecutive", "repeat_interleave", "bincount", "_local_scalar_dense",
    "histogramdd", "_histogramdd_from_bin_cts",
})
# Ops that move data between neuron and other devices; they may legally mix devices.
TRANSFER = frozenset({"copy_", "_copy_from", "_copy_from_and_resize", "_to_copy", "to", "set_"})
# Indexing accepts CPU index tensors on accelerators (as CUDA does).
MIXED_OK = TRANSFER | frozenset({"index", "index_put_", "index_put", "_index_put_impl_"})
# Ops that write arguments their schemas do not mark as written (a training batch norm's
# running statistics): never on the direct kernel, which may run a call again on its Python
# path after the host op ran (an output past the capacity).
UNDECLARED_WRITES = frozenset({"native_batch_norm", "batch_norm_update_stats"})
# Packed sequences keep their lengths/batch sizes on the CPU on every device (PyTorch requires
# it), so these overloads take one CPU tensor among device tensors, as on CUDA.
MIXED_OK_OVERLOADS = frozenset({
    "aten::_pack_padded_sequence", "aten::_pack_padded_sequence_backward",
    "aten::_pad_packed_sequence", "aten::lstm.data", "aten::gru.data", "aten::rnn_tanh.data",
    "aten::rnn_relu.data",
})
RANDOM = frozenset({"native_dropout", "rrelu_with_noise", "rrelu_with_noise_", "_fused_dropout",
                    "_standard_gamma", "_sample_dirichlet", "poisson", "binomial",
                    "_fused_rms_norm"}) - {"_fused_rms_norm"}
# Not tagged pointwise, but a float argument of theirs is a fill value too.
FLOAT_VALUE_OPS = frozenset({"fill", "fill_", "full", "full_like", "new_full", "where",
                             "masked_fill", "masked_fill_"})


class OpFacts:
    __slots__ = ("op", "call", "name", "base", "ret_alias", "restride", "random", "data_dependent",
                 "mixed_ok", "has_device_kw", "n_returns", "is_inplace", "mutates", "tags", "fresh",
                 "zero_tensor", "floats_are_data", "sizer",
                 "written_kw", "target", "dropout_at", "per_call", "plain", "direct",
                 "direct_size", "direct_kernel")

    def __init__(self, op: torch._ops.OpOverload) -> None:
        schema = op._schema
        self.op = op
        self.base = schema.name.split("::", 1)[1]
        self.name = schema.name + ("." + schema.overload_name if schema.overload_name else "")
        args = schema.arguments          # each read of these builds new objects: read once
        returns = schema.returns
        ret_types = [str(r.type) for r in returns]
        takes_generator = any(str(a.type).startswith("Generator") for a in args)
        pos = [a for a in args if not a.kwarg_only]
        self.ret_alias = tuple(self._alias_of(r, args, pos) for r in returns)
        self.mutates = tuple(i for i, a in enumerate(args)
                             if a.alias_info is not None and a.alias_info.is_write)
        self.written_kw = frozenset(a.name for a in args if a.kwarg_only and a.alias_info is not None
                                    and a.alias_info.is_write)   # out=, values=, indices=...
        self.tags = set(op.tags)
        self.is_inplace = self.base.endswith("_") or any(a.kwarg_only and a.name == "out" for a in args)
        self.restride = (torch.Tag.inplace_view in self.tags or self.base.startswith("resize")
                         or self.base in ("set_", "_copy_from_and_resize")
                         or any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
                                for a in args))
        self.random = (takes_generator
                       or self.base in RANDOM or torch.Tag.nondeterministic_seeded in self.tags)
        # random only through dropout (SDPA's kernels take ``dropout_p`` and are tagged
        # nondeterministic_seeded): (position, name) of dropout_p; ``draws_random`` reads it
        self.dropout_at = next(((i, a.name) for i, a in enumerate(args) if a.name == "dropout_p"),
                               None) if (self.random and self.base not in RANDOM
                                         and not takes_generator) else None
        self.data_dependent = self.base in DATA_DEPENDENT
        self.mixed_ok = self.base in MIXED_OK or self.name in MIXED_OK_OVERLOADS
        self.has_device_kw = any(a.name == "device" for a in args)
        self.n_returns = len(returns)
        self.call = op._op                 # the C++ entry point, without OpOverload.__call__
        # what runs on the host (eager, replay) and in a fused program's graph: the op, or the
        # way the device computes a dtype its host kernel lacks (host_gaps)
        gap = host_gaps.substitute(op)
        if gap is not None:
            self.call = gap
        self.target = gap or op
        # one plain Tensor return that aliases nothing, and no device kwarg to honour
        self.fresh = (self.n_returns == 1 and self.ret_alias[0] is None and not self.has_device_kw
                      and ret_types[0] == "Tensor")
        # autograd's zero gradients: a host ZeroTensor has no bytes behind it (see kernels)
        self.zero_tensor = self.base == "_efficientzerotensor"
        self.floats_are_data = (torch.Tag.pointwise in self.tags or self.base in FLOAT_VALUE_OPS
                                or self.base.startswith(("_foreach_", "_fused_")))
        # the output bytes, known from the arguments: checked before the host allocates
        self.sizer = sizing.sizer(op)
        # the device looks at this op's arguments on every call (boolean indexing, data-dependent
        # shapes, random draws); the others skip those checks
        self.per_call = self.base == "index" or self.data_dependent or self.random
        # the eager path's short cut (kernels.execute): no per-call checks, no admission
        # before the host allocates, one new tensor
        self.plain = not self.per_call and self.sizer is None and self.fresh and not self.zero_tensor
        # a sized op whose bytes the direct kernel checks itself before the host allocates
        # (sizing.DIRECT_SIZED: 1 or 2), else 0
        self.direct_size = (sizing.DIRECT_SIZED.get(self.base, 0) if self.sizer is not None
                            and not self.per_call and self.fresh and not self.zero_tensor else 0)
        # what the native direct kernel runs in eager mode without entering Python
        # (csrc/direct.cpp), or None: see ``_direct``
        self.direct = self._direct(ret_types, gap)
        self.direct_kernel = False     # registry: the direct kernel is this op's (aten ops only)

    def _direct(self, ret_types: list, gap) -> str | None:
        """``"new"`` (a plain op that writes no argument), ``"view"`` (a view of argument
        ``ret_alias[0][0]``: ``view``, ``t``, ``slice``...), ``"in_place"`` (a pointwise op
        writing its ``self``: ``add_``, ``mul_``...) or ``"new_tuple"`` (several new tensors
        and no argument written: attention's forward and backward, ``nll_loss_forward``,
        ``native_layer_norm``, ``topk``), for ops whose host op is the op itself (no
        ``host_gaps`` substitute), with no per-call checks (but ``dropout_p``, which the direct
        kernel reads: a call with ``dropout_p`` 0 draws nothing) and no admission other than the
        one the direct kernel makes itself (``direct_size``); else None.
        A ``new``, ``new_tuple`` or ``view`` op writes nothing, so the direct kernel may hand a
        call the host op failed to the Python path, which runs it again and raises the device's
        error; a pointwise in-place op checks its arguments before it writes."""
        dropout_only = (self.dropout_at is not None and not self.data_dependent
                        and self.base != "index")
        if (gap is not None or self.per_call and not dropout_only
                or self.sizer is not None and not self.direct_size
                or self.zero_tensor or self.has_device_kw or self.written_kw
                or self.base in UNDECLARED_WRITES):
            return None
        if (self.n_returns > 1 and all(t == "Tensor" for t in ret_types)
                and not any(self.ret_alias) and not self.mutates):
            return "new_tuple"
        if self.per_call or self.n_returns != 1 or ret_types[0] != "Tensor":
            return None
        alias = self.ret_alias[0]
        if (self.plain or self.direct_size) and not self.mutates:
            return "new"
        if (alias is not None and type(alias[0]) is int and not alias[1] and not alias[2]
                and not self.mutates and not self.restride):
            return "view"
        if (alias == (0, True, False) and self.mutates == (0,) and self.base.endswith("_")
                and torch.Tag.pointwise in self.tags):
            return "in_place"
        return None

    @staticmethod
    def _alias_of(ret, args, pos):
        """None, or (position or kwarg name, is_write, is_list) of the argument ``ret`` aliases."""
        ai = ret.alias_info
        if ai is None:
            return None
        for a in args:
            if a.alias_info is not None and a.alias_info.before_set & ai.before_set:
                where = pos.index(a) if not a.kwarg_only else a.name
                return (where, bool(ai.is_write), str(a.type).startswith("List"))
        return None

    def __repr__(self) -> str:
        return f"OpFacts({self.name})"


_cache: dict[torch._ops.OpOverload, OpFacts] = {}


def overload(qualname: str) -> torch._ops.OpOverload:
    """The op a qualified name such as ``"aten::mul.Tensor"`` (``OpOverload.name()``) names."""
    ns, rest = qualname.split("::", 1)
    name, _, over = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), name), over or "default")


def facts(op: torch._ops.OpOverload) -> OpFacts:
    f = _cache.get(op)
    if f is None:
        f = _cache[op] = OpFacts(op)
    return f


def draws_random(f: OpFacts, args, kwargs) -> bool:
    """Does this call draw random numbers? ``f.random``, except an op whose only randomness is
    dropout called with ``dropout_p == 0`` (every attention call of a model in eval mode or
    without attention dropout): a plain op, neither a host-generator fallback nor a region
    boundary."""
    at = f.dropout_at
    if at is None:
        return f.random
    i, name = at
    p = args[i] if i < len(args) else (kwargs or {}).get(name, 0.0)
    return p != 0
