"""Bad input across ranks: a collective the ranks disagree on, a rank that died, a timeout.

gloo, the transport under the ``neuron`` backend, handles these badly for an interactive user:
ranks that all-reduce tensors of different sizes abort the whole process from gloo's I/O thread
(``gloo::EnforceNotMet``, SIGABRT: a Jupyter kernel dies), and its errors name a source file
of gloo, not the collective the user called. So before each collective on ``neuron`` tensors
the ranks exchange a fingerprint — which collective, the dtype and the element count that must
agree — in one small all-gather on the same group (``NEURON_LAB_DIST_CHECK``, on by default; one
more round trip: ~0.4 ms per collective with 2 ranks on this 2-core machine's loopback, where a
32-byte all-reduce takes 0.3 ms). Every rank then sees the same table and raises the same
``CollectiveMismatch`` naming each rank's call. Transport errors (the fingerprint exchange or
the collective itself timing out after the group's timeout, a peer's connection closing) are
re-raised as ``CollectiveError`` naming the collective, the device, the rank and the fix.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..device.config import Knob, boolean

CHECK = Knob("NEURON_LAB_DIST_CHECK", True, boolean,
             doc="before each collective on neuron tensors, check across ranks that every rank "
                 "calls the same collective with the same dtype and element count")


class CollectiveError(RuntimeError):
    """A collective on neuron tensors failed in the transport (timeout, peer gone)."""


class CollectiveMismatch(CollectiveError):
    """The ranks called different collectives, or the same one with different tensors."""


# c10d op -> (collective, index of the argument whose element count every rank must share;
# None where counts may differ, e.g. all_to_all with uneven splits)
MATCHED: dict[str, int | None] = {
    "allreduce_": 0, "allreduce_coalesced_": 0, "broadcast_": 0, "reduce_": 0,
    "allgather_": 1, "_allgather_base_": 1, "allgather_coalesced_": 1,
    "allgather_into_tensor_coalesced_": 1, "reduce_scatter_": 0, "_reduce_scatter_base_": 0,
    "reduce_scatter_tensor_coalesced_": 0, "gather_": 1, "scatter_": 0,
    "alltoall_base_": None, "alltoall_": None, "barrier": None,
}
_CODES = {name: i for i, name in enumerate(MATCHED)}
_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
           torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64]


def tensors_in(a):
    """The tensors in ``a`` (a tensor or nested lists of them)."""
    if isinstance(a, torch.Tensor):
        yield a
    elif isinstance(a, (list, tuple)):
        for x in a:
            yield from tensors_in(x)


def _fingerprint(name: str, args) -> list[int]:
    where = MATCHED[name]
    ts = list(tensors_in(args[where])) if where is not None else []
    numel = sum(t.numel() for t in ts) if where is not None else -1
    dtype = _DTYPES.index(ts[0].dtype) if ts and ts[0].dtype in _DTYPES else -1
    return [_CODES[name], dtype, numel]


def _describe(fp: list[int], user_names: dict[str, str]) -> str:
    code, dtype, numel = fp
    ops = list(MATCHED)
    what = user_names.get(ops[code], ops[code]) if 0 <= code < len(ops) else f"op #{code}"
    if numel >= 0:
        what += f" of {numel} elements"
    if dtype >= 0:
        what += f" ({str(_DTYPES[dtype]).removeprefix('torch.')})"
    return what


def where() -> str:
    try:
        return f"rank {dist.get_rank()} of {dist.get_world_size()}"
    except (RuntimeError, ValueError):
        return "this rank"


def transport_error(user_name: str, e: BaseException) -> CollectiveError:
    """A gloo error in ``user_name`` as the user should read it."""
    text = str(e)
    low = text.lower()
    if "timed out" in low or "timeout" in low:
        fix = ("a rank did not reach this collective within the group's timeout: check that every "
               "rank runs the same collectives in the same order, or raise the timeout "
               "(init_process_group(timeout=datetime.timedelta(...)))")
    elif "connection closed" in low or "connection reset" in low or "broken pipe" in low \
            or "peer" in low:
        fix = "another rank exited or crashed: see its log (torchrun prints each rank's error)"
    else:
        fix = "see the transport's message above; every rank must call the same collectives"
    return CollectiveError(f"neuron: {user_name} on device neuron:0 ({where()}) failed: "
                           f"{text.strip()}. Fix: {fix}")


def agree(name: str, user_names: dict[str, str], args, group_obj) -> None:
    """Raise ``CollectiveMismatch`` on every rank unless all ranks issue the same collective
    (``name``) with the same dtype and element count. Runs on the host backend of the group."""
    if not CHECK.get() or name not in MATCHED:
        return
    pg = torch._C._distributed_c10d.ProcessGroup.unbox(group_obj) \
        if isinstance(group_obj, torch.ScriptObject) else group_obj
    size = pg.size()
    if size <= 1:
        return
    mine = torch.tensor(_fingerprint(name, args), dtype=torch.int64)
    table = torch.empty(size * mine.numel(), dtype=torch.int64)
    try:
        _, work = torch.ops.c10d._allgather_base_(table, mine, group_obj, True, -1)
        torch._C._distributed_c10d.Work.unbox(work).wait()
    except RuntimeError as e:
        raise transport_error(user_names.get(name, name), e) from e
    rows = table.view(size, -1).tolist()
    if all(r == rows[0] for r in rows):
        return
    calls = "; ".join(f"rank {i}: {_describe(r, user_names)}" for i, r in enumerate(rows))
    raise CollectiveMismatch(
        f"neuron: {user_names.get(name, name)} on device neuron:0 ({where()}): the ranks "
        f"disagree — {calls}. Every rank must call the same collectives in the same order with "
        f"tensors of the same dtype and size; fix the differing rank's call "
        f"(NEURON_LAB_DIST_CHECK=0 skips this check, and gloo then aborts the process)")
