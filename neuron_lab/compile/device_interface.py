"""Inductor's view of the ``neuron`` device: a device interface and a backend registration.

Inductor asks two registries about every device a graph touches, whatever its inputs are:
dynamo's ``device_interface`` (``get_interface_for_device``: properties, streams, the device
guard, bf16 support, used while lowering — without it a graph that only *creates* ``neuron``
tensors failed with "No interface for device neuron") and codegen's
``register_backend_for_device`` (scheduling and wrapper per device type). PyTorch's OpenReg
backend registers both for its PrivateUse1 device; so does this module, for ``neuron``:

- ``NeuronInterface`` answers from ``torch.neuron`` (the device module): one device,
  ``torch.Stream``/``torch.Event`` on ``neuron``, the modelled chip's properties, no float64.
- the codegen registration is the host executor's C++ scheduling and Python wrapper, as
  OpenReg's. Code is never generated for a ``neuron`` graph directly: ``backend.py`` compiles
  the same graph moved to the host executor (docs/compile.md says why), and ``registration.py`` sends
  every graph that touches ``neuron`` there — inputs, a factory's ``device=``, a ``.to()``, or
  a traced value — from the default ``inductor`` backend as from ``backend="neuron"``.

Both registrations are made when the module they extend is first imported (``registration.install``:
``import neuron_lab`` imports neither dynamo nor inductor).
"""
from __future__ import annotations

from typing import Any

import torch

_NEURON = "neuron"


def _module():
    return torch.neuron


def interface():
    """The ``DeviceInterface`` subclass for ``neuron`` (built on first use: it subclasses
    dynamo's base class, which lives in ``torch._dynamo``)."""
    if _cls[0] is None:
        _cls[0] = _build()
    return _cls[0]


_cls: list = [None]


def _build():
    from torch._dynamo.device_interface import DeviceInterface

    class NeuronInterface(DeviceInterface):
        """``torch.neuron`` as inductor's device runtime interface."""

        class device:                                  # noqa: N801 - the interface's name
            def __new__(cls, device: Any):
                return _module().device(device)

        Stream = torch.Stream
        Event = torch.Event

        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                _module().set_device(device)

            @staticmethod
            def current_device() -> int:
                return 0

            @staticmethod
            def get_device_properties(device: Any = None) -> Any:
                return _module().get_device_properties(0)

        @staticmethod
        def current_device() -> int:
            return _module().current_device()

        @staticmethod
        def set_device(device: Any) -> None:
            _module().set_device(device)

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            return 0

        @staticmethod
        def exchange_device(device: int) -> int:
            return 0

        @staticmethod
        def device_count() -> int:
            return _module().device_count()

        @staticmethod
        def is_available() -> bool:
            return _module().is_available()

        @staticmethod
        def stream(stream: torch.Stream):
            return _module().stream(stream)

        @staticmethod
        def current_stream() -> torch.Stream:
            return _module().current_stream()

        @staticmethod
        def set_stream(stream: torch.Stream) -> None:
            _module().set_stream(stream)

        @staticmethod
        def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
            _module().set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                              device_type=device_type))

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            return 0

        @staticmethod
        def synchronize(device: Any = None) -> None:
            _module().synchronize()

        @staticmethod
        def get_compute_capability(device: Any = None) -> str:
            return ""

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return True

        @classmethod
        def is_dtype_supported(cls, dtype: torch.dtype, including_emulation: bool = False) -> bool:
            return dtype not in (torch.float64, torch.complex64, torch.complex128)

        @staticmethod
        def memory_allocated(device: Any = None) -> int:
            return _module().memory_allocated()

        @staticmethod
        def is_triton_capable(device: Any = None) -> bool:
            return False

    return NeuronInterface


def register_interface() -> None:
    """``get_interface_for_device("neuron")`` answers (called when dynamo is imported)."""
    from torch._dynamo import device_interface as di
    if di.device_interfaces.get(_NEURON) is not interface():
        di.register_interface_for_device(_NEURON, interface())
        di.register_interface_for_device(f"{_NEURON}:0", interface())


def register_codegen() -> None:
    """``register_backend_for_device("neuron", ...)``: the host executor's C++ scheduling and
    Python wrapper, as PyTorch's OpenReg registers for its device (called when inductor's
    codegen registry is imported)."""
    from torch._inductor.codegen import common
    if common.get_scheduling_for_device(_NEURON) is not None:
        return
    from torch._inductor.codegen.cpp import CppScheduling
    from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    common.register_backend_for_device(_NEURON, CppScheduling, PythonWrapperCodegen,
                                       CppWrapperCpu)
