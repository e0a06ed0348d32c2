"""Kernel-library tests: small shapes, where per-op cost dominates and two host threads on a
busy 2-core machine spin against each other (measured 10x slower per kernel call); the results
do not depend on the thread count, so each module runs with one."""
import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
