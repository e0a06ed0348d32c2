"""The direct eager kernel (device/csrc/direct.cpp): plain ops in eager mode run in C++ without
entering Python, with the Python kernel's results, errors, memory accounting and op counts; every
other call reaches the generic kernel (runtime_interface.launch or execute, called from C++:
test_python_call.py)."""
import gc
import os
import subprocess
import sys
import threading

import pytest
import torch

import neuron_lab
from neuron_lab.device import config, executor, registry, runtime_interface, tensor_data
from neuron_lab.runtime import knobs

pytestmark = pytest.mark.skipif(
    registry._native is None or not config.DIRECT.get() or executor.host_device().type != "cpu",
    reason="the direct kernel runs on the CPU executor with the native extension built "
           "(not NEURON_LAB_DIRECT=0)")

ext = registry._native


@pytest.fixture(autouse=True)
def eager():
    neuron_lab.clear_op_tracking()
    with neuron_lab.mode("eager"):
        yield


def direct_runs(fn):
    """(fn's result, {op: runs on the direct path while fn ran})."""
    ext.direct_counts()
    out = fn()
    return out, ext.direct_counts()


def test_eager_mode_turns_the_direct_kernel_on_and_adaptive_mode_off():
    assert runtime_interface.direct and ext.direct_enabled()
    with neuron_lab.mode("adaptive"):
        assert not runtime_interface.direct and not ext.direct_enabled()
    assert ext.direct_enabled()


def test_plain_ops_run_on_the_direct_path_and_are_counted():
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    a, b = x.to("neuron"), y.to("neuron")
    out, runs = direct_runs(lambda: torch.tanh(a * b + a).sum(0))
    assert torch.equal(out.cpu(), torch.tanh(x * y + x).sum(0))
    assert runs == {"aten::mul.Tensor": 1, "aten::add.Tensor": 1, "aten::tanh": 1,
                    "aten::sum.dim_IntList": 1}
    neuron_lab.clear_op_tracking()
    torch.relu(a)
    assert neuron_lab.executed_ops() == {"aten::relu": 1}     # C++ counts reach executed_ops


CASES = [
    ("strided input", lambda t: t.t() * 2.0),                  # output keeps the input's layout
    ("offset input", lambda t: t[1:, 2:] + 1.0),
    ("negative view", lambda t: t._neg_view() * 1.0),          # the neg bit reaches the host view
    ("CPU scalar tensor", lambda t: t * torch.tensor(3.0)),
    ("list of tensors", lambda t: torch.cat([t, t * 2.0], 1)),
    ("kwarg", lambda t: torch.add(t, t, alpha=3)),
    ("int result", lambda t: (t > 0).sum()),
    ("bf16", lambda t: t.bfloat16().exp()),
    ("reduction with dims", lambda t: t.mean(dim=(0,), keepdim=True)),
    ("matmul", lambda t: t @ t.t()),
]


@pytest.mark.parametrize("fn", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_results_equal_cpu_bitwise_with_the_same_layout(fn):
    x = torch.randn(6, 6)
    got, want = fn(x.to("neuron")), fn(x)
    assert got.device.type == "neuron"
    assert (got.shape, got.stride(), got.storage_offset(), got.dtype) == \
        (want.shape, want.stride(), want.storage_offset(), want.dtype)
    assert torch.equal(got.cpu(), want)


def test_views_share_their_base_storage_and_in_place_ops_return_self():
    x = torch.randn(4, 6)
    n = x.to("neuron")

    def work():
        v = n.t()[1:, ::2].unsqueeze(0)                         # t, slice, unsqueeze
        w = v.reshape(-1)                                       # not viewable: a copy
        same = n.mul_(2.0)                                      # pointwise in place
        return v, w, same
    (v, w, same), runs = direct_runs(work)
    assert {"aten::t", "aten::slice.Tensor", "aten::unsqueeze", "aten::mul_.Tensor"} <= set(runs)
    assert same is n
    assert v.untyped_storage().data_ptr() == n.untyped_storage().data_ptr()
    assert torch._C._is_alias_of(v, n)                           # one StorageImpl, as on any device
    want = (x * 2.0).t()[1:, ::2].unsqueeze(0)
    assert (v.shape, v.stride(), v.storage_offset()) == (want.shape, want.stride(),
                                                         want.storage_offset())
    assert torch.equal(v.cpu(), want)                            # the view sees the write
    assert torch.equal(w.cpu(), x.t()[1:, ::2].reshape(-1))     # copied before the write
    assert n._version == 1                                       # autograd's counter moved


def test_size_one_dimensions_keep_cpus_strides():
    """A contiguous (2, 50, 1) tensor may have strides (50, 1, 50); CPU's kernels choose their
    paths by them (bmm's for linalg.pinv's backward), so a device tensor and the host view
    rebuilt from it keep them exactly, through every path."""
    h = torch.empty_strided((2, 50, 1), (50, 1, 50)).normal_()
    n = h.to("neuron")
    for got, want in ((n, h), (n * 1.0, h * 1.0), (n.expand(2, 50, 1), h.expand(2, 50, 1)),
                      (n.clone(), h.clone())):
        assert got.stride() == want.stride()
    a, b = torch.randn(2, 50, 1), torch.randn(2, 50, 1)
    x, y = a.to("neuron").requires_grad_(), b.to("neuron").requires_grad_()
    ca, cb = a.clone().requires_grad_(), b.clone().requires_grad_()
    torch.linalg.pinv(ca @ cb.mT).sum().backward()
    torch.linalg.pinv(x @ y.mT).sum().backward()
    assert torch.equal(y.grad.cpu(), cb.grad) and torch.equal(x.grad.cpu(), ca.grad)


def test_a_view_op_that_copies_takes_the_python_path():
    x = torch.randn(3, 3)
    r, runs = direct_runs(lambda: x.to("neuron").t().reshape(9))   # reshape of a transpose copies
    assert torch.equal(r.cpu(), x.t().reshape(9))


def test_in_place_errors_leave_self_unchanged():
    x = torch.arange(6.0).view(2, 3)
    n = x.to("neuron")
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        n.add_(torch.ones(4, 2, 3).to("neuron"))
    i = torch.arange(6).to("neuron")
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type"):
        i.mul_(1.5 * torch.ones(6).to("neuron"))
    assert torch.equal(n.cpu(), x) and torch.equal(i.cpu(), torch.arange(6))


def test_a_direct_output_is_a_full_device_tensor_for_python():
    x = torch.randn(4, 4)
    c = x.to("neuron") * 2.0                                   # made in C++: no Python attributes
    assert "_d" not in c.__dict__
    st = c.untyped_storage()
    assert st.data_ptr() != 0 and st.nbytes() == 64
    assert tensor_data.host_storage(st).data_ptr() == st.data_ptr()
    v = c.view(16)                                             # a view shares the storage
    assert v.untyped_storage().data_ptr() == st.data_ptr()
    c.add_(1.0)                                                # in place: the Python path
    assert torch.equal(v.cpu(), (x * 2.0 + 1.0).view(16))
    c.t_()                                                     # metadata in place
    assert torch.equal(c.cpu(), (x * 2.0 + 1.0).t())
    assert c.tolist() == (x * 2.0 + 1.0).t().tolist()


def test_memory_is_counted_and_freed():
    n = torch.randn(1024).to("neuron")
    base = torch.neuron.memory_allocated()
    y, runs = direct_runs(lambda: n * 2.0)
    assert runs == {"aten::mul.Tensor": 1}
    assert torch.neuron.memory_allocated() == base + 4096
    del y
    assert torch.neuron.memory_allocated() == base


def test_copies_check_their_bytes_and_run_on_the_direct_path():
    """``clone`` (``.contiguous()``) and ``cat`` are sized (their bytes are checked before the
    host allocates): the direct kernel checks them itself (sizing.DIRECT_SIZED)."""
    x = torch.randn(6, 5)
    n = x.to("neuron")
    got, runs = direct_runs(lambda: (n.t().contiguous(), torch.cat([n, n * 2.0], 0)))
    assert runs == {"aten::t": 1, "aten::clone": 1, "aten::mul.Tensor": 1, "aten::cat": 1}
    want = (x.t().contiguous(), torch.cat([x, x * 2.0], 0))
    for g, w in zip(got, want):
        assert (g.shape, g.stride()) == (w.shape, w.stride()) and torch.equal(g.cpu(), w)
    base = torch.neuron.memory_allocated()
    with config.HBM_GB.scoped((base + 200) / (1 << 30)):        # room for 50 floats
        with pytest.raises(torch.OutOfMemoryError, match="aten::cat"):
            torch.cat([n, n], 0)                                # 60 floats
        a, b = n[:2], n[:3]
        small, runs = direct_runs(lambda: torch.cat([a, b], 0))     # 25 floats
        assert runs == {"aten::cat": 1} and torch.equal(small.cpu(), x[[0, 1, 0, 1, 2]])
    assert torch.neuron.memory_allocated() == base + 100


TUPLES = [
    ("aten::topk", lambda t: t.topk(3, dim=1)),
    ("aten::max.dim", lambda t: t.max(dim=0)),
    ("aten::native_layer_norm", lambda t: torch.ops.aten.native_layer_norm(t, [6], None, None,
                                                                           1e-5)),
    ("aten::nll_loss_forward", lambda t: torch.ops.aten.nll_loss_forward(
        t.log_softmax(1), torch.tensor([0, 1, 2, 3, 4, 5]).to(t.device), None, 1, -100)),
    ("aten::_scaled_dot_product_flash_attention_for_cpu",
     lambda t: torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
         t.view(1, 1, 6, 6), t.view(1, 1, 6, 6), t.view(1, 1, 6, 6), 0.0, True)),
]


@pytest.mark.parametrize("op,fn", TUPLES, ids=[c[0] for c in TUPLES])
def test_ops_returning_several_new_tensors_run_direct_bitwise(op, fn):
    x = torch.randn(6, 6)
    n = x.to("neuron")
    base = torch.neuron.memory_allocated()
    got, runs = direct_runs(lambda: fn(n))
    want = fn(x)
    assert runs[op] == 1
    for g, w in zip(got, want):
        assert g.device.type == "neuron" and (g.shape, g.stride(), g.dtype) == \
            (w.shape, w.stride(), w.dtype)
        assert torch.equal(g.cpu(), w)
    assert torch.neuron.memory_allocated() > base
    del got, g
    assert torch.neuron.memory_allocated() == base


def test_attention_with_dropout_draws_on_the_python_path():
    """``dropout_p`` 0 runs on the direct kernel; any other value draws random numbers: the
    Python path (host generator, recorded as a fallback)."""
    q = torch.randn(1, 2, 4, 8).to("neuron")
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    _, runs = direct_runs(lambda: flash(q, q, q, 0.0, False))
    assert runs == {"aten::_scaled_dot_product_flash_attention_for_cpu": 1}
    neuron_lab.clear_op_tracking()
    ext.direct_counts()
    with pytest.raises(RuntimeError, match="dropout"):         # CPU's flash kernel: no dropout
        flash(q, q, q, 0.5, False)
    assert ext.direct_counts() == {}
    assert any(r["op"] == "aten::_scaled_dot_product_flash_attention_for_cpu"
               for r in neuron_lab.fallback_ops())


def test_several_outputs_past_the_capacity_raise_and_nothing_stays_counted():
    n = torch.randn(256, 256).to("neuron")                      # 256 KiB
    gc.collect()            # earlier tests' cyclic garbage (exception frames) must not die mid-test
    base = torch.neuron.memory_allocated()
    with config.HBM_GB.scoped((base + (300 << 10)) / (1 << 30)):   # not for both outputs
        with pytest.raises(torch.OutOfMemoryError, match="aten::topk"):
            n.topk(200, dim=1)                                  # 200 KiB values + 400 indices
    assert torch.neuron.memory_allocated() == base


def test_a_batch_norm_past_the_capacity_updates_its_running_stats_once():
    """``native_batch_norm`` writes its running statistics though its schema does not say so:
    it stays off the direct kernel, whose Python-path retry after an output past the capacity
    would update them twice (op_facts.UNDECLARED_WRITES)."""
    bn = torch.nn.BatchNorm1d(64)
    x = torch.randn(4096, 64)
    dbn, dx = torch.nn.BatchNorm1d(64).to("neuron"), x.to("neuron")
    base = torch.neuron.memory_allocated()
    with config.HBM_GB.scoped((base + (512 << 10)) / (1 << 30)):   # not the 1 MiB output
        with pytest.raises(torch.OutOfMemoryError):
            dbn(dx)
    bn(x)                                                          # one update, on the CPU
    assert torch.equal(dbn.running_mean.cpu(), bn.running_mean)
    assert torch.equal(dbn.running_var.cpu(), bn.running_var)


def test_past_the_capacity_the_python_path_raises_and_nothing_is_counted():
    n = torch.randn(1 << 20).to("neuron")                       # 4 MiB
    base = torch.neuron.memory_allocated()
    with config.HBM_GB.scoped((base + (6 << 20)) / (1 << 30)):  # room for one more copy only
        y = n * 2.0
        with pytest.raises(torch.OutOfMemoryError, match="neuron: out of memory .* aten::mul"):
            n * 3.0
        assert torch.neuron.memory_allocated() == base + (4 << 20)
        del y
    z = n * 3.0                                                 # the capacity follows the knob
    assert torch.equal(z.cpu(), n.cpu() * 3.0)


def test_errors_are_the_devices_errors():
    a = torch.randn(2, 3).to("neuron")
    with pytest.raises(RuntimeError, match="mat1 and mat2 shapes cannot be multiplied"):
        a @ torch.randn(4, 5).to("neuron")
    with pytest.raises(RuntimeError, match="found at least two devices, neuron:0 and cpu"):
        a + torch.randn(2, 3)                                   # a CPU tensor that is not 0-dim


def test_host_only_dtypes_keep_the_fallback_rules():
    d = torch.randn(3, dtype=torch.float64).to("neuron")
    neuron_lab.clear_op_tracking()
    y, runs = direct_runs(lambda: d * 2.0)
    assert runs == {} and y.dtype == torch.float64
    assert any(r["op"] == "aten::mul.Tensor" for r in neuron_lab.fallback_ops())
    f = torch.randn(3).to("neuron")
    s, runs = direct_runs(lambda: f.sum(0, dtype=torch.float64))      # a float64 output
    assert runs == {} and s.dtype == torch.float64
    assert any(r["op"] == "aten::sum.dim_IntList" for r in neuron_lab.fallback_ops())


def test_ops_queued_before_a_bare_mode_switch_run_first():
    with neuron_lab.mode("adaptive"):
        x = torch.ones(4).to("neuron")
        y = x + 1.0                                             # queued (pending)
        with knobs.MODE.scoped("eager"):                        # no flush: y still pending
            assert not ext.direct_enabled()
            z = y * 2.0                                         # the engine flushes, then runs it
            assert ext.direct_enabled()
            assert torch.equal(z.cpu(), torch.full((4,), 4.0))


def test_autograd_on_the_device_thread_matches_cpu():
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    dev = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    dev.load_state_dict(cpu.state_dict())
    dev.to("neuron")
    x = torch.randn(5, 8)
    ext.direct_counts()
    cpu(x).pow(2).mean().backward()
    dev(x.to("neuron")).pow(2).mean().backward()
    assert ext.direct_counts()                                  # the backward ran direct ops too
    for p, q in zip(cpu.parameters(), dev.parameters()):
        assert torch.equal(p.grad, q.grad.cpu())


def test_threads_running_direct_ops_at_once_get_their_own_results():
    xs = [torch.randn(64, 64) for _ in range(4)]
    want = [torch.tanh(x @ x + x) for x in xs]
    got, errors = [None] * 4, []

    def work(i):
        try:
            n = xs[i].to("neuron")
            for _ in range(200):
                r = torch.tanh(n @ n + n)
            got[i] = r.cpu()
        except Exception as e:          # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_the_knob_turns_the_direct_kernel_off():
    code = ("import torch, neuron_lab; from neuron_lab.device import registry, runtime_interface\n"
            "neuron_lab.set_mode('eager')\n"
            "x = torch.randn(3).to('neuron')\n"
            "assert torch.equal((x * 2).cpu(), x.cpu() * 2)\n"
            "assert not registry._native.direct_counts()\n"
            "print('ok')\n")
    env = {**os.environ, "NEURON_LAB_DIRECT": "0"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_run_now_runs_an_op_on_the_direct_kernel_whatever_the_switch():
    """The adaptive engine's capture runs each op at once through ``kernels.run_now``: on the
    direct kernel where it takes the call, else ``execute`` (float64: a recorded fallback)."""
    from neuron_lab.device import kernels
    from neuron_lab.device.op_facts import facts
    x = torch.randn(5)
    n = x.to("neuron")
    mul = facts(torch.ops.aten.mul.Tensor)
    runtime_interface.run_directly(False)
    try:
        out, runs = direct_runs(lambda: kernels.run_now(mul, (n, n), {}))
        assert runs == {"aten::mul.Tensor": 1} and torch.equal(out.cpu(), x * x)
        d = x.double().to("neuron")
        neuron_lab.clear_op_tracking()
        out, runs = direct_runs(lambda: kernels.run_now(mul, (d, d), {}))
        assert runs == {} and torch.equal(out.cpu(), x.double() * x.double())
        assert any(r["op"] == "aten::mul.Tensor" for r in neuron_lab.fallback_ops())
        with pytest.raises(RuntimeError, match="found at least two devices"):
            kernels.run_now(mul, (n, torch.ones(5)), {})          # declined, then Python's error
    finally:
        runtime_interface.run_directly(True)


def test_adaptive_capture_runs_its_ops_on_the_direct_kernel():
    from neuron_lab import runtime
    x = torch.randn(16)
    with neuron_lab.mode("adaptive"), knobs.COMPILE.scoped(False):
        runtime.reset()
        n = x.to("neuron")
        ext.direct_counts()
        y = torch.tanh(n * 2.0 + 1.0)                            # a new segment: captured
        runs = ext.direct_counts()
        assert runs.get("aten::tanh") == 1 and runs.get("aten::mul.Tensor") == 1
        assert torch.equal(y.cpu(), torch.tanh(x * 2.0 + 1.0))


def test_python_scalars_reach_the_python_kernel_as_the_same_python_numbers():
    """A declined op's wrapped numbers (``x * 1.5``: a 0-dim CPU tensor marked as a Python
    scalar) are passed on as Scalars, which the kernel holder turns into the same Python float,
    int, bool or complex it made from the tensor (without building a Python tensor for it)."""
    from neuron_lab import runtime
    x_cpu = torch.linspace(-1, 1, 6)
    x = x_cpu.to("neuron")
    c = torch.randn(6, dtype=torch.complex64)
    with neuron_lab.mode("adaptive"):
        runtime.reset()
        outs = [x * 1.5, x + 2, x.mul(True)]
        args = [rec.args[1] for rec in runtime.current().engine.seg.records]   # queued, not run
        outs.append(torch.view_as_real(c.to("neuron") * 2j))    # complex: runs at once
        neuron_lab.sync()
    assert [(type(a), a) for a in args] == [(float, 1.5), (int, 2), (bool, True)]
    want = [x_cpu * 1.5, x_cpu + 2, x_cpu.mul(True), torch.view_as_real(c * 2j)]
    for got, w in zip(outs, want):
        assert torch.equal(got.cpu(), w)


def test_host_view_in_c_is_the_view_recover_builds_in_python(eager, monkeypatch):
    """tensor_data._recover's C path (direct.cpp host_view) against its Python path, on tensors the
    direct kernel made (no cached host view): dense, a strided view with an offset, a negative
    view; a pending tensor has none."""
    a = torch.randn(4, 6).to("neuron")
    made = [a * 2, (a + 1).t()[1:, 2:], torch._neg_view(a - 1)]
    for x in made:
        assert "_d" not in x.__dict__
        got = ext.host_view(x)
        with monkeypatch.context() as m:
            m.setattr(tensor_data, "_host_view", None)
            want = tensor_data._recover(x)
        assert type(got) is torch.Tensor and got.device.type == "cpu"
        assert (got.data_ptr(), got.shape, got.stride(), got.storage_offset(), got.dtype) == \
            (want.data_ptr(), want.shape, want.stride(), want.storage_offset(), want.dtype)
        assert got.is_neg() == want.is_neg() and not got.requires_grad
        assert torch.equal(got.resolve_neg(), want.resolve_neg())
    fresh = a * 3                                   # the C path caches the view it builds
    assert tensor_data.host(fresh) is fresh._d and torch.equal(fresh._d, a.cpu() * 3)
    assert ext.host_view(tensor_data.pending_dense((2, 3), torch.float32)) is None   # no bytes yet
    assert ext.host_view(torch.randn(2)) is None    # not a neuron tensor


def test_capture_runs_the_handed_call_on_the_dispatchers_arguments(monkeypatch):
    """Capture runs the op the direct kernel passed to the runtime on the arguments the
    dispatcher passed (``run_boxed_call``), not through the op's Python binding again
    (``run_here``): a new tensor, a view, an in-place op (its self comes back), a wrapped number
    (``x * 1.5``) and several outputs, each on the direct kernel, equal to CPU's. Outside the
    passed call it runs nothing."""
    from neuron_lab import runtime
    from neuron_lab.device import kernels
    bound = []
    here = kernels._run_here
    a_cpu, w_cpu = torch.randn(4, 8), torch.randn(8, 8)
    with neuron_lab.mode("adaptive"), knobs.COMPILE.scoped(False):
        runtime.reset()
        a, w = a_cpu.to("neuron"), w_cpu.to("neuron")
        torch.mm(a, w)                               # the segment's first op (Python engine)
        monkeypatch.setattr(kernels, "_run_here", lambda *c: bound.append(c) or here(*c))
        ext.direct_counts()
        y = torch.mm(a, w)
        v = y.view(32)
        z = y.add_(1.0)
        s = y * 1.5
        ln = torch.ops.aten.native_layer_norm(y, [8], None, None, 1e-5)
        runs = ext.direct_counts()
        captured = [r.facts.name for r in runtime.current().engine.seg.records[1:]]
        neuron_lab.sync()
    assert captured == ["aten::mm", "aten::view", "aten::add_.Tensor", "aten::mul.Tensor",
                        "aten::native_layer_norm"]
    assert bound == [] and sum(runs.values()) == 5 and runs.get("aten::native_layer_norm") == 1
    assert z is y and v.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    y_cpu = a_cpu @ w_cpu + 1.0
    want_ln = torch.ops.aten.native_layer_norm(y_cpu, [8], None, None, 1e-5)
    assert torch.equal(y.cpu(), y_cpu) and torch.equal(v.cpu(), y_cpu.view(32))
    assert torch.equal(s.cpu(), y_cpu * 1.5)
    assert all(torch.equal(g.cpu(), e) for g, e in zip(ln, want_ln))
    assert ext.run_boxed_call((a, w)) is None            # no call passed to this thread now
