"""torch.compile on ``neuron`` (issue 11): the ``"neuron"`` dynamo backend and its wiring.

``install()`` (called by ``import neuron_lab``) costs nothing at import: the backend is
registered with dynamo when ``torch._dynamo`` is first imported (or at once if it already is),
and ``torch.compile``'s default inductor backend hands every graph that touches ``neuron`` to
the same pipeline; inductor's device registries know ``neuron`` (``device_interface``), and
FlexAttention runs on the device's own kernels (``flex_attention``). See docs/compile.md.
"""
from __future__ import annotations

from .backend import neuron_backend
from .registration import install

__all__ = ["neuron_backend", "install"]
