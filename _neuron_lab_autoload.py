"""PyTorch's ``torch.backends`` entry point for neuron_lab (declared in pyproject.toml).

``import torch`` calls ``autoload`` at its end, so ``device="neuron"`` works in a process that
never imports neuron_lab, as for other out-of-tree backends; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``
makes PyTorch skip it. It lives outside the package because PyTorch turns any exception from an
entry point into a failed ``import torch``: here a neuron_lab that cannot load (its compiled
extension built for another torch, say) costs one warning naming the cause and the fix, and
``import torch`` goes on without the ``neuron`` device; ``import neuron_lab`` then raises the
same error as an ImportError.
"""
from __future__ import annotations

import warnings


def autoload() -> None:
    try:
        import neuron_lab
    except Exception as e:      # noqa: BLE001 - import torch must not fail because of us
        warnings.warn(f"{e} (import torch goes on without the 'neuron' device; "
                      f"TORCH_DEVICE_BACKEND_AUTOLOAD=0 skips loading neuron_lab)",
                      RuntimeWarning, stacklevel=2)
        return
    neuron_lab._autoload()
