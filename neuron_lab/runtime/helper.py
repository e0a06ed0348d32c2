"""The compile helper: a second Python process that compiles regions, so the user's process only
loads each program from inductor's caches.

Why. A region's compile is seconds of Python (AOTAutograd's trace, inductor's lowering) that
holds the GIL in the user's process; the worker thread lowers the switch interval
(``worker.py``), but the user's loop still stalls while its regions compile (the bench's W7
measures that loop), single steps for tens of times their eager time. In the helper,
the compile holds another interpreter's GIL; the user's process then runs the same
``programs.compile_program`` on the same graph, which hits the AOTAutograd and FX graph caches
the helper just wrote (same graph, example metadata and inductor options, so the same keys) and
only loads the program.

How. The helper starts at the first compile that needs it (``python -c`` calling
``helper.main``: torch and neuron_lab imported once, then kept warm; not earlier, since with a
warm cache no compile needs it and its start-up, ~4 s of imports, would compete with the
user's loop and the cache loads for the cores). ``ask`` (called by the
worker thread, never on the user's thread) sends it a ``Request`` and waits for the ``Reply``
with the GIL released (a blocking pipe read). The graph travels as a list of node specs
(``graph_spec``): an FX GraphModule pickles by regenerating and re-tracing its code, which
turns ``arange(64)`` into a tensor constant (another graph, another cache key). Examples travel as metadata; tensors of
at most ``_BY_VALUE`` elements by value (the packed floats a specialized program is made on).

The in-process compile stays the reference: without a helper (``NEURON_LAB_COMPILE_HELPER=0``,
foreground compiles, a graph it cannot describe, a helper that would not start or died) and
after any error in the helper, the region compiles in the user's process as before, with the
same outcome. A graph a helper compiled before (a marker file in the cache directory, keyed
by the request) is not sent again: its programs are in inductor's caches. A helper that dies
is not restarted (``state["broken"]`` says why).

A compile has a limit of ``NEURON_LAB_COMPILE_TIMEOUT_S`` (600 s) of CPU time, the helper's and
its compiler processes' (``_answered``, ``process_cpu.session_cpu_s``): inductor takes minutes
to hours on some graphs (a chain of 50 transposes and reshapes: each view nests the index
expressions of the one before), and one such region would hold the helper, so no later region
of the process would compile. CPU time, not wall time: at its default priority the helper only
gets what the user's loop leaves (``process_cpu.lower_priority``), so a compile's wall time
beside a busy loop has no bound. A helper that uses no CPU for as long as the limit is taken
for stuck. Past the limit the helper
is killed (the next compile starts a new one) and the region fails with ``CompileTimeout``: it
stays per-op, and it is not compiled in the user's process, where the same compile would hold
the GIL as long.

The helper costs ~380 MiB of resident memory (torch and inductor imported) and ~4 s of
start-up on another core before the first compile.
"""
from __future__ import annotations

import hashlib
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, NamedTuple

import torch
from torch import fx

from ..device.op_facts import overload
from . import knobs, process_cpu
from .programs import Build

_BY_VALUE = 4096


class NodeRef(NamedTuple):
    """An argument that is another node of the graph (by name)."""
    name: str


class NodeSpec(NamedTuple):
    op: str              # placeholder, call_function, output
    name: str
    target: Any          # a placeholder's name, an op's qualified name, or "operator.getitem"
    args: tuple
    kwargs: dict


class ExampleSpec(NamedTuple):
    shape: tuple
    stride: tuple
    dtype: torch.dtype
    device: str
    values: Any          # the tensor itself when small, else None


class Request(NamedTuple):
    nodes: list          # [NodeSpec]
    examples: list       # [ExampleSpec]
    build: Build
    fixed: list | None
    fallback: list | None


class Reply(NamedTuple):
    ok: bool
    specialized_on: list | None   # the floats it specialized because they could not be data
    error: str | None
    seconds: float


class NotDescribable(Exception):
    """A graph holding something ``graph_spec`` does not send (the caller compiles in-process)."""


_MAIN = "from neuron_lab.runtime.helper import main; main()"   # not -m: replies pickle by module
state = {"started": 0, "compiles": 0, "known": 0, "failed": 0, "timeouts": 0, "broken": None}
_proc: subprocess.Popen | None = None
_owner = 0                  # the pid that started _proc: a forked child inherits the pipes,
_lock = threading.Lock()    # which it must neither write to nor close


# --- the graph as data ---------------------------------------------------------------------
def _target_name(t) -> str:
    import operator
    if t is operator.getitem:
        return "operator.getitem"
    if isinstance(t, torch._ops.OpOverload):
        return t.name()                      # "aten::mul.Tensor"
    raise NotDescribable(f"target {t!r}")


def _target(name: str):
    import operator
    return operator.getitem if name == "operator.getitem" else overload(name)


def _arg_spec(a):
    if isinstance(a, fx.Node):
        return NodeRef(a.name)
    if isinstance(a, list):                  # fx's immutable_list too
        return [_arg_spec(x) for x in a]
    if isinstance(a, tuple) and type(a) is not torch.Size:
        return tuple(_arg_spec(x) for x in a)
    if isinstance(a, dict):
        return {k: _arg_spec(v) for k, v in a.items()}
    if a is None or type(a) in (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                torch.memory_format, torch.Size):
        return a
    raise NotDescribable(f"argument {a!r}")


def graph_spec(gm: fx.GraphModule) -> list:
    """``gm``'s nodes as picklable data; NotDescribable for anything else."""
    out = []
    for n in gm.graph.nodes:
        target = n.target if n.op in ("placeholder", "output") else _target_name(n.target)
        out.append(NodeSpec(n.op, n.name, target, _arg_spec(n.args), _arg_spec(dict(n.kwargs))))
    return out


def graph_of(nodes: list) -> fx.GraphModule:
    """The GraphModule ``graph_spec`` describes (the same code)."""
    g = fx.Graph()
    made: dict[str, fx.Node] = {}

    def arg(a):
        if type(a) is NodeRef:
            return made[a.name]
        if type(a) in (list, tuple):
            return type(a)(arg(x) for x in a)
        if type(a) is dict:
            return {k: arg(v) for k, v in a.items()}
        return a
    for s in nodes:
        target = s.target if s.op in ("placeholder", "output") else _target(s.target)
        made[s.name] = g.create_node(s.op, target, arg(s.args), arg(s.kwargs), name=s.name)
    return fx.GraphModule(torch.nn.Module(), g)


def example_spec(t: torch.Tensor) -> ExampleSpec:
    small = t.numel() <= _BY_VALUE
    return ExampleSpec(tuple(t.shape), tuple(t.stride()), t.dtype, str(t.device),
                       t if small else None)


def example_of(s: ExampleSpec) -> torch.Tensor:
    if s.values is not None:
        return s.values
    return torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=s.device)


class CompileTimeout(Exception):
    """The helper did not answer within ``NEURON_LAB_COMPILE_TIMEOUT_S`` (module header)."""


# --- the user's side -----------------------------------------------------------------------
_POLL_S = 2.0               # how often a compile's CPU time is read while waiting for it


def _answered(proc: subprocess.Popen, limit: float) -> bool:
    """Wait for the helper's reply: True once it can be read, False when the compile has used
    ``limit`` CPU seconds (module header) or the helper has used none for ``limit`` seconds.
    Without ``/proc`` the limit is wall time."""
    if limit <= 0:
        return True
    start = process_cpu.session_cpu_s(proc.pid)
    if start is None:
        return bool(select.select([proc.stdout], [], [], limit)[0])
    last, progressed = start, time.monotonic()
    while not select.select([proc.stdout], [], [], min(limit, _POLL_S))[0]:
        used = process_cpu.session_cpu_s(proc.pid) or last
        now = time.monotonic()
        if used - start >= limit:
            return False
        if used > last:
            last, progressed = used, now
        elif now - progressed >= limit:
            return False
    return True


def ask(gm, examples: list, build: Build, fixed, fallback) -> Reply | None:
    """Compile in the helper; its Reply (a marker's, if a helper compiled the graph before), or
    None when there is no helper to ask (the caller compiles in-process). Blocks the calling
    thread (the worker), not the GIL."""
    try:
        req = Request(graph_spec(gm), [example_spec(t) for t in examples], build, fixed,
                      fallback)
    except NotDescribable:
        return None
    done = _marker(req)
    known = _recalled(done)
    if known is not None:
        state["known"] += 1
        return known
    with _lock:
        proc = _started()
        if proc is None:
            return None
        limit = knobs.COMPILE_TIMEOUT_S.get()
        try:
            pickle.dump(req, proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            proc.stdin.flush()
            reply = pickle.load(proc.stdout) if _answered(proc, limit) else None
        except Exception as e:  # noqa: BLE001 - a pipe or a reply gone wrong: no helper any more
            _broken(f"{type(e).__name__}: {e}")
            return None
        if reply is None:
            state["timeouts"] += 1
            _ended()
            raise CompileTimeout(f"the compile took more than {limit:g} s of CPU time "
                                 f"(NEURON_LAB_COMPILE_TIMEOUT_S); the region stays per-op")
    state["compiles"] += 1
    if not reply.ok:
        state["failed"] += 1
    else:
        _remember(done, reply)
    return reply


def _marker(req: Request) -> str:
    """The file that says a compile of ``req`` already went through a helper: its programs are
    in inductor's caches, so the user's process loads them without asking again (a warm cache
    would otherwise be read twice, in the helper and here)."""
    data = pickle.dumps((torch.__version__, req._replace(     # values: the launch's floats
        examples=[e._replace(values=None) for e in req.examples])))
    return os.path.join(knobs.CACHE_DIR.get(), "helper", hashlib.sha256(data).hexdigest())


def _remember(path: str, reply: Reply) -> None:
    """Write the marker: what the user's process needs of the reply (the floats a specialized
    program was made on), written whole (a temporary file renamed)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(reply.specialized_on, fh)
        os.replace(tmp, path)
    except OSError:
        pass


def _recalled(path: str) -> Reply | None:
    """The reply a marker keeps, or None (no marker, or one that cannot be read)."""
    try:
        with open(path, "rb") as fh:
            return Reply(True, pickle.load(fh), None, 0.0)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def _started() -> subprocess.Popen | None:
    global _proc, _owner
    if _proc is not None and _owner != os.getpid():     # forked: the parent's helper
        _proc = None
        state["broken"] = None
    if _proc is not None and _proc.poll() is None:
        return _proc
    if state["broken"] is not None:
        return None
    if _proc is not None:
        _broken(f"exited with {_proc.returncode}")
        return None
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [root, *sys.path, env.get("PYTHONPATH")] if p)
    quiet = not knobs.DEBUG_LEVEL()
    try:
        _proc = subprocess.Popen([sys.executable, "-c", _MAIN],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.DEVNULL if quiet else None, env=env,
                                 start_new_session=True)
    except OSError as e:
        _broken(f"could not start: {e}")
        return None
    process_cpu.lower_priority(_proc.pid, knobs.COMPILE_NICE.get())
    _owner = os.getpid()
    state["started"] += 1
    return _proc


def _broken(why: str) -> None:
    state["broken"] = why
    _ended()


def _ended() -> None:
    """Kill the helper (its reply, if any, is not read); the next compile may start another."""
    global _proc
    p, _proc = _proc, None
    if p is not None and p.poll() is None:
        p.kill()
        p.wait()


def stop(wait_s: float = 1.0) -> None:
    """End the helper (interpreter exit): it keeps nothing worth a wait (inductor writes its
    cache files whole), so it is terminated at once; a compile waiting for it gets EOF."""
    global _proc
    p, _proc = _proc, None
    if p is None or _owner != os.getpid():      # a forked child leaves its parent's helper be
        return
    try:
        p.stdin.close()
    except OSError:
        pass
    p.terminate()
    try:
        p.wait(wait_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def running() -> bool:
    return _proc is not None and _proc.poll() is None


# --- the helper's side ---------------------------------------------------------------------
def _serve(inp, out) -> None:
    from .programs import Specialized, compile_program
    while True:
        try:
            req = pickle.load(inp)
        except EOFError:
            return
        t0 = time.perf_counter()
        try:
            gm = graph_of(req.nodes)
            program = compile_program(gm, [example_of(s) for s in req.examples],
                                      req.build, req.fixed, req.fallback)
            forced = (program.fixed if isinstance(program, Specialized) and not program.chosen
                      else None)
            reply = Reply(True, forced, None, time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001 - the user's process compiles it itself
            traceback.print_exc()
            reply = Reply(False, None, f"{type(e).__name__}: {e}"[:500], time.perf_counter() - t0)
        pickle.dump(reply, out, protocol=pickle.HIGHEST_PROTOCOL)
        out.flush()


def main() -> None:
    # Ctrl-C is the user's process's (a terminal's reaches its whole process group, Jupyter's
    # interrupt button may too): the helper ignores SIGINT, in a session of its own, and ends
    # when the user's process closes its pipe or kills it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)
    replies = os.fdopen(os.dup(1), "wb")      # replies only: prints go to stderr
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, replies)

