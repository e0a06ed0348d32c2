"""Region formation and the region cache: sync-point regions, repeated suffixes, hits, LRU."""
import pytest
import torch

import neuron_lab
from neuron_lab import runtime
from neuron_lab.runtime import knobs


def _chain(x, n=8):
    for _ in range(n):
        x = x * 1.5 + 1.0
    return x


def test_sync_point_regions_hit_on_repeat(compile_off):
    x = torch.ones(16, device="neuron")
    neuron_lab.sync()                     # the factory is its own region
    runtime.reset()
    for _ in range(5):
        _chain(x).sum().item()            # item() is the boundary
    s = runtime.stats()
    assert s["misses"] == 1               # the first iteration recorded the region
    assert s["hits"] == 4                 # every later one recognised it while ops arrived
    assert s["ops_deferred"] >= 4 * 17    # ...and deferred its 17 ops (16 chain + sum)
    (r,) = runtime.regions()
    assert r["ops"] == 17 and r["hits"] == 4


def test_repeated_suffix_cuts_a_loop_without_syncs(compile_off):
    x = torch.ones(16, device="neuron")
    with knobs.MIN_PERIOD_OPS.scoped(8), knobs.PERIOD_AFTER.scoped(0):
        runtime.reset()
        y = x
        for _ in range(40):
            y = y * 1.5 + 1.0             # period of 2 ops, no sync anywhere
        neuron_lab.sync()
    s = runtime.stats()
    regions = runtime.regions()
    assert any(r["ops"] == 8 for r in regions), regions   # 4 periods of 2 ops = 8 >= MIN_PERIOD
    assert s["hits"] >= 5
    assert torch.equal(y.cpu(), _chain(torch.ones(16), 40))


def test_keys_depend_on_shape_dtype_and_scalars(compile_off):
    a = torch.ones(4, device="neuron")
    inputs = (a, a, torch.ones(5, device="neuron"), a.half(), a)
    neuron_lab.sync()
    runtime.reset()
    for x in inputs:
        (x * 2).sum().item()
    # shapes/dtypes differ -> distinct regions; 4-element float32 recurs -> hits
    s = runtime.stats()
    assert s["misses"] == 3 and s["hits"] == 2


def test_lru_bounds_the_cache(compile_off):
    with knobs.CACHE_SIZE.scoped(3):
        for n in range(1, 7):
            (torch.ones(n, device="neuron") + 1).sum().item()
    s = runtime.stats()
    assert s["regions"] == 3 and s["evictions"] == 3


def test_eager_mode_bypasses_the_queue(compile_off):
    with neuron_lab.mode("eager"):
        for _ in range(3):
            _chain(torch.ones(4, device="neuron")).sum().item()
    s = runtime.stats()
    assert s["hits"] == 0 and s["misses"] == 0 and s["ops_deferred"] == 0


def test_queue_depth_and_flush_reasons(compile_off):
    x = torch.ones(4, device="neuron")
    neuron_lab.sync()
    y = _chain(x, 3)
    assert runtime.stats()["queue_depth"] == 6     # recorded, not yet cut
    y.cpu()                                        # a sync point ends the segment
    s = runtime.stats()
    assert s["queue_depth"] == 0 and s["flushes"]["cpu"] == 1


def test_float_values_of_pointwise_ops_are_data_not_keys(compile_off):
    """x * 2.5 and x * 3.5 are one region (the float is an input); x * 2 (an int) is another;
    floats that can change a shape (arange's end) stay in the key."""
    a = torch.ones(4, device="neuron")
    neuron_lab.sync()
    runtime.reset()
    got = [(a * s).sum().item() for s in (2.5, 3.5, 4.5)]
    assert got == [10.0, 14.0, 18.0]
    s = runtime.stats()
    assert s["misses"] == 1 and s["hits"] == 2
    (a * 2).sum().item()
    assert runtime.stats()["misses"] == 2
    sizes = [torch.arange(0.0, end, device="neuron").sum().item() for end in (3.0, 4.0, 5.0)]
    assert sizes == [3.0, 6.0, 10.0]


def test_rerun_training_cell_hits_every_region(compile_off):
    """Optimizer.step() starts and ends a region, so the second run of a training cell finds
    every region its first run cached, though that run's first step also created AdamW's state
    (and backward() starts one, with NEURON_LAB_BACKWARD_BOUNDARY)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).to("neuron")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(8, 16, device="neuron"), torch.randint(0, 4, (8,), device="neuron")

    def cell():
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        return loss.item()

    for split, regions in ((False, 2), (True, 3)):    # forward+backward, update / each phase
        with knobs.BACKWARD_BOUNDARY.scoped(split):
            cell()
            s0 = runtime.stats()
            cell()
            s1 = runtime.stats()
        assert s1["misses"] == s0["misses"] and s1["hits"] - s0["hits"] == 3 * regions
        assert s1["flushes"]["optimizer-step"] - s0["flushes"]["optimizer-step"] == 6
        assert s1["flushes"].get("backward", 0) - s0["flushes"].get("backward", 0) == 3 * split


@pytest.mark.parametrize("split", [False, True])
def test_training_with_a_periodic_no_grad_evaluation_settles_into_known_regions(compile_off, split):
    """A loop that trains and, every few steps, evaluates under ``no_grad`` and reads the loss:
    the evaluation's forward is a prefix of the training step's path (the same ops up to the
    loss), cut where the training step goes on. After the first rounds every op meets a known
    region (no misses), with the forward cut at ``backward()`` or not, and every value equals
    CPU's."""
    def run(device, rounds):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                    torch.nn.Linear(32, 4)).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x, y = torch.randn(8, 16).to(device), torch.randint(0, 4, (8,)).to(device)
        evals, stats = [], []
        for _ in range(rounds):
            for _ in range(3):
                opt.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
            with torch.no_grad():
                evals.append(torch.nn.functional.cross_entropy(model(x), y).item())
            stats.append(runtime.stats()["misses"] if device == "neuron" else 0)
        return evals, stats, [p.detach().cpu() for p in model.parameters()]

    want, _, params = run("cpu", 6)
    with knobs.BACKWARD_BOUNDARY.scoped(split):
        got, misses, dev_params = run("neuron", 6)
    assert got == pytest.approx(want, rel=1e-5)
    assert misses[-1] == misses[2]          # rounds 4-6 met every region known
    for a, b in zip(dev_params, params):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_saved_output_with_a_view_is_wired_to_its_own_op(compile_off):
    """Autograd saves tanh's output as a shallow copy (a new tensor over the same storage), and
    ``y.t()`` is a view over that storage too. The copy's key must name tanh, not the later
    view: then the captured region has the keys the deferred steps build, and the loop is one
    region from its second step. (Wired to the view, each step's deferral diverged from the
    capture and recorded again: two extra regions, and BART, ViT and Mamba in the zoo fused
    only from step 4 or 5.) The Python reference: test_fastpath."""
    xc, wc = torch.randn(6, 6), torch.randn(6, 6)

    def step(x, w):
        y = torch.tanh(x)
        (y.t() * w).sum().backward()
        return x.grad

    expect = step(xc.clone().requires_grad_(), wc)
    w = wc.to("neuron")
    for _ in range(5):
        got = step(xc.to("neuron").requires_grad_(), w)
        torch.testing.assert_close(got.cpu(), expect)
    neuron_lab.sync()
    (region,) = runtime.current().engine.cache.lru.values()
    names, keys = region.names, region.keys
    i = names.index("aten::tanh_backward")
    saved = keys[i][1][1]                       # ("r", distance back, output)
    assert names[i - saved[1]] == "aten::tanh"
    assert runtime.stats()["hits"] >= 3


@pytest.mark.parametrize("copied", ["base", "view"])
def test_a_copy_of_an_identity_view_or_its_base_is_one_region(compile_off, copied):
    """``y.view(y.shape)`` (an identity view: same storage, same metadata) and ``y`` cannot be
    told apart by a shallow copy of either, in capture; the deferral, where each has a storage
    of its own, can. Both name the first of them (output_plans.identity_view), so a loop that copies
    either is one region. (SDPA's saved output next to ``_reshape_alias`` in ViT, a layer
    norm's output next to ``view`` in GPT-2: ViT fused from step 5 only, 83 %.)"""
    x = torch.randn(6, 6).to("neuron")

    def step():
        y = torch.tanh(x)
        z = y.view(6, 6)
        c = (y if copied == "base" else z).data     # a C++ shallow copy
        return (c * 2 + z).sum()

    want = (torch.tanh(x.cpu()) * 3).sum()
    for _ in range(5):
        torch.testing.assert_close(step().cpu(), want)
    assert len(runtime.regions()) == 1
    assert runtime.stats()["hits"] == 4
