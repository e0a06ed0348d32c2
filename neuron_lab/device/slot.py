"""Claim the PrivateUse1 slot under the name ``neuron`` (first thing the device package does).

``torch.device("neuron")`` only parses after the rename, so every other device module may
create ``neuron`` devices at import time once this has run. PyTorch allows one PrivateUse1
backend per process: if another one owns the slot, fail here with a clear message.
"""
import torch

NAME = "neuron"

_owner = torch._C._get_privateuse1_backend_name()
if _owner == "privateuseone":
    torch.utils.rename_privateuse1_backend(NAME)
elif _owner != NAME:
    raise RuntimeError(
        f"neuron_lab: the PrivateUse1 slot is already owned by backend {_owner!r}; PyTorch allows "
        f"one PrivateUse1 backend per process. Import neuron_lab in a process without {_owner!r}.")
