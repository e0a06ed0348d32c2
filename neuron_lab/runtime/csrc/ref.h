// A queued op's argument that is an output of an earlier op of the same segment (``record.Ref``):
// a C type the runtime's C++ reads field by field (record.cpp, replay.cpp), immutable, shared
// per (pos, k) through ``shared`` (``record.ref``). Python reads ``pos`` and ``k`` through its
// members.
#pragma once

#include <Python.h>

namespace neuron_lab::ref {

struct RefObject {
  PyObject_HEAD
  Py_ssize_t pos;   // the earlier op's position in the segment
  Py_ssize_t k;     // which of its (flattened) outputs
};

extern PyTypeObject RefType;

inline bool is_ref(PyObject* o) { return Py_TYPE(o) == &RefType; }

inline const RefObject& as_ref(PyObject* o) { return *reinterpret_cast<RefObject*>(o); }

// A new Ref(pos, k), or nullptr with an exception set.
PyObject* make(Py_ssize_t pos, Py_ssize_t k);

// The shared Ref of output ``k`` of op ``pos`` (``record.ref``): made the first time, kept for
// the process's life in a table indexed by (pos, k). A new reference, or nullptr with an
// exception set (a negative pos or k).
PyObject* shared(Py_ssize_t pos, Py_ssize_t k);

}  // namespace neuron_lab::ref
