// A producers-map entry (``record.Produced``): which op of the segment made a tensor or storage
// (output ``k`` of op ``pos``), a weak reference that tells the live object from a new one that
// reuses its id, and the Ref naming it in argument templates. A C type the runtime's C++ builds
// and reads field by field (record.cpp, deferral.cpp, deferral_keys.cpp); Python reads its
// fields through read-only members. Not cycle-collected: it refers to nothing that refers back
// (a weak reference and a Ref).
#pragma once

#include <Python.h>

namespace neuron_lab::produced {

struct ProducedObject {
  PyObject_HEAD
  Py_ssize_t pos;   // the op's position in the segment
  Py_ssize_t k;     // which of its outputs
  PyObject* obj;    // weak reference to the tensor or storage
  PyObject* ref;    // the record.Ref of output k of op pos
};

extern PyTypeObject ProducedType;

inline bool is_produced(PyObject* o) { return o != nullptr && Py_TYPE(o) == &ProducedType; }

inline ProducedObject& as_produced(PyObject* o) {
  return *reinterpret_cast<ProducedObject*>(o);
}

// A new entry (``obj`` stolen, also on failure; ``ref`` borrowed); nullptr with an exception.
PyObject* make(Py_ssize_t pos, Py_ssize_t k, PyObject* obj, PyObject* ref);

}  // namespace neuron_lab::produced
