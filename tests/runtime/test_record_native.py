"""The engine's record keeping in C (runtime/csrc/record.cpp) against its Python references.

``record_run`` (capture's record and producer entries), ``live_outputs``, ``scalar_values``,
``packed_scalars`` and ``host_inputs`` are each compared with the Python function of the same
name and ``_py`` suffix on real op outputs, and ``weak_ref`` (csrc/weak_outputs.cpp, the
pending outputs' weak references) with ``weakref.ref``; the whole engine with and without the extension is compared on a Transformers model
in test_fastpath.py.
"""
import gc
import weakref

import pytest
import torch

import neuron_lab.runtime as rt
from neuron_lab.device.op_facts import facts
from neuron_lab.device import tensor_data
from neuron_lab.runtime import compiler, core, fused, knobs, pending, producers, record, segment

ext = core.extension()
pytestmark = pytest.mark.skipif(ext is None, reason="the runtime extension is not built")

aten = torch.ops.aten


def _record_both(op, args, out):
    """(records, producers) from the C implementation and from the Python reference, for one op
    run now, each recorded on a segment (the C one and the Python reference) with one earlier
    record: positions start at 1."""
    f = facts(op)
    key, targs, tkw = record.describe(f, args, None, 1, producers._Producers())
    got, want = ext.Segment(), segment._Fields()
    for seg in (got, want):
        seg.append(record.QueuedOp(f, (), None, None, []))
    record.record_run_py(f, targs, tkw, key, out, ("cell.py", 3), want)
    ext.record_run(f, targs, tkw, key, out, ("cell.py", 3), got)
    return (got.records, got.producers), (want.records, want.producers)


def _fields(q) -> tuple:
    """A record's fields (the C ``QueuedOp`` compares by identity, as a class does)."""
    return (q.facts, q.args, q.kwargs, q.key, q.outs, q.metas, q.structure, q.where, q.plan)


def _same_producers(got, want, out, metas) -> None:
    """The C map ``got`` and the reference ``want`` hold the same entries: as many, naming the
    same outputs (the shared Refs), and each output and its storage (seen with its metadata)
    finds the same one."""
    assert type(got) is ext.Producers and type(want) is producers._Producers
    assert len(got) == len(want)
    assert (sorted((r.pos, r.k) for r in got.refs())
            == sorted((r.pos, r.k) for r in want.refs()))
    assert all(type(r) is ext.Ref and r is record.ref(r.pos, r.k) for r in got.refs())
    for t, meta in zip(record.flatten_outputs(out), metas):
        if t is not None:
            assert got.of(t) is want.of(t)
            assert got.of_storage(t, meta) is want.of_storage(t, meta)


@pytest.mark.parametrize("case", ["tensor", "view", "tuple", "tuple_none", "list", "none",
                                  "complex", "strided"])
def test_record_run_equals_the_python_reference(case):
    with rt.mode("eager"):
        x = torch.randn(4, 6).to("neuron")
        if case == "tensor":
            op, args = aten.mul.Tensor, (x, x)
        elif case == "view":
            op, args = aten.t.default, (x,)
        elif case == "tuple":                          # three new tensors
            op, args = aten.native_layer_norm.default, (x, [6], None, None, 1e-5)
        elif case == "tuple_none":                     # a tensor and two Nones
            mean, rstd = aten.native_layer_norm.default(x, [6], None, None, 1e-5)[1:]
            op, args = aten.native_layer_norm_backward.default, (
                x, x, [6], mean, rstd, None, None, [True, False, False])
        elif case == "list":
            op, args = aten._foreach_sqrt.default, ([x.abs(), x.abs() + 1],)
        elif case == "none":                           # in place, returns nothing
            op, args = aten._foreach_add_.Scalar, ([x.clone(), x.clone()], 1.0)
        elif case == "complex":                        # a host-only output: no producer entries
            op, args = aten.view_as_complex.default, (x.view(4, 3, 2),)
        else:
            op, args = aten.slice.Tensor, (x, 1, 1, 5, 2)
        out = op(*args)
    (grecs, gprod), (wrecs, wprod) = _record_both(op, args, out)
    g, w = grecs[1], wrecs[1]
    assert type(g) is record.QueuedOp
    assert _fields(g) == _fields(w)
    assert all(type(m) is record.OutMeta or m is None for m in g.metas)
    assert g.structure == record.structure_of(out)
    if case == "none":
        assert g.outs == [] and len(gprod) == 0
        return
    first = out if isinstance(out, torch.Tensor) else out[0]
    assert g.metas[0] == (tuple(first.shape), first.stride(), first.storage_offset(), first.dtype)
    _same_producers(gprod, wprod, out, g.metas)
    if case == "complex":
        assert out.dtype == torch.complex64 and len(gprod) == 0
    else:                                              # each tensor output and its storage
        assert len(gprod) == 2 * sum(m is not None for m in g.metas)
        assert all(gprod.of(t) is record.ref(1, k)
                   for k, t in enumerate(record.flatten_outputs(out)) if t is not None)


def test_record_run_rejects_what_is_not_a_segment():
    with pytest.raises(TypeError, match="record_run"):
        ext.record_run(None, (), None, None, torch.zeros(1), None, [])


def _records_with_outs(outs_per_op):
    f = facts(aten.add.Tensor)
    return [record.QueuedOp(f, (), None, None, list(outs)) for outs in outs_per_op]


def test_live_outputs_equals_the_python_reference():
    with rt.mode("eager"):
        alive = [torch.zeros(2).to("neuron") for _ in range(3)]
        dead = torch.zeros(2).to("neuron")
    pair = lambda t: (weakref.ref(t), weakref.ref(t.untyped_storage()))  # noqa: E731
    c_pair = lambda t: (ext.weak_ref(t), ext.weak_ref(t.untyped_storage()))  # noqa: E731
    dead_pair = pair(dead)
    copy = alive[2].detach()                           # a shallow copy keeps the storage alive
    storage_only = (weakref.ref(torch.zeros(1)), ext.weak_ref(copy.untyped_storage()))
    del dead
    gc.collect()
    records = _records_with_outs([[pair(alive[0]), None], [dead_pair], [],
                                  [None, c_pair(alive[1]), storage_only]])
    want = pending.live_outputs_py(records)
    assert want == {(0, 0), (3, 1), (3, 2)}
    assert ext.live_outputs(records) == want
    with pytest.raises(TypeError, match="live_outputs"):
        ext.live_outputs(_records_with_outs([[("not", "weakrefs")]]))


def test_weak_ref_answers_as_a_weakref_does():
    """``weak_ref`` (a c10 weak pointer) against ``weakref.ref`` on the cases a pending output
    meets: alive, dead, kept alive only from C++ (a view's base: PyTorch keeps its one Python
    object), a storage outliving its tensor (a shallow copy), and identity tests."""
    with rt.mode("eager"):
        t = torch.ones(4, device="neuron")
        view = t[:2]
        copy = t.detach()
        st = t.untyped_storage()
        pairs = [(ext.weak_ref(o), weakref.ref(o)) for o in (t, st)]
        base_id = id(t)
        for w, py in pairs:
            assert w() is py() is not None
        del t
        gc.collect()
        for w, py in pairs:                       # the view's base keeps the tensor's object
            assert w() is py() is not None
        assert id(pairs[0][0]()) == base_id and view._base is pairs[0][0]()
        del view
        gc.collect()
        assert pairs[0][0]() is None and pairs[0][1]() is None
        assert pairs[1][0]() is st                # the storage: still the shallow copy's
        st_id = id(st)
        del st
        gc.collect()
        # PyTorch keeps a live storage's one Python object: the reference answers with it
        assert id(copy.untyped_storage()) == st_id and pairs[1][0]() is copy.untyped_storage()
        other = torch.ones(4, device="neuron")
        assert pairs[1][0]() is not other.untyped_storage()
        del copy
        gc.collect()
        assert pairs[1][0]() is None and pairs[1][1]() is None
        with pytest.raises(TypeError, match="tensor or a storage"):
            ext.weak_ref([1])
        assert not gc.is_tracked(ext.weak_ref(other)) and "Tensor" in repr(ext.weak_ref(other))


def test_scalar_values_equals_the_python_reference():
    f = facts(aten.add.Tensor)
    records = [record.QueuedOp(f, (None, 0.5), None, None, []),
               record.QueuedOp(f, (None, [1.5, 2.5]), {"alpha": 3.0}, None, []),
               record.QueuedOp(f, (0.25,), None, None, [])]
    scalars = ((0, (1, None)), (1, (1, 1)), (1, ("alpha", None)), (2, (0, None)))
    want = compiler.scalar_values_py(scalars, records)
    assert want == [0.5, 2.5, 3.0, 0.25]
    assert ext.scalar_values(scalars, records) == want
    assert ext.scalar_values((), records) == []
    with pytest.raises(IndexError):
        ext.scalar_values(((5, (0, None)),), records)
    with pytest.raises(TypeError, match="scalar_values"):
        ext.scalar_values(((0, 1),), records)
    packed = ext.packed_scalars(scalars, records)            # the program's float64 input
    ref = compiler.packed_scalars_py(scalars, records)
    assert packed.dtype == ref.dtype == torch.float64 and packed.device == ref.device
    assert torch.equal(packed, ref) and ext.packed_scalars((), records).shape == (0,)
    with pytest.raises(IndexError):
        ext.packed_scalars(((5, (0, None)),), records)


def test_host_inputs_equals_the_python_reference():
    f = facts(aten.add.Tensor)
    a, b = torch.randn(3).to("neuron"), torch.randn(2, 2).to("neuron")
    c = torch.randn(4).to("neuron")[1:]                  # a view: its host view is built on demand
    records = [record.QueuedOp(f, (a, b), None, None, []),
               record.QueuedOp(f, ([b, a], c), {"other": a}, None, [])]
    occurrences = ((0, (0, None)), (0, (1, None)), (1, (0, 0)), (1, (0, 1)), (1, (1, None)),
                   (1, ("other", None)))
    pattern = (0, 1, 1, 0, 2, 0)
    want = fused.host_inputs_py(occurrences, pattern, records, tensor_data.host)
    got = ext.host_inputs(occurrences, pattern, records, tensor_data.host)
    assert len(got) == len(want) == 3
    assert all(g is w for g, w in zip(got, want))             # the same cached host views
    assert torch.equal(got[2], c.cpu())
    other = (0, 1, 1, 0, 2, 1)                              # aliasing not as compiled: None
    assert fused.host_inputs_py(occurrences, other, records, tensor_data.host) is None
    assert ext.host_inputs(occurrences, other, records, tensor_data.host) is None
    assert ext.host_inputs((), (), records, tensor_data.host) == []
    with pytest.raises(IndexError):
        ext.host_inputs(((2, (0, None)),), (0,), records, tensor_data.host)
    with pytest.raises(TypeError, match="host_inputs"):
        ext.host_inputs(occurrences, pattern[:2], records, tensor_data.host)


def test_the_engine_keeps_the_c_implementations_after_a_reset():
    """runtime.reset() refreshes the engine's __dict__; capture's C key builder must survive it
    (it did not: every capture after a reset built its keys in Python)."""
    rt.reset()
    assert rt.current().engine.describe is ext.describe
    assert record.record_run is ext.record_run
    assert pending.live_outputs is ext.live_outputs
    assert compiler.scalar_values is ext.scalar_values
    assert compiler.packed_scalars is ext.packed_scalars
    assert fused.host_inputs is ext.host_inputs
    from neuron_lab.runtime import deferral
    assert (deferral._pending, deferral._pending_dense) == (ext.pending, ext.pending_dense)


def test_record_run_records_tuples_lists_and_none_itself():
    """Layer norm's three tensors, a backward's tensor and Nones, a foreach op's list and an
    in-place foreach op's None are recorded in C; only other return values (``torch.return_types``)
    reach the Python body."""
    reached = []

    def python(*a):
        reached.append(a[0].name)
        return record.record_run_py(*a)

    def configure(body):
        ext.configure_records({"host_only": record.HOST_ONLY, "python": body})
    with rt.mode("eager"):
        x = torch.randn(4, 6).to("neuron")
        ln = aten.native_layer_norm.default(x, [6], None, None, 1e-5)
        calls = [(aten.native_layer_norm.default, (x, [6], None, None, 1e-5), ln),
                 (aten.native_layer_norm_backward.default,
                  (x, x, [6], ln[1], ln[2], None, None, [True, False, False]), None),
                 (aten._foreach_sqrt.default, ([x.abs()],), None),
                 (aten._foreach_add_.Scalar, ([x.clone()], 1.0), None),
                 (aten.max.dim, (x, 1), torch.max(x, 1))]     # torch.return_types.max
        calls = [(op, args, out if out is not None else op(*args)) for op, args, out in calls]
    configure(python)
    try:
        for op, args, out in calls:
            f = facts(op)
            key, targs, tkw = record.describe(f, args, None, 0, producers._Producers())
            ext.record_run(f, targs, tkw, key, out, None, ext.Segment())
    finally:
        configure(record.record_run_py)
    assert reached == ["aten::max.dim"]


def test_every_reference_has_its_c_implementation():
    """``core.references()``: each Python reference the modules picked an implementation for
    has one of the same name in the extension (NEURON_LAB_NATIVE_DEFER=0 runs the references)."""
    from neuron_lab.runtime import core
    refs = core.references()
    assert {"replay", "live_outputs", "host_inputs", "held_call", "Segment", "Node",
            "observe_repeats", "weak_ref"} <= refs.keys()
    for name, reference in refs.items():
        assert callable(getattr(ext, name)) and getattr(ext, name) is not reference, name


def test_refs_are_the_extensions_c_type_shared_per_output():
    """``record.Ref`` is the extension's C type (csrc/ref.cpp: record.cpp and replay.cpp read its
    fields from the struct): shared per (pos, k) by ``record.ref`` (the extension's ``ref``) and
    by the C capture alike, read-only, pickled as itself; the C replay refuses another ref type
    rather than misread."""
    import pickle
    assert record.Ref is ext.Ref
    r = record.ref(5, 1)
    assert (r.pos, r.k) == (5, 1) and repr(r) == "Ref(5, 1)" and record.ref(5, 1) is r
    with pytest.raises(AttributeError):
        r.pos = 2
    back = pickle.loads(pickle.dumps(r))
    assert type(back) is record.Ref and (back.pos, back.k) == (5, 1)
    x = torch.randn(3).to("neuron")
    y = torch.neg(x)
    seg = ext.Segment()
    key, targs, tkw = record.describe(facts(aten.neg.default), (x,), None, 0,
                                      producers._Producers())
    record.record_run(facts(aten.neg.default), targs, tkw, key, y, None, seg)
    records = seg.records
    made = seg.producers.of(y)                  # the Ref record.cpp made for y (ref_of)
    assert type(made) is ext.Ref and (made.pos, made.k) == (0, 0)
    assert made is record.ref(0, 0) and record.ref is ext.ref   # one table, C++'s
    with pytest.raises(ValueError, match="negative"):
        record.ref(-1, 0)
    with pytest.raises(TypeError, match="ref_type"):
        ext.replay(records, tensor_data.host, pending.fill, record._Ref, torch.device, None)


def test_records_and_producer_entries_are_the_extensions_c_types():
    """``record.QueuedOp`` and the producers map are the extension's C types (csrc/queued_op.cpp,
    csrc/producers.cpp), which the C++ builds and reads directly: a deferred op's record carries
    the fields the Python reference does, read-only, and its output's entries (the tensor's and
    its storage's) name it by its shared Ref, with no Python object of their own."""
    assert record.QueuedOp is ext.QueuedOp and producers.Producers is ext.Producers
    x = torch.randn(8).to("neuron")
    with rt.mode("adaptive"), knobs.COMPILE.scoped(False):
        for _ in range(3):
            y = (x * 2).tanh()
            seg = rt.current().engine.seg
            recs, prods = list(seg.records), seg.producers   # clear() starts a new map
            meta = record.out_meta(y)
            y.sum().item()
    assert [type(r) for r in recs] == [record.QueuedOp] * 2
    mul, tanh = recs
    assert mul.facts.name == "aten::mul.Tensor" and tanh.args[0] is record.ref(0, 0)
    assert len(mul.outs) == 1 and mul.outs[0] is not None and mul.plan is not None
    assert type(prods) is ext.Producers and not gc.is_tracked(prods)
    assert prods.of(y) is prods.of_storage(y, meta) is record.ref(1, 0)
    assert len(prods) == 6          # mul, tanh and the sum: each its tensor's and its storage's
    with pytest.raises(AttributeError):
        mul.args = ()
    with pytest.raises(AttributeError):
        record.ref(1, 0).pos = 3


def test_output_plans_are_the_extensions_c_types():
    """A trie node's output plan is the extension's C types (csrc/out_plan.cpp: ``OutSpec`` per
    output, ``FastOut`` for the common op), which deferral.cpp reads field by field: the plan
    of a single-output op and of a two-output one (``max.dim``, deferred in C by defer_many) are
    built as those types, read-only, pickled as themselves, and the deferred results are CPU's."""
    import pickle
    from neuron_lab.runtime import fastpath, output_plans
    assert output_plans.OutSpec is ext.OutSpec and output_plans.FastOut is ext.FastOut
    xc = torch.randn(4, 8)
    x = xc.to("neuron")
    with rt.mode("adaptive"), knobs.COMPILE.scoped(False):
        for _ in range(4):                  # the last iteration defers along a known path
            y = (x * 2).tanh()
            node = rt.current().engine.seg.node
            fast0 = fastpath.counts()[0]
            values, indices = torch.max(y, dim=1)
            in_c = fastpath.counts()[0] - fast0
            plan = rt.current().engine.seg.records[-1].plan
            (values.sum() + indices.sum()).item()
    fast = node.fast
    assert type(fast) is ext.FastOut and fast.size == (4, 8) and fast.dtype == torch.float32
    assert fast.nbytes == 4 * 8 * 4 and fast.dense and fast.queueable and fast.same_as is None
    assert fast.ref is record.ref(1, 0)
    assert in_c == 1                                         # max.dim: defer_many, in C
    assert [type(s) for s in plan] == [ext.OutSpec] * 2
    assert [(s.kind, s.nbytes, s.meta.dtype) for s in plan] == \
        [(output_plans.PENDING, 16, torch.float32), (output_plans.PENDING, 32, torch.int64)]
    with pytest.raises(AttributeError):
        fast.nbytes = 0
    with pytest.raises(AttributeError):
        plan[0].kind = 0
    back = pickle.loads(pickle.dumps((fast, plan[0])))
    assert [type(b) for b in back] == [ext.FastOut, ext.OutSpec]
    assert repr(back[0]) == repr(fast) and repr(back[1]) == repr(plan[0])
    want_v, want_i = torch.max((xc * 2).tanh(), dim=1)
    assert torch.equal(values.cpu(), want_v) and torch.equal(indices.cpu(), want_i)
    with pytest.raises(TypeError):
        ext.FastOut([4], (1,), 0, torch.float32, 16, True, True, record.ref(0, 0))  # a list


def test_out_meta_is_the_extensions_tuple_type():
    """A captured output's ``OutMeta`` is the extension's C type (csrc/out_meta.cpp), a tuple
    subclass whose fields deferral.cpp reads by name. As a key it is the reference NamedTuple's
    equal: the same tuple, equal and hashed alike, so a region or storage key built in either
    implementation finds the other's. It pickles as itself and stays off the cycle collector."""
    import gc
    import pickle
    assert record.OutMeta is ext.OutMeta and issubclass(ext.OutMeta, tuple)
    xc = torch.randn(4, 8)
    with rt.mode("adaptive"), knobs.COMPILE.scoped(False):
        x = xc.to("neuron")
        y = (x * 2).t()
        rec = rt.current().engine.seg.records[-1]
        meta = rec.metas[0]
        y.sum().item()
    assert type(meta) is ext.OutMeta
    assert (meta.size, meta.stride, meta.offset, meta.dtype) == ((8, 4), (1, 8), 0, torch.float32)
    ref = record._OutMeta((8, 4), (1, 8), 0, torch.float32)
    assert meta == ref and hash(meta) == hash(ref) == hash(tuple(ref)) and tuple(meta) == ref
    assert {(7, ref): 1}.get((7, meta)) == 1                     # a storage key's lookup
    assert meta != record._OutMeta((8, 4), (1, 8), 0, torch.float64)
    assert record.out_meta(y) == meta and type(record.out_meta(y)) is ext.OutMeta
    back = pickle.loads(pickle.dumps(meta))
    assert type(back) is ext.OutMeta and back == meta and repr(back) == repr(meta) == \
        "OutMeta(size=(8, 4), stride=(1, 8), offset=0, dtype=torch.float32)"
    assert not gc.is_tracked(meta)
    with pytest.raises(AttributeError):
        meta.size = (1,)
    with pytest.raises(TypeError):
        ext.OutMeta((8, 4), (1, 8), 0)                          # a field missing


@pytest.mark.parametrize("make", [lambda: ext.Segment(), lambda: segment._Fields()],
                         ids=["c", "reference"])
def test_the_segment_owns_its_records(make):
    """The segment's queued records and producers map are its own, in C and in the Python
    reference alike: the records read through ``depth``, ``record(i)`` and ``records`` (a copy:
    changing it queues nothing), changed by ``append`` and ``clear``; the map a read-only
    attribute that ``clear`` replaces. A copy taken before ``clear`` keeps the ended segment's
    records (what a launch runs). The C segment queues only QueuedOps."""
    seg = make()
    ops = [record.QueuedOp(facts(aten.neg.default), (), None, ("k", i), []) for i in range(3)]
    assert seg.depth == 0 and seg.records == [] and len(seg.producers) == 0
    for q in ops:
        seg.append(q)
    assert seg.depth == 3 and seg.record(0) is ops[0] and seg.record(-1) is ops[2]
    copy = seg.records
    assert copy == ops
    copy.append(ops[0])
    copy.clear()
    assert seg.depth == 3 and seg.records == ops
    kept, prods = seg.records, seg.producers
    t = torch.zeros(2).to("neuron")
    prods.set(t, record.ref(0, 0))                   # an entry of this segment's map
    seg.clear()
    assert seg.depth == 0 and kept == ops
    assert len(seg.producers) == 0 and seg.producers is not prods
    assert prods.of(t) is record.ref(0, 0) and seg.producers.of(t) is None
    with pytest.raises(IndexError):
        seg.record(0)
    with pytest.raises(AttributeError):
        seg.records = []
    with pytest.raises(AttributeError):
        seg.producers = {}
    if type(seg) is ext.Segment:
        with pytest.raises(TypeError, match="QueuedOp"):
            seg.append(object())


def test_the_producers_map_names_its_method_on_bad_input():
    """The C map takes tensors; the storage methods, tensors with a storage: a sparse tensor (no
    storage, whose ``storage()`` throws in C++) gets a TypeError naming the method, not a crash."""
    m = ext.Producers()
    r = record.ref(0, 0)
    with pytest.raises(TypeError, match="Producers.of takes a tensor, got int"):
        m.of(3)
    sparse = torch.zeros(3).to_sparse()
    for call in (lambda: m.of_storage(sparse, None), lambda: m.set_storage(sparse, r),
                 lambda: m.set_view_storage(sparse, None, r)):
        with pytest.raises(TypeError, match="Producers.* with a storage.*Sparse"):
            call()
    with pytest.raises(TypeError, match="ref must be a Ref"):
        m.set(torch.zeros(1), 0)
    assert m.of(sparse) is None and len(m) == 0
