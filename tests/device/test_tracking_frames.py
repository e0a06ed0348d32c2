"""Looking up the user's line keeps no frame alive.

``tracking.user_frame_token`` runs for every captured op. When no user frame is on the current
stack (a program run as ``python -m package``, a device thread), it searches the other threads'
stacks (``_waiting_caller``). That search once kept this thread's own frame in a local: the
frame outlived its return in a reference cycle and kept its callers' frames, locals included,
alive until the cycle collector ran. A captured op's output then had a second reference, and
autograd's AccumulateGrad, which steals a new gradient only when nothing else refers to it,
copied every parameter's gradient (measured on the W6 Llama step run with ``python -m``: 62
``copy_`` sync points in the backward pass, its training step split into 127 regions).
"""
import gc
import weakref

import torch

from neuron_lab.device import tracking


def _search_holding(t):
    """A caller frame with a tensor in its locals, as ``Engine._capture``'s ``out``."""
    tracking._waiting_caller()
    tracking.user_frame_token(1)
    return None


def test_searching_other_threads_keeps_the_callers_locals_free():
    t = torch.randn(4)
    alive = weakref.ref(t)
    gc.disable()                   # a cycle would survive until the collector: keep it off
    try:
        _search_holding(t)
        del t
        assert alive() is None
    finally:
        gc.enable()


def test_a_gradient_seen_during_the_search_is_stolen_not_copied():
    """AccumulateGrad takes a new gradient as is (same storage) when nothing else refers to it;
    a hook whose frame stayed alive made it copy the gradient."""
    w = torch.randn(3, requires_grad=True)
    ptrs = []

    def hook(g):
        ptrs.append(g.data_ptr())
        _search_holding(g)
    w.register_hook(hook)
    gc.disable()
    try:
        (w * 2).sum().backward()
        assert w.grad.data_ptr() == ptrs[0]
    finally:
        gc.enable()
