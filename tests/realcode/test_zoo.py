"""The model zoo (``neuron_lab.testing.zoo``): Transformers architectures from small configs,
4 AdamW steps on CPU and on neuron, every loss and parameter compared, then greedy generate().

Default: a representative subset (GQA+RoPE decoder, tied-head decoder, MoE, encoder-decoder,
encoder, vision) in eager and adaptive, bitwise; plus GPT-2 with fused programs (tolerance in
zoo.TOL; every region must run fused: a failed region is a verdict's failure). ``-m slow``:
every architecture, in every mode, fused too.
"""
import copy

import pytest

from neuron_lab.testing import zoo

MODES = ("eager", "adaptive")


def _check(v):
    assert v.ok, f"{v.name} [{v.mode}]: {v.reason}"


def test_the_zoo_covers_the_issue():
    assert len(zoo.ARCHS) >= 12
    fam = " ".join(a.family for a in zoo.ARCHS.values())
    for kind in ("GQA + RoPE", "encoder,", "encoder-decoder", "MoE", "state-space", "vision"):
        assert kind in fam
    assert set(zoo.DEFAULT) <= set(zoo.ARCHS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", zoo.DEFAULT)
def test_default_subset_trains_bitwise_like_cpu(name, mode):
    _check(zoo.run(name, mode))


def test_fused_programs_train_gpt2_within_tolerance():
    _check(zoo.run("gpt2", "adaptive", compile=True))


def test_the_comparison_catches_what_it_must():
    cpu = zoo.cpu_trace("gpt2")
    assert zoo.compare("gpt2", cpu, cpu, "eager", exact=True).ok
    for spoil, words in [
        (lambda t: t.losses.__setitem__(1, t.losses[1] + 1e-6), "step 2 loss"),
        (lambda t: t.params["transformer.wte.weight"].add_(1e-7), "parameter transformer.wte.weight"),
        (lambda t: t.tokens[0].__setitem__(-1, t.tokens[0][-1] + 1), "generate() tokens"),
        (lambda t: setattr(t, "n_params", t.n_params + 1), "a tie broke"),
    ]:
        bad = copy.deepcopy(cpu)
        spoil(bad)
        v = zoo.compare("gpt2", cpu, bad, "eager", exact=True)
        assert not v.ok and words in v.reason
    far = copy.deepcopy(cpu)
    far.params["transformer.wte.weight"].add_(1e-2)
    assert not zoo.compare("gpt2", cpu, far, "adaptive+fused", exact=False).ok


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(set(zoo.ARCHS) - set(zoo.DEFAULT)))
def test_full_zoo_trains_bitwise_like_cpu(name, mode):
    _check(zoo.run(name, mode))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(zoo.ARCHS))
def test_full_zoo_with_fused_programs(name):
    """Within tolerance, and no region failed its compile or fused run (``zoo.failed_regions``)."""
    _check(zoo.run(name, "adaptive", compile=True))
