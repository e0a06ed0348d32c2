// One op call in the segment's queue (``record.QueuedOp``): a C type the runtime's C++ builds
// and reads field by field (deferral.cpp, record.cpp, replay.cpp, repeated_suffix.cpp); Python
// reads its fields through read-only members. Its fields are record.QueuedOp's docstring's.
// Not cycle-collected, as the tuples it replaces were kept off the collector: it refers to
// nothing that refers back to it (its outputs through weak references only).
#pragma once

#include <Python.h>

namespace neuron_lab::queued_op {

struct QueuedOpObject {
  PyObject_HEAD
  PyObject* facts;       // the op's OpFacts
  PyObject* args;        // argument templates (a tuple): a Ref for an output of the segment
  PyObject* kwargs;      // keyword templates (a dict), or None
  PyObject* key;         // the op's key in the region trie
  PyObject* outs;        // per flattened output: None or (tensor weak_ref, storage weak_ref)
  PyObject* metas;       // their OutMeta (None where an output is not a tensor)
  PyObject* structure;   // how to rebuild the op's return value
  PyObject* where;       // the user's line (tracking.user_frame_token)
  PyObject* plan;        // the trie node's OutSpecs for a deferred op, None for a captured one
};

extern PyTypeObject QueuedOpType;

inline bool is_queued_op(PyObject* o) { return Py_TYPE(o) == &QueuedOpType; }

inline QueuedOpObject& as_queued_op(PyObject* o) {
  return *reinterpret_cast<QueuedOpObject*>(o);
}

// A new QueuedOp of the nine fields, in the order above (the references are stolen, also on
// failure); nullptr with an exception set.
PyObject* make(PyObject* const fields[9]);

}  // namespace neuron_lab::queued_op
