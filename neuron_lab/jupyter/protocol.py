"""The comm protocol between the kernel (``neuron_lab.jupyter.comm``) and the JupyterLab side panel.

Defined once here; ``extension/src/protocol.ts`` mirrors it as a TypeScript union and must be
changed together with this file (``tests/jupyter/test_protocol_mirror.py`` checks that the type
names and the version agree).

Every message is a JSON object with a ``type`` field (a discriminated union) and ``v`` (the
protocol version). The comm target is named ``TARGET``.

Kernel -> frontend
------------------
``hello``     sent once when a comm opens: {neuron_lab, executor, mode, capacity, push_hz,
              chip} (chip: the modelled chip's name, e.g. "Trainium3")
``snapshot``  the full state (answer to ``request``, at cell end, and when idle on change):
              {memory, fallbacks, cells, running, regions, counters, cell_ids, advice,
              distributed, compiled}
              (``distributed``: {rank, world_size, backend, collectives, collective_bytes,
              collective_s}, see ``neuron_lab.distributed.summary``)
              (``compiled``: torch.compile on neuron: {frames, programs, recompiles,
              graph_breaks, failures, compile_s, rows: [{kind, location, detail, count}]},
              kind "recompile" | "graph break" | "failure", see ``comm.compiled_summary``)
              (``advice``: the advisor's top findings, [{kind, where, message, fix,
              modelled_s, count}], see ``telemetry/advise.py``)
              (``cell_ids``: {"N": cell id} for the ``Cell In[N], line M`` locations)
``memory``    one memory sample: {t, allocated, reserved, peak, capacity}
``fallback``  rows new or changed (count) since the last push; upsert by (op, reason):
              {rows: [{op, reason, count, locations, source}]}
``cell``      a finished cell record: {record: {cell_id, execution_count, wall_s, device_s, ops, launches,
              fused_share, compiles, fallbacks, peak_bytes, started}}
``running``   live timing of the running cell: {cell_id, execution_count, elapsed_s, ops, ops_per_s,
              launches, fused_share, compile_queue} (or ``null`` fields when idle)
``error``     a request the kernel refused: {message}

Frontend -> kernel
------------------
``request``   {what: "snapshot"}                  -> answered with ``snapshot``
``set_rate``  {hz: float}  (clamped to [0.5, 20]) -> push rate while a cell runs

Nothing else is accepted: the panel can never make the kernel run code. The only code the panel
ever runs is ``%load_ext neuron_lab`` through the normal execute request, by the user's click.
"""
from __future__ import annotations

TARGET = "neuron_lab"
VERSION = 1

# kernel -> frontend
HELLO = "hello"
SNAPSHOT = "snapshot"
MEMORY = "memory"
FALLBACK = "fallback"
CELL = "cell"
RUNNING = "running"
ERROR = "error"
KERNEL_TYPES = (HELLO, SNAPSHOT, MEMORY, FALLBACK, CELL, RUNNING, ERROR)

# frontend -> kernel
REQUEST = "request"
SET_RATE = "set_rate"
FRONTEND_TYPES = (REQUEST, SET_RATE)

DEFAULT_PUSH_HZ = 4.0
MIN_PUSH_HZ, MAX_PUSH_HZ = 0.5, 20.0


def message(type_: str, **body) -> dict:
    """Build a kernel->frontend message; the single place the envelope is written."""
    if type_ not in KERNEL_TYPES:
        raise ValueError(f"unknown neuron_lab message type {type_!r}")
    return {"type": type_, "v": VERSION, **body}
