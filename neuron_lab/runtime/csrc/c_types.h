// The runtime's own C types (trie_node.cpp, segment.cpp, queued_op.cpp, producers.cpp, ref.cpp):
// objects whose fields the C++ reads from their structs and Python through member descriptors.
// The first two take part in cycle collection (``collected``), the others not (``plain``); this
// is their shared type boilerplate.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

namespace neuron_lab::c_types {

// The object fields ``F...`` of a ``T``: what the collector visits and clears.
template <class T, PyObject* T::*... F>
struct ObjectFields {
  static int traverse(PyObject* self, visitproc visit, void* arg) {
    T* o = reinterpret_cast<T*>(self);
    for (PyObject* v : {o->*F...}) {
      if (v != nullptr) {
        int r = visit(v, arg);
        if (r != 0) return r;
      }
    }
    return 0;   // a Python subclass's type is visited (and released) by CPython's subtype_*
  }
  static int clear(PyObject* self) {
    T* o = reinterpret_cast<T*>(self);
    for (PyObject** p : {&(o->*F)...}) Py_CLEAR(*p);
    return 0;
  }
  static void dealloc(PyObject* self) {
    PyObject_GC_UnTrack(self);
    clear(self);
    Py_TYPE(self)->tp_free(self);
  }
};

// A collected type whose object fields are ``Fields`` (an ``ObjectFields``), with these slots
// (``subclassable``: Python classes may derive from it).
template <class Fields>
PyTypeObject collected(const char* name, Py_ssize_t size, const char* doc, initproc init,
                       PyMemberDef* members, bool subclassable) {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = name;
  t.tp_basicsize = size;
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | (subclassable ? Py_TPFLAGS_BASETYPE : 0);
  t.tp_doc = doc;
  t.tp_init = init;
  t.tp_new = PyType_GenericNew;
  t.tp_dealloc = Fields::dealloc;
  t.tp_traverse = Fields::traverse;
  t.tp_clear = Fields::clear;
  t.tp_members = members;
  return t;
}

// A type kept off the cycle collector (its objects refer to nothing that refers back to them),
// not subclassable, made by ``tp_new``; ``dealloc`` may be nullptr (nothing to release).
inline PyTypeObject plain(const char* name, Py_ssize_t size, const char* doc, newfunc tp_new,
                          destructor dealloc, reprfunc repr, PyMemberDef* members,
                          PyMethodDef* methods) {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = name;
  t.tp_basicsize = size;
  t.tp_flags = Py_TPFLAGS_DEFAULT;
  t.tp_doc = doc;
  t.tp_new = tp_new;
  if (dealloc != nullptr) t.tp_dealloc = dealloc;
  t.tp_repr = repr;
  t.tp_members = members;
  t.tp_methods = methods;
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
