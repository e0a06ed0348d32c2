"""Looking up the user's line keeps no frame alive.

``tracking.user_frame_token`` runs for every captured op. When no user frame is on the current
stack (a program run as ``python -m package``, a device thread), it falls back to the line of the
``backward()`` in progress (``_waiting_caller``). That once searched the other threads' stacks,
which crashed the process when a thread walked was running (a segfault in ``f_back`` while the
compile thread imported modules), and kept this thread's own frame in a local: the frame
outlived its return in a reference cycle and kept its callers' frames, locals included, alive
until the cycle collector ran. A captured op's output then had a second reference, and
autograd's AccumulateGrad, which steals a new gradient only when nothing else refers to it,
copied every parameter's gradient (measured on the W6 Llama step run with ``python -m``: 62
``copy_`` sync points in the backward pass, its training step split into 127 regions).
"""
import gc
import os
import sys
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


def _skipped_hook(out: list):
    """A hook whose code counts as torch's (skipped in the search for the user's line)."""
    ns = {"out": out, "tracking": tracking}
    torch_file = os.path.join(os.path.dirname(torch.__file__), "_neuron_lab_test_hook.py")
    code = compile("def hook(g):\n    out.append(tracking.user_frame_token(1))\n", torch_file,
                   "exec")
    exec(code, ns)
    return ns["hook"]


def test_ops_on_a_device_thread_are_blamed_on_the_backward_line():
    """A neuron graph reached from a CPU root runs on autograd's device thread, whose stack
    holds no user code: its ops name the line that called ``backward()``."""
    seen = []
    x = torch.randn(3).to("neuron").requires_grad_()
    x.register_hook(_skipped_hook(seen))
    loss = (x * 2).cpu().sum()
    line = sys._getframe().f_lineno + 1
    loss.backward()
    assert seen == [(__file__, line)]
    assert tracking._backward_callers == {}          # nothing left once the pass is over
