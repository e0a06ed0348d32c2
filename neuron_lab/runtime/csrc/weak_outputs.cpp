// Weak references to a pending output's tensor and storage, as the deferral keeps them: two per
// output, in the record's pair and the producer entries (weak_outputs.h).
//
// A ``weakref.ref`` is a cycle-collected object, and CPython counts every such allocation toward
// its young-collection threshold (700) until it is freed, untracked or not: the two weakrefs of
// each deferred op live until the region launches, and were 2 of the ~3.6 counted allocations a
// deferred op holds (a 200-op chain). A ``WeakRef`` here is a plain object holding c10's weak
// pointer to the TensorImpl or StorageImpl, which the collector never counts or sees, so a
// training step triggers fewer young collections at the same deferral cost. It is called like
// a weakref (``w()``: the object, or None once it died; the Python engine's code reads both
// kinds) and answers by locking the pointer. A live
// TensorImpl or StorageImpl keeps its one Python object alive (PyTorch's PyObject preservation),
// so "the impl is alive" is "the object is alive", as for a weakref; the object's address is
// kept for identity tests (``weak_is``: equal address and a live impl, as a weakref's ``is``).
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <new>
#include <optional>

#include "weak_outputs.h"

namespace py = pybind11;

namespace neuron_lab {
namespace {

using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

struct WeakRef {
  PyObject_HEAD
  std::optional<WeakTensor> tensor;     // exactly one of the two is set
  std::optional<WeakStorage> storage;
  PyObject* obj;                        // the object's address (never dereferenced): while the
                                        // impl lives, its Python object is this one
};

PyObject* target(WeakRef* w) {
  if (w->tensor) {
    auto impl = w->tensor->lock();
    if (!impl.defined()) Py_RETURN_NONE;
    return THPVariable_Wrap(at::TensorBase(std::move(impl)));
  }
  auto impl = w->storage->lock();
  if (!impl) Py_RETURN_NONE;
  return THPStorage_Wrap(c10::Storage(std::move(impl)));
}

bool expired(const WeakRef* w) { return w->tensor ? w->tensor->expired() : w->storage->expired(); }

void weak_dealloc(PyObject* self) {
  auto* w = reinterpret_cast<WeakRef*>(self);
  w->tensor.~optional();
  w->storage.~optional();
  Py_TYPE(self)->tp_free(self);
}

PyObject* weak_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  if (PyTuple_GET_SIZE(args) != 0 || (kwargs != nullptr && PyDict_GET_SIZE(kwargs) != 0)) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: WeakRef() takes no arguments");
    return nullptr;
  }
  return target(reinterpret_cast<WeakRef*>(self));
}

PyObject* weak_repr(PyObject* self) {
  auto* w = reinterpret_cast<WeakRef*>(self);
  return PyUnicode_FromFormat("<neuron_lab WeakRef to %s%s>",
                              w->tensor ? "Tensor" : "UntypedStorage", expired(w) ? " (dead)" : "");
}

PyTypeObject WeakRefType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "neuron_lab_runtime.WeakRef";
  t.tp_basicsize = sizeof(WeakRef);
  t.tp_flags = Py_TPFLAGS_DEFAULT;      // no Py_TPFLAGS_HAVE_GC: the point of the type
  t.tp_doc = "A weak reference to a pending output's tensor or storage (weak_outputs.cpp): "
             "w() is the object, or None once it died.";
  t.tp_dealloc = weak_dealloc;
  t.tp_call = weak_call;
  t.tp_repr = weak_repr;
  return t;
}();

PyObject* weak_ref_py(PyObject*, PyObject* o) { return weak_ref(o); }

PyMethodDef weak_ref_def = {"weak_ref", weak_ref_py, METH_O,
                            "weak_ref(tensor or storage): a weak reference without a Python "
                            "weakref (weak_outputs.cpp), called like weakref.ref"};

// Is ``o`` a tensor (1) or a storage (2)? 0 if neither, -1 with an exception set. The exact
// types first: isinstance of a tensor subclass asks torch.Tensor's metaclass (~0.1 us).
int kind_of(PyObject* o) {
  if (THPVariable_CheckExact(o)) return 1;
  if (THPStorage_CheckExact(o)) return 2;
  int is = THPVariableClass ? PyObject_IsInstance(o, THPVariableClass) : 0;
  if (is != 0) return is;
  is = THPStorageClass ? PyObject_IsInstance(o, reinterpret_cast<PyObject*>(THPStorageClass)) : 0;
  return is > 0 ? 2 : is;
}

}  // namespace

PyObject* weak_ref(PyObject* o) {
  const int kind = kind_of(o);
  if (kind <= 0) {
    if (kind == 0)
      PyErr_Format(PyExc_TypeError, "neuron_lab: weak_ref takes a tensor or a storage, not %s",
                   Py_TYPE(o)->tp_name);
    return nullptr;
  }
  auto* w = PyObject_New(WeakRef, &WeakRefType);
  if (w == nullptr) return nullptr;
  new (&w->tensor) std::optional<WeakTensor>();
  new (&w->storage) std::optional<WeakStorage>();
  w->obj = o;
  if (kind == 1) w->tensor.emplace(THPVariable_Unpack(o).getIntrusivePtr());
  else w->storage.emplace(THPStorage_Unpack(o).getWeakStorageImpl());
  return reinterpret_cast<PyObject*>(w);
}

PyObject* weak_object(PyObject* w) {
  if (Py_TYPE(w) == &WeakRefType) return target(reinterpret_cast<WeakRef*>(w));
  if (PyWeakref_CheckRef(w)) return Py_NewRef(PyWeakref_GetObject(w));
  PyErr_Format(PyExc_TypeError, "neuron_lab: a weak reference was expected, not %s",
               Py_TYPE(w)->tp_name);
  return nullptr;
}

bool weak_is(PyObject* w, PyObject* o) {
  if (Py_TYPE(w) == &WeakRefType) {
    auto* r = reinterpret_cast<WeakRef*>(w);
    return r->obj == o && !expired(r);   // a live object's address is its own
  }
  return PyWeakref_CheckRef(w) && PyWeakref_GetObject(w) == o;
}

int weak_alive(PyObject* w) {
  if (Py_TYPE(w) == &WeakRefType) return expired(reinterpret_cast<WeakRef*>(w)) ? 0 : 1;
  if (PyWeakref_CheckRef(w)) return PyWeakref_GetObject(w) != Py_None;
  PyErr_Format(PyExc_TypeError, "neuron_lab: a weak reference was expected, not %s",
               Py_TYPE(w)->tp_name);
  return -1;
}

void init_weak_outputs(py::module_& m) {
  if (PyType_Ready(&WeakRefType) < 0) throw py::error_already_set();
  Py_INCREF(&WeakRefType);
  m.add_object("WeakRef", py::reinterpret_steal<py::object>(
                              reinterpret_cast<PyObject*>(&WeakRefType)));
  m.add_object(weak_ref_def.ml_name,
               py::reinterpret_steal<py::object>(PyCFunction_New(&weak_ref_def, nullptr)));
}

}  // namespace neuron_lab
