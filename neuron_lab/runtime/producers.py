"""A segment's producers map (``Engine.seg.producers``): which queued op of the segment made a
tensor or a storage, as the ``record.Ref`` naming that output in argument templates.

Three tables:

- tensors: an output tensor (pending, captured, or the caller's own in place / ``out=``);
- storages: a pending output's storage (every pending output has a storage of its own);
- views: a captured output's storage seen with its metadata (``OutMeta``): a view shares its
  base's storage, so the storage alone does not name the output a C++ shallow copy (``.data``,
  autograd's saved tensors) stands for.

Where the runtime's extension is built this is its C++ object (``csrc/producers.cpp``): tables
keyed by the TensorImpl's and StorageImpl's addresses, each entry holding c10's weak pointer
to its impl, so no entry makes a Python object. ``NEURON_LAB_NATIVE_DEFER=0`` runs with the
class below, the reference with the same methods, keyed by ``id`` of the tensor and by
``record.storage_id`` of the storage, with a weak reference telling a live object from a new
one that reuses the id.
"""
from __future__ import annotations

from . import core
from .record import Ref, storage_id, storage_ref, weak_ref


class _Producers:
    """The producers map in Python (the reference); the C type has the same methods."""
    __slots__ = ("_tensors", "_storages", "_views")

    def __init__(self) -> None:
        self._tensors: dict = {}      # id(tensor) -> (weak_ref(tensor), Ref)
        self._storages: dict = {}     # storage_id -> (storage_ref, Ref)
        self._views: dict = {}        # (storage_id, OutMeta) -> (storage_ref, Ref)

    def of(self, t) -> Ref | None:
        """The Ref of the op of the segment that made tensor ``t``, or None."""
        e = self._tensors.get(id(t))
        return e[1] if e is not None and e[0]() is t else None

    def of_storage(self, t, meta) -> Ref | None:
        """The Ref of the output ``t``'s storage names seen with ``meta``: a captured output's
        first, it is the later producer in a segment that captured after it deferred, else a
        pending output's; or None."""
        sid = storage_id(t)
        for table, key in ((self._views, (sid, meta)), (self._storages, sid)):
            e = table.get(key)
            if e is not None and storage_id(e[0]) == sid:
                return e[1]
        return None

    def of_pending_storage(self, sid: int) -> Ref | None:
        """The Ref of the pending output whose live storage is ``sid`` (``storage_id``), or None."""
        e = self._storages.get(sid)
        return e[1] if e is not None and storage_id(e[0]) == sid else None

    def set(self, t, ref: Ref) -> None:
        """Tensor ``t`` is the output ``ref`` names."""
        self._tensors[id(t)] = (weak_ref(t), ref)

    def set_storage(self, t, ref: Ref) -> None:
        """The storage of pending output ``t`` is the output ``ref`` names."""
        self._storages[storage_id(t)] = (storage_ref(t), ref)

    def set_view_storage(self, t, meta, ref: Ref) -> None:
        """``t``'s storage seen with ``meta`` is the captured output ``ref`` names."""
        self._views[(storage_id(t), meta)] = (storage_ref(t), ref)

    def refs(self) -> list:
        """Every entry's Ref (tests and debugging)."""
        return [e[1] for table in (self._tensors, self._storages, self._views)
                for e in table.values()]

    def __len__(self) -> int:
        return len(self._tensors) + len(self._storages) + len(self._views)


Producers = core.implementation("Producers", _Producers)
