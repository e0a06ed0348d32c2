"""Launches queued on the device's thread (runtime/launch_queue.py, ``NEURON_LAB_ASYNC=1``) and
reads served before their region launches (runtime/cone_reads.py): the host goes on, and every
value it reads is the one eager computes (within the fused programs' tolerance: only a region
decided fused is queued; ``fused`` makes every compiled region that, without trials, with the
device's thread on)."""
import copy
import io
import threading
import time
import weakref

import pytest
import torch

import neuron_lab
from neuron_lab import runtime
from neuron_lab.runtime import knobs, worker
from neuron_lab.runtime.launch_queue import Job, LaunchQueue

TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture
def fused():
    # compiles an earlier test left in the background make launches run inline (a launch waits
    # for the queue while the worker is busy): start with none
    worker.wait(300)
    with knobs.COMPILE.scoped(True), knobs.TRIALS.scoped(0), knobs.COMPILE_AFTER.scoped(1), \
            knobs.ASYNC.scoped(True):
        yield


def _close(a, b):
    return torch.allclose(a, b, **TOL)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _train(model, x, y, steps):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()          # no sync: the loop never reads a value
    return opt


class _Record:
    """Stands for a job's deferred op: only the job refers to it."""


def _until(cond, timeout=30.0) -> None:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "the queue's worker did not get there"
        time.sleep(0.001)


def test_the_host_lets_go_of_jobs_that_ran_while_the_worker_has_more_to_run():
    """A job that ran with another queued behind it is left to the host (the worker runs on);
    the host's next submit lets its records go, while the worker still runs."""
    q, first, last = LaunchQueue(), threading.Event(), threading.Event()
    rec = _Record()
    gone = weakref.ref(rec)
    q.submit(Job(lambda: first.wait(30), []))
    q.submit(Job(lambda: None, [rec]))
    q.submit(Job(lambda: last.wait(30), []))
    del rec
    first.set()
    _until(lambda: q.launched == 2)             # the record's job ran; the third job runs
    assert gone() is not None                   # the worker left it to the host
    q.submit(Job(lambda: None, []))
    assert gone() is None and q.busy()
    last.set()
    q.wait()


def test_a_worker_going_idle_lets_go_of_every_record_before_a_wait_returns():
    """The last queued job's records, and any left to the host, are gone when ``wait``
    returns: memory read after a synchronize counts none of them."""
    q = LaunchQueue()
    for _ in range(50):
        gate = threading.Event()
        recs = [_Record(), _Record()]
        gone = [weakref.ref(r) for r in recs]
        q.submit(Job(lambda: gate.wait(30), [recs[0]]))
        q.submit(Job(lambda: None, [recs[1]]))
        del recs
        gate.set()
        q.wait()
        assert [g() for g in gone] == [None, None]


def test_a_training_loop_without_reads_runs_on_the_device_thread_and_equals_cpu(fused):
    """The steps' regions launch at Optimizer.step()'s boundaries, queued; the parameters read
    afterwards (``.cpu()``, ``state_dict`` through ``torch.save``) carry every queued
    update."""
    torch.manual_seed(1)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    ref = _mlp()
    _train(ref, x, y, 12)
    model = _mlp().to("neuron")
    before, s0 = runtime.current().engine.queue.launched, runtime.stats()
    _train(model, x.to("neuron"), y.to("neuron"), 12)
    assert runtime.current().engine.queue.launched > before       # launched on the device's thread
    neuron_lab.sync()
    s1 = runtime.stats()
    assert s1["device_thread_launches"] == runtime.current().engine.queue.launched
    assert s1["device_thread_busy_s"] > s0["device_thread_busy_s"]
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)                 # read while launches may be queued
    saved = torch.load(io.BytesIO(buf.getvalue()), map_location="cpu")
    for name, p in ref.state_dict().items():
        assert _close(saved[name], p), name
        assert _close(model.state_dict()[name].cpu(), p), name


def test_a_host_read_of_a_tensor_a_queued_launch_writes_waits_for_it(fused):
    """``tensor_data.host`` (what ``.cpu()``, printing, the compile bridge and collectives read)
    waits for the queue: an optimizer's in-place update may still be queued."""
    from neuron_lab.device import tensor_data
    torch.manual_seed(2)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    ref = _mlp()
    _train(ref, x, y, 6)
    model = _mlp().to("neuron")
    _train(model, x.to("neuron"), y.to("neuron"), 6)
    for p, r in zip(model.parameters(), ref.parameters()):
        assert _close(tensor_data.host(p), r)


def test_by_default_every_launch_runs_on_the_issuing_thread():
    """``NEURON_LAB_ASYNC`` is off unless set: fused launches nobody waits for run where they
    are issued (launch_queue.py says why), and the training equals CPU's."""
    worker.wait(300)
    torch.manual_seed(3)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    ref = _mlp()
    _train(ref, x, y, 6)
    model = _mlp().to("neuron")
    before, fused_before = runtime.current().engine.queue.launched, runtime.stats()["launches_fused"]
    with knobs.COMPILE.scoped(True), knobs.TRIALS.scoped(0), knobs.COMPILE_AFTER.scoped(1), \
            knobs.SYNC_COMPILE.scoped(True):
        assert not knobs.ASYNC.get()
        _train(model, x.to("neuron"), y.to("neuron"), 6)
        neuron_lab.sync()
    assert runtime.stats()["launches_fused"] > fused_before
    assert runtime.current().engine.queue.launched == before
    for p, r in zip(model.parameters(), ref.parameters()):
        assert _close(p.cpu(), r)


def test_a_queued_launch_that_fails_raises_at_the_next_sync_naming_the_op(fused):
    """A deferred gather with an index out of range fails when its region runs, on the
    device's thread: the next sync raises it (as a device reports an asynchronous error),
    and the values it did not compute raise where they are read."""
    table = torch.randn(10, 4).to("neuron")
    w = torch.randn(4, 4).to("neuron")

    def step(idx):
        out = (table[idx] @ w).tanh()
        y = out * 2          # the region ends at the next op: queued
        return y.relu(), out

    good = torch.tensor([1, 2, 3]).to("neuron")
    for _ in range(4):
        step(good)
    neuron_lab.sync()
    bad = torch.tensor([1, 2, 30]).to("neuron")
    _, out = step(bad)
    with pytest.raises(Exception, match="index"):
        neuron_lab.sync()
    with pytest.raises(RuntimeError, match="no value"):
        out.cpu()
    neuron_lab.sync()                     # reported once
    assert _close(step(good)[1].cpu(), (table.cpu()[good.cpu()] @ w.cpu()).tanh())


class _Gated(torch.nn.Module):
    """A forward that reads a value computed from its own inputs only (Transformers' mask
    checks), after a gather from a weight the previous step's update writes."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 16)
        self.lin = torch.nn.Linear(16, 4)

    def forward(self, ids):
        h = self.emb(ids)
        pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        if (pos.diff(dim=-1) != 1).any():        # a sync read the weights do not feed
            h = h * 0
        return self.lin(h).sum(1)


def test_a_read_independent_of_queued_work_is_served_without_waiting(fused):
    """The read's ops run at once on the host (``cone_reads``), the step's region is queued as
    usual, and the training equals CPU's. The last forward runs while a job holds the
    device's thread: its read is served without waiting (whether the queue is still busy at a
    read of the training loop depends on timing)."""
    torch.manual_seed(4)
    ids, y = torch.randint(0, 20, (4, 6)), torch.randn(4, 4)
    ref = _Gated()
    model = copy.deepcopy(ref).to("neuron")
    _train(ref, ids, y, 10)
    dids = ids.to("neuron")
    opt = _train(model, dids, y.to("neuron"), 10)
    gate = threading.Event()
    runtime.current().engine.queue.submit(Job(lambda: gate.wait(30), []))
    try:
        before = runtime.current().engine.stats["reads_served"]
        t0 = time.perf_counter()
        out = model(dids)                 # reads its mask while the gate holds the queue
        assert runtime.current().engine.stats["reads_served"] == before + 1
        assert time.perf_counter() - t0 < 10
    finally:
        gate.set()
    assert _close(out.detach().cpu(), ref(ids).detach())
    for (name, p), r in zip(model.named_parameters(), ref.parameters()):
        assert _close(p.cpu(), r), name
    del opt


def test_a_read_of_a_value_a_queued_launch_computes_waits_for_it(fused):
    """A loss logged every step: its value comes from the step's region itself (not served
    early: it depends on the parameters the queued update writes); each equals CPU's."""
    torch.manual_seed(5)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    ref, model = _mlp(), _mlp().to("neuron")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref, model)]
    xs, ys = (x, y), (x.to("neuron"), y.to("neuron"))
    for _ in range(8):
        got = []
        for m, opt, (a, b) in zip((ref, model), opts, (xs, ys)):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(m(a), b)
            loss.backward()
            opt.step()
            got.append(loss.item())
        assert got[0] == pytest.approx(got[1], rel=1e-5)


def test_a_read_of_a_counter_the_segment_increments_in_place_is_not_served_early(fused):
    """AdamW with its ``step`` counters on neuron (an optimizer state loaded with
    ``map_location='neuron'``) queues ``_foreach_add_(steps, 1)`` and reads each step with
    ``.item()`` in the same segment: the read waits for the increment (the compatibility
    table's checkpoint idiom; served early, it read the old count)."""
    from neuron_lab.testing.idioms import modules
    torch.manual_seed(0)
    cpu = modules.checkpoint_resume("cpu")
    for _ in range(2):                    # the second run meets its regions known: deferred
        torch.manual_seed(0)
        dev = modules.checkpoint_resume("neuron")
        for name, p in cpu["params"].items():
            assert _close(dev["params"][name].cpu(), p), name
        assert [float(v) for v in dev["losses"]] == pytest.approx([float(v) for v in cpu["losses"]], rel=1e-5)


def test_a_batch_uploaded_each_step_does_not_wait_for_the_queued_steps(fused):
    """``x.to("neuron")`` of each new batch (a host-to-device copy into a fresh tensor) reads
    nothing queued work writes: it runs while the previous step's launches are queued. The
    upload of the last batch runs while a job holds the device's thread."""
    torch.manual_seed(6)
    batches = [(torch.randn(8, 16), torch.randn(8, 4)) for _ in range(8)]
    ref, model = _mlp(), _mlp().to("neuron")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref, model)]

    def step(m, opt, x, y):
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()

    for x, y in batches:
        step(ref, opts[0], x, y)
        step(model, opts[1], x.to("neuron"), y.to("neuron"))
    gate = threading.Event()
    runtime.current().engine.queue.submit(Job(lambda: gate.wait(30), []))
    try:
        t0 = time.perf_counter()
        x = batches[0][0].to("neuron")
        assert time.perf_counter() - t0 < 10
        assert runtime.current().engine.queue.busy()
    finally:
        gate.set()
    assert torch.equal(x.cpu(), batches[0][0])
    for p, r in zip(model.parameters(), ref.parameters()):
        assert _close(p.cpu(), r)


def test_the_forward_runs_on_the_device_thread_while_the_backward_is_issued(fused):
    """With ``NEURON_LAB_BACKWARD_BOUNDARY``, ``backward()`` ends the forward's region (the
    device's ``runtime_interface.boundary``): it is queued and the host issues the backward's ops
    without waiting for it, as a loop that reads its loss every step needs (the step's work would
    otherwise wait for the host's whole forward+backward before it starts). The last step
    runs while a job holds the device's thread; the training equals CPU's."""
    torch.manual_seed(7)
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    ref, model = _mlp(), _mlp().to("neuron")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (ref, model)]
    xs, ys = (x, y), (x.to("neuron"), y.to("neuron"))

    def held_backward(loss):              # the regions are known and fused: hold the device
        queue = runtime.current().engine.queue
        queue.wait()                      # the last step's launch may still be queued (a busy host)
        gate = threading.Event()
        queue.submit(Job(lambda: gate.wait(30), []))
        try:
            assert queue.records() == []
            before = runtime.stats()["flushes"].get("backward", 0)
            t0 = time.perf_counter()
            loss.backward()
            assert time.perf_counter() - t0 < 10
            assert runtime.stats()["flushes"]["backward"] == before + 1
            assert queue.records()        # the forward's region, queued
        finally:
            gate.set()

    with knobs.BACKWARD_BOUNDARY.scoped(True):
        for i in range(8):
            got = []
            for m, opt, (a, b) in zip((ref, model), opts, (xs, ys)):
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.mse_loss(m(a), b)
                held_backward(loss) if i == 7 and m is model else loss.backward()
                opt.step()
                got.append(loss.item())
            assert got[0] == pytest.approx(got[1], rel=1e-5)
    for p, r in zip(model.parameters(), ref.parameters()):
        assert _close(p.cpu(), r)
