"""The runtime's knobs: each a process-wide value/env pair (``neuron_lab.device.config.Knob``).

The adaptive policy's rule, written down (see ``policy.py``): a region is compiled once it has
been seen ``NEURON_LAB_COMPILE_AFTER`` times and has at least ``NEURON_LAB_MIN_REGION_OPS`` ops;
then fused and per-op launches alternate until ``NEURON_LAB_TRIALS`` samples of each (or 2 that
do not overlap) decide; a region judged slower is tried again with backoff.
"""
import os

from ..device.config import DEBUG, Knob, boolean

MODE = Knob("NEURON_LAB_MODE", "adaptive", str, choices=("eager", "adaptive"),
            doc="adaptive: queue, cache and fuse op sequences; eager: launch every op")
QUEUE_LIMIT = Knob("NEURON_LAB_QUEUE_LIMIT", 1024, int, doc="ops queued before a forced flush")
MAX_PERIOD = Knob("NEURON_LAB_MAX_PERIOD", 512, int, doc="longest repeating suffix that cuts a region")
PERIOD_AFTER = Knob("NEURON_LAB_PERIOD_AFTER", 256, int,
                    doc="segment length after which the repeated-suffix rule looks for periods")
MIN_PERIOD_OPS = Knob("NEURON_LAB_MIN_PERIOD_OPS", 32, int,
                      doc="a repeated-suffix region holds whole periods and at least this many ops")
MIN_SPLIT = Knob("NEURON_LAB_MIN_SPLIT", 8, int,
                 doc="a cached path that diverges after this many ops is cut into its own region")
COMPILE = Knob("NEURON_LAB_COMPILE", True, boolean, doc="compile hot regions with inductor")
COMPILE_AFTER = Knob("NEURON_LAB_COMPILE_AFTER", 2, int, doc="hits before a region is compiled")
MIN_REGION_OPS = Knob("NEURON_LAB_MIN_REGION_OPS", 4, int, doc="smallest region worth compiling")
TRIALS = Knob("NEURON_LAB_TRIALS", 3, int,
              doc="samples of each kind (fused, per-op) that decide a trial at most "
                  "(0: no A/B, compiled regions run fused)")
PARALLEL_MIN_NUMEL = Knob("NEURON_LAB_PARALLEL_MIN_NUMEL", 1 << 18, int,
                          doc="regions with smaller tensors compile single-threaded (CPU executor)")
CACHE_SIZE = Knob("NEURON_LAB_REGION_CACHE", 512, int, doc="regions kept (LRU)")
COMPILE_SWITCH_US = Knob("NEURON_LAB_COMPILE_SWITCH_US", 50.0, float,
                         doc="the interpreter's GIL switch interval while a background compile "
                             "runs (0: leave it at Python's 5 ms)")
COMPILE_THREADS = Knob("NEURON_LAB_COMPILE_THREADS", 1, int, minimum=1,
                       doc="inductor's compile workers for the runtime's background compiles "
                           "(1: in the compile thread; more start a process pool that competes "
                           "with the user's loop for cores)")
COMPILE_HELPER = Knob("NEURON_LAB_COMPILE_HELPER", True, boolean,
                      doc="background compiles run in a helper process; the user's process "
                          "loads the result from inductor's caches (helper.py; 0: compile in "
                          "the compile thread)")
COMPILE_NICE = Knob("NEURON_LAB_COMPILE_NICE", 19, int, minimum=0,
                    doc="how far below the user's process the compile helper's CPU priority "
                        "is (Unix nice steps, at most 19; 0: the same). At 19 the helper also "
                        "runs under Linux's SCHED_IDLE: it gets only CPU time no other task "
                        "wants, and a task that wakes takes its core at once (helper.py)")
COMPILE_LOAD_IDLE_MS = Knob("NEURON_LAB_COMPILE_LOAD_IDLE_MS", 20.0, float, minimum=0.0,
                            doc="a background compile's part in the user's process (the cache "
                                "load after the helper; the whole compile without it) starts "
                                "once the engine has ended no segment for this long and is not "
                                "at work (0: at once)")
COMPILE_LOAD_WAIT_S = Knob("NEURON_LAB_COMPILE_LOAD_WAIT_S", 1.0, float, minimum=0.0,
                           doc="how long that part waits for the engine to go idle at most")
COMPILE_TIMEOUT_S = Knob("NEURON_LAB_COMPILE_TIMEOUT_S", 600.0, float, minimum=0.0,
                         doc="CPU seconds a region's compile in the helper may take; past them the "
                             "helper is stopped (the next compile starts another) and the "
                             "region stays per-op (0: no limit)")
COMPILE_QUEUE = Knob("NEURON_LAB_COMPILE_QUEUE", 32, int, minimum=1,
                     doc="regions waiting for a background compile at most; a region found "
                         "while the queue is full is queued at a later launch")
EXIT_WAIT_S = Knob("NEURON_LAB_EXIT_WAIT_S", 2.0, float,
                   doc="seconds a compile running at interpreter exit may take to finish before "
                       "it is cancelled (queued compiles are dropped at exit)")
NATIVE_DEFER = Knob("NEURON_LAB_NATIVE_DEFER", True, boolean,
                    doc="defer ops on a known region path and keep the engine's records in C "
                        "(runtime/csrc); 0: the Python engine's path (the reference; same "
                        "results)")
ASYNC = Knob("NEURON_LAB_ASYNC", False, boolean,
             doc="1: launch a region nobody waits for on the device's thread and go on "
                 "(launch_queue.py); off by default: on the CPU executor that thread's "
                 "OpenMP pool slows every parallel op of the process (launch_queue.py says "
                 "how much); 0: every launch runs on the thread that issues it")
BACKWARD_BOUNDARY = Knob("NEURON_LAB_BACKWARD_BOUNDARY", False, boolean,
                         doc="end the forward's region where a backward pass of neuron roots "
                             "starts, so the device computes the forward while the host issues "
                             "the backward (loops that read a value every step; off: forward "
                             "and backward are one region, docs/performance.md)")
CPP_WRAPPER_OPS = Knob("NEURON_LAB_CPP_WRAPPER_OPS", 100, int, minimum=0,
                       doc="programs of at least this many ATen calls, and any whose "
                           "launches run beside the host (nobody waits for them), compile "
                           "with inductor's C++ wrapper: their launch runs from its first "
                           "kernel to its last without the GIL (a graph it cannot build gets "
                           "the Python wrapper); 0: every program gets the Python wrapper "
                           "(docs/performance.md)")
VERIFY = Knob("NEURON_LAB_VERIFY", False, boolean,
              doc="check each fused program's first launches against per-op replay "
                  "(a mismatch makes the region per-op, warns and is counted)")
VERIFY_LAUNCHES = Knob("NEURON_LAB_VERIFY_LAUNCHES", 3, int, minimum=1,
                       doc="how many fused launches of each region NEURON_LAB_VERIFY checks")
SYNC_COMPILE = Knob("NEURON_LAB_SYNC_COMPILE", False, boolean,
                    doc="compile in the foreground (tests); default: background worker")
CACHE_DIR = Knob("NEURON_LAB_CACHE_DIR",
                 os.path.join(os.path.expanduser("~"), ".cache", "neuron_lab"), str,
                 doc="where inductor's compiled programs persist across processes")


def DEBUG_LEVEL() -> int:
    return DEBUG.get()
