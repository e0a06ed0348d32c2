// The segment's producers map as a C++ object (producers.h): ``_runtime_ext.Producers``.
#include "producers.h"

#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "c_types.h"
#include "ref.h"

namespace py = pybind11;

namespace neuron_lab {
namespace producers {

using WeakTensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;
using WeakStorage = c10::weak_intrusive_ptr<c10::StorageImpl>;

// A strong reference to a Python object (a Ref, an OutMeta), released with the entry; the map is
// only touched with the GIL held.
class Owned {
 public:
  explicit Owned(PyObject* o) : o_(Py_NewRef(o)) {}
  Owned(Owned&& other) noexcept : o_(std::exchange(other.o_, nullptr)) {}
  Owned& operator=(Owned&& other) noexcept {
    std::swap(o_, other.o_);
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() { Py_XDECREF(o_); }
  PyObject* get() const { return o_; }

 private:
  PyObject* o_;
};

struct TensorEntry {
  WeakTensor impl;
  Owned ref;
};

struct StorageEntry {
  WeakStorage impl;
  Owned ref;
};

struct ViewEntry {
  WeakStorage impl;
  Owned meta;   // the captured output's OutMeta
  Owned ref;
};

struct ProducerMap {
  std::unordered_map<const c10::TensorImpl*, TensorEntry> tensors;
  std::unordered_map<const c10::StorageImpl*, StorageEntry> storages;
  std::unordered_map<const c10::StorageImpl*, std::vector<ViewEntry>> views;
};

namespace {

bool check_ref(PyObject* ref) {
  if (ref::is_ref(ref)) return true;
  PyErr_Format(PyExc_TypeError, "neuron_lab: a producer entry's ref must be a Ref, got %s",
               Py_TYPE(ref)->tp_name);
  return false;
}

// The index in ``v`` (one storage's view entries) of the entry whose metadata equals ``meta``:
// -1 for none, -2 with an exception set (the comparison failed).
Py_ssize_t view_index(const std::vector<ViewEntry>& v, PyObject* meta) {
  for (size_t i = 0; i < v.size(); ++i) {
    PyObject* m = v[i].meta.get();
    int eq = m == meta ? 1 : PyObject_RichCompareBool(m, meta, Py_EQ);
    if (eq < 0) return -2;
    if (eq == 1) return static_cast<Py_ssize_t>(i);
  }
  return -1;
}

}  // namespace

ProducersObject* as_producers(PyObject* o) {
  return c_types::as<ProducersObject>(o, ProducersType, "a producers map");
}

PyObject* of_tensor(ProducersObject* p, const c10::TensorImpl* impl) {
  auto it = p->map->tensors.find(impl);
  return it == p->map->tensors.end() ? nullptr : it->second.ref.get();
}

PyObject* of_storage(ProducersObject* p, const c10::Storage& storage, PyObject* meta) {
  const c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  auto v = p->map->views.find(impl);
  if (v != p->map->views.end()) {
    Py_ssize_t i = view_index(v->second, meta);
    if (i == -2) return nullptr;
    if (i >= 0) return v->second[i].ref.get();
  }
  auto it = p->map->storages.find(impl);
  return it == p->map->storages.end() ? nullptr : it->second.ref.get();
}

PyObject* of_pending_storage(ProducersObject* p, const void* impl) {
  auto it = p->map->storages.find(static_cast<const c10::StorageImpl*>(impl));
  if (it == p->map->storages.end() || it->second.impl.expired()) return nullptr;
  return it->second.ref.get();
}

bool set_tensor(ProducersObject* p, const at::TensorBase& t, PyObject* ref) {
  if (!check_ref(ref)) return false;
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  p->map->tensors.insert_or_assign(impl, TensorEntry{WeakTensor(t.getIntrusivePtr()), Owned(ref)});
  return true;
}

bool set_storage(ProducersObject* p, const c10::Storage& storage, PyObject* ref) {
  if (!check_ref(ref)) return false;
  const c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  p->map->storages.insert_or_assign(
      impl, StorageEntry{WeakStorage(storage.getWeakStorageImpl()), Owned(ref)});
  return true;
}

bool set_view_storage(ProducersObject* p, const c10::Storage& storage, PyObject* meta,
                      PyObject* ref) {
  if (!check_ref(ref)) return false;
  std::vector<ViewEntry>& v = p->map->views[storage.unsafeGetStorageImpl()];
  Py_ssize_t i = view_index(v, meta);
  if (i == -2) return false;
  ViewEntry e{WeakStorage(storage.getWeakStorageImpl()), Owned(meta), Owned(ref)};
  if (i >= 0) v[i] = std::move(e);
  else v.push_back(std::move(e));
  return true;
}

namespace {

// The Python methods' tensor argument: its tensor, or nullptr with a TypeError set.
const at::Tensor* tensor_arg(PyObject* o, const char* method) {
  if (THPVariable_Check(o)) return &THPVariable_Unpack(o);
  PyErr_Format(PyExc_TypeError, "neuron_lab: Producers.%s takes a tensor, got %s", method,
               Py_TYPE(o)->tp_name);
  return nullptr;
}

// The storage of the Python methods' tensor argument, read without the checks of
// ``Tensor::storage()`` (which throws for a sparse tensor or a functorch wrapper); nullptr with
// a TypeError set where it has none.
const c10::Storage* storage_arg(PyObject* o, const char* method) {
  const at::Tensor* t = tensor_arg(o, method);
  if (t == nullptr) return nullptr;
  const c10::Storage& st = t->unsafeGetTensorImpl()->unsafe_storage();
  if (st) return &st;
  const std::string layout = c10::str(t->layout());
  PyErr_Format(PyExc_TypeError, "neuron_lab: Producers.%s takes a tensor with a storage, got "
               "one without (layout %s)", method, layout.c_str());
  return nullptr;
}

PyObject* or_none(PyObject* ref) {
  if (ref == nullptr && PyErr_Occurred()) return nullptr;
  return Py_NewRef(ref != nullptr ? ref : Py_None);
}

ProducersObject* self_of(PyObject* self) { return reinterpret_cast<ProducersObject*>(self); }

bool nargs(Py_ssize_t n, Py_ssize_t want, const char* usage) {
  if (n == want) return true;
  PyErr_Format(PyExc_TypeError, "neuron_lab: Producers.%s", usage);
  return false;
}

PyObject* py_of(PyObject* self, PyObject* t) {
  const at::Tensor* x = tensor_arg(t, "of");
  return x ? or_none(of_tensor(self_of(self), x->unsafeGetTensorImpl())) : nullptr;
}

PyObject* py_of_storage(PyObject* self, PyObject* const* argv, Py_ssize_t n) {
  if (!nargs(n, 2, "of_storage(t, meta)")) return nullptr;
  const c10::Storage* st = storage_arg(argv[0], "of_storage");
  return st ? or_none(of_storage(self_of(self), *st, argv[1])) : nullptr;
}

PyObject* py_of_pending_storage(PyObject* self, PyObject* sid) {
  void* impl = PyLong_AsVoidPtr(sid);
  if (impl == nullptr && PyErr_Occurred()) return nullptr;
  return or_none(of_pending_storage(self_of(self), impl));
}

PyObject* done(bool ok) { return ok ? Py_NewRef(Py_None) : nullptr; }

PyObject* py_set(PyObject* self, PyObject* const* argv, Py_ssize_t n) {
  if (!nargs(n, 2, "set(t, ref)")) return nullptr;
  const at::Tensor* x = tensor_arg(argv[0], "set");
  return x ? done(set_tensor(self_of(self), *x, argv[1])) : nullptr;
}

PyObject* py_set_storage(PyObject* self, PyObject* const* argv, Py_ssize_t n) {
  if (!nargs(n, 2, "set_storage(t, ref)")) return nullptr;
  const c10::Storage* st = storage_arg(argv[0], "set_storage");
  return st ? done(set_storage(self_of(self), *st, argv[1])) : nullptr;
}

PyObject* py_set_view_storage(PyObject* self, PyObject* const* argv, Py_ssize_t n) {
  if (!nargs(n, 3, "set_view_storage(t, meta, ref)")) return nullptr;
  const c10::Storage* st = storage_arg(argv[0], "set_view_storage");
  return st ? done(set_view_storage(self_of(self), *st, argv[1], argv[2])) : nullptr;
}

PyObject* py_refs(PyObject* self, PyObject*) {
  const ProducerMap& m = *self_of(self)->map;
  PyObject* out = PyList_New(0);
  auto add = [&](const Owned& r) { return out != nullptr && PyList_Append(out, r.get()) == 0; };
  bool ok = out != nullptr;
  for (const auto& [impl, e] : m.tensors) ok = ok && add(e.ref);
  for (const auto& [impl, e] : m.storages) ok = ok && add(e.ref);
  for (const auto& [impl, v] : m.views)
    for (const ViewEntry& e : v) ok = ok && add(e.ref);
  if (!ok) Py_CLEAR(out);
  return out;
}

Py_ssize_t length(PyObject* self) {
  const ProducerMap& m = *self_of(self)->map;
  size_t n = m.tensors.size() + m.storages.size();
  for (const auto& [impl, v] : m.views) n += v.size();
  return static_cast<Py_ssize_t>(n);
}

PyObject* alloc(PyTypeObject* type) {
  PyObject* self = type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  try {
    self_of(self)->map = new ProducerMap();
  } catch (const std::bad_alloc&) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return self;
}

PyObject* new_producers(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, ":Producers", const_cast<char**>(names)))
    return nullptr;
  return alloc(type);
}

void dealloc(PyObject* self) {
  delete self_of(self)->map;   // releases the Refs and metas (the GIL is held)
  Py_TYPE(self)->tp_free(self);
}

PyObject* repr(PyObject* self) {
  const ProducerMap& m = *self_of(self)->map;
  return PyUnicode_FromFormat("<neuron_lab Producers: %zu tensors, %zu storages, %zu views>",
                              m.tensors.size(), m.storages.size(), m.views.size());
}

#define FAST(f) reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&f)), METH_FASTCALL
PyMethodDef methods[] = {
    {"of", py_of, METH_O, "of(t): the Ref of the op of the segment that made tensor t, or None"},
    {"of_storage", FAST(py_of_storage),
     "of_storage(t, meta): the Ref of the output t's storage names seen with OutMeta meta (a "
     "captured output's first, else a pending output's), or None"},
    {"of_pending_storage", py_of_pending_storage, METH_O,
     "of_pending_storage(sid): the Ref of the pending output whose live storage has StorageImpl "
     "address sid (record.storage_id), or None"},
    {"set", FAST(py_set), "set(t, ref): tensor t is the output ref names"},
    {"set_storage", FAST(py_set_storage),
     "set_storage(t, ref): the storage of pending output t is the output ref names"},
    {"set_view_storage", FAST(py_set_view_storage),
     "set_view_storage(t, meta, ref): t's storage seen with OutMeta meta is the captured output "
     "ref names"},
    {"refs", py_refs, METH_NOARGS, "refs(): every entry's Ref (tests and debugging)"},
    {nullptr, nullptr, 0, nullptr}};
#undef FAST

PySequenceMethods as_sequence = [] {
  PySequenceMethods s{};
  s.sq_length = length;
  return s;
}();

PyTypeObject make_type() {
  PyTypeObject t = c_types::plain(
      "neuron_lab.runtime._runtime_ext.Producers", sizeof(ProducersObject),
      "Producers(): a segment's producers map (which queued op made a tensor or storage)",
      new_producers, dealloc, repr, nullptr, methods);
  t.tp_as_sequence = &as_sequence;
  return t;
}

}  // namespace

PyTypeObject ProducersType = make_type();

PyObject* make() { return alloc(&ProducersType); }

}  // namespace producers

void init_producers(py::module_& m) {
  c_types::add(m, producers::ProducersType, "Producers");
}

}  // namespace neuron_lab
