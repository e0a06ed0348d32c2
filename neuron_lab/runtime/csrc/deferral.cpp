// The adaptive engine's hot path in C: ``Engine.launch`` for an op that continues a known
// region path (runtime/adaptive.py and record.py hold the same logic in Python, the reference).
//
// On a known path a deferred op does no work of its own: it gets a pending tensor whose
// metadata the trie node predicts (record.FastOut) and is appended to the queue. Here the steps
// Python took for that (building the key, the trie lookup, the tensor, two weak references, two
// producer entries, the record) are C calls on the same Python objects, so the engine's slow
// paths (capture, divergence, launches, materialize), the telemetry and the tests see exactly
// what the Python path would have built:
//
//   key      (facts, (arg keys...)) as record.describe builds it: a tensor made earlier in the
//            segment ("r", distance, k), a region input ("x", shape, stride, offset, dtype), a
//            float that is data FLOAT, a top-level list of ints ("ints", values), other lists
//            and tuples element by element, numbers (type, value), kwargs (name, key) sorted;
//   record   QueuedOp(facts, templates, kwarg templates, node.key, [(tensor ref, storage ref)],
//            node.metas, "t", node.where, node.plan), made like tuple.__new__ makes it (the
//            trie node's key object: the op's own equal key dies at once);
//   producer Produced(pos, 0, weakref, Ref) under id(tensor) and id(storage).
//
// What a deferred op keeps until its region launches (and what capture keeps for good) is
// taken off the cycle collector's lists (``untracked``, python_objects.h): none of it can be
// part of a cycle, and tracked it made CPython run ~200 ms full collections in training loops.
//
// Anything else (capture, a divergence, a region's end, an op with several outputs or an
// in-place one) goes to the Python engine (``Engine._adaptive``), under the engine's lock as
// there; its shells come from ``pending``/``pending_dense`` here (shell.pending's twins). In
// eager mode an op goes to the device's execute (``Engine.launch`` first when ops are still
// queued). ``configure`` hands over the objects; attribute names are interned once.
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <unordered_map>

#include "python_objects.h"   // device/csrc: intern, hold, untracked, named

namespace py = pybind11;

namespace neuron_lab {
namespace {

struct State {
  PyObject* engine = nullptr;        // runtime.adaptive.Engine (one per process)
  PyObject* acquire = nullptr;       // engine.lock.acquire / .release, bound (an RLock, the
                                     // same object for the engine's life)
  PyObject* release = nullptr;
  PyObject* plain = nullptr;         // adaptive._plain: {OpFacts: bool}
  PyObject* host_only = nullptr;     // dtypes.HOST_ONLY (a frozenset)
  PyTypeObject* dtype_type = nullptr;          // torch.dtype, torch.memory_format, ...
  PyTypeObject* memory_format_type = nullptr;
  PyTypeObject* layout_type = nullptr;
  PyTypeObject* device_type = nullptr;
  PyObject* not_queueable = nullptr; // record.NotQueueable
  PyObject* float_key = nullptr;     // record.FLOAT
  PyTypeObject* produced = nullptr;  // record.Produced
  PyTypeObject* queued = nullptr;    // record.QueuedOp
  PyObject* mode = nullptr;          // knobs.MODE (a Knob)
  PyObject* unset = nullptr;         // config._UNSET
  PyObject* adaptive = nullptr;      // "adaptive"
  c10::Allocator* allocator = nullptr;   // create_empty_tensor's storages: their allocator and
  c10::Device device{c10::DeviceType::PrivateUse1, 0};   // device (an empty DataPtr's)
  PyTypeObject* tensor = nullptr;    // torch.Tensor
  PyObject* execute = nullptr;       // the device's kernels.execute (eager mode)
  PyObject* py_launch = nullptr;     // Engine.launch (the Python path), bound
  PyObject* py_adaptive = nullptr;   // Engine._adaptive, bound
  PyObject* admit = nullptr;         // Engine._admit_pending, bound
  PyObject* flush = nullptr;         // Engine.flush, bound
  long fast = 0, slow = 0;           // ops deferred here / handed to Python (tests read them)
  std::unordered_map<PyObject*, long long> deferred;   // facts -> ops deferred here since the
                                     // last deferred_counts() (held: OpFacts live for good)
};

State S;

// interned names
PyObject *s_node, *s_key, *s_records, *s_producers, *s_depth, *s_children, *s_fast, *s_metas, *s_where,
    *s_plan, *s_queued_bytes, *s_headroom, *s_pressure, *s_floats, *s_name, *s_value,
    *s_env_value, *s_untyped_storage, *s_h, *s_d, *s_r, *s_ints, *s_t, *s_memory, *s_is_cpu, *s_dtype, *s_shape, *s_stride,
    *s_storage_offset, *s_x;

bool mode_is_adaptive() {
  PyObject* v = PyObject_GetAttr(S.mode, s_value);
  if (v == nullptr) return false;
  if (v == S.unset) {
    Py_DECREF(v);
    v = PyObject_GetAttr(S.mode, s_env_value);
    if (v == nullptr) return false;
  }
  int eq = PyUnicode_Check(v) ? PyUnicode_Compare(v, S.adaptive) == 0 : 0;
  Py_DECREF(v);
  PyErr_Clear();
  return eq;
}

// A tensor made earlier in this segment: its producer entry, or nullptr (borrowed). A C++
// shallow copy of an output (``.data``, autograd's saved outputs: no cached host view) is
// found through its storage and gets an entry of its own (record._by_storage).
PyObject* producer_of(PyObject* a, PyObject* producers) {
  PyObject* id = PyLong_FromVoidPtr(a);
  if (id == nullptr) return nullptr;
  PyObject* p = PyDict_GetItemWithError(producers, id);   // borrowed
  if (p != nullptr && PyTuple_GET_SIZE(p) == 4 && PyWeakref_GetObject(PyTuple_GET_ITEM(p, 2)) == a) {
    Py_DECREF(id);
    return p;
  }
  if (PyErr_Occurred()) {
    Py_DECREF(id);
    return nullptr;
  }
  PyObject** dictptr = _PyObject_GetDictPtr(a);
  if (dictptr != nullptr && *dictptr != nullptr) {
    int has = PyDict_Contains(*dictptr, s_d);
    if (has != 0) {   // a shell with a host view (or pending): not a copy
      Py_DECREF(id);
      return nullptr;
    }
  }
  PyObject* st = PyObject_CallMethodNoArgs(a, s_untyped_storage);
  if (st == nullptr) {
    Py_DECREF(id);
    return nullptr;
  }
  PyObject* sid = PyLong_FromVoidPtr(st);
  p = sid ? PyDict_GetItemWithError(producers, sid) : nullptr;
  Py_XDECREF(sid);
  if (p == nullptr || PyTuple_GET_SIZE(p) != 4 || PyWeakref_GetObject(PyTuple_GET_ITEM(p, 2)) != st) {
    Py_DECREF(st);
    Py_DECREF(id);
    return nullptr;
  }
  Py_DECREF(st);
  PyObject* wr = untracked(PyWeakref_NewRef(a, nullptr));
  PyObject* items[4] = {Py_NewRef(PyTuple_GET_ITEM(p, 0)), Py_NewRef(PyTuple_GET_ITEM(p, 1)), wr,
                        Py_NewRef(PyTuple_GET_ITEM(p, 3))};
  PyObject* mine = wr ? untracked(named(S.produced, 4, items)) : nullptr;
  if (wr == nullptr) {
    for (int i : {0, 1, 3}) Py_DECREF(items[i]);
  }
  int bad = mine == nullptr || PyDict_SetItem(producers, id, mine) < 0;
  Py_XDECREF(mine);
  Py_DECREF(id);
  return bad ? nullptr : p;   // p stays alive: it is still the storage's entry
}

PyObject* pack2(PyObject* a, PyObject* b) { return PyTuple_Pack(2, a, b); }

// The key and template of one argument (record._describe); false with an exception set
// (record.NotQueueable for a call that cannot be queued). ``top``: a positional argument of
// the op, where a list of plain ints is keyed ("ints", values) (record.describe).
bool describe_arg(PyObject* a, Py_ssize_t pos, PyObject* producers, bool floats, bool top,
                  PyObject** key, PyObject** tmpl) {
  PyTypeObject* t = Py_TYPE(a);
  if (t == S.tensor || PyType_IsSubtype(t, S.tensor)) {
    PyObject* p = producer_of(a, producers);
    if (p == nullptr && PyErr_Occurred()) return false;
    if (p != nullptr) {
      Py_ssize_t ppos = PyLong_AsSsize_t(PyTuple_GET_ITEM(p, 0));
      if (ppos == -1 && PyErr_Occurred()) return false;
      PyObject* dist = PyLong_FromSsize_t(pos - ppos);
      if (dist == nullptr) return false;
      *key = untracked(PyTuple_Pack(3, s_r, dist, PyTuple_GET_ITEM(p, 1)));
      Py_DECREF(dist);
      if (*key == nullptr) return false;
      *tmpl = Py_NewRef(PyTuple_GET_ITEM(p, 3));
      return true;
    }
    // an input of the region: ("x", shape, stride, offset, dtype); CPU tensors and host-only
    // dtypes cannot be queued
    PyObject* cpu = PyObject_GetAttr(a, s_is_cpu);
    if (cpu == nullptr) return false;
    int is_cpu = PyObject_IsTrue(cpu);
    Py_DECREF(cpu);
    if (is_cpu) {
      if (is_cpu > 0) PyErr_SetNone(S.not_queueable);
      return false;
    }
    PyObject* dtype = PyObject_GetAttr(a, s_dtype);
    if (dtype == nullptr) return false;
    int host_only = PySet_Contains(S.host_only, dtype);
    if (host_only) {
      Py_DECREF(dtype);
      if (host_only > 0) PyErr_SetNone(S.not_queueable);
      return false;
    }
    PyObject* shape = PyObject_GetAttr(a, s_shape);
    PyObject* stride = shape ? PyObject_CallMethodNoArgs(a, s_stride) : nullptr;
    PyObject* offset = stride ? PyObject_CallMethodNoArgs(a, s_storage_offset) : nullptr;
    *key = offset ? untracked(PyTuple_Pack(5, s_x, shape, stride, offset, dtype)) : nullptr;
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(offset);
    Py_DECREF(dtype);
    if (*key == nullptr) return false;
    *tmpl = Py_NewRef(a);
    return true;
  }
  if (t == &PyFloat_Type && floats) {
    *key = Py_NewRef(S.float_key);
    *tmpl = Py_NewRef(a);
    return true;
  }
  if (t == &PyList_Type || t == &PyTuple_Type) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
    PyObject** items = PySequence_Fast_ITEMS(a);
    bool ints = top && t == &PyList_Type;
    for (Py_ssize_t i = 0; i < n && ints; ++i) ints = PyLong_CheckExact(items[i]);
    if (ints) {   // sizes, dims: ("ints", values)
      PyObject* values = PyList_AsTuple(a);
      if (values == nullptr) return false;
      *key = untracked(PyTuple_Pack(2, s_ints, values));
      Py_DECREF(values);
      if (*key == nullptr) return false;
      *tmpl = Py_NewRef(a);
      return true;
    }
    PyObject* keys = untracked(PyTuple_New(n));
    PyObject* tmpls = untracked(t == &PyList_Type ? PyList_New(n) : PyTuple_New(n));
    if (keys == nullptr || tmpls == nullptr) {
      Py_XDECREF(keys);
      Py_XDECREF(tmpls);
      return false;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject *k, *v;
      if (!describe_arg(items[i], pos, producers, floats, false, &k, &v)) {
        Py_DECREF(keys);
        Py_DECREF(tmpls);
        return false;
      }
      PyTuple_SET_ITEM(keys, i, k);
      if (t == &PyList_Type) PyList_SET_ITEM(tmpls, i, v);
      else PyTuple_SET_ITEM(tmpls, i, v);
    }
    *key = keys;
    *tmpl = tmpls;
    return true;
  }
  if (t == &PyLong_Type || t == &PyFloat_Type || t == &PyBool_Type) {   // (type, value)
    *key = untracked(pack2(reinterpret_cast<PyObject*>(t), a));
    if (*key == nullptr) return false;
    *tmpl = Py_NewRef(a);
    return true;
  }
  if (t == S.dtype_type) {
    int host_only = PySet_Contains(S.host_only, a);
    if (host_only) {
      if (host_only > 0) PyErr_SetNone(S.not_queueable);
      return false;
    }
  } else if (!(a == Py_None || t == &PyUnicode_Type || t == S.memory_format_type ||
               t == S.layout_type || t == S.device_type)) {
    PyErr_SetNone(S.not_queueable);
    return false;
  }
  *key = Py_NewRef(a);   // dtypes, None, strings, memory formats, layouts, devices: as they are
  *tmpl = Py_NewRef(a);
  return true;
}

// (key, templates, kwarg templates) as record.describe builds them; nullptr + exception. The
// key's tuples and the templates are untracked (python_objects.h): capture keeps them in the
// region cache for good, and none can be part of a cycle.
PyObject* describe(PyObject* f, PyObject* args, PyObject* kwargs, Py_ssize_t pos,
                   PyObject* producers, bool floats) {
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  Py_ssize_t nkw = (kwargs != nullptr && kwargs != Py_None) ? PyDict_GET_SIZE(kwargs) : 0;
  PyObject* keys = untracked(PyTuple_New(n + nkw));
  PyObject* targs = untracked(PyTuple_New(n));
  PyObject* tkw = nullptr;
  PyObject* names = nullptr;
  if (keys == nullptr || targs == nullptr) goto fail;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *k, *v;
    if (!describe_arg(PyTuple_GET_ITEM(args, i), pos, producers, floats, true, &k, &v)) goto fail;
    PyTuple_SET_ITEM(keys, i, k);
    PyTuple_SET_ITEM(targs, i, v);
  }
  if (nkw) {
    tkw = PyDict_New();
    names = PyDict_Keys(kwargs);
    if (tkw == nullptr || names == nullptr || PyList_Sort(names) < 0) goto fail;
    for (Py_ssize_t i = 0; i < nkw; ++i) {
      PyObject* name = PyList_GET_ITEM(names, i);
      PyObject *k, *v;
      PyObject* value = PyDict_GetItemWithError(kwargs, name);
      if (value == nullptr) goto fail;
      if (!describe_arg(value, pos, producers, floats, false, &k, &v)) goto fail;
      PyObject* named_key = untracked(PyTuple_Pack(2, name, k));
      Py_DECREF(k);
      int bad = named_key == nullptr || PyDict_SetItem(tkw, name, v) < 0;
      Py_DECREF(v);
      if (bad) {
        Py_XDECREF(named_key);
        goto fail;
      }
      k = named_key;
      PyTuple_SET_ITEM(keys, n + i, k);
    }
    Py_DECREF(names);
  }
  {
    PyObject* key = untracked(PyTuple_Pack(2, f, keys));
    Py_DECREF(keys);
    if (key == nullptr) {
      Py_DECREF(targs);
      Py_XDECREF(tkw);
      return nullptr;
    }
    PyObject* out = PyTuple_Pack(3, key, targs, tkw ? untracked(tkw) : Py_None);
    Py_DECREF(key);
    Py_DECREF(targs);
    Py_XDECREF(tkw);
    return out;
  }
fail:
  Py_XDECREF(keys);
  Py_XDECREF(targs);
  Py_XDECREF(tkw);
  Py_XDECREF(names);
  return nullptr;
}

bool int_vector(PyObject* tuple, std::vector<int64_t>* out) {
  if (!PyTuple_Check(tuple)) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: a FastOut's size and stride must be tuples");
    return false;
  }
  out->resize(static_cast<size_t>(PyTuple_GET_SIZE(tuple)));
  for (size_t i = 0; i < out->size(); ++i) {
    (*out)[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, static_cast<Py_ssize_t>(i)));
    if ((*out)[i] == -1 && PyErr_Occurred()) return false;
  }
  return true;
}

// A pending shell as shell.pending makes it, without a Python call: a PrivateUse1 tensor of the
// predicted size, stride and offset on a storage without bytes (they come when the region runs):
// dense, create_empty_tensor's (an empty storage of the device's shell allocator); strided, an
// unresizable storage of the bytes the strides span (_construct_storage_from_data_pointer's).
// (tensor, storage) as new references, or false with an exception set. `strides` and `off` are
// read only when not dense.
bool make_shell(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                int64_t off, PyObject* dtype, bool dense, PyObject** t, PyObject** st) {
  if (Py_TYPE(dtype) != S.dtype_type) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: a FastOut's dtype must be a torch.dtype");
    return false;
  }
  const c10::ScalarType type = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
  try {
    size_t nbytes = 0;
    if (!dense && c10::multiply_integers(sizes) > 0) {
      int64_t span = 1;
      for (size_t i = 0; i < sizes.size(); ++i) span += (sizes[i] - 1) * strides[i];
      nbytes = static_cast<size_t>(off + span) * c10::elementSize(type);
    }
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(nullptr, S.device),
                         dense ? S.allocator : nullptr, /*resizable=*/dense);
    at::Tensor tensor = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
        c10::scalarTypeToTypeMeta(type));
    if (dense) tensor.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
    else tensor.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, off);
    *t = THPVariable_Wrap(std::move(tensor));
    *st = *t ? THPStorage_Wrap(std::move(storage)) : nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return false;
  }
  if (*st == nullptr) Py_CLEAR(*t);
  return *t != nullptr;
}

// make_shell from a FastOut's Python size, stride and offset (tuples and an int).
bool new_shell(PyObject* size, PyObject* stride, PyObject* offset, PyObject* dtype, bool dense,
               PyObject** t, PyObject** st) {
  std::vector<int64_t> sizes, strides;
  if (!int_vector(size, &sizes) || (!dense && !int_vector(stride, &strides))) return false;
  int64_t off = dense ? 0 : PyLong_AsLongLong(offset);
  if (off == -1 && PyErr_Occurred()) return false;
  return make_shell(sizes, strides, off, dtype, dense, t, st);
}

PyObject* set_attr_none(PyObject* o, PyObject* name) {
  return PyObject_SetAttr(o, name, Py_None) < 0 ? nullptr : o;
}

// Past 90% of the capacity (Engine._admit_pending set _pressure): run what is queued right
// after handing this op's output out. False with an exception set.
bool flush_under_pressure() {
  PyObject* pressure = PyObject_GetAttr(S.engine, s_pressure);
  if (pressure == nullptr) return false;
  int p = PyObject_IsTrue(pressure);
  Py_DECREF(pressure);
  if (p <= 0) return p == 0;
  if (PyObject_SetAttr(S.engine, s_pressure, Py_False) < 0) return false;
  PyObject* r = PyObject_CallOneArg(S.flush, s_memory);
  Py_XDECREF(r);
  return r != nullptr;
}

// Engine._defer_one: hand out one pending tensor predicted by trie node ``nxt``.
PyObject* defer_one(PyObject* f, PyObject* described, PyObject* nxt, PyObject* fast,
                    PyObject* records, PyObject* producers, Py_ssize_t pos) {
  PyObject* size = PyTuple_GET_ITEM(fast, 0);
  PyObject* stride = PyTuple_GET_ITEM(fast, 1);
  PyObject* offset = PyTuple_GET_ITEM(fast, 2);
  PyObject* dtype = PyTuple_GET_ITEM(fast, 3);
  PyObject* nbytes = PyTuple_GET_ITEM(fast, 4);
  bool dense = PyTuple_GET_ITEM(fast, 5) == Py_True;
  bool queueable = PyTuple_GET_ITEM(fast, 6) == Py_True;
  PyObject* ref = PyTuple_GET_ITEM(fast, 7);

  long long nb = PyLong_AsLongLong(nbytes);
  if (nb == -1 && PyErr_Occurred()) return nullptr;
  if (nb) {   // the segment's bound on pending bytes (Engine._admit_pending past the headroom)
    PyObject* q = PyObject_GetAttr(S.engine, s_queued_bytes);
    if (q == nullptr) return nullptr;
    PyObject* q2 = PyNumber_Add(q, nbytes);
    Py_DECREF(q);
    if (q2 == nullptr || PyObject_SetAttr(S.engine, s_queued_bytes, q2) < 0) {
      Py_XDECREF(q2);
      return nullptr;
    }
    PyObject* head = PyObject_GetAttr(S.engine, s_headroom);
    int over = head == nullptr ? -1 : PyObject_RichCompareBool(q2, head, Py_GT);
    Py_DECREF(q2);
    Py_XDECREF(head);
    if (over < 0) return nullptr;
    if (over) {
      PyObject* r = PyObject_CallFunctionObjArgs(S.admit, f, nbytes, nullptr);
      if (r == nullptr) return nullptr;
      Py_DECREF(r);
    }
  }
  PyObject *t = nullptr, *st = nullptr;
  if (!new_shell(size, stride, offset, dtype, dense, &t, &st)) return nullptr;
  if (set_attr_none(st, s_h) == nullptr || set_attr_none(t, s_d) == nullptr) {
    Py_DECREF(st);
    Py_DECREF(t);
    return nullptr;   // shell.pending's two attributes
  }
  PyObject* tr = untracked(PyWeakref_NewRef(t, nullptr));
  PyObject* sr = untracked(PyWeakref_NewRef(st, nullptr));
  PyObject *tid = nullptr, *sid = nullptr, *pos_obj = nullptr, *outs = nullptr, *pair = nullptr;
  bool ok = tr && sr;
  if (ok && queueable) {
    pos_obj = PyLong_FromSsize_t(pos);
    tid = PyLong_FromVoidPtr(t);
    sid = PyLong_FromVoidPtr(st);
    ok = pos_obj && tid && sid;
    if (ok) {
      PyObject* a[4] = {Py_NewRef(pos_obj), PyLong_FromLong(0), Py_NewRef(tr), Py_NewRef(ref)};
      PyObject* pt = untracked(named(S.produced, 4, a));
      PyObject* b[4] = {Py_NewRef(pos_obj), PyLong_FromLong(0), Py_NewRef(sr), Py_NewRef(ref)};
      PyObject* ps = untracked(named(S.produced, 4, b));
      ok = pt && ps && PyDict_SetItem(producers, tid, pt) == 0 &&
           PyDict_SetItem(producers, sid, ps) == 0;
      Py_XDECREF(pt);
      Py_XDECREF(ps);
    }
  }
  if (ok) {
    pair = untracked(PyTuple_Pack(2, tr, sr));
    outs = pair ? untracked(PyList_New(1)) : nullptr;
    ok = outs != nullptr;
    if (ok) PyList_SET_ITEM(outs, 0, Py_NewRef(pair));
  }
  if (ok) {   // QueuedOp(facts, args, kwargs, key, outs, metas, structure, where, plan)
    PyObject* key = PyObject_GetAttr(nxt, s_key);   // the trie's key: this op's own copy dies now
    PyObject* metas = PyObject_GetAttr(nxt, s_metas);
    PyObject* where = PyObject_GetAttr(nxt, s_where);
    PyObject* plan = PyObject_GetAttr(nxt, s_plan);
    ok = key && metas && where && plan;
    if (ok) {
      PyObject* items[9] = {Py_NewRef(f),
                            Py_NewRef(PyTuple_GET_ITEM(described, 1)),
                            Py_NewRef(PyTuple_GET_ITEM(described, 2)),
                            key, Py_NewRef(outs), metas, Py_NewRef(s_t), where, plan};
      key = metas = where = plan = nullptr;
      PyObject* rec = untracked(named(S.queued, 9, items));
      ok = rec && PyList_Append(records, rec) == 0;
      Py_XDECREF(rec);
    }
    Py_XDECREF(key);
    Py_XDECREF(metas);
    Py_XDECREF(where);
    Py_XDECREF(plan);
  }
  ok = ok && PyObject_SetAttr(S.engine, s_node, nxt) == 0;
  if (ok) {   // tracking.executed gets it when read (deferred_counts)
    auto it = S.deferred.find(f);
    if (it == S.deferred.end()) S.deferred.emplace(Py_NewRef(f), 1);
    else ++it->second;
  }
  Py_XDECREF(tr);
  Py_XDECREF(sr);
  Py_XDECREF(tid);
  Py_XDECREF(sid);
  Py_XDECREF(pos_obj);
  Py_XDECREF(pair);
  Py_XDECREF(outs);
  Py_DECREF(st);
  if (!ok || !flush_under_pressure()) {
    Py_DECREF(t);
    return nullptr;
  }
  return t;
}

// Engine.launch's body with the lock held.
PyObject* launch_locked(PyObject* f, PyObject* args, PyObject* kwargs) {
  PyObject* node = PyObject_GetAttr(S.engine, s_node);
  if (node == nullptr) return nullptr;
  PyObject* result = nullptr;
  PyObject* described = nullptr;
  PyObject *records = nullptr, *producers = nullptr, *children = nullptr;
  if (node != Py_None) {
    PyObject* plain = PyDict_GetItemWithError(S.plain, f);   // borrowed
    if (plain == nullptr && PyErr_Occurred()) goto done;
    records = PyObject_GetAttr(S.engine, s_records);
    if (records == nullptr) goto done;
    if (plain == Py_True && PyList_Check(records)) {
      Py_ssize_t pos = PyList_GET_SIZE(records);
      PyObject* depth = PyObject_GetAttr(node, s_depth);
      if (depth == nullptr) goto done;
      Py_ssize_t d = PyLong_AsSsize_t(depth);
      Py_DECREF(depth);
      if (d == -1 && PyErr_Occurred()) goto done;
      if (d == pos) {   // the hot path: deferring along a known region, one op at a time
        PyObject* floats = PyObject_GetAttr(f, s_floats);
        if (floats == nullptr) goto done;
        int fl = PyObject_IsTrue(floats);
        Py_DECREF(floats);
        producers = PyObject_GetAttr(S.engine, s_producers);
        if (producers == nullptr) goto done;
        described = describe(f, args, kwargs, pos, producers, fl == 1);
        if (described == nullptr) {
          if (!PyErr_ExceptionMatches(S.not_queueable)) goto done;
          PyErr_Clear();
          ++S.slow;
          result = PyObject_CallFunctionObjArgs(S.py_adaptive, f, args, kwargs, nullptr);
          goto done;
        }
        children = PyObject_GetAttr(node, s_children);
        if (children == nullptr) goto done;
        PyObject* nxt = PyDict_GetItemWithError(children, PyTuple_GET_ITEM(described, 0));
        if (nxt == nullptr && PyErr_Occurred()) goto done;
        if (nxt != nullptr) {
          Py_INCREF(nxt);
          PyObject* fast = PyObject_GetAttr(nxt, s_fast);
          if (fast != nullptr && PyTuple_Check(fast) && PyTuple_GET_SIZE(fast) == 8) {
            result = defer_one(f, described, nxt, fast, records, producers, pos);
            Py_DECREF(fast);
            Py_DECREF(nxt);
            if (result != nullptr) ++S.fast;
            goto done;
          }
          Py_XDECREF(fast);
          Py_DECREF(nxt);
          if (PyErr_Occurred()) goto done;
        }
        ++S.slow;
        result = PyObject_CallFunctionObjArgs(S.py_adaptive, f, args, kwargs, described, nullptr);
        goto done;
      }
    }
  }
  ++S.slow;
  result = PyObject_CallFunctionObjArgs(S.py_adaptive, f, args, kwargs, nullptr);
done:
  Py_DECREF(node);
  Py_XDECREF(records);
  Py_XDECREF(producers);
  Py_XDECREF(children);
  Py_XDECREF(described);
  return result;
}

// launch(facts, args, kwargs): the device's seam.launch
PyObject* launch(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 3 || !PyTuple_Check(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: launch(facts, args: tuple, kwargs)");
    return nullptr;
  }
  if (S.engine == nullptr) return PyObject_Vectorcall(S.py_launch, argv, 3, nullptr);
  if (!mode_is_adaptive()) {   // eager mode: Engine.launch runs the op (after flushing a queue)
    PyObject* records = PyObject_GetAttr(S.engine, s_records);
    if (records == nullptr) return nullptr;
    bool empty = PyList_Check(records) && PyList_GET_SIZE(records) == 0;
    Py_DECREF(records);
    return PyObject_Vectorcall(empty ? S.execute : S.py_launch, argv, 3, nullptr);
  }
  PyObject* got = PyObject_CallNoArgs(S.acquire);
  if (got == nullptr) return nullptr;
  Py_DECREF(got);
  PyObject* result = launch_locked(argv[0], argv[1], argv[2]);
  // release with any exception of the launch kept
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
  PyObject* r = PyObject_CallNoArgs(S.release);
  if (r == nullptr) {
    Py_XDECREF(result);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    return nullptr;
  }
  Py_DECREF(r);
  PyErr_Restore(et, ev, tb);
  return result;
}

// describe(facts, args, kwargs, pos, producers): the C key builder alone (tests compare it with
// record.describe)
PyObject* describe_py(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 5 || !PyTuple_Check(argv[1]) || !PyDict_Check(argv[4])) {
    PyErr_SetString(PyExc_TypeError,
                    "neuron_lab: describe(facts, args: tuple, kwargs, pos: int, producers: dict)");
    return nullptr;
  }
  if (S.engine == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "neuron_lab: configure() first");
    return nullptr;
  }
  Py_ssize_t pos = PyLong_AsSsize_t(argv[3]);
  if (pos == -1 && PyErr_Occurred()) return nullptr;
  PyObject* floats = PyObject_GetAttr(argv[0], s_floats);
  if (floats == nullptr) return nullptr;
  int fl = PyObject_IsTrue(floats);
  Py_DECREF(floats);
  return describe(argv[0], argv[1], argv[2], pos, argv[4], fl == 1);
}

// shell.pending(size, stride, dtype, offset=0) and shell.pending_dense(size, dtype) in C: the
// shells Engine._defer hands out for ops with several outputs (SDPA's, a foreach op's list),
// ~20 us (strided) and ~2 us (dense) of Python each. Dense: offset 0 and torch's contiguous
// strides (size-1 dimensions' strides included), as shell.pending decides.
PyObject* pending_shell(PyObject* size, PyObject* stride, PyObject* dtype, PyObject* offset) {
  if (S.allocator == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "neuron_lab: configure() first");
    return nullptr;
  }
  std::vector<int64_t> sizes, strides;
  int64_t off = 0;
  if (!int_vector(size, &sizes)) return nullptr;
  bool dense = true;
  if (stride != nullptr) {
    if (!int_vector(stride, &strides)) return nullptr;
    if (strides.size() != sizes.size()) {
      PyErr_SetString(PyExc_ValueError, "neuron_lab: pending: size and stride lengths differ");
      return nullptr;
    }
    off = PyLong_AsLongLong(offset);
    if (off == -1 && PyErr_Occurred()) return nullptr;
    int64_t expect = 1;
    dense = off == 0;
    for (size_t i = sizes.size(); i-- > 0 && dense;) {
      dense = strides[i] == expect;
      expect *= std::max<int64_t>(sizes[i], 1);
    }
  }
  PyObject *t = nullptr, *st = nullptr;
  if (!make_shell(sizes, strides, off, dtype, dense, &t, &st)) return nullptr;
  bool ok = set_attr_none(st, s_h) != nullptr && set_attr_none(t, s_d) != nullptr;
  Py_DECREF(st);
  if (!ok) Py_CLEAR(t);
  return t;
}

PyObject* pending_py(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 3 && n != 4) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: pending(size, stride, dtype, offset=0)");
    return nullptr;
  }
  static PyObject* zero = PyLong_FromLong(0);
  PyObject* size = PySequence_Tuple(argv[0]);     // tuples as they are; lists, torch.Size
  PyObject* stride = size ? PySequence_Tuple(argv[1]) : nullptr;
  PyObject* t = stride ? pending_shell(size, stride, argv[2], n == 4 ? argv[3] : zero) : nullptr;
  Py_XDECREF(size);
  Py_XDECREF(stride);
  return t;
}

PyObject* pending_dense_py(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 2) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: pending_dense(size, dtype)");
    return nullptr;
  }
  PyObject* size = PySequence_Tuple(argv[0]);
  PyObject* t = size ? pending_shell(size, nullptr, argv[1], nullptr) : nullptr;
  Py_XDECREF(size);
  return t;
}

PyMethodDef pending_def = {"pending",
                           reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&pending_py)),
                           METH_FASTCALL, "pending(size, stride, dtype, offset=0): shell.pending"};
PyMethodDef pending_dense_def = {
    "pending_dense", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&pending_dense_py)),
    METH_FASTCALL, "pending_dense(size, dtype): shell.pending_dense"};

PyMethodDef describe_def = {"describe",
                            reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&describe_py)),
                            METH_FASTCALL, "describe(facts, args, kwargs, pos, producers)"};

PyMethodDef launch_def = {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&launch)),
                          METH_FASTCALL,
                          "launch(facts, args, kwargs): Engine.launch with its hot path in C"};

// {op name: ops deferred on the C path since the last call} (tracking.count_native)
py::dict deferred_counts() {
  py::dict out;
  for (auto& [f, n] : S.deferred) {
    if (n == 0) continue;
    py::object name = py::reinterpret_borrow<py::object>(f).attr("name");
    out[name] = py::int_(n) + out.attr("get")(name, 0);
    n = 0;
  }
  return out;
}

void configure(py::dict o) {
  hold(S.engine, o["engine"]);
  hold(S.acquire, o["lock"].attr("acquire"));
  hold(S.release, o["lock"].attr("release"));
  hold(S.plain, o["plain"]);
  hold(S.host_only, o["host_only"]);
  hold(S.dtype_type, o["dtype_type"]);
  hold(S.memory_format_type, o["memory_format_type"]);
  hold(S.layout_type, o["layout_type"]);
  hold(S.device_type, o["device_type"]);
  hold(S.not_queueable, o["not_queueable"]);
  hold(S.float_key, o["float_key"]);
  hold(S.produced, o["produced"]);
  hold(S.queued, o["queued"]);
  hold(S.mode, o["mode"]);
  hold(S.unset, o["unset"]);
  const c10::Storage& shell = THPStorage_Unpack(o["shell_storage"].ptr());
  S.allocator = shell.unsafeGetStorageImpl()->allocator();
  S.device = shell.device();
  hold(S.tensor, o["tensor"]);
  hold(S.execute, o["execute"]);
  hold(S.py_launch, o["engine"].attr("launch"));
  hold(S.py_adaptive, o["engine"].attr("_adaptive"));
  hold(S.admit, o["engine"].attr("_admit_pending"));
  hold(S.flush, o["engine"].attr("flush"));
  if (!PyType_IsSubtype(S.produced, &PyTuple_Type) || !PyType_IsSubtype(S.queued, &PyTuple_Type))
    throw py::type_error("neuron_lab: Produced and QueuedOp must be tuples (NamedTuples)");
  if (!PyDict_Check(S.plain)) throw py::type_error("neuron_lab: plain must be a dict");
}

}  // namespace

void init_deferral(py::module_& m) {
  s_node = intern("node");
  s_key = intern("key");
  s_records = intern("records");
  s_producers = intern("producers");
  s_depth = intern("depth");
  s_children = intern("children");
  s_fast = intern("fast");
  s_metas = intern("metas");
  s_where = intern("where");
  s_plan = intern("plan");
  s_queued_bytes = intern("queued_bytes");
  s_headroom = intern("headroom");
  s_pressure = intern("_pressure");
  s_floats = intern("floats_are_data");
  s_name = intern("name");
  s_value = intern("_value");
  s_env_value = intern("_env_value");
  s_untyped_storage = intern("untyped_storage");
  s_h = intern("_h");
  s_d = intern("_d");
  s_r = intern("r");
  s_ints = intern("ints");
  s_t = intern("t");
  s_memory = intern("memory");
  s_is_cpu = intern("is_cpu");
  s_dtype = intern("dtype");
  s_shape = intern("shape");
  s_stride = intern("stride");
  s_storage_offset = intern("storage_offset");
  s_x = intern("x");
  S.adaptive = intern("adaptive");
  m.def("configure", &configure,
        "configure({engine, lock, plain, ...}): the objects the hot path uses (fastpath.py)");
  m.def("deferred_counts", &deferred_counts,
        "{op name: ops deferred on the C path since the last call} (tracking.executed's share)");
  m.def("counts", [] { return py::make_tuple(S.fast, S.slow); },
        "(ops deferred on the C path, launches handed to the Python engine)");
  m.add_object("launch", py::reinterpret_steal<py::object>(PyCFunction_New(&launch_def, nullptr)));
  for (PyMethodDef* d : {&pending_def, &pending_dense_def})
    m.add_object(d->ml_name, py::reinterpret_steal<py::object>(PyCFunction_New(d, nullptr)));
  m.add_object("describe",
               py::reinterpret_steal<py::object>(PyCFunction_New(&describe_def, nullptr)));
}

}  // namespace neuron_lab
