"""Registering ``neuron`` with PyTorch through the PrivateUse1 extension point.

``_setup_privateuseone_for_python_backend`` gives the device guard and hooks that ``.to``,
``nn.Module.to`` and ``backward()`` need; ``register`` takes its steps with C++ hooks where they
can be built. Here: the generic kernel registered for every ATen op (``_register_kernels``),
``_has_compatible_shallow_copy_type`` and ``scaled_dot_product_attention``. Where the setup
stops short, ``patches`` (accelerator, tensor, data_ptr) and ``serialization`` (load, storages)
patch PyTorch's Python API narrowly.

``scaled_dot_product_attention`` picks its kernel through a C++ DispatchStub a Python backend
cannot fill; ``_sdpa`` makes CPU's choice so results stay bitwise CPU's. On the CUDA executor it
takes the math path (the decomposition into matmuls and softmax, run by the GPU): CPU's fused
kernel has no CUDA implementation, and CUDA's choice among its own (flash, memory-efficient,
cuDNN) is not mirrored here, so results are those of CUDA's math backend, not its fused kernels.
"""
from __future__ import annotations

import torch

from . import (autocast, config, dtypes, executor, hooks, kernels, module, patches,
               runtime_interface, serialization, streams, tracking, transfers)
from .op_facts import facts, overload

_registered = False
_libs: list = []
_native = None          # the native extension (device/native.py): the generic kernel is its
                        # ``kernel``


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _kernel(op):
    """The generic kernel for ``op``: ``runtime_interface.launch(facts, args, kwargs)`` with a
    runtime installed, else ``kernels.execute``. In C when the native extension is built
    (``csrc/kernel.cpp``: one interpreter frame less per op); the closure below is the same."""
    f = facts(op)
    execute = kernels.execute
    if f.base == "set_" and "Storage" in f.name:
        return transfers.set_storage
    if _native is not None:
        return _native.kernel(f, execute, vars(runtime_interface))

    def kernel(*args, **kwargs):
        launch = runtime_interface.launch
        if launch is None:
            return execute(f, args, kwargs)
        return launch(f, args, kwargs)

    kernel.__name__ = f"neuron_{f.base}"
    return kernel


def _fallback(op, *args, **kwargs):
    """Ops without a neuron kernel. For ATen, only ops the scan above skipped; any other
    namespace's op (a custom op with only a CPU kernel, torchvision's...) runs its host kernel
    and is recorded as a fallback, like any op Trainium lacks."""
    f = facts(op)
    if op.namespace != "aten":
        tracking.record_fallback(f.name, "no neuron kernel: ran its CPU kernel on the host")
    return _kernel(op)(*args, **kwargs)


# Left to PyTorch's CompositeExplicitAutograd kernels: they shallow-copy the TensorImpl in C++
# (no Python object attached), which ``Parameter``/``_make_subclass`` requires; the copy shares
# the storage, so ``tensor_data.host`` finds its data through the storage.
NATIVE = frozenset({"detach", "alias", "lift_fresh"})

# An op with any of these kernels gets ours. CompositeExplicitAutogradNonFunctional kernels
# (``*_scatter``, ``*_copy``, ``diag_embed``...) would otherwise run on the device tensors
# themselves and
# read the device storage's byte size (``clone_preserve_strides``), which is 0 for fresh outputs.
BACKEND_KEYS = ("CPU", "CompositeExplicitAutograd", "CompositeExplicitAutogradNonFunctional")

SPECIAL = {"_copy_from": transfers.copy_from,
           "_copy_from_and_resize": transfers.copy_from_and_resize,
           "_pin_memory": hooks.pin_device_tensor, "is_pinned": hooks.is_pinned_device_tensor,
           "_pack_padded_sequence": transfers.pack_padded_sequence,
           "_pad_packed_sequence": transfers.pad_packed_sequence}


_DIRECT_KINDS = {"new": 0, "view": 1, "in_place": 2, "new_tuple": 3}   # csrc/direct.cpp's Kind


def _dtype_kwarg(op) -> int:
    """The position of ``op``'s keyword-only ``dtype`` argument, or -1 (the Python path checks
    a ``dtype=`` keyword against Trainium's dtypes: the direct kernel hands those calls to it)."""
    return next((i for i, a in enumerate(op._schema.arguments)
                 if a.kwarg_only and a.name == "dtype"), -1)


def _register_kernels(direct=None) -> int:
    """Our kernel for every aten op it should own. With ``direct`` (the native extension), an
    ``OpFacts.direct`` op gets the direct kernel under PrivateUse1 (``csrc/direct.cpp``), which
    calls the generic kernel's runtime_interface.launch or execute (``_kernel``'s) from C++ for
    everything it does not run itself (``csrc/python_call.cpp``)."""
    lib = torch.library.Library("aten", "IMPL")
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    n = 0
    for qualname in torch._C._dispatch_get_all_op_names():
        if not qualname.startswith("aten::"):
            continue
        # A decomposition runs unless CPU has its own kernel (silu_backward, mish_backward):
        # then CPU's kernel wins on CPU, and ours (running it) must win here, or results and
        # autograd differ from CPU's.
        if has(qualname, "CompositeImplicitAutograd") and not has(qualname, "CPU"):
            continue
        if not any(has(qualname, k) for k in BACKEND_KEYS):
            continue
        short = qualname[6:]
        base = short.split(".", 1)[0]
        if base in NATIVE:
            continue
        try:
            op = overload(qualname)
            special = SPECIAL.get(base)
            f = facts(op)
            if direct is not None and special is None and f.direct:
                direct.register_direct(short, f.name, _DIRECT_KINDS[f.direct],
                                       f.ret_alias[0][0] if f.ret_alias[0] else -1,
                                       _dtype_kwarg(op), f.direct_size,
                                       f.dropout_at[0] if f.dropout_at else -1,
                                       (f, kernels.execute, vars(runtime_interface)))
                f.direct_kernel = True
            else:
                lib.impl(short, special or _kernel(op), "PrivateUse1")
            n += 1
        except (AttributeError, RuntimeError):
            continue
    lib.impl("record_stream", streams.record_stream, "PrivateUse1")   # a CUDA-only op
    fb = torch.library.Library("_", "IMPL")
    fb.fallback(_fallback, dispatch_key="PrivateUse1")
    _libs.extend([lib, fb])
    return n


def _hints(sizes) -> list:
    """Concrete sizes for symbolic ones (their example values while tracing)."""
    try:
        from torch.fx.experimental.symbolic_shapes import optimization_hint
    except ImportError:                                   # torch < 2.13
        from torch.fx.experimental.symbolic_shapes import hint_int as optimization_hint
    return [s if type(s) is int else optimization_hint(s, fallback=8) for s in sizes]


def _no_tracing():
    from torch.utils._python_dispatch import _disable_current_modes
    return _disable_current_modes()


def _cpu_view(t):
    """A CPU stand-in for ``t`` with what CPU's SDPA choice looks at (sizes, strides, dtype,
    requires_grad) and no data: reading the data would be a sync in adaptive mode."""
    if t is None or t.device.type != "neuron":
        return t
    return torch.empty_strided(_hints(t.shape), _hints(t.stride()), dtype=t.dtype,
                               requires_grad=t.requires_grad)


def _read_by_choice(t):
    """What CPU's SDPA choice reads of argument ``t`` (``_cpu_view``'s, and the device)."""
    if t is None:
        return None
    return t.shape, t.stride(), t.dtype, t.requires_grad, t.device.type


# The process-wide settings CPU's choice reads besides the arguments (torch.nn.attention's
# sdpa_kernel sets them; those this torch has), and the choices made, by everything they read.
_SDP_SETTINGS = tuple(getattr(torch._C, name) for name in (
    "_get_flash_sdp_enabled", "_get_math_sdp_enabled", "_get_mem_efficient_sdp_enabled",
    "_get_cudnn_sdp_enabled", "_get_overrideable_sdp_enabled", "_get_sdp_priority_order")
    if hasattr(torch._C, name)) + (torch.is_grad_enabled,
                                   torch.are_deterministic_algorithms_enabled)
_choices: dict = {}


def _sdp_settings() -> tuple:
    return tuple(tuple(v) if type(v) is list else v for v in (read() for read in _SDP_SETTINGS))


def _sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) -> int:
    """CPU's ``_fused_sdp_choice`` for these arguments. It depends on the arguments' metadata
    and the settings above only, so a model's attention calls look it up by those instead of
    building three CPU stand-ins and leaving the dispatch modes each time (~15 us a call).
    Under torch.compile's tracing (fake tensors, maybe symbolic sizes) the choice is made as
    before, outside the trace: traced, its int-valued node would reach AOTAutograd's
    partitioner ("Expected _fused_sdp_choice to be a tensor")."""
    key = None
    if torch._C._len_torch_dispatch_stack() == 0:
        key = (*map(_read_by_choice, (q, k, v, attn_mask)), dropout_p, is_causal, scale,
               enable_gqa, _sdp_settings())
        try:
            choice = _choices.get(key)
        except TypeError:                # symbolic sizes (fake tensors) do not hash
            key = choice = None
        if choice is not None:
            return choice
    with _no_tracing():
        choice = torch.ops.aten._fused_sdp_choice(*map(_cpu_view, (q, k, v, attn_mask)),
                                                  dropout_p, is_causal, scale=scale,
                                                  enable_gqa=enable_gqa)
    if key is not None:
        if len(_choices) >= 1024:        # a bound for programs that vary shapes endlessly
            _choices.clear()
        _choices[key] = choice
    return choice


_FLASH = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
          enable_gqa=False):
    """``scaled_dot_product_attention`` as on CPU. Its C++ decomposition asks a DispatchStub
    for the backend, which a Python backend cannot register, so on ``neuron`` it would always
    take the math path while CPU takes its flash kernel (results differ in the last bits).
    Here the choice is CPU's (``_sdp_choice``) and so is the kernel. A host executor other
    than the CPU takes the math path (module header)."""
    aten = torch.ops.aten
    if executor.host_device().type != "cpu":
        return aten._scaled_dot_product_attention_math(
            q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
    if _sdp_choice(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa) != _FLASH:
        return aten._scaled_dot_product_attention_math(
            q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)[0]
    if attn_mask is not None and attn_mask.dtype == torch.bool:   # convert_boolean_attn_mask
        attn_mask = torch.zeros((), dtype=q.dtype, device=q.device).masked_fill(
            attn_mask.logical_not(), float("-inf"))
    return aten._scaled_dot_product_flash_attention_for_cpu.default(
        q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]


def _register_sdpa() -> None:
    lib = torch.library.Library("aten", "IMPL")
    for key in ("PrivateUse1", "AutogradPrivateUse1"):   # the inner ops carry autograd
        lib.impl("scaled_dot_product_attention", _sdpa, key)
    _libs.append(lib)


# Devices whose dense tensors may swap TensorImpl contents with a neuron tensor (``.data =``):
# the ones PyTorch's TensorImpl::has_compatible_shallow_copy_type treats as dense, and neuron.
_DENSE = frozenset({"cpu", "cuda", "mps", "hip", "xpu", "hpu", "mtia", "neuron"})


def _shallow_copy_compatible(self, other) -> bool:
    """``aten::_has_compatible_shallow_copy_type`` for neuron: dense strided tensors of neuron
    and the dense devices are compatible (CPU <-> CUDA already are), so ``param.data = x.to(d)``
    keeps the Parameter object. Meta is not (as for CUDA): ``to_empty`` from meta makes new
    Parameters there too."""
    return (self.layout == torch.strided and other.layout == torch.strided
            and self.device.type in _DENSE and other.device.type in _DENSE)


def _register_shallow_copy() -> None:
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("_has_compatible_shallow_copy_type", _shallow_copy_compatible, "PrivateUse1")
    _libs.append(lib)


def register() -> None:
    """Register ``neuron`` (idempotent). Raises if another backend owns PrivateUse1."""
    global _registered, _native
    if _registered:
        return
    existing = getattr(torch, "neuron", None)
    if existing is not None and existing is not module:
        raise RuntimeError("neuron_lab: another 'neuron' backend (torch-neuronx?) is registered; "
                           "use one or the other in a process")
    from . import memory, native, tensor_data
    # first, so that a library that cannot load leaves nothing half registered
    ext = _native = native.load()       # NativeLibraryError (an ImportError) names the fix
    # _setup_privateuseone_for_python_backend's steps, with the C++ hooks
    torch.utils.generate_methods_for_privateuse1_backend()
    torch._register_device_module("neuron", module)
    hooks.install(ext)                  # pinned memory and generators need the C++ hooks
    tensor_data.use_native(ext)               # storages get their host buffer's address
    if executor.host_device().type == "cpu":
        memory.use_native(ext)          # and are counted in their own DataPtr
    kernels.use_native(ext)             # the eager path's short cut in C
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())
    streams.install()       # the C++ guard: streams and events (after the Python one)
    direct = None
    if config.DIRECT.get() and executor.host_device().type == "cpu":
        direct = _native           # eager ops in C++ (their outputs counted by the native counter)
        device_storage = torch._C._acc.create_empty_tensor((0,), torch.uint8).untyped_storage()
        direct.configure_direct(sorted(dtypes.HOST_ONLY, key=str), device_storage)
        tracking.count_native(direct.direct_counts)
        runtime_interface.connect(direct.set_direct)
        kernels.use_direct(direct)
    _register_kernels(direct)
    _register_sdpa()
    _register_shallow_copy()
    autocast.register()
    patches.accelerator()
    patches.tensor()
    patches.data_ptr()
    patches.backward()
    serialization.install()
    serialization.storage()
    _registered = True
