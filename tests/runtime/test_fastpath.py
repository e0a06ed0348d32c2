"""The deferral hot path in C (runtime/csrc/deferral.cpp) against the Python engine it replaces.

The C path builds the same keys, records and producer entries as ``Engine.launch`` does in
Python (record.describe, Engine._defer_one). Checked three ways: key by key against
``record.describe`` on every kind of argument, region statistics of a real model's training
against a process that runs the Python path (NEURON_LAB_NATIVE_DEFER=0), and results bitwise
equal to CPU.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import neuron_lab.runtime as rt
from neuron_lab.device.op_facts import facts
from neuron_lab.runtime import fastpath, output_plans, producers, record
from neuron_lab.runtime.segment import _Fields

ext = fastpath.extension()
pytestmark = pytest.mark.skipif(ext is None, reason="the deferral extension is not built")

aten = torch.ops.aten


def _maps(fill=None):
    """A reference producers map and a C one (``fill``: what puts the same entries in each)."""
    maps = producers._Producers(), ext.Producers()
    for m in maps:
        if fill is not None:
            fill(m)
    return maps


def _both(op, args, kwargs, pos, fill=None):
    """record.describe with a reference map, and the C key builder with a C map, each holding
    the entries ``fill`` makes."""
    f = facts(op)
    py_map, c_map = _maps(fill)
    want = record.describe(f, args, kwargs, pos, py_map)
    got = ext.describe(f, tuple(args), kwargs, pos, c_map)
    return want, got


def _calls():
    """Calls with every kind of argument, and what fills the producers map they are described
    with (a tensor made by op 2 of the segment)."""
    n = torch.randn(3, 4).to("neuron")
    p = torch.nn.Parameter(torch.randn(4).to("neuron"))
    made = torch.randn(3, 4).to("neuron")

    def fill(m):
        m.set(made, record.ref(2, 0))

    cases = [
        (aten.mul.Tensor, (n, made), None),                        # an input, a tensor made at 2
        (aten.add.Tensor, (made, 0.5), {"alpha": 2}),              # float data, a kwarg
        (aten.view.default, (made, [4, 3]), None),                 # a top-level list of ints
        (aten.sum.dim_IntList, (n, [1], True), {"dtype": torch.float32}),
        (aten.cat.default, ([n, made, p], 0), None),               # a list of tensors
        (aten.permute.default, (n, (1, 0)), None),                  # a tuple of ints
        (aten.clamp.default, (n, None, 1.0), None),                # None, a float not data? (clamp)
        (aten.empty_like.default, (n,), {"memory_format": torch.contiguous_format}),
        (aten._foreach_mul.Scalar, ([n, p], 0.9), None),
        (aten.add.Tensor, (p, made), None),                         # a Parameter (a subclass)
    ]
    return cases, fill, made


def test_keys_equal_python_describe_for_every_argument_kind():
    cases, fill, _ = _calls()
    for op, args, kwargs in cases:
        want, got = _both(op, args, kwargs, 5, fill)
        assert got[0] == want[0], op
        assert hash(got[0]) == hash(want[0]), op
        assert len(got[1]) == len(want[1])
        for a, b in zip(got[1], want[1]):
            assert type(a) is type(b) and (a is b or a == b if not isinstance(a, torch.Tensor)
                                           else a is b), op
        assert got[2] == want[2], op


class _Sub(torch.Tensor):
    pass


def _key_or_none(f, args, kwargs, pos, py_map):
    try:
        return record.describe(f, args, kwargs, pos, py_map)
    except record.NotQueueable:
        return None


def test_the_hot_path_compares_a_trie_key_in_place_as_describe_would():
    """deferral.cpp's first try on a known path compares the call with the one child's key
    without building its own (match_key): it must find them equal exactly when
    record.describe's key equals it, and give describe's templates. Every call against every
    other's key: region inputs of other layouts and dtypes, a CPU tensor and a float64 one
    (describe refuses them), a tensor made one op further back, another kwarg, another op."""
    cases, fill, made = _calls()
    py_map, c_map = _maps(fill)
    base = torch.randn(4, 6).to("neuron")
    cases += [(aten.neg.default, (a,), None) for a in (
        base, base.t(), base[1:, 2:], base[2], base[3], torch.tensor(3.0).to("neuron"),
        torch.nn.Parameter(torch.randn(4, 6).to("neuron")), base.as_subclass(_Sub),
        torch.zeros(0, 6).to("neuron"), torch.ones(4, 6, dtype=torch.int32).to("neuron"),
        torch.randn(4, 6), torch.randn(4, 6).double().to("neuron"), made)]
    cases += [(aten.add.Tensor, (made, 0.5), {"alpha": 3}),
              (aten.sub.Tensor, (made, 0.5), {"alpha": 2}),
              (aten.view.default, (made, [2, 6]), None),
              (aten.view.default, (made, [4, True]), None),
              (aten.mul.Tensor, (made, made), None)]
    described = [(facts(op), args, kwargs, _key_or_none(facts(op), args, kwargs, 5, py_map))
                 for op, args, kwargs in cases]
    compared = 0
    for f, args, kwargs, mine in described:
        for _, _, _, other in described:
            if other is None:
                continue
            for pos in (5, 6):      # at 6, the tensor made at 2 is one op further back
                here = _key_or_none(f, args, kwargs, pos, py_map)
                got = ext.match_key(f, tuple(args), kwargs, pos, c_map, other[0])
                assert (got is not None) == (here is not None and here[0] == other[0]), (f, args)
                compared += 1
                if got is None:
                    continue
                assert len(got[0]) == len(here[1])
                for a, b in zip(got[0], here[1]):
                    assert type(a) is type(b) and (a is b or a == b), f
                assert got[1] == here[2]
    assert compared > 500


def test_region_input_keys_read_from_the_tensor_equal_the_python_attributes():
    """A plain tensor's or Parameter's input key is read from its TensorImpl in C; a subclass's
    through its Python attributes. Both are ("x", torch.Size, stride, offset, dtype)."""
    base = torch.randn(4, 6).to("neuron")
    inputs = [base, base.t(), base[1:, 2:], base[2], torch.tensor(3.0).to("neuron"),
              torch.nn.Parameter(torch.randn(2, 3).to("neuron")), base.as_subclass(_Sub),
              torch.zeros(0, 3).to("neuron"), torch.ones(5, dtype=torch.int32).to("neuron")]
    for a in inputs:
        want, got = _both(aten.neg.default, (a,), None, 0)
        key = got[0][1][0]
        assert key == want[0][1][0] == ("x", a.shape, a.stride(), a.storage_offset(), a.dtype)
        assert type(key[1]) is torch.Size and type(key[2]) is tuple and key[4] is a.dtype
        assert got[1][0] is a


def test_shallow_copy_of_an_output_is_found_by_its_storage():
    made = torch.randn(6).to("neuron")
    copy = made.data                      # a C++ shallow copy: no cached host view
    if "_d" in copy.__dict__:
        pytest.skip("this build caches host views on shallow copies")
    r = record.ref(1, 0)
    f = facts(aten.neg.default)
    for m, describe in zip(_maps(lambda m: m.set_storage(made, r)),   # a pending storage's
                           (record.describe, ext.describe)):
        assert m.of(copy) is None
        got = describe(f, (copy,), None, 4, m)
        assert got[0] == (f, (("r", 3, 0),)) and got[1][0] is r
        assert m.of(copy) is r            # an entry of its own, as record._by_storage adds


def test_shallow_copy_of_a_captured_output_with_views_names_its_own_op():
    """A captured output and its view share a storage: the copy's metadata picks the entry
    (``Producers.of_storage``), in C as in Python: each segment records the base and the view
    (``record_run`` and its reference) and describes the copies with its own map."""
    with rt.mode("eager"):
        base = torch.randn(4, 6).to("neuron")
        view = base.t()
    copies = {"base": base.data, "view": view.data}
    if any("_d" in c.__dict__ for c in copies.values()):
        pytest.skip("this build caches host views on shallow copies")
    segs = _Fields(), ext.Segment()       # the Python reference segment, the C one
    f = facts(aten.neg.default)
    for seg, run, describe in zip(segs, (record.record_run_py, ext.record_run),
                                  (record.describe, ext.describe)):
        seg.append(record.QueuedOp(f, (), None, None, []))   # op 0
        for out in (base, view):          # ops 1 and 2: the base, then its view
            run(facts(aten.t.default), (), None, None, out, None, seg)
        for name, pos in (("base", 1), ("view", 2)):
            got = describe(f, (copies[name],), None, 4, seg.producers)
            assert got[0] == (f, (("r", 4 - pos, 0),)), (name, type(seg))


@pytest.mark.parametrize("arg", [torch.randn(3, 4),                        # a CPU tensor
                                 torch.randn(3).double().to("neuron"),    # a host-only dtype
                                 object()])                               # unhashable kind
def test_unqueueable_arguments_raise_not_queueable(arg):
    n = torch.randn(3).to("neuron")
    f = facts(aten.add.Tensor)
    with pytest.raises(record.NotQueueable):
        record.describe(f, (n, arg), None, 0, producers._Producers())
    with pytest.raises(record.NotQueueable):
        ext.describe(f, (n, arg), None, 0, ext.Producers())


def test_a_training_loop_defers_in_c_and_equals_cpu(compile_off):   # per-op replay: bitwise
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    ref = [p.detach().clone() for p in model.parameters()]
    dev = __import__("copy").deepcopy(model).to("neuron")
    opt_c = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt_n = torch.optim.AdamW(dev.parameters(), lr=1e-2)
    xn, yn = x.to("neuron"), y.to("neuron")
    with rt.mode("adaptive"):
        for i in range(16):
            if i == 6:                           # the regions are known from here on
                before = fastpath.counts()
            for m, o, a, b in ((model, opt_c, x, y), (dev, opt_n, xn, yn)):
                o.zero_grad()
                torch.nn.functional.mse_loss(m(a), b).backward()
                o.step()
        rt.sync()
    fast, slow = (a - b for a, b in zip(fastpath.counts(), before))
    # per step ~22 ops stay in C, AdamW's foreach ops too (new lists, or in place returning
    # nothing); the Python engine takes each node's first deferral and what is not plain
    assert fast > 2 * slow, (fast, slow)
    for p, q in zip(model.parameters(), dev.parameters()):
        assert torch.equal(p, q.cpu())
    assert any(not torch.equal(p, r) for p, r in zip(model.parameters(), ref))


def _known_run(body, *args):
    """``body(*args)`` run four times, a sync before each (its region is known from the second
    run): the last run's result and its (ops deferred in C, calls passed to Python)."""
    for _ in range(4):
        rt.sync()
        before = fastpath.counts()
        got = body(*args)
    return got, tuple(n - m for n, m in zip(fastpath.counts(), before))


def test_calls_plain_by_their_arguments_defer_in_c_as_python_decides(compile_off):
    """An op that is not plain for every call is for some: attention with dropout_p 0 (SDPA's
    forward, twice a Llama step) and a dtype cast that stays on neuron (a bf16 model's casts).
    deferral.cpp plain_call decides them as Engine._adaptive does: deferred in C, pending,
    bitwise CPU's values; a dropout_p above 0 (random numbers) and a copy to the CPU stay
    boundaries the Python engine runs now."""
    from neuron_lab.device import tensor_data
    from neuron_lab.runtime import verdict
    F = torch.nn.functional

    def body(q, k, v):
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, is_causal=True)
        h = (a * 2.0).to(torch.bfloat16)            # _to_copy, staying on the device
        return h.float() + 1.0, a.sum()

    g = torch.Generator().manual_seed(0)
    q_cpu, k_cpu, v_cpu = (torch.randn(2, 2, 8, 16, generator=g) for _ in range(3))
    want = body(q_cpu, k_cpu, v_cpu)
    q, k, v = q_cpu.to("neuron"), k_cpu.to("neuron"), v_cpu.to("neuron")
    with rt.mode("adaptive"):
        got, (fast, slow) = _known_run(body, q, k, v)
        assert all(tensor_data.is_pending(t) for t in got)
        # sdpa, mul, _to_copy, _to_copy, add, sum: every one in C
        assert (fast, slow) == (6, 0), (fast, slow)
        whens = {f.base: w for f, w in verdict.PLAIN_WHEN.items() if w is not None}
        assert whens["_to_copy"] == (verdict.SAME_DEVICE,)
        assert any(w[0] == verdict.NO_DROPOUT for w in whens.values())
        rt.sync()
        for g_, w in zip(got, want):
            assert torch.equal(g_.cpu(), w)

        rt.sync()
        fast, slow = fastpath.counts()
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)   # draws random numbers
        c = (q * 2.0).cpu()                                          # leaves the device
        fast2, slow2 = fastpath.counts()
        assert not tensor_data.is_pending(x) and c.device.type == "cpu"
        assert slow2 - slow >= 2          # both went to the Python engine
        assert torch.equal(c, q_cpu * 2.0)
    assert x.shape == q.shape


def test_a_nodes_first_deferral_is_in_c_too(fresh_engine, compile_off):
    """The first deferral along a region's path derives each trie node's output plan
    (output_plans.derive, which deferral.cpp calls) and hands the outputs out in C, as every
    later deferral does: the Python engine takes none of the ops, the plans are derived once,
    and the values are CPU's (per-op replay: bitwise)."""
    from neuron_lab.device import tensor_data
    from neuron_lab.runtime import output_plans

    def body(a):
        values, indices = torch.max(a * 2.0, 1)          # two outputs: defer_many
        return (values.tanh() + indices).sum()           # FastOuts: defer_one

    a_cpu = torch.randn(3, 4)
    want = body(a_cpu)
    a = a_cpu.to("neuron")
    body(a).item()                                       # captured; cached at the sync
    nodes, node = [], fresh_engine.cache.root
    while node.children:
        node = next(iter(node.children.values()))
        nodes.append(node)
    assert len(nodes) == 5 and all(n.fast is None for n in nodes)
    fast, slow = fastpath.counts()
    got = body(a)                                        # the first deferral of every node
    fast, slow = (n - m for n, m in zip(fastpath.counts(), (fast, slow)))
    assert tensor_data.is_pending(got)
    assert (fast, slow) == (5, 0)
    assert [type(n.fast) for n in nodes] == \
        [output_plans.FastOut, bool, output_plans.FastOut, output_plans.FastOut,
         output_plans.FastOut]
    assert all(n.plan is not None for n in nodes)
    assert torch.equal(got.cpu(), want)


def test_in_place_ops_defer_in_c_and_equal_cpu(compile_off):
    """An op whose output is the caller's own tensor (``add_``, ``mul_``, ``clamp_``: a
    non-foreach optimizer's step) is deferred in C too (deferral.cpp defer_many): it returns the
    caller's tensor, whose producer entry makes the next op read this op's result. One that
    changes its tensor's metadata (``t_``) stays with the Python engine, which restrides it.
    Values: CPU's, bitwise (per-op replay)."""
    from neuron_lab.device import tensor_data

    def body(a, b):
        c = a * 2.0
        c.add_(b).mul_(0.5)
        c.clamp_(min=-0.25)
        d = (b + 1.0).t_()
        return c.tanh() + d.t()

    a_cpu, b_cpu = torch.randn(3, 4), torch.randn(3, 4)
    want = body(a_cpu, b_cpu)
    with rt.mode("adaptive"):
        got, (fast, slow) = _known_run(body, a_cpu.to("neuron"), b_cpu.to("neuron"))
        assert tensor_data.is_pending(got)
        # mul, add_, mul_, clamp_, add, tanh, t, add in C; t_ in Python
        assert (fast, slow) == (8, 1), (fast, slow)
        rt.sync()
    assert torch.equal(got.cpu(), want)


def test_ops_with_several_new_outputs_defer_in_c_and_equal_cpu(compile_off):
    """Ops whose outputs are all new (a tuple, a list of views, a foreach list) or that return
    nothing (in place, foreach) are deferred in C (deferral.cpp defer_many), as Engine._defer
    does: pending until the region runs, then the values eager gives (per-op replay: bitwise)."""
    from neuron_lab.device import tensor_data

    def body(a, b):
        values, indices = torch.max(a * b, 1)
        lo, hi = torch.split(a + 1.0, 2, dim=1)
        var, mean = torch.var_mean(lo * hi, 0)
        roots = torch._foreach_sqrt([a.abs(), b.abs()])
        torch._foreach_mul_(roots, 0.5)
        return values + indices, var - mean, roots[0] * roots[1]

    a_cpu, b_cpu = torch.randn(3, 4), torch.randn(3, 4)
    want = body(a_cpu, b_cpu)
    with rt.mode("adaptive"):
        got, (fast, slow) = _known_run(body, a_cpu.to("neuron"), b_cpu.to("neuron"))
        assert all(tensor_data.is_pending(t) for t in got)
        # 13 ops (mul, max, add, split, mul, var_mean, abs, abs, _foreach_sqrt, _foreach_mul_,
        # add, sub, mul): all in C, the region's first (it starts the segment from the root)
        # and the five with several outputs too
        assert (fast, slow) == (13, 0)
        rt.sync()
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)


SCRIPT = textwrap.dedent("""
    import json, torch, torch.nn.functional as F
    import neuron_lab, neuron_lab.runtime as rt
    from neuron_lab.runtime import fastpath
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    model = LlamaForCausalLM(cfg).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (2, 16)).to("neuron")
    losses = []
    for _ in range(8):
        opt.zero_grad()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    s = rt.stats()
    print(json.dumps({"losses": losses, "hits": s["hits"], "misses": s["misses"],
                      "regions": s["regions"], "ops_deferred": s["ops_deferred"],
                      "counts": fastpath.counts()}))
""")


def _run(native: str) -> dict:
    env = dict(os.environ, NEURON_LAB_NATIVE_DEFER=native, NEURON_LAB_COMPILE="0")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_llama_training_regions_are_the_same_with_and_without_the_c_path():
    pytest.importorskip("transformers")
    c, py = _run("1"), _run("0")
    assert py["counts"] == [0, 0]
    assert c["counts"][0] > 0
    for k in ("hits", "misses", "regions", "ops_deferred"):
        assert c[k] == py[k], (k, c, py)
    assert c["losses"] == py["losses"]           # per-op replay: bitwise the same


CAPTURE = textwrap.dedent("""
    import json, torch
    import neuron_lab, neuron_lab.runtime as rt
    from neuron_lab.runtime import fastpath
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                            torch.nn.Linear(16, 4)).to("neuron")
    x, y = torch.randn(4, 8).to("neuron"), torch.randn(4, 4).to("neuron")
    with neuron_lab.mode("adaptive"):
        loss = torch.nn.functional.mse_loss(m(x), y)     # the forward's segment, op by op
        loss.backward()                                  # then the backward's
        value = loss.item()
    path = []
    for key, node in rt.current().engine.cache.root.children.items():    # one chain per segment
        while True:
            path.append([repr(key), [repr(tuple(mt)) if mt is not None else None
                                     for mt in node.metas],
                         [node.where[0].rsplit("/", 1)[-1], node.where[1]] if node.where else None])
            if not node.children:
                break
            (key, node), = node.children.items()
    print(json.dumps({"path": path, "loss": value, "captured": fastpath.captured(),
                      "stats": {k: rt.stats()[k] for k in ("launches_per_op", "ops_per_op")}}))
""")


def test_ops_captured_in_c_are_recorded_as_python_records_them():
    """Capture in C (run now, record, the user's line) builds the trie path Python builds: the
    same keys, output metadata and user lines, op by op, and the same counters."""
    runs = {}
    for native in ("1", "0"):
        env = dict(os.environ, NEURON_LAB_NATIVE_DEFER=native, NEURON_LAB_COMPILE="0")
        out = subprocess.run([sys.executable, "-c", CAPTURE], env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        runs[native] = json.loads(out.stdout.strip().splitlines()[-1])
    c, py = runs["1"], runs["0"]
    # in C: every op but a segment's first and an op's first call (verdict.plain is learnt then)
    assert py["captured"] == 0 and c["captured"] >= 10
    assert len(c["path"]) > 20 and c["path"] == py["path"]
    assert all(w is not None and w[0] == "<string>" for _, _, w in c["path"])
    assert c["stats"] == py["stats"] and c["loss"] == py["loss"]


def test_captured_ops_get_their_own_line_when_lines_alternate_in_one_function(compile_off):
    """The user's line of a captured op (csrc/deferral.cpp ``user_line``) is kept for the next
    op issued by the same instruction of the same code; ops from other lines of the same
    function, and from the same line of another function, each get their own."""
    import inspect
    rt.install()

    def lines(x):
        a = x * 2.0                                   # +1
        b = a + x; c = b.tanh()                       # noqa: E702 - two ops, one line: +2
        d = a * c                                     # +3
        return (d - b).sum()                          # +4

    def other(x):
        return x.sin()                                # +1

    first = inspect.getsourcelines(lines)[1]
    x = torch.linspace(-1, 1, 8).to("neuron")
    with rt.mode("adaptive"):
        (lines(x) + other(x).sum()).item()       # the segment's first op and first calls: Python
        before = fastpath.captured()
        call = inspect.currentframe().f_lineno + 1
        (lines(x * 3) + other(x * 3).sum()).item()
        assert fastpath.captured() - before >= 6
    region = rt.current().engine.cache.regions()[-1]
    node, got = rt.current().engine.cache.root, []
    for key in region.keys:                          # the second segment's path, op by op
        node = node.children[key]
        assert node.where is not None and node.where[0] == __file__
        got.append(node.where[1])
    sin = inspect.getsourcelines(other)[1] + 1
    assert got == [call, first + 1, first + 2, first + 2, first + 3, first + 4, first + 4,
                   call, sin, call, call]


def test_an_op_the_direct_kernel_cannot_run_is_captured_without_python(compile_off, monkeypatch):
    """Capture in C runs an op whose PrivateUse1 kernel is not the direct kernel (``zero_``)
    through the device's ``execute`` itself, as ``kernels.run_now`` would, not through
    ``run_now``'s Python frame; the results equal CPU's."""
    from neuron_lab.device import kernels
    assert not facts(aten.zero_.default).direct_kernel
    calls = []
    real = kernels.run_now
    monkeypatch.setattr(kernels, "run_now", lambda f, a, k: calls.append(f) or real(f, a, k))
    rt.install()          # the C path takes run_now at configure

    def step(x, k):
        y = x * k
        y.zero_()             # an op's first call is captured in Python (its verdict is learnt)
        return (y + x).sum()

    try:
        x_cpu = torch.linspace(-1, 1, 12)
        x = x_cpu.to("neuron")
        with rt.mode("adaptive"):
            first = step(x, 2.0).item()
            before = fastpath.captured()
            again = step(x * 3, 2.0).item()    # a new segment: its ops after the first, in C
            captured = fastpath.captured() - before
        assert first == step(x_cpu, 2.0).item() and again == step(x_cpu * 3, 2.0).item()
        assert captured >= 2 and calls == []
    finally:
        monkeypatch.undo()
        rt.install()


def test_a_pending_output_made_in_c_is_the_tensor_python_makes():
    """The C path builds a dense pending output itself (not through create_empty_tensor): it
    must be the same kind of tensor ``tensor_data.pending_dense`` makes, and get its value like
    one."""
    from neuron_lab.device import tensor_data
    x_cpu = torch.linspace(-1, 1, 12).reshape(3, 4)
    x = x_cpu.to("neuron")
    with rt.mode("adaptive"):
        for _ in range(3):                       # the region is known from the second run
            rt.sync()
            before = fastpath.counts()[0]
            y = (x * 2.0).tanh().add(1.0)        # the region's first op starts the segment
        assert fastpath.counts()[0] == before + 3
        ref = tensor_data.pending_dense((3, 4), torch.float32)
        for t in (y, ref):
            st = t.untyped_storage()
            assert (t.device, t.dtype, t.shape, t.stride(), t.requires_grad) == (
                torch.device("neuron", 0), torch.float32, (3, 4), (4, 1), False)
            assert (st.device, st.nbytes(), t.__dict__.get("_d", 0),
                    tensor_data.storage_is_pending(t)) == (torch.device("neuron", 0), 0, None, True)
        assert tensor_data.is_pending(y)
        rt.sync()
    assert torch.equal(y.cpu(), (x_cpu * 2.0).tanh().add(1.0))


def test_a_strided_pending_output_made_in_c_is_the_tensor_python_makes():
    """A deferred op whose output is not contiguous at offset 0 (a transpose, a slice: pending
    views) gets a device tensor with its strides and offset, like tensor_data.pending's, and its
    value."""
    from neuron_lab.device import tensor_data
    x_cpu = torch.linspace(-1, 1, 24).reshape(4, 6)
    x = x_cpu.to("neuron")
    with rt.mode("adaptive"):
        for _ in range(3):
            rt.sync()
            before = fastpath.counts()[0]
            y = (x * 2.0).t()[1:, ::2]           # view outputs: strided, at an offset
        assert fastpath.counts()[0] == before + 4  # mul, t, slice, slice
        ref = tensor_data.pending(y.shape, y.stride(), torch.float32, y.storage_offset())
        for t in (y, ref):
            st = t.untyped_storage()
            assert (t.shape, t.stride(), t.storage_offset()) == ((5, 2), (1, 12), 1)
            assert (st.device, st.nbytes(), st.resizable(), t.__dict__.get("_d", 0),
                    tensor_data.storage_is_pending(t)) == (
                torch.device("neuron", 0), 4 * 18, False, None, True)
        rt.sync()
    assert torch.equal(y.cpu(), (x_cpu * 2.0).t()[1:, ::2])


@pytest.mark.parametrize("size, stride, offset", [
    ((3, 4), (4, 1), 0),          # dense
    ((4, 3), (1, 4), 0),          # a transpose
    ((2, 3), (4, 1), 5),          # at an offset
    ((2, 1, 3), (3, 3, 1), 0),    # torch's contiguous strides, a size-1 dimension's included
    ((2, 1, 3), (3, 1, 1), 0),    # the same sizes, another stride on the size-1 dimension
    ((0, 3), (3, 1), 0),          # empty
])
def test_pending_shells_made_in_c_are_the_shells_python_makes(size, stride, offset):
    """Engine._defer's device tensors for ops with several outputs (deferral.cpp pending and
    pending_dense against tensor_data.pending and tensor_data.pending_dense)."""
    from neuron_lab.device import tensor_data
    pairs = [(ext.pending(size, stride, torch.float16, offset),
              tensor_data.pending(size, stride, torch.float16, offset))]
    if offset == 0 and stride == torch.empty(size).stride():
        pairs.append((ext.pending_dense(torch.Size(size), torch.float16),
                      tensor_data.pending_dense(size, torch.float16)))
    for got, want in pairs:
        for t in (got, want):
            assert t.__dict__.get("_d", 0) is None and tensor_data.storage_is_pending(t)
        g, w = got.untyped_storage(), want.untyped_storage()
        assert (got.shape, got.stride(), got.storage_offset(), got.dtype, got.device) == \
            (want.shape, want.stride(), want.storage_offset(), want.dtype, want.device)
        assert (g.nbytes(), g.resizable(), g.device) == (w.nbytes(), w.resizable(), w.device)
    with pytest.raises(ValueError, match="lengths"):
        ext.pending((2, 3), (1,), torch.float32)


def test_deferred_bookkeeping_stays_off_the_cycle_collector(compile_off):
    """What a deferred op keeps until its region launches (record, producer entries, weak
    references, templates) is untracked, and the record holds the trie's key, not a copy: else
    every young collection scans them and promotes them, and the promotions made CPython run a
    ~200 ms full collection every ~100 steps of a Llama training loop (docs/performance.md)."""
    import gc
    w = torch.randn(8, 8).to("neuron")
    x = torch.randn(4, 8).to("neuron")

    def step():
        h = torch.nn.functional.linear(x, w).relu()
        return (h * 2.0 + 1.0).sum(dim=1, keepdim=True)

    for _ in range(4):                       # record, then a known region
        step()
        rt.sync()
    before = fastpath.counts()
    out = step()                             # deferred along the known path, not launched yet
    eng = rt.current().engine
    fast = fastpath.counts()[0] - before[0]
    assert fast >= 3 and len(eng.seg.records) >= fast
    node = eng.seg.node
    for rec in reversed(eng.seg.records[-fast:]):
        assert not gc.is_tracked(rec), rec.facts
        assert not gc.is_tracked(rec.outs) and not gc.is_tracked(rec.outs[0])
        assert not any(gc.is_tracked(r) for r in rec.outs[0])
        assert not gc.is_tracked(rec.args)
        assert rec.key is node.key and not gc.is_tracked(rec.key)   # the trie's own key
        node = None if node is None else _parent(eng, node)
    first_c = len(eng.seg.records) - fast        # the ops deferred in C: the last `fast` records
    refs = [r for r in eng.seg.producers.refs() if r.pos >= first_c]   # no object per entry
    assert refs and not gc.is_tracked(eng.seg.producers) and not any(map(gc.is_tracked, refs))
    assert torch.equal(out.cpu(), step().cpu())


def _parent(eng, node):
    """The trie node whose child is ``node`` (the tests walk records back from the position)."""
    stack = [eng.cache.root]
    while stack:
        n = stack.pop()
        for c in n.children.values():
            if c is node:
                return n
            stack.append(c)
    return None


def test_ops_deferred_in_c_are_counted_when_the_counts_are_read(compile_off):
    """The C path counts a deferral per op in C++ (no Python counter update per op);
    executed_ops() adds them when read, as many as the eager path counts."""
    import neuron_lab
    x = torch.randn(64).to("neuron")
    with neuron_lab.mode("adaptive"):
        for _ in range(4):
            (x * 2 + 1).tanh().sum().item()
        neuron_lab.clear_op_tracking()
        fast0 = fastpath.counts()[0]
        for _ in range(5):
            (x * 2 + 1).tanh().sum().item()
        deferred_in_c = fastpath.counts()[0] - fast0
        got = neuron_lab.executed_ops()
    assert deferred_in_c >= 15
    assert {k: got.get(k) for k in ("aten::mul.Tensor", "aten::add.Tensor", "aten::tanh")} == \
        {"aten::mul.Tensor": 5, "aten::add.Tensor": 5, "aten::tanh": 5}
    assert neuron_lab.executed_ops() == got          # read once: nothing counted twice


def test_the_c_types_carry_their_references_fields_in_order():
    """The records the C++ reads (OutMeta, QueuedOp, FastOut, OutSpec) are the extension's own C
    types, read by field; each has its Python reference's fields, in the same order, so a record
    built positionally means the same in both implementations."""
    meta = record.OutMeta((2, 8), (8, 1), 0, torch.float32)
    assert record.OutMeta._fields == record._OutMeta._fields == ("size", "stride", "offset",
                                                                 "dtype")
    assert [getattr(meta, f) for f in record._OutMeta._fields] == list(meta)
    q = record.QueuedOp("facts", "args", "kwargs", "key", "outs", "metas", "structure", "where",
                        "plan")
    assert [getattr(q, f) for f in record._QueuedOp._fields] == list(record._QueuedOp._fields)
    spec = output_plans.OutSpec(2, "arg", "meta", 64, True, False, True)
    assert [getattr(spec, f) for f in output_plans._OutSpec._fields] == \
        [2, "arg", "meta", 64, True, False, True]
    fast = output_plans.FastOut((2, 8), (8, 1), 0, torch.float32, 64, True, True,
                                record.ref(3, 0), (1, 0), True)
    assert [getattr(fast, f) for f in output_plans._FastOut._fields] == \
        [(2, 8), (8, 1), 0, torch.float32, 64, True, True, record.ref(3, 0), (1, 0), True]