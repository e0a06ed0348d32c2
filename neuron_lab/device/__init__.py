"""Layer 1, the device: ``neuron`` registered through PrivateUse1, emulated on a host executor.

Modules: ``registry`` (registration and the few patches PyTorch needs), ``tensor_data`` (device
tensors and their host data), ``kernels`` (the generic kernel), ``transfers`` (the transfer
ops' kernels), ``op_facts`` (per-op facts from schemas), ``memory`` (accounting, OOM),
``dtypes`` (Trainium rules), ``tracking`` (executed ops, fallbacks, sync points), ``module``
(``torch.neuron``), ``executor`` (CPU/CUDA host), ``config`` (knobs), ``events`` (the
instrumentation bus).
"""
from . import slot  # noqa: F401  (must run first: makes "neuron" parse)
from .executor import executor_name, host_device
from .registry import register
from .tensor_data import DEVICE

__all__ = ["register", "DEVICE", "executor_name", "host_device"]
