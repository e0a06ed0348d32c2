// Weak references to a pending output's tensor and storage, as the deferral keeps them: two per
// output, in the record's pair (weak_outputs.h).
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
// so "the impl is alive" is "the object is alive", as for a weakref.
//
// A storage's reference is made from its c10::Storage, never its Python object (weak_outputs.h
// says why); its identity is its StorageImpl's address (``storage_id``), which cannot be reused
// while a weak reference to it lives.
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
  const void* impl;                     // a storage's StorageImpl (never dereferenced)
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

// The storage of ``o``, a tensor or a storage, or nullptr with an exception set
const c10::Storage* storage_of(PyObject* o, const char* fn) {
  const int kind = kind_of(o);
  if (kind == 1) return &THPVariable_Unpack(o).storage();
  if (kind == 2) return &THPStorage_Unpack(o);
  if (kind == 0)
    PyErr_Format(PyExc_TypeError, "neuron_lab: %s takes a tensor or a storage, not %s", fn,
                 Py_TYPE(o)->tp_name);
  return nullptr;
}

PyObject* storage_ref_py(PyObject*, PyObject* o) {
  const c10::Storage* st = storage_of(o, "storage_ref");
  return st != nullptr ? weak_storage_ref(*st) : nullptr;
}

PyObject* storage_id_py(PyObject*, PyObject* o) {
  if (Py_TYPE(o) == &WeakRefType) {
    auto* w = reinterpret_cast<WeakRef*>(o);
    if (!w->storage || expired(w)) Py_RETURN_NONE;   // a tensor's names no storage
    return PyLong_FromVoidPtr(const_cast<void*>(w->impl));
  }
  const c10::Storage* st = storage_of(o, "storage_id");
  return st != nullptr ? PyLong_FromVoidPtr(st->unsafeGetStorageImpl()) : nullptr;
}

PyMethodDef storage_ref_def = {
    "storage_ref", storage_ref_py, METH_O,
    "storage_ref(tensor or storage): a weak reference to its storage, made without the "
    "storage's Python object (weak_outputs.cpp)"};
PyMethodDef storage_id_def = {
    "storage_id", storage_id_py, METH_O,
    "storage_id(tensor, storage, or a weak reference): the address of its StorageImpl "
    "(UntypedStorage._cdata); None for a dead reference or a tensor's; no Python storage "
    "object is made"};

}  // namespace

PyObject* weak_ref(PyObject* o) {
  const int kind = kind_of(o);
  if (kind <= 0) {
    if (kind == 0)
      PyErr_Format(PyExc_TypeError, "neuron_lab: weak_ref takes a tensor or a storage, not %s",
                   Py_TYPE(o)->tp_name);
    return nullptr;
  }
  if (kind == 2) return weak_storage_ref(THPStorage_Unpack(o));
  auto* w = PyObject_New(WeakRef, &WeakRefType);
  if (w == nullptr) return nullptr;
  new (&w->tensor) std::optional<WeakTensor>(THPVariable_Unpack(o).getIntrusivePtr());
  new (&w->storage) std::optional<WeakStorage>();
  w->impl = nullptr;
  return reinterpret_cast<PyObject*>(w);
}

PyObject* weak_storage_ref(const c10::Storage& storage) {
  auto* w = PyObject_New(WeakRef, &WeakRefType);
  if (w == nullptr) return nullptr;
  new (&w->tensor) std::optional<WeakTensor>();
  new (&w->storage) std::optional<WeakStorage>(storage.getWeakStorageImpl());
  w->impl = storage.unsafeGetStorageImpl();
  return reinterpret_cast<PyObject*>(w);
}

PyObject* weak_object(PyObject* w) {
  if (Py_TYPE(w) == &WeakRefType) return target(reinterpret_cast<WeakRef*>(w));
  if (PyWeakref_CheckRef(w)) return Py_NewRef(PyWeakref_GetObject(w));
  PyErr_Format(PyExc_TypeError, "neuron_lab: a weak reference was expected, not %s",
               Py_TYPE(w)->tp_name);
  return nullptr;
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
  for (PyMethodDef* d : {&weak_ref_def, &storage_ref_def, &storage_id_def})
    m.add_object(d->ml_name, py::reinterpret_steal<py::object>(PyCFunction_New(d, nullptr)));
}

}  // namespace neuron_lab
