// A trie node's output plan (``output_plans.py``) as C types the deferral's C++ reads field by
// field (deferral.cpp): ``OutSpec``, how one output of the node's op is handed out when the op
// is deferred, and ``FastOut``, the common op's single new pending tensor, precomputed. Python
// builds them once per trie node and reads their fields through read-only members. Neither is
// cycle-collected: they refer to tuples of ints, a dtype, an OutMeta and a Ref, none of which
// refers back.
#pragma once

#include <Python.h>

namespace neuron_lab::out_plan {

struct OutSpecObject {
  PyObject_HEAD
  long kind;              // output_plans.CALLER, NOT_TENSOR or PENDING
  PyObject* arg;          // CALLER: the argument's position or keyword; else None
  PyObject* meta;         // the output's record.OutMeta (None where it is not a tensor)
  Py_ssize_t nbytes;      // fresh bytes of a PENDING output (0 for a view)
  bool dense;             // contiguous at offset 0: made without restriding
  bool queueable;         // its dtype may be an argument of a later queued op
  bool view;              // a view of an argument (its storage is held twice: output_plans)
};

struct FastOutObject {
  PyObject_HEAD
  PyObject* size;         // tuple of ints
  PyObject* stride;       // tuple of ints
  PyObject* offset;       // int
  PyObject* dtype;        // torch.dtype
  Py_ssize_t nbytes;      // fresh bytes (0 for a view)
  bool dense;
  bool queueable;
  PyObject* ref;          // record.Ref of the output (its position in the segment, output 0)
  Py_ssize_t same_back;   // identity view of output ``same_k`` of the op ``same_back`` back
  Py_ssize_t same_k;      // (output_plans.identity_view); same_back -1: none
  bool view;              // a view of an argument (its storage is held twice: output_plans)
};

extern PyTypeObject OutSpecType;
extern PyTypeObject FastOutType;

inline bool is_out_spec(PyObject* o) { return Py_TYPE(o) == &OutSpecType; }
inline bool is_fast_out(PyObject* o) { return Py_TYPE(o) == &FastOutType; }

inline const OutSpecObject& as_out_spec(PyObject* o) {
  return *reinterpret_cast<OutSpecObject*>(o);
}
inline const FastOutObject& as_fast_out(PyObject* o) {
  return *reinterpret_cast<FastOutObject*>(o);
}

}  // namespace neuron_lab::out_plan
