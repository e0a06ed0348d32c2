"""PyTorch's parallel APIs on ``neuron`` in a real 2-process group on loopback, eager and adaptive
(``parallel_ranks.run_all``): DDP (small buckets, ``no_sync``) and FSDP2 (float32 and bf16 mixed
precision) on half the batch per rank end with the parameters of one CPU process on the full
batch; DTensor sharded matmul equals dense; tensor parallel MLP trains like the plain one;
distributed checkpoint of an FSDP2 model and its optimizer round-trips."""
from __future__ import annotations

import pytest

NAMES = ["ddp", "ddp_no_sync", "fsdp2", "fsdp2_bf16", "dtensor_matmul", "dtensor_redistribute",
         "tensor_parallel", "checkpoint"]


@pytest.fixture(scope="module")
def job(ranks, tmp_path_factory):
    return ranks("parallel_ranks", "run_all", str(tmp_path_factory.mktemp("dcp")))


@pytest.mark.parametrize("mode", ["eager", "adaptive"])
@pytest.mark.parametrize("name", NAMES)
def test_parallel_api_matches_single_process(job, mode, name):
    for rank in (0, 1):
        result = job[rank][f"{mode}/{name}"]
        assert result is None, f"rank {rank}: {result}"
