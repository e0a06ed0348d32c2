// The runtime's own C types (trie_node.cpp, segment.cpp): objects whose fields the C++ reads
// from their structs and Python through member descriptors. Both take part in cycle
// collection; this is their shared type boilerplate.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

namespace neuron_lab::c_types {

// tp_dealloc of a collected type whose tp_clear is ``Clear``.
template <inquiry Clear>
void dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  Clear(self);
  Py_TYPE(self)->tp_free(self);
}

// A collected type with these slots (``subclassable``: Python classes may derive from it).
template <inquiry Clear>
PyTypeObject collected(const char* name, Py_ssize_t size, const char* doc, initproc init,
                       traverseproc traverse, PyMemberDef* members, bool subclassable) {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = name;
  t.tp_basicsize = size;
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | (subclassable ? Py_TPFLAGS_BASETYPE : 0);
  t.tp_doc = doc;
  t.tp_init = init;
  t.tp_new = PyType_GenericNew;
  t.tp_dealloc = dealloc<Clear>;
  t.tp_traverse = traverse;
  t.tp_clear = Clear;
  t.tp_members = members;
  return t;
}

// ``o`` as a ``T`` (an instance of ``type`` or of a subclass), or nullptr with a TypeError set
// naming ``what`` was expected.
template <class T>
T* as(PyObject* o, PyTypeObject& type, const char* what) {
  if (PyObject_TypeCheck(o, &type)) return reinterpret_cast<T*>(o);
  PyErr_Format(PyExc_TypeError, "neuron_lab: %s was expected, got %s", what, Py_TYPE(o)->tp_name);
  return nullptr;
}

// ``type`` made ready and added to module ``m`` as ``name``.
inline void add(pybind11::module_& m, PyTypeObject& type, const char* name) {
  if (PyType_Ready(&type) < 0) throw pybind11::error_already_set();
  Py_INCREF(&type);
  m.add_object(name, pybind11::handle(reinterpret_cast<PyObject*>(&type)));
}

}  // namespace neuron_lab::c_types
