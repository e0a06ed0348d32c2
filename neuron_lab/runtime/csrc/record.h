// What record.cpp shares with the runtime's other C files.
#pragma once
#include <Python.h>

namespace neuron_lab {

// tensor_data.host(t) without a call where t's host view is cached (``t._d`` not None), else
// ``host(t)``; a new reference, or nullptr with an exception set
PyObject* host_of(PyObject* t, PyObject* host);

// record.ref(pos, k): the shared Ref of output ``k`` of op ``pos`` (ref::shared); a new
// reference, or nullptr with an exception set
PyObject* ref_of(Py_ssize_t pos, Py_ssize_t k);

// OutMeta(size, stride, offset, dtype) of a tensor (record.out_meta), untracked; a new
// reference, or nullptr with an exception set
PyObject* out_meta_of(PyObject* t);

}  // namespace neuron_lab
