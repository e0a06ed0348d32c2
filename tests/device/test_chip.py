"""A chip chosen once (issue 44): NEURON_LAB_CHIP=trn2|trn3 or neuron_lab.set_chip before first
use; device properties, memory capacity, the cost model and the panel's hello follow it.

Each chip runs in a fresh process: the chip is fixed once the device was used, and this test
process has used it."""
import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import json, os, torch, neuron_lab
from neuron_lab.device import memory
chip = os.environ.get("PROBE_SET")
if chip:
    neuron_lab.set_chip(chip)
p = torch.neuron.get_device_properties(0)
host_half = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
m = neuron_lab.cost_model()
print(json.dumps({"name": p.name, "bw": p.memory_bandwidth, "cores": p.multi_processor_count,
                  "hbm": p.hbm_bytes, "total": p.total_memory,
                  "free_total": torch.neuron.mem_get_info()[1],
                  "expected_capacity": min(p.hbm_bytes, host_half), "major": p.major,
                  "model": m.chip, "model_bw": m.params.hbm_bytes_per_s,
                  "summary": torch.neuron.memory_summary().splitlines()[1],
                  "chip": neuron_lab.get_chip()}))
"""

EXPECTED = {"trn2": ("Trainium2", 2.9e12, 96 << 30, 3),
            "trn3": ("Trainium3", 4.9e12, 144 << 30, 4)}


def _probe(env: dict) -> dict:
    full = {**os.environ, **env}
    full.pop("NEURON_LAB_HBM_GB", None)
    r = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _check(out: dict, chip: str) -> None:
    name, bw, hbm, major = EXPECTED[chip]
    assert out["chip"] == chip and out["model"] == chip
    assert out["name"].startswith(name + " (emulated on ")
    assert out["bw"] == bw and out["model_bw"] == bw
    assert out["hbm"] == hbm and out["cores"] == 8 and out["major"] == major
    assert out["total"] == out["free_total"] == out["expected_capacity"]
    assert f"emulated {name} HBM" in out["summary"]


@pytest.mark.parametrize("chip", ["trn2", "trn3"])
def test_chip_from_environment(chip):
    _check(_probe({"NEURON_LAB_CHIP": chip}), chip)


def test_chip_from_set_chip_before_first_use():
    _check(_probe({"NEURON_LAB_CHIP": "trn2", "PROBE_SET": "trn3"}), "trn3")


def test_unknown_chip_names_the_allowed_ones():
    from neuron_lab.device import chips
    with pytest.raises(chips.ChipError, match="allowed: trn2, trn3"):
        chips.set_chip("trn9")
    r = subprocess.run([sys.executable, "-c", "import neuron_lab"], capture_output=True,
                       text=True, env={**os.environ, "NEURON_LAB_CHIP": "inferentia"}, timeout=300)
    assert r.returncode != 0
    assert "NEURON_LAB_CHIP='inferentia' is not valid: expected one of 'trn2', 'trn3'" in r.stderr


def test_chip_is_chosen_once():
    import torch
    import neuron_lab
    from neuron_lab.device import chips
    torch.ones(2, device="neuron")
    other = "trn3" if neuron_lab.get_chip() == "trn2" else "trn2"
    with pytest.raises(chips.ChipError, match="chosen once"):
        neuron_lab.set_chip(other)
    neuron_lab.set_chip(neuron_lab.get_chip())       # the same chip again is fine


def test_panel_hello_names_the_chip():
    from neuron_lab.device import chips
    from neuron_lab.jupyter import comm
    hello = comm.Endpoint.hello(object.__new__(comm.Endpoint), hz=4.0)
    assert hello["chip"] == chips.current().name
