"""Wiring the ``neuron`` backend into torch.compile, without importing dynamo at import time.

1. ``"neuron"`` is registered with dynamo's backend registry the moment ``torch._dynamo`` is
   imported (``neuron_lab.after_import.when_imported``, as for FlexAttention's device check;
   at once if it is imported already): ``import neuron_lab`` does not import dynamo, and ``torch.compile(m, backend="neuron")`` /
   ``torch.compiler.set_default_backend("neuron")`` find the name; the device's own packages
   are added to dynamo's skip list (see ``_SKIPPED``), and graph breaks are recorded with the
   user's line (``outcomes``).
2. ``torch.compile(m)`` with the default ``"inductor"`` backend: PyTorch's
   ``_TorchCompileInductorWrapper`` calls inductor's ``compile_fx``, which generates code for a
   graph's own device. The patched ``__call__`` hands every graph that touches ``neuron`` — an
   input, a factory's ``device=``, a ``.to("neuron")``, any traced value (``hostgraph.
   touches_neuron``) — to ``neuron_backend`` with the same config patches (``mode=``,
   ``options=``); every other graph takes PyTorch's path unchanged. Inductor's device registries
   know ``neuron`` too (``device_interface``), registered before any graph compiles.
3. FX's global "symbolic trace running" flag counts only in the tracing thread (the adaptive
   runtime's background compiles trace while the user's thread calls compiled code).
"""
from __future__ import annotations

import threading

import torch

from ..after_import import when_imported
from . import device_interface

_DYNAMO = "torch._dynamo"
# The device's own Python (its PrivateUse1 kernels, the adaptive runtime, telemetry) is to
# dynamo what CUDA's C++ kernels are: never traced. Without this, an op on neuron tensors run
# between two graphs (a graph break, AOTAutograd's runtime wrappers) enters our kernel's Python
# frame with dynamo's frame hook active, and dynamo tries to compile the device itself.
# ``neuron_lab.library`` (user-level modules calling custom ops) stays traceable.
# ``neuron_lab.compile.traceable`` holds replacements of torch functions dynamo traces through.
_SKIPPED = ("neuron_lab.device", "neuron_lab.runtime", "neuron_lab.telemetry",
            "neuron_lab.jupyter")
_TRACEABLE = "neuron_lab.compile.traceable"


def _skipped_modules() -> list[str]:
    import pkgutil

    from .. import compile as pkg
    own = [f"{pkg.__name__}.{m.name}" for m in pkgutil.iter_modules(pkg.__path__)]
    # module by module: adding the package would add its directory, traceable.py included
    return [*_SKIPPED, *(m for m in own if m != _TRACEABLE)]
_state = {"registered": False, "patched": False}


def _on_neuron(inputs) -> bool:
    return any(isinstance(x, torch.Tensor) and x.device.type == "neuron" for x in inputs)


def _graph_on_neuron(gm) -> bool:
    """A graph without ``neuron`` inputs that still creates, moves or returns ``neuron``
    tensors (``torch.arange(n, device="neuron")``, ``create_block_mask(..., device="neuron")``)."""
    from . import hostgraph
    return isinstance(gm, torch.fx.GraphModule) and hostgraph.touches_neuron(gm, ())


def _register_backend(_dynamo=None) -> None:
    if _state["registered"]:
        return
    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend

    from torch._dynamo import trace_rules

    from .backend import neuron_backend
    if "neuron" not in _COMPILER_FNS:
        register_backend(neuron_backend, name="neuron")
    device_interface.register_interface()
    for mod in _skipped_modules():
        trace_rules.add(mod)
    _watch_graph_breaks()
    _state["registered"] = True


def _describe(reason: str, exc) -> str:
    """Dynamo's break type and context (``Data-dependent branching: ...``) when it has them;
    the first line of ``reason`` is often only "Encountered graph break when ..."."""
    gb_type, context = getattr(exc, "gb_type", None), getattr(exc, "context", None)
    if gb_type:
        return f"{gb_type}: {context}" if context else str(gb_type)
    return reason


def _watch_graph_breaks() -> None:
    """Record each graph break (user line + reason) as dynamo logs it: dynamo keeps only a
    per-reason counter, and its located message goes to a logger that is off by default."""
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    from . import outcomes
    orig = InstructionTranslatorBase.log_graph_break

    def log_graph_break(self, code_options, reason, exc):
        if not getattr(exc, "logged", False):
            try:
                stack = getattr(exc, "real_stack", None) or torch._guards.TracingContext.extract_stack()
                frame = stack[-1] if stack else None
                outcomes.record_graph_break(frame.filename if frame else code_options.get("co_filename"),
                                           frame.lineno if frame else code_options.get("co_firstlineno"),
                                           _describe(reason, exc))
            except Exception:   # noqa: BLE001 - the record is best effort; dynamo's log is not
                pass
        return orig(self, code_options, reason, exc)

    InstructionTranslatorBase.log_graph_break = log_graph_break


def _patch_inductor_wrapper() -> None:
    if _state["patched"]:
        return
    cls = torch._TorchCompileInductorWrapper
    orig = cls.__call__

    def __call__(self, model_, inputs_, *, config_patches=None):
        if _on_neuron(inputs_) or _graph_on_neuron(model_):
            from .backend import neuron_backend
            return neuron_backend(model_, inputs_, **{**self.config, **(config_patches or {})})
        return orig(self, model_, inputs_, config_patches=config_patches)

    cls.__call__ = __call__
    _state["patched"] = True


def _patch_flex_attention(_module=None) -> None:
    from torch.nn.attention import flex_attention as fa

    from . import flex_attention, traceable
    fa._validate_device = traceable.validate_device
    flex_attention.install()


_fx_here = threading.local()


def _fx_tracing_flag_per_thread() -> None:
    """FX's "a symbolic trace is running" flag is one global, set by ``Tracer.trace`` while it
    traces; dynamo refuses to run a compiled function while it is set ("Detected that you are
    using FX to symbolically trace a dynamo-optimized function"). The adaptive runtime's
    background compiles trace (inductor's pattern set-up), so a ``torch.compile``'d model called
    on the user's thread meanwhile failed. The flag now counts only in the tracing thread."""
    from torch.fx import _symbolic_trace as st
    if getattr(st.is_fx_symbolic_tracing, "_neuron_lab", False):
        return
    orig_trace = st.Tracer.trace

    def trace(self, *args, **kwargs):
        depth = getattr(_fx_here, "depth", 0)
        _fx_here.depth = depth + 1
        try:
            return orig_trace(self, *args, **kwargs)
        finally:
            _fx_here.depth = depth

    def is_fx_symbolic_tracing() -> bool:
        return (st._is_fx_tracing_flag and getattr(_fx_here, "depth", 0) > 0
                and not torch.compiler.is_compiling())

    is_fx_symbolic_tracing._neuron_lab = True
    st.Tracer.trace = trace
    st.is_fx_symbolic_tracing = is_fx_symbolic_tracing


def install() -> None:
    _fx_tracing_flag_per_thread()
    _patch_inductor_wrapper()
    when_imported(_DYNAMO, _register_backend)
    when_imported("torch.nn.attention.flex_attention", _patch_flex_attention)
