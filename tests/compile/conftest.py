"""torch.compile tests: each starts from a clean dynamo (no cached frames, default backend
inductor) and leaves it clean; both runtime modes are exercised where it matters."""
import pytest
import torch

import neuron_lab


@pytest.fixture(autouse=True)
def clean_dynamo():
    torch._dynamo.reset()
    torch.compiler.set_default_backend(None)
    yield
    neuron_lab.sync()
    torch._dynamo.reset()
    torch.compiler.set_default_backend(None)

