"""The benchmark's neuron peers share the process's one adaptive engine: each is sampled and
reported with the regions it learned at its own set-up, so a peer set up later does not make an
earlier one's samples recapture and re-trial its regions."""
import torch

from neuron_lab import runtime
from neuron_lab.bench import peers
from neuron_lab.runtime import knobs


def _step(x, k):
    return (x * k).sin().add(0.25).sum().item()


def test_each_runtime_peer_is_sampled_with_its_own_regions():
    adaptive, compiled = peers.NeuronAdaptive(), peers.NeuronCompile()
    xa, xc = torch.randn(64).to("neuron"), torch.randn(8, 8).to("neuron")
    with knobs.SYNC_COMPILE.scoped(True), knobs.TRIALS.scoped(0):
        with adaptive.active():
            for _ in range(4):
                _step(xa, 1.5)
            learned = runtime.stats()["misses"]
        with compiled.active():                      # set up after: starts from an empty cache
            assert runtime.stats()["misses"] == 0
            for _ in range(4):
                _step(xc, 0.5)
        with adaptive.sampling():
            for _ in range(3):
                _step(xa, 1.5)
            assert runtime.stats()["misses"] == learned      # nothing recaptured
        counters = adaptive.extra()
        assert counters["misses"] == learned and counters["launches_fused"] >= 3
        assert compiled.extra()["misses"] >= 1
