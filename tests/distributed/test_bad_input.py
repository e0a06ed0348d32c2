"""Bad input across ranks gives a clear error on every rank, never a hang or an abort: ranks that
disagree on a collective's size, a rank that never joins (the group's timeout), a rank that dies."""
from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_mismatched_shapes_raise_the_same_named_error_on_every_rank(ranks):
    r = ranks("failure_ranks", "mismatched_shapes", timeout_s=10)
    for rank in (0, 1):
        err = r[rank]["error"]
        assert err.startswith("CollectiveMismatch: neuron: all_reduce on device neuron:0")
        assert "rank 0: all_reduce of 4 elements (float32); rank 1: all_reduce of 5 elements" in err
        assert "fix the differing rank's call" in err


def test_a_rank_that_never_joins_fails_after_the_timeout(ranks):
    r = ranks("failure_ranks", "timeout", timeout_s=3)
    err = r[0]["error"]
    assert err.startswith("CollectiveError: neuron: all_reduce on device neuron:0 (rank 0 of 2)")
    assert "within the group's timeout" in err and "Timed out" in err
    assert 2.5 < r[0]["seconds"] < 30              # the configured 3 s, not a hang
    assert r[0]["value"] == [1.0] * 4              # the tensor is left as it was


def test_an_async_collective_that_times_out_raises_from_wait(ranks):
    r = ranks("failure_ranks", "timeout_async", timeout_s=3)
    err = r[0]["error"]
    assert "CollectiveError: neuron: all_reduce on device neuron:0 (rank 0 of 2)" in err
    assert "within the group's timeout" in err
    assert 2.5 < r[0]["seconds"] < 30


def test_a_dead_rank_is_an_error_not_a_hang(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                        "--rdzv-endpoint", "127.0.0.1:0", "--rdzv-backend", "c10d",
                        os.path.join(HERE, "dead_rank_script.py")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    out = p.stdout + p.stderr
    assert "CollectiveError: neuron: all_reduce on device neuron:0 (rank 0 of 2) failed" in out, out[-3000:]
    assert "another rank exited or crashed" in out
