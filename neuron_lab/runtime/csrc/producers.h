// The segment's producers map (``Engine.seg.producers``, ``record.Producers`` in Python): which
// op of the segment made a tensor or a storage, as the Ref that names that output in argument
// templates (output ``k`` of op ``pos``). A C++ object the runtime's C++ reads and writes through
// the functions below (deferral.cpp, deferral_keys.cpp, record.cpp); Python reads it through
// its methods (producers.cpp), the same as the reference class's (record.py ``_Producers``).
//
// Three tables, each keyed by a c10 object's address and holding c10's weak pointer to it:
//   tensors    TensorImpl of an output (pending, captured, or the caller's in place / out=)
//   storages   StorageImpl of a pending output (every pending output has a storage of its own)
//   views      (StorageImpl, OutMeta) of a captured output: a view shares its base's storage,
//              so the storage alone does not name the output a C++ shallow copy stands for
// A weak pointer keeps the impl's memory, so while an entry lives no other impl can take its
// address: a live object found under its own address is the one the entry was made for, and
// the entries need no Python object of their own (no key, entry or weak reference per output).
#pragma once

#include <Python.h>

#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>

namespace neuron_lab::producers {

struct ProducerMap;

struct ProducersObject {
  PyObject_HEAD
  ProducerMap* map;   // owned; nullptr only before tp_new finished
};

extern PyTypeObject ProducersType;

// ``o`` as a producers map, or nullptr with a TypeError set.
ProducersObject* as_producers(PyObject* o);

// A new, empty map; nullptr with an exception set.
PyObject* make();

// The Ref of tensor ``impl``'s entry (borrowed), or nullptr (no entry; no exception).
PyObject* of_tensor(ProducersObject* p, const c10::TensorImpl* impl);

// The Ref of the live entry of ``storage`` seen with metadata ``meta`` (an OutMeta): a captured
// output's (views) first, it is the later producer in a segment that captured after it deferred,
// else a pending output's. Borrowed, or nullptr (an exception set, or no entry).
PyObject* of_storage(ProducersObject* p, const c10::Storage& storage, PyObject* meta);

// The Ref of pending storage ``impl``'s entry (never dereferenced: found by address) if that
// storage is alive; borrowed, or nullptr (no exception).
PyObject* of_pending_storage(ProducersObject* p, const void* impl);

// Entries: ``ref`` is a record.Ref (borrowed; the map holds its own reference). Each replaces
// the entry under its key. False with an exception set.
bool set_tensor(ProducersObject* p, const at::TensorBase& t, PyObject* ref);
bool set_storage(ProducersObject* p, const c10::Storage& storage, PyObject* ref);
bool set_view_storage(ProducersObject* p, const c10::Storage& storage, PyObject* meta,
                      PyObject* ref);

}  // namespace neuron_lab::producers
