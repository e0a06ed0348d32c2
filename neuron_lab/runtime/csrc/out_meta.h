// record.OutMeta as a C type: what a pending output must look like, the metadata of one tensor
// output of an op (size, stride, storage offset, dtype). A tuple subclass, as the Python
// reference (a NamedTuple) is: metas are compared and hashed inside region keys and storage
// keys, by tuple equality. The C++ reads its fields by name (``field``), never by position.
#pragma once

#include <Python.h>

namespace neuron_lab::out_meta {

enum Field : Py_ssize_t { SIZE, STRIDE, OFFSET, DTYPE, N_FIELDS };

extern PyTypeObject OutMetaType;

inline bool is_out_meta(PyObject* o) { return Py_IS_TYPE(o, &OutMetaType); }

// Field ``f`` of OutMeta ``m`` (borrowed; ``m`` checked by the caller with is_out_meta).
inline PyObject* field(PyObject* m, Field f) { return PyTuple_GET_ITEM(m, f); }

// OutMeta(size, stride, offset, dtype) from new references (stolen, released on failure),
// untracked by the cycle collector (it holds ints, tuples of ints and a dtype); nullptr with an
// exception set.
PyObject* make(PyObject* size, PyObject* stride, PyObject* offset, PyObject* dtype);

}  // namespace neuron_lab::out_meta
