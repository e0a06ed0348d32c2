"""The ``neuron`` dynamo backend: inductor's own pipeline, with host code generation.

``compile_fx`` (inductor's entry point) runs unchanged on the ``neuron`` graph: pre-grad
passes, AOTAutograd with inductor's decompositions and partitioner on fake ``neuron`` tensors
(so autograd, input mutations and output aliasing are handled on the device's tensors, as for
any backend), joint-graph passes. Only the last stage differs: ``inner_compile`` — the step
that turns one post-grad ATen graph (forward, backward or inference) into a program — moves the
graph to the host executor's device (``hostgraph``), lets inductor's ``compile_fx_inner`` generate
and compile it there, and puts the call boundary of ``bridge`` around the program.

Inductor's device registries know ``neuron`` (``device_interface``: a device interface and
``register_backend_for_device``, as PyTorch's OpenReg registers), but code is generated for the
host graph, not for ``neuron``: an OpenReg tensor's ``data_ptr()`` is real host memory, so C++
kernels can take it; a ``neuron`` tensor's is its host buffer's address too, but a value the
adaptive runtime deferred has none yet (``device/tensor_data.py``), inductor's Python wrapper
refuses C++ kernels on any device but ``cpu`` ("device neuron nyi"), and its lowerings pick kernels
by device type. The host graph is what such a registration would generate anyway — the same C++ —
with the device's tensors bound at the call. FlexAttention's higher-order ops become the
device's own kernels first (``flex_attention.replace_hops``).

AOTAutograd's own cache is off for ``neuron`` graphs (a hit would skip ``inner_compile``, and so
the boundary); inductor's FX graph cache stays on, under the runtime's cache directory, so a
restarted process reuses compiled programs (``runtime/__init__``: ``TORCHINDUCTOR_CACHE_DIR``).
"""
from __future__ import annotations

import time
import traceback
import warnings

import torch

from ..device import config
from . import bridge, device_interface, flex_attention, hostgraph, outcomes


def _inner_compile(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import compile_fx_inner

    kind = "backward" if kwargs.get("is_backward") else (
        "inference" if kwargs.get("is_inference") else "forward")
    t0 = time.perf_counter()
    on_device = hostgraph.neuron_outputs(gm)
    if not any(on_device) and not hostgraph.touches_neuron(gm, example_inputs):
        return compile_fx_inner(gm, example_inputs, **kwargs)   # a host graph: inductor's own
    fake_mode = detect_fake_mode(example_inputs)
    flex_attention.replace_hops(gm)          # the device's FlexAttention kernels
    hostgraph.rewrite_devices(gm)
    host_inputs = hostgraph.host_example_inputs(example_inputs, fake_mode)
    hostgraph.refresh_meta(gm, host_inputs, fake_mode)
    out = compile_fx_inner(gm, host_inputs, **kwargs)
    gid = outcomes.next_graph_id()
    out.current_callable = bridge.bridged(out.current_callable, on_device,
                                           f"compiled {kind} graph {gid}")
    outcomes.record_program(gid, kind, gm, time.perf_counter() - t0)
    return out


def neuron_backend(gm: torch.fx.GraphModule, example_inputs, **options):
    """The dynamo backend registered as ``"neuron"`` (``options``: inductor config patches,
    as ``torch.compile(options=...)`` passes them).

    A graph that fails to compile runs eagerly instead — dynamo's graph module called as is,
    each op through the device (and the adaptive runtime) — and the failure is recorded with
    the graph's user line (``neuron_lab.metrics()["compile"]["recent_failures"]``) and warned
    once per line (``NEURON_LAB_DEBUG=1`` prints the traceback): a slower step, never a wrong or missing result. Dynamo's own control-flow
    exceptions (restart analysis, skip frame) pass through."""
    from torch._dynamo import exc as dynamo_exc
    from torch._functorch import config as functorch_config
    from torch._inductor.compile_fx import compile_fx

    device_interface.register_codegen()
    try:
        with functorch_config.patch(enable_autograd_cache=False):
            return compile_fx(gm, example_inputs, inner_compile=_inner_compile,
                              config_patches=options or None)
    except (dynamo_exc.RestartAnalysis, dynamo_exc.SkipFrame):
        raise
    except Exception as e:  # noqa: BLE001 - any compile error: this graph runs eagerly
        rec = outcomes.record_failure(gm, e, "eager")
        if config.DEBUG.get():
            traceback.print_exc()
        if rec.location not in _warned:
            _warned.add(rec.location)
            warnings.warn(f"neuron: torch.compile could not compile the graph at {rec.location} "
                          f"({rec.error}); it runs eagerly on neuron (results unchanged). "
                          f"See neuron_lab.metrics()['compile']['recent_failures'].",
                          stacklevel=2)
        return gm.forward


_warned: set = set()
