"""Per-op replay in C (runtime/csrc/replay.cpp) against its Python reference
(``replay.replay_py``): the same values in the same pending outputs, dead outputs skipped, and
an op that raises marked with its index and record for the engine's explanation."""
import weakref

import pytest
import torch

import neuron_lab.runtime as rt
from neuron_lab.device import tensor_data
from neuron_lab.device.executor import host_device
from neuron_lab.device.op_facts import facts
from neuron_lab.runtime import core, record, replay
from neuron_lab.runtime.pending import fill

ext = core.extension()
pytestmark = pytest.mark.skipif(ext is None, reason="the runtime extension is not built")

aten = torch.ops.aten
TWINS = {"c": lambda recs: ext.replay(recs, tensor_data.host, fill, record.Ref, torch.device,
                                      host_device),
         "python": lambda recs: replay.replay_py(recs, tensor_data.host, fill, record.Ref,
                                                 torch.device, host_device)}


def _rec(op, args, kwargs=None, outs=(None,)):
    return record.QueuedOp(facts(op), tuple(args), kwargs, None, list(outs), None, "t", None,
                           None)


def _target(size, dtype=torch.float32):
    """A pending output and its weak pair, as a deferred op's record holds it."""
    t = tensor_data.pending_dense(size, dtype)
    return t, (weakref.ref(t), weakref.ref(t.untyped_storage()))


def _queue(x, y):
    """Records of every argument kind: a region input, a Ref (also to a second output), a float,
    a kwarg, a list of tensors, a neuron device keyword, several outputs; the pending outputs
    (one of them dropped before the replay)."""
    r = record.ref
    outs = {}
    t = {k: _target(s, d) for k, s, d in (("mul", (3, 4), torch.float32),
                                          ("add", (3, 4), torch.float32),
                                          ("cat", (6, 4), torch.float32),
                                          ("zeros", (2,), torch.float32),
                                          ("idx", (3,), torch.int64),
                                          ("dead", (3, 4), torch.float32))}
    for k, (tensor, pair) in t.items():
        outs[k] = tensor
    recs = [
        _rec(aten.mul.Tensor, (x, 2.5), outs=[t["mul"][1]]),
        _rec(aten.add.Tensor, (r(0, 0), y), {"alpha": 3}, outs=[t["add"][1]]),
        _rec(aten.cat.default, ([r(1, 0), x], 0), outs=[t["cat"][1]]),
        _rec(aten.zeros.default, ([2],), {"device": torch.device("neuron", 0)},
             outs=[t["zeros"][1]]),
        _rec(aten.max.dim, (r(2, 0), 1), outs=[None, t["idx"][1]]),
        _rec(aten.neg.default, (r(0, 0),), outs=[t["dead"][1]]),
    ]
    del outs["dead"], t["dead"]      # its tensor dies: the replay must skip it
    return recs, outs


def test_the_c_replay_fills_the_outputs_python_fills():
    x_cpu, y_cpu = torch.randn(3, 4), torch.randn(3, 4)
    x, y = x_cpu.to("neuron"), y_cpu.to("neuron")
    got = {}
    with rt.mode("eager"):
        for name, run in TWINS.items():
            recs, outs = _queue(x, y)
            run(recs)
            # every value lands on the host device (a neuron device keyword included)
            assert all(v.__dict__["_d"].device == host_device() for v in outs.values()), name
            got[name] = {k: v.cpu() for k, v in outs.items()}
    mul = x_cpu * 2.5
    add = torch.add(mul, y_cpu, alpha=3)
    want = {"mul": mul, "add": add, "cat": torch.cat([add, x_cpu]), "zeros": torch.zeros(2),
            "idx": torch.cat([add, x_cpu]).max(1).indices}
    for name in TWINS:
        assert got[name].keys() == want.keys()
        for k, w in want.items():
            assert torch.equal(got[name][k], w), (name, k)


def test_an_op_that_raises_is_marked_with_its_record_by_both():
    x = torch.randn(3, 4).to("neuron")
    for name, run in TWINS.items():
        bad = _rec(aten.mm.default, (x, x))          # (3, 4) @ (3, 4): raises at run time
        recs = [_rec(aten.neg.default, (x,)), bad]
        with pytest.raises(RuntimeError) as e:
            run(recs)
        assert e.value.neuron_lab_failed == (1, bad), name


def test_per_op_takes_the_c_implementation():
    assert replay.replay is ext.replay


def test_both_let_an_output_go_after_the_last_op_reading_it():
    """As eager lets an intermediate go: op 0's value is read by ops 1 and 3, op 1's by op 2,
    op 2's by op 3; op 4 reads only the input. Each fill (the test's: it keeps only a weak
    reference) sees which earlier host values are gone."""
    assert replay.freed_after(_chain(torch.randn(2, 3).to("neuron"))[0], record.Ref) == \
        [[], [], [1], [0, 2, 3], [4]]
    x = torch.randn(2, 3).to("neuron")
    for name in TWINS:
        recs, targets = _chain(x)
        seen, gone_at = [], []

        def weak_fill(tgt, h):
            gone_at.append([j for j, w in enumerate(seen) if w() is None])
            seen.append(weakref.ref(h))
        run = {"c": ext.replay, "python": replay.replay_py}[name]
        run(recs, tensor_data.host, weak_fill, record.Ref, torch.device, host_device)
        # at op i's fill: the values let go after ops 0 .. i-1
        assert gone_at == [[], [], [], [1], [0, 1, 2, 3]], name
        del targets


def _chain(x):
    r = record.ref
    targets = [_target((2, 3)) for _ in range(5)]
    recs = [_rec(aten.neg.default, (x,), outs=[targets[0][1]]),
            _rec(aten.mul.Tensor, (r(0, 0), 2.0), outs=[targets[1][1]]),
            _rec(aten.add.Tensor, (r(1, 0), x), outs=[targets[2][1]]),
            _rec(aten.add.Tensor, (r(0, 0), r(2, 0)), outs=[targets[3][1]]),
            _rec(aten.neg.default, (x,), outs=[targets[4][1]])]
    return recs, targets
