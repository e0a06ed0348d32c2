// Weak references to a pending output's tensor and storage without Python weakrefs
// (weak_outputs.cpp). A record's output pair holds one per object (the producers map holds
// c10's weak pointers directly: producers.h).
#pragma once
#include <Python.h>

#include <c10/core/Storage.h>

namespace neuron_lab {

// A weak reference to ``o`` (a torch.Tensor or torch.UntypedStorage): c10's weak pointer to its
// TensorImpl or StorageImpl in a Python object the cycle collector never sees, called like a
// ``weakref.ref`` (``w()``: the object, or None once it died). A new reference, or nullptr with
// an exception set (any other object).
PyObject* weak_ref(PyObject* o);

// A weak reference to ``storage``'s StorageImpl, as weak_ref of its Python object, made without
// one: wrapping a storage in a Python object keeps its use count above one for good, which
// makes autograd accumulate gradients in that storage out of place. A new reference, or
// nullptr with an exception set.
PyObject* weak_storage_ref(const c10::Storage& storage);

// What ``w`` (a weak_ref or a weakref.ref) refers to: a new reference, Py_None (new) once it
// died, or nullptr with an exception set.
PyObject* weak_object(PyObject* w);

// Is what ``w`` refers to alive? 1 or 0; -1 with an exception set (``w`` neither kind).
int weak_alive(PyObject* w);

}  // namespace neuron_lab
