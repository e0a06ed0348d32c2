"""Run by torchrun in test_bad_input.py: rank 1 dies before an all-reduce; rank 0 reports what
it saw and exits normally (it must not hang)."""
import datetime
import os
import time

import torch
import torch.distributed as dist

import neuron_lab  # noqa: F401

dist.init_process_group(timeout=datetime.timedelta(seconds=5))
if dist.get_rank() == 1:
    os._exit(0)
t = torch.ones(4, device="neuron")
time.sleep(0.5)
t0 = time.perf_counter()
try:
    dist.all_reduce(t)
    print("no error", flush=True)
except Exception as e:                       # noqa: BLE001
    print(f"error after {time.perf_counter() - t0:.2f} s: {type(e).__name__}: {e}", flush=True)
dist.destroy_process_group()
