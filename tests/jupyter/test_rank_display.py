"""``%neuron`` and the panel's snapshot show the kernel's place in a torch.distributed job: a
process group made in a cell (single process on a HashStore, world size 1, as a notebook that
tries the API first would), its collectives, and nothing once it is destroyed."""
import torch.distributed as dist

from neuron_lab.jupyter.comm import snapshot_body


def _rank_row(ip):
    table = ip.run_line_magic("neuron", "")
    return next(r["value"] for r in table.rows if r["item"] == "distributed")


def test_neuron_magic_and_snapshot_show_the_process_group(ip):
    assert _rank_row(ip) == "no process group (single process)"
    ip.run_cell("import torch, torch.distributed as dist\n"
                "dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)\n"
                "t = torch.ones(8, device='neuron')\n"
                "dist.all_reduce(t)\n", store_history=True).raise_error()
    try:
        row = _rank_row(ip)
        assert row.startswith("rank 0 of 1 (neuron:neuron), ") and "collectives" in row
        d = snapshot_body()["distributed"]
        assert (d["rank"], d["world_size"], d["backend"]) == (0, 1, "neuron:neuron")
        assert d["collectives"] >= 1 and d["collective_bytes"] >= 32
    finally:
        dist.destroy_process_group()
    assert snapshot_body()["distributed"]["backend"] is None
