"""The device's launch queue: a region's launch runs on the device's own thread, in issue order,
while the host goes on deferring the next ops.

An accelerator runs its work asynchronously: the host issues a launch and goes on; it waits only
where it reads a value (``.item()``, ``.cpu()``, ``print``) or asks to (``synchronize``). The
adaptive runtime keeps that shape on the emulated device. A region whose values nobody is
waiting for — it ended because the next op left its path, at ``Optimizer.step()``'s start or
end, or (``NEURON_LAB_BACKWARD_BOUNDARY``) at a ``backward()``'s start — and whose fused program
is decided on is queued here and run by one worker thread (``Engine._launch`` says which
launches, and why not the others); the host returns to the user's Python at once. Its outputs
are pending tensors until the worker fills them, exactly as they were between deferral and
launch, so the host can defer ops that read them, and the next region's launch reads them filled
(jobs run in issue order).

Every place the host touches device data waits for the queue first (``drain``): the runtime
interface's flush (a value read, a sync point, an event, a stream or device synchronize), an op the
engine runs at once (capture, a boundary op, a divergence's per-op replay), eager mode, reading a
pending value (``Engine.materialize``) and any host read of a device tensor (``tensor_data.host``
through ``runtime_interface.wait_launches``: a queued optimizer update may still write a parameter
in place). So the host never sees a value before the launch that writes it, nor writes a tensor a
queued launch still reads: in-order execution, as before, with the host's Python overlapped with the
device's work (the model's Python and the next step's deferral run while the previous step's program
runs; the programs' ATen calls release the GIL).

Opt-in (``NEURON_LAB_ASYNC=1``); by default every launch runs on the thread that issues it. On
the CPU executor the device's thread shares the host's cores and its OpenMP runtime: the first
parallel ATen call it makes (an MKL matmul in a fused program) starts a second OpenMP thread
pool, and libgomp, seeing more OpenMP threads than CPUs, stops spinning its idle workers and
puts them to sleep after a few hundred iterations instead of ~300,000. From then on every
parallel region of the process, on any thread, pays a futex wake and sleep at its start and
end. Measured on 2 cores, 2 intra-op threads, the Transformers Llama train step of the bench's
W6: adaptive 22 ms/step launching on the issuing thread against 39-41 ms with the device's
thread, and a CPU eager loop in the same process 21 ms/step before that thread's first launch
against 51 ms after (plain torch shows the same: a second thread that ran one 2-thread matmul
and stays alive). Run single-threaded (OpenMP and MKL limited to 1 on that thread) the device's
thread adds no pool, but computes on one core: 37 ms/step with a read every step, 29 ms with
one every 10, against 25 ms on the issuing thread. On one core it only adds thread switches:
37-41 ms/step against 33 ms (a read every 10 steps). The queue models a device whose compute
does not run on the host's cores (a real Trainium); on the CUDA executor the kernels a launch
issues already run asynchronously on the GPU, so the issuing thread does not wait for them
either.

A launch that raises on the worker keeps its error; the next ``drain`` on a user thread raises
it (once), as a device reports an asynchronous failure at the next synchronization; the values
it did not compute raise "has no value" where they are read (``errors.no_value``).

At most ``DEPTH`` launches wait: a host further ahead waits for the oldest (its pending outputs
are counted as allocated until then, so a runaway host cannot outgrow the modelled memory).
A job that ran leaves its records (and the tensors they hold) to the host's next ``submit``
while the worker has more to run, and the worker lets them go itself before it goes idle, so a
``wait`` never returns before they are gone (``submit`` says why).

Ctrl-C. A KeyboardInterrupt reaches the host thread wherever it waits for the queue; it must
never leave the queue's lock held or released twice. ``threading.Condition`` cannot promise
that on the interrupted thread: its ``__exit__``, ``wait`` and their helpers are Python
functions, and an interrupt raised at the entry of one (where CPython runs signal handlers)
leaves its lock taken, or released by the wrong thread. So the host never touches a Condition:
it takes the C lock ``_lock`` directly (``with`` on a C lock cannot be interrupted between the
acquire and the block, nor skip the release), and waits on a lock of its own (``_waiter``) that
the worker releases when a job ends; an interrupted wait leaves that lock behind in
``_waiters``, which the worker releases like any other. ``submit`` runs with SIGINT deferred
(``interrupts.deferred_interrupts``): a job is queued and the worker told, or neither. Only the
worker waits on the Condition ``_work`` (for jobs), and signals never reach it.
"""
from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from typing import Callable, NamedTuple

import torch

from .interrupts import deferred_interrupts

DEPTH = 4
_allocate_lock = threading.Lock


class Job(NamedTuple):
    """One queued launch: ``run()`` executes it; ``records`` are its deferred ops (their pending
    outputs count in ``memory_allocated()`` until it has run)."""
    run: Callable[[], None]
    records: list


class LaunchQueue:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)   # the worker waits on it for jobs
        self._waiters: list = []              # held locks of host threads waiting (``_waiter``)
        self._jobs: deque[Job] = deque()      # the running job stays first until it is done
        self._done: list[Job] = []            # run, their records not yet let go (``submit``)
        self._thread: threading.Thread | None = None
        self.ident: int | None = None         # the worker thread's
        self.error: BaseException | None = None
        self.launched = 0                     # jobs run on the worker (tests, metrics)
        self.busy_s = 0.0                     # seconds the worker spent running them
        _queues.add(self)

    def busy(self) -> bool:
        """Is a launch queued or running?"""
        return bool(self._jobs)

    def on_worker(self) -> bool:
        return threading.get_ident() == self.ident

    def submit(self, job: Job) -> None:
        """Queue ``job``; waits while ``DEPTH`` launches are ahead of it. Then lets go of the
        records of the jobs run meanwhile (``_drop_done``): the worker leaves them to the host
        while it has more to run, and drops them itself when it goes idle. Every Python tensor
        freed releases and retakes the GIL (torch's ``THPVariable_clear``), so a worker
        dropping a large job's records beside the host's Python would hand the GIL back and
        forth, waiting for the host's Python each time; the host drops them while the worker
        runs its next program without the GIL (docs/performance.md)."""
        with deferred_interrupts():
            while True:
                with self._lock:
                    if len(self._jobs) < DEPTH:
                        self._jobs.append(job)
                        if self._thread is None:
                            self._start()
                        self._work.notify()
                        break
                    w = self._waiter()
                w.acquire()
        self._drop_done()

    def _waiter(self):
        """A lock, taken, that the worker releases when a job ends (call with ``_lock`` held):
        the host waits by taking it again, which a KeyboardInterrupt can end with nothing of
        the queue's held."""
        w = _allocate_lock()
        w.acquire()
        self._waiters.append(w)
        return w

    def wait(self) -> None:
        """Wait until every queued launch has run (on the worker thread itself: at once)."""
        if not self._jobs or threading.get_ident() == self.ident:
            return
        while True:
            with self._lock:
                if not self._jobs:
                    return
                w = self._waiter()
            w.acquire()

    def drain(self) -> None:
        """``wait``, then raise the first error a queued launch raised since the last drain,
        if any."""
        if not self._jobs and self.error is None:
            return
        if threading.get_ident() == self.ident:
            return
        self.wait()
        err, self.error = self.error, None
        if err is not None:
            raise err

    def records(self) -> list:
        """The deferred ops of every launch not yet run (a snapshot)."""
        return [r for job in list(self._jobs) for r in job.records]

    def _start(self) -> None:
        t = threading.Thread(target=self._loop, name="neuron-launch", daemon=True)
        self._thread = t
        t.start()

    def _loop(self) -> None:
        self.ident = threading.get_ident()
        torch.set_grad_enabled(False)     # host tensors only: nothing to record for autograd
        lock, work, jobs = self._lock, self._work, self._jobs
        while True:
            with lock:
                while not jobs:
                    work.wait()
                job = jobs[0]
            t0 = time.perf_counter()
            try:
                job.run()
            except BaseException as e:  # noqa: BLE001 - reported at the next drain
                if self.error is None:
                    self.error = e
            finally:
                job = None
                with lock:
                    ran = jobs.popleft()
                    if jobs:                # more to run: the host lets it go (``submit``)
                        self._done.append(ran)
                    else:                   # going idle: every record goes now, before a
                        self._done.clear()  # waiting host hears that the queue ran
                    del ran
                    self.launched += 1
                    self.busy_s += time.perf_counter() - t0
                    waiters, self._waiters = self._waiters, []
                    for w in waiters:       # the hosts in wait or submit look again
                        w.release()

    def _drop_done(self) -> None:
        """On the host: let the finished jobs' records go (see ``submit``), outside the lock."""
        if self._done:
            with self._lock:
                done, self._done = self._done, []
            done.clear()

    def after_fork(self) -> None:
        """A forked child (a DataLoader worker) has no worker thread: it starts empty."""
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._waiters = []
        self._jobs = deque()
        self._done = []
        self._thread = None
        self.ident = None
        self.error = None


_queues: "weakref.WeakSet[LaunchQueue]" = weakref.WeakSet()
os.register_at_fork(after_in_child=lambda: [q.after_fork() for q in list(_queues)])
