"""Tutorial idioms (``neuron_lab.testing.idioms``), each run on CPU and on neuron in eager and
adaptive (per-op replay): results bitwise equal, or (``KNOWN``) the clear error named there.
``-m slow``: adaptive with fused programs, within ``FUSED_TOL``."""
import pytest

from neuron_lab.testing import idioms

NAMES = sorted(idioms.IDIOMS)


def test_there_are_enough_idioms():
    assert len(idioms.IDIOMS) - len(idioms.KNOWN) >= 20


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
@pytest.mark.parametrize("name", NAMES)
def test_idiom_matches_cpu(name, mode):
    v = idioms.run(name, mode)
    if name in idioms.KNOWN:
        assert not v.ok and idioms.KNOWN[name] in v.reason, v.reason
    else:
        assert v.ok, f"{name} [{mode}]: {v.reason}"


def test_the_comparison_catches_differences():
    import torch
    a = {"x": torch.ones(2), "n": 3, "flag": True}
    dev = {"x": torch.ones(2).to("neuron"), "n": 3, "flag": True}
    assert idioms.compare(a, dev, "neuron", exact=True) == ""
    assert "differs" in idioms.compare(a, {**dev, "x": dev["x"] + 1e-7}, "neuron", exact=True)
    assert "is on cpu" in idioms.compare(a, {**dev, "x": torch.ones(2)}, "neuron", exact=True)
    assert "vs CPU True" in idioms.compare(a, {**dev, "flag": False}, "neuron", exact=True)
    assert "bfloat16" in idioms.compare(a, {**dev, "x": dev["x"].bfloat16()}, "neuron", True)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(NAMES) - set(idioms.KNOWN)))
def test_idiom_with_fused_programs(name):
    v = idioms.run(name, "adaptive", compile=True)
    assert v.ok, f"{name} [adaptive+fused]: {v.reason}"


def test_the_compatibility_doc_lists_every_row():
    """docs/compatibility.md is generated (python -m neuron_lab.testing.compat): a new idiom or
    architecture without a regenerated doc fails here."""
    from neuron_lab.testing import compat, zoo
    text = compat.DOC.read_text()
    for name in [*idioms.IDIOMS, *zoo.ARCHS]:
        assert f"| {name} |" in text, f"{name}: regenerate docs/compatibility.md"
