"""Ctrl-C and the adaptive runtime: a launch runs to completion, the interrupt is delivered after.

A KeyboardInterrupt (Ctrl-C, Jupyter's interrupt button: SIGINT, whose Python handler raises
at the next bytecode boundary of the main thread) must never leave a tensor the user already
holds without its value. The dangerous window is a region's launch: the queue is taken off the
engine and its ops run; an interrupt there used to drop the rest of the queue, and every pending
tensor it would have filled then raised "has no value" although nothing had failed.

``deferred_interrupts()`` wraps each launch (per-op replay, fused program, filling the pending
tensors). On the main thread it swaps SIGINT's handler for one that only remembers the signal,
and on exit restores the handler and raises the signal again, so the KeyboardInterrupt is raised right after
the launch, with every value in place. It costs a getsignal and two signal calls of the C module (~1 us) per launch,
nothing per deferred op. Other threads never receive signals in Python, so it does nothing
there. A handler that is not a Python callable (SIG_IGN, SIG_DFL) is left alone. It also makes
multi-step bookkeeping atomic with respect to Ctrl-C: a segment's end and its caching
(``Engine._end_segment``, ``Engine._cut_repeats``), queueing a launch (``LaunchQueue.submit``).

Deferring an op (the per-op hot path) is not wrapped: an interrupt there can leave the trie
position one op behind the queue; the engine checks that invariant when the next op arrives and
replays the queue per-op if it does not hold (``Engine._adaptive``). Tests:
tests/runtime/test_interrupts.py sends real SIGINTs at random points of deferred loops.
"""
from __future__ import annotations

import _signal   # the C module: ``signal.signal`` wraps it with enum conversions (5 us vs 0.3 us)
import threading

_MAIN = threading.main_thread().ident
_SIGINT = int(_signal.SIGINT)


class deferred_interrupts:
    __slots__ = ("old", "got")

    def __enter__(self):
        self.old = self.got = None
        if threading.get_ident() != _MAIN:
            return self
        old = _signal.getsignal(_SIGINT)
        if callable(old):
            self.old = old          # first: __exit__ must restore it once the swap happened
            _signal.signal(_SIGINT, self._remember)
        return self

    def _remember(self, signum, frame) -> None:
        self.got = True     # not the frame: the KeyboardInterrupt's traceback holds this
                            # object, and the launch's frame would keep its host tensors alive

    def __exit__(self, *exc) -> None:
        old = self.old
        if old is None:
            return
        _signal.signal(_SIGINT, old)
        if self.got is not None:
            _signal.raise_signal(_SIGINT)    # delivered now, to the handler the user has
