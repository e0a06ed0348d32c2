// CPython helpers shared by the native extensions' C callables (device/csrc/kernel.cpp,
// python_call.cpp, runtime/csrc/deferral.cpp, record.cpp): interned names, the objects Python
// configures them with, the call into the device's generic kernel, and the one counter every op
// increments.
#pragma once

#include <Python.h>
#include <pybind11/pybind11.h>

namespace neuron_lab {

inline PyObject* intern(const char* s) { return PyUnicode_InternFromString(s); }

// Keep ``v`` in ``slot`` (a strong reference: configured objects live as long as the process).
template <class T>
void hold(T*& slot, pybind11::handle v) {
  Py_XINCREF(v.ptr());
  PyObject* old = reinterpret_cast<PyObject*>(slot);
  slot = reinterpret_cast<T*>(v.ptr());
  Py_XDECREF(old);
}

// `o` (may be null) taken off the cycle collector's lists: for the objects the runtime keeps per
// queued op that cannot be part of a reference cycle (weak references without a callback, the
// records, templates and producer entries only the engine refers to). Tracked, each would be
// scanned by every young collection until its region launches and promoted on the way; the
// promotions made CPython run a full collection (~210 ms) every ~100 steps of a training loop.
inline PyObject* untracked(PyObject* o) {
  if (o != nullptr && PyObject_GC_IsTracked(o)) PyObject_GC_UnTrack(o);
  return o;
}

// The device's generic kernel for one op (registry._kernel): ``runtime_interface.launch(facts,
// args,
// kwargs)`` with a runtime installed, else ``execute(facts, args, kwargs)``. `generic` is the
// tuple (facts, execute, runtime_interface's globals); `kwargs` a dict. A new reference, or nullptr
// with an
// exception set. Called by kernel.cpp's kernel and python_call.cpp's direct-kernel call.
inline PyObject* call_generic_kernel(PyObject* generic, PyObject* args, PyObject* kwargs) {
  static PyObject* s_launch = intern("launch");
  PyObject* launch = PyDict_GetItemWithError(PyTuple_GET_ITEM(generic, 2), s_launch);  // borrowed
  if (launch == nullptr && PyErr_Occurred()) return nullptr;
  PyObject* target = launch != nullptr && launch != Py_None ? launch : PyTuple_GET_ITEM(generic, 1);
  Py_INCREF(target);   // runtime_interface.install may replace it while the op runs
  PyObject* argv[3] = {PyTuple_GET_ITEM(generic, 0), args, kwargs};
  PyObject* out = PyObject_Vectorcall(target, argv, 3, nullptr);
  Py_DECREF(target);
  return out;
}

// tracking.executed[name] += 1 (a Counter: executed_ops() counts every op the user ran, however
// it was launched); false with an exception set.
inline bool count_executed(PyObject* executed, PyObject* name) {
  PyObject* c = PyDict_GetItemWithError(executed, name);   // borrowed
  if (c == nullptr && PyErr_Occurred()) return false;
  static PyObject* one = PyLong_FromLong(1);
  PyObject* c2 = c != nullptr ? PyNumber_Add(c, one) : Py_NewRef(one);
  bool ok = c2 != nullptr && PyDict_SetItem(executed, name, c2) == 0;
  Py_XDECREF(c2);
  return ok;
}

}  // namespace neuron_lab
