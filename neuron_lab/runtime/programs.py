"""Compiling a region's graph (``compiler.build``) into a program with torch inductor.

``compile_program`` returns a callable ``program(*inputs) -> tuple of outputs``: inductor's
module, or ``Specialized`` when the region's floats are compiled in as constants (chosen,
because they were constant, or forced, because they cannot be data; ``compiler``'s module
header explains both). Inductor's on-disk caches live under ``NEURON_LAB_CACHE_DIR`` and every
compile fakes its examples with a ShapeEnv, so a region compiled once, in this process, the
compile helper's (``helper.py``) or an earlier one, is a cache load.
"""
from __future__ import annotations

import contextlib
import copy
import os
import threading
from typing import NamedTuple

import torch
from torch import fx

from ..device.executor import host_device
from . import knobs


_cache_ready = False


def _persist_cache() -> None:
    """Point inductor's on-disk caches at NEURON_LAB_CACHE_DIR so restarts reuse programs."""
    global _cache_ready
    if _cache_ready:
        return
    base = knobs.CACHE_DIR.get()
    os.makedirs(base, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(base, "inductor"))
    import torch._functorch.config as fconf
    import torch._inductor.config as iconf
    iconf.fx_graph_cache = True
    fconf.enable_autograd_cache = True
    _cache_ready = True


def _fx_patches_stay_in_their_thread() -> None:
    """FX tracing (inductor's pattern setup, AOTAutograd's make_fx) patches ``nn.Module.__call__``
    on the class, for every thread, while it traces. A model called on the main thread during a
    background compile then fails ("module is not installed as a submodule"). Route patched
    methods to the patched version only in the thread that is tracing."""
    from torch.fx import _symbolic_trace as st
    orig = st._Patcher.patch_method
    if getattr(orig, "_neuron_lab", False):
        return

    def patch_method(self, cls, name, new_fn, deduplicate=True):
        owner, real = threading.get_ident(), getattr(cls, name)

        def routed(*a, **k):
            return new_fn(*a, **k) if threading.get_ident() == owner else real(*a, **k)
        return orig(self, cls, name, routed, deduplicate)

    patch_method._neuron_lab = True
    st._Patcher.patch_method = patch_method


_region_compile = threading.local()    # .active: this thread is in compile_program


def _fx_meta_stays_in_its_thread() -> None:
    """``torch.fx.traceback.preserve_node_meta`` copies the process-wide ``current_meta`` when
    entered and rebinds it to that copy when left; inductor's ``compile_fx`` enters it around
    every compile and cache load. On a thread compiling a region beside the user's that undoes
    what the user's thread did meanwhile: ``torch.fx.traceback.annotate`` adds a key when
    entered and deletes it when left, so a load in between made the delete raise KeyError
    (``create_block_mask``, in the user's thread, annotates). There the context sets and
    restores only its flag, ``should_preserve_node_meta``, and leaves ``current_meta`` as it is;
    elsewhere it is PyTorch's. (A region compiled from scratch on that thread still traces with
    the process-wide ``current_meta``: dynamo's lock, ``worker._compile_lock``, keeps
    ``torch.compile`` out of it, not ``annotate``.)"""
    from torch.fx import traceback as fx_traceback
    orig = fx_traceback.preserve_node_meta
    if getattr(orig, "_neuron_lab", False):
        return

    @contextlib.contextmanager
    def flag_only(enable: bool = True):
        saved = fx_traceback.should_preserve_node_meta
        try:
            fx_traceback.should_preserve_node_meta = enable
            yield
        finally:
            fx_traceback.should_preserve_node_meta = saved

    def preserve_node_meta(enable: bool = True):
        if getattr(_region_compile, "active", False):
            return flag_only(enable)
        return orig(enable)

    preserve_node_meta._neuron_lab = True
    fx_traceback.preserve_node_meta = preserve_node_meta


@contextlib.contextmanager
def _compiling_region():
    """This thread compiles a region (``compile_program``) beside the user's main thread."""
    if threading.current_thread() is threading.main_thread():
        yield
        return
    _region_compile.active = True
    try:
        yield
    finally:
        _region_compile.active = False


class Build(NamedTuple):
    """How a region's program is built, beyond its graph. ``largest``: the element count of its
    largest tensor (smaller regions compile single-threaded, ``compile_program``);
    ``beside_host``: its launches were not waited for, so it runs on the device's thread beside
    the host's Python and gets inductor's C++ wrapper whatever its size (``_inductor``);
    ``threads``: the OpenMP threads its kernels are written for, the user's
    ``torch.get_num_threads()`` when it was queued (0: this process's, read at the compile).
    Inductor writes them into the code, so they are part of the program's cache key: the compile
    helper (one thread of its own) and the user's process compile the same program with them."""
    largest: int = 0
    beside_host: bool = False
    threads: int = 0


class Specialized:
    """A program compiled with the region's floats as constants ``fixed`` (a list, in plan
    order); ``fused.launch_inputs`` checks them before each launch. ``chosen``: specialized
    because the floats were constant (else: because they cannot be data). ``packed``: the
    scalars input the program still takes (unread), made once."""
    __slots__ = ("program", "fixed", "chosen", "packed")

    def __init__(self, program, fixed: list, chosen: bool = False) -> None:
        self.program, self.fixed, self.chosen = program, fixed, chosen
        self.packed = torch.tensor(fixed, dtype=torch.float64)

    def __call__(self, *inputs):
        return self.program(*inputs)


def _specialize(gm: fx.GraphModule, values: list) -> fx.GraphModule:
    """``gm`` with each packed float read (``select`` + ``item()``) replaced by its value."""
    item = torch.ops.aten._local_scalar_dense.default
    g = gm.graph
    for n in list(g.nodes):
        if n.target is item:
            sel = n.args[0]
            val = float(values[sel.args[2]])
            for user in list(n.users):
                user.args = fx.node.map_arg(user.args, lambda a: val if a is n else a)
                user.kwargs = fx.node.map_arg(user.kwargs, lambda a: val if a is n else a)
            g.erase_node(n)
            if not sel.users:
                g.erase_node(sel)
    g.lint()
    gm.recompile()
    return gm


def compile_program(gm: fx.GraphModule, examples: list, build: Build = Build(),
                    fixed: list | None = None, fallback: list | None = None,
                    packed: bool | None = None):
    """Compile with inductor; returns a callable ``program(*inputs) -> tuple of outputs``.
    ``fixed``: the region's floats were constant (these values): specialize them. If the floats
    cannot be data, the program is specialized too (``Specialized``; see the module header), on
    ``fallback`` (the values a specialized program of the region had) or this launch's.
    ``packed``: what the compile helper found of compiling the floats as data — True: it
    worked (this compile is a cache hit: no copy of the graph is kept for the fallback, ~8 ms of
    a ~45 ms load), False: they cannot be data (do not try again), None: not known.

    Regions whose tensors are all small are compiled single-threaded: OpenMP fork/join costs
    more than the work (measured, 65 ops on 1 K floats, 2 cores: 390-730 us with 2 threads vs
    11 us with 1). ``NEURON_LAB_PARALLEL_MIN_NUMEL`` sets the size from which kernels go parallel.
    """
    _persist_cache()
    _fx_patches_stay_in_their_thread()
    _fx_meta_stays_in_its_thread()
    with _compiling_region():
        return _compile_program(gm, examples, build, fixed, fallback, packed)


def _compile_program(gm, examples, build, fixed, fallback, packed):
    """``compile_program``'s body."""
    item = torch.ops.aten._local_scalar_dense.default
    if not any(n.target is item for n in gm.graph.nodes):
        return _inductor(gm, _fake(examples), build)
    if fixed is not None:         # fake examples with a ShapeEnv: inductor's caches need one
        return Specialized(_inductor(_specialize(gm, fixed), _fake(examples), build), fixed,
                           chosen=True)
    if packed:
        return _inductor(gm, _fake(examples), build)
    if packed is None:
        try:                                               # packed floats (see module header)
            return _inductor(copy.deepcopy(gm), _fake(examples), build)
        except Exception:  # noqa: BLE001 - floats that cannot be data: specialize, guard them
            pass
    values = fallback if fallback is not None else examples[0].tolist()
    return Specialized(_inductor(_specialize(gm, values), _fake(examples), build), values)


def _inductor(gm: fx.GraphModule, examples: list, build: Build):
    """``compile_fx`` with ``NEURON_LAB_COMPILE_THREADS`` compile workers (default 1). Inductor
    would start a pool of one worker process per core, each importing torch, which competes
    with the user's loop for the cores while the first regions compile (the pool's start-up
    most of all); with one worker the compile itself takes as long.

    AOTAutograd's cache key is made without renaming the placeholders first
    (``autograd_cache_normalize_inputs``): that renaming regenerates the module's code twice
    (~8 ms of a ~45 ms load from a warm cache, with the GIL), and ``build`` names them the same
    way for the same region every time (``scalars``, ``in0``...), so the keys hit as before.

    A program that runs beside the host (``Build.beside_host``: its launches were not waited
    for, so they go to the device's thread) or has at least ``NEURON_LAB_CPP_WRAPPER_OPS`` (100)
    ATen calls gets inductor's C++ wrapper: the launch is one C++ call that releases the GIL
    from its first kernel to its last. The Python wrapper runs inductor's kernels holding the
    GIL and releases it around each ATen call, which on the device's thread (``launch_queue``)
    means taking turns with the host's Python: a thread switch at every ATen call, where the C++
    wrapper has a few per launch (docs/performance.md). A program whose launches are waited
    for, and small, keeps the Python wrapper: the C++ wrapper costs a C++ compile and more time
    to load, and a small program read every iteration runs no faster with it. A graph the C++
    wrapper cannot build falls back to the Python wrapper."""
    import torch._functorch.config as fconf
    import torch._inductor.config as iconf
    from torch._inductor.compile_fx import compile_fx
    patch = {"compile_threads": knobs.COMPILE_THREADS.get(),
             "cpp.threads": build.threads or torch.get_num_threads()}
    if host_device().type == "cpu" and build.largest < knobs.PARALLEL_MIN_NUMEL.get():
        patch["cpp.threads"] = 1
    names = ({"autograd_cache_normalize_inputs": False}      # a torch without it renames
             if hasattr(fconf, "autograd_cache_normalize_inputs") else {})
    if _wants_cpp_wrapper(gm, build.beside_host):
        try:
            with iconf.patch({**patch, "cpp_wrapper": True}), fconf.patch(names):
                return compile_fx(copy.deepcopy(gm), examples)
        except Exception:  # noqa: BLE001 - a graph the C++ wrapper cannot build: Python's
            pass
    with iconf.patch(patch), fconf.patch(names):
        return compile_fx(gm, examples)


def _wants_cpp_wrapper(gm: fx.GraphModule, beside_host: bool) -> bool:
    """Does this region's program get inductor's C++ wrapper? If it runs beside the host
    (``Build.beside_host``) or has ``NEURON_LAB_CPP_WRAPPER_OPS`` ATen calls; never with the
    knob at 0."""
    least = knobs.CPP_WRAPPER_OPS.get()
    return least > 0 and (beside_host or sum(isinstance(n.target, torch._ops.OpOverload)
                                             for n in gm.graph.nodes) >= least)


def _fake(examples: list) -> list:
    """Example inputs as fake tensors of a mode with a ShapeEnv, so ``item()`` in the graph can
    make an unbacked SymFloat; shapes stay static (the region's key fixes them). Inductor's FX
    graph and AOTAutograd caches also need the ShapeEnv: with real example tensors they bypass
    ("No shape env") and every process compiles the region again instead of loading it from
    the cache. Every program compiles with them, with floats or without."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    mode = FakeTensorMode(shape_env=ShapeEnv())
    return [mode.from_tensor(t, static_shapes=True) for t in examples]
