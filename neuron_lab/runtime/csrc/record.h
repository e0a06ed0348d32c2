// What record.cpp shares with the runtime's other C files.
#pragma once
#include <Python.h>

#include <c10/core/Storage.h>

namespace neuron_lab {

// tensor_data.host(t) without a call where t's host view is cached (``t._d`` not None), else
// ``host(t)``; a new reference, or nullptr with an exception set
PyObject* host_of(PyObject* t, PyObject* host);

// producers[id(o)] = Produced(pos, k, wr, r): where a pending ``o`` (a tensor or its storage)
// comes from (produced.h). ``wr``: a weak reference to ``o`` (borrowed), or nullptr to make
// one. False with an exception set. The deferral (its pending outputs), record_run and a C++
// shallow copy's entry (deferral_keys.cpp producer_of) all write through it.
bool set_producer(PyObject* producers, PyObject* o, Py_ssize_t pos, Py_ssize_t k, PyObject* wr,
                  PyObject* r);

// producers[address of storage's StorageImpl] = Produced(pos, k, wr, r): a pending output's
// storage entry; ``wr``, a weak reference to the storage (borrowed, weak_storage_ref). Every
// storage entry is keyed by its StorageImpl (``UntypedStorage._cdata`` in Python), and none
// needs the storage's Python object (weak_outputs.h says why). False with an exception set.
bool set_storage_producer(PyObject* producers, const c10::Storage& storage, Py_ssize_t pos,
                          Py_ssize_t k, PyObject* wr, PyObject* r);

// The key of a captured output's storage entry, (address of the storage's StorageImpl,
// OutMeta): a view shares its base's storage, so the storage alone does not name the output a
// C++ shallow copy (``.data``, autograd's saved tensors) stands for; its metadata does
// (record.storage_key). A new reference, or nullptr with an exception set.
PyObject* storage_key(const c10::Storage& storage, PyObject* meta);

// record.ref(pos, k): the shared Ref of output ``k`` of op ``pos``, read from record._refs
// (made and stored there the first time); a new reference, or nullptr with an exception set
PyObject* ref_of(Py_ssize_t pos, Py_ssize_t k);

// The live producer entry of ``storage`` seen with metadata ``meta`` (record.storage_entry): a
// captured output's (``storage_key``) first, it is the later producer in a segment that
// captured after it deferred, else a pending output's (its StorageImpl's address). Borrowed, or
// nullptr (an exception set, or no live entry).
PyObject* storage_entry(PyObject* producers, const c10::Storage& storage, PyObject* meta);

// OutMeta(size, stride, offset, dtype) of a tensor (record.out_meta), untracked; a new
// reference, or nullptr with an exception set
PyObject* out_meta_of(PyObject* t);

}  // namespace neuron_lab
