"""Test tooling shipped with the package: the OpInfo sweep (``python -m neuron_lab.testing.opinfo``)."""
