"""A post-grad ATen graph on ``neuron`` -> the same graph on the host executor's device.

Inductor compiles the host graph with its own code generation for that device (C++ on CPU,
Triton with the CUDA executor). The rewrite is the only device-specific step: every
``torch.device('neuron')`` argument (factories' ``device=``, ``_to_copy``, ``device_put``)
becomes the host device, tensor constants move to the host, the example inputs become fake
host tensors of the same sizes and strides (symbolic sizes stay symbolic: same ShapeEnv), and
fake-tensor propagation refreshes every node's ``meta['val']``, which inductor's lowering reads.
"""
from __future__ import annotations

import torch
from torch.fx.node import map_aggregate

from ..device.executor import host_device

_NEURON = "neuron"


def _is_neuron_device(a) -> bool:
    if isinstance(a, torch.device):
        return a.type == _NEURON
    return isinstance(a, str) and (a == _NEURON or a.startswith(_NEURON + ":"))


def _host_arg(a):
    if _is_neuron_device(a):
        return host_device()
    return a


def neuron_outputs(gm: torch.fx.GraphModule) -> list[bool]:
    """For each output of ``gm``: is it a tensor on ``neuron``? (From the traced ``meta['val']``.)"""
    (ret,) = gm.graph.output_node().args
    flat = ret if isinstance(ret, (list, tuple)) else [ret]
    out = []
    for n in flat:
        v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        out.append(isinstance(v, torch.Tensor) and v.device.type == _NEURON)
    return out


def _graphs(gm: torch.fx.GraphModule):
    """``gm`` and the subgraphs its higher-order ops call (FlexAttention's score_mod, cond's
    branches...), which are GraphModule attributes of ``gm``."""
    return [m for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]


def _val_on_neuron(v) -> bool:
    if isinstance(v, torch.Tensor):
        return v.device.type == _NEURON
    if isinstance(v, (list, tuple)):
        return any(_val_on_neuron(x) for x in v)
    return False


def touches_neuron(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Any input, any traced value (``val``, or dynamo's ``example_value``) or any device
    argument on ``neuron``, in ``gm`` or its subgraphs."""
    if any(isinstance(x, torch.Tensor) and x.device.type == _NEURON for x in example_inputs):
        return True
    found = []
    for g in _graphs(gm):
        for node in g.graph.nodes:
            if _val_on_neuron(node.meta.get("val")) or _val_on_neuron(
                    node.meta.get("example_value")):
                return True
            if node.op in ("call_function", "call_method"):
                map_aggregate((node.args, node.kwargs),
                              lambda a: found.append(a) if _is_neuron_device(a) else None)
                if found:
                    return True
    return False


def rewrite_devices(gm: torch.fx.GraphModule) -> int:
    """Point every device argument and tensor constant of ``gm`` at the host; returns how many
    device arguments changed."""
    changed = 0
    dev = host_device()
    for g in _graphs(gm):
        changed += _rewrite_one(g, dev)
    return changed


def _rewrite_one(gm: torch.fx.GraphModule, dev) -> int:
    changed = 0
    for node in gm.graph.nodes:
        if node.op in ("call_function", "call_method"):   # dynamo's graphs: x.new_ones(device=)
            new_args = map_aggregate(node.args, _host_arg)
            new_kwargs = map_aggregate(node.kwargs, _host_arg)
            if new_args != node.args or new_kwargs != node.kwargs:
                changed += 1
                node.args, node.kwargs = new_args, new_kwargs
        elif node.op == "get_attr":
            obj = gm
            *path, last = node.target.split(".")
            for p in path:
                obj = getattr(obj, p)
            v = getattr(obj, last, None)
            if isinstance(v, torch.Tensor) and v.device.type == _NEURON:
                setattr(obj, last, _to_host(v, dev))
    gm.recompile()
    return changed


def _to_host(v: torch.Tensor, dev) -> torch.Tensor:
    from ..device import tensor_data
    h = tensor_data.host(v)
    return h if h.device == dev else h.to(dev)


def host_example_inputs(example_inputs, fake_mode) -> list:
    """Fake host tensors with the sizes, strides and dtypes of the (fake) neuron inputs."""
    dev = host_device()
    out = []
    with fake_mode:
        for x in example_inputs:
            if isinstance(x, torch.Tensor) and x.device.type == _NEURON:
                h = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=dev,
                                        requires_grad=x.requires_grad)
                if x.storage_offset():
                    h = h.as_strided(x.size(), x.stride(), x.storage_offset())
                out.append(h)
            else:
                out.append(x)
    return out


def refresh_meta(gm: torch.fx.GraphModule, host_inputs, fake_mode) -> None:
    """Recompute each node's ``meta['val']`` on the host (placeholders get the host fakes)."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    FakeTensorProp(gm, fake_mode).propagate_dont_convert_inputs(*host_inputs)
