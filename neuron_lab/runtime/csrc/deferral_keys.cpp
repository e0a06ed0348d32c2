// The key of an op call in C: record.describe in C (the same keys, so the trie built by either
// matches the other; tests/runtime/test_fastpath.py compares them), used by the deferral hot
// path (deferral.cpp) and, as ``describe``, by capture (Engine.describe, ~3 us less per op).
//
//   key      (facts, (arg keys...)): a tensor made earlier in the segment ("r", distance, k), a
//            region input ("x", shape, stride, offset, dtype), a float that is data FLOAT, a
//            top-level list of ints ("ints", values), other lists and tuples element by
//            element, numbers (type, value), kwargs (name, key) sorted;
//   templates the arguments with every tensor made in the segment replaced by its Ref.
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>

#include "deferral.h"
#include "producers.h"
#include "record.h"   // out_meta_of
#include "ref.h"

namespace py = pybind11;

namespace neuron_lab {
namespace deferral {
namespace {

// A tensor made earlier in this segment: the Ref of its producer entry, or nullptr (borrowed).
// A C++ shallow copy of an output (``.data``, autograd's saved outputs: no cached host view) is
// found through its storage: a captured output's with the copy's metadata (a view shares its
// base's storage), else a pending output's; it gets an entry of its own (record._by_storage).
PyObject* producer_of(PyObject* a, producers::ProducersObject* producers) {
  const at::Tensor& t = THPVariable_Unpack(a);
  PyObject* r = producers::of_tensor(producers, t.unsafeGetTensorImpl());
  if (r != nullptr) return r;
  PyObject** dictptr = _PyObject_GetDictPtr(a);
  if (dictptr != nullptr && *dictptr != nullptr) {
    int has = PyDict_Contains(*dictptr, s_d);
    if (has != 0) return nullptr;   // a device tensor with a host view (or pending): not a copy
  }
  const c10::Storage& st = t.unsafeGetTensorImpl()->unsafe_storage();   // storage() may throw
  if (!st) return nullptr;   // sparse: no storage, so no shallow copy of an output
  PyObject* meta = out_meta_of(a);
  r = meta ? producers::of_storage(producers, st, meta) : nullptr;
  Py_XDECREF(meta);
  if (r == nullptr) return nullptr;
  return producers::set_tensor(producers, t, r) ? r : nullptr;   // r: still the storage's
}

PyObject* pack2(PyObject* a, PyObject* b) { return PyTuple_Pack(2, a, b); }

// Can a value of ``dtype`` be queued? Host-only dtypes (dtypes.HOST_ONLY: float64, complex)
// cannot: false with record.NotQueueable set (or another error of the lookup).
bool queueable_dtype(PyObject* dtype) {
  int host_only = PySet_Contains(S.host_only, dtype);
  if (host_only > 0) PyErr_SetNone(S.not_queueable);
  return host_only == 0;
}

// Is ``a`` (a tensor) a region input whose key is read from its TensorImpl: a plain tensor or
// Parameter without symbolic sizes? A subclass, or symbolic sizes, go through the attributes.
bool impl_readable(PyObject* a) {
  return THPVariable_CheckTypeExact(Py_TYPE(a)) &&
         !THPVariable_Unpack(a).unsafeGetTensorImpl()->has_symbolic_sizes_strides();
}

// The key of a region input that is a plain tensor or Parameter, read from its TensorImpl: the
// same ("x", torch.Size, stride tuple, offset, dtype) the Python attributes give (five calls
// through the interpreter that were ~7 % of a deferred op's host time). A subclass, or a tensor
// with symbolic sizes, takes the Python attributes (describe_arg).
bool input_key(PyObject* a, PyObject** key, PyObject** tmpl) {
  const at::Tensor& t = THPVariable_Unpack(a);
  if (t.is_cpu()) {
    PyErr_SetNone(S.not_queueable);
    return false;
  }
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));  // borrowed
  if (!queueable_dtype(dtype)) return false;
  const int64_t dim = t.dim();
  PyObject* shape = untracked(S.size_type->tp_alloc(S.size_type, dim));   // torch.Size (THPSize)
  PyObject* stride = shape ? untracked(PyTuple_New(dim)) : nullptr;
  PyObject* offset = stride ? PyLong_FromLongLong(t.storage_offset()) : nullptr;
  bool ok = offset != nullptr;
  for (int64_t i = 0; ok && i < dim; ++i) {
    PyObject* n = PyLong_FromLongLong(t.sizes()[i]);
    PyObject* s = n ? PyLong_FromLongLong(t.strides()[i]) : nullptr;
    ok = s != nullptr;
    if (n) PyTuple_SET_ITEM(shape, i, n);
    if (s) PyTuple_SET_ITEM(stride, i, s);
  }
  *key = ok ? untracked(PyTuple_Pack(5, s_x, shape, stride, offset, dtype)) : nullptr;
  Py_XDECREF(shape);
  Py_XDECREF(stride);
  Py_XDECREF(offset);
  if (*key == nullptr) return false;
  *tmpl = Py_NewRef(a);
  return true;
}

// The key and template of one argument (record._describe); false with an exception set
// (record.NotQueueable for a call that cannot be queued). ``top``: a positional argument of
// the op, where a list of plain ints is keyed ("ints", values) (record.describe).
bool describe_arg(PyObject* a, Py_ssize_t pos, producers::ProducersObject* producers,
                  bool floats, bool top,
                  PyObject** key, PyObject** tmpl) {
  PyTypeObject* t = Py_TYPE(a);
  if (t == S.tensor || PyType_IsSubtype(t, S.tensor)) {
    PyObject* p = producer_of(a, producers);
    if (p == nullptr && PyErr_Occurred()) return false;
    if (p != nullptr) {
      const ref::RefObject& e = ref::as_ref(p);
      PyObject* dist = PyLong_FromSsize_t(pos - e.pos);
      PyObject* k = dist ? PyLong_FromSsize_t(e.k) : nullptr;
      *key = k ? untracked(PyTuple_Pack(3, s_r, dist, k)) : nullptr;
      Py_XDECREF(dist);
      Py_XDECREF(k);
      if (*key == nullptr) return false;
      *tmpl = Py_NewRef(p);
      return true;
    }
    // an input of the region: ("x", shape, stride, offset, dtype); CPU tensors and host-only
    // dtypes cannot be queued
    if (impl_readable(a)) return input_key(a, key, tmpl);
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
    if (!queueable_dtype(dtype)) {
      Py_DECREF(dtype);
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
    if (!queueable_dtype(a)) return false;
  } else if (!(a == Py_None || t == &PyUnicode_Type || t == S.memory_format_type ||
               t == S.layout_type || t == S.device_type)) {
    PyErr_SetNone(S.not_queueable);
    return false;
  }
  *key = Py_NewRef(a);   // dtypes, None, strings, memory formats, layouts, devices: as they are
  *tmpl = Py_NewRef(a);
  return true;
}

// Is ``o`` the int ``v``? (An int key item compared without building one.)
bool is_int(PyObject* o, Py_ssize_t v) {
  if (!PyLong_CheckExact(o)) return false;
  Py_ssize_t x = PyLong_AsSsize_t(o);
  if (x == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return x == v;
}

// Is ``o`` a tuple (torch.Size too) of the ints ``v``?
bool is_ints(PyObject* o, c10::IntArrayRef v) {
  if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != static_cast<Py_ssize_t>(v.size())) return false;
  for (size_t i = 0; i < v.size(); ++i)
    if (!is_int(PyTuple_GET_ITEM(o, static_cast<Py_ssize_t>(i)), v[i])) return false;
  return true;
}

// Is ``o`` the str ``tag`` (an interned "r", "x", "ints")?
bool is_tag(PyObject* o, PyObject* tag) {
  return o == tag || (PyUnicode_CheckExact(o) && PyUnicode_Compare(o, tag) == 0);
}

// ``a == b`` as the dict lookup compares keys (identity first): 1, 0, or -1 with an exception.
int same(PyObject* a, PyObject* b) { return a == b ? 1 : PyObject_RichCompareBool(a, b, Py_EQ); }

// Does one argument's key equal ``want`` (describe_arg's key), and its template? The common
// arguments are compared where they are (a tensor made earlier in the segment against ("r",
// distance, k), a plain region input's TensorImpl against ("x", size, stride, offset, dtype), a
// float that is data, a list of ints); any other is described and compared. 1 with ``*tmpl``
// set, 0 where the key differs or the call cannot be queued, -1 with an exception.
int match_arg(PyObject* a, PyObject* want, Py_ssize_t pos,
              producers::ProducersObject* producers, bool floats,
              bool top, PyObject** tmpl) {
  PyTypeObject* t = Py_TYPE(a);
  if (t == S.tensor || PyType_IsSubtype(t, S.tensor)) {
    PyObject* p = producer_of(a, producers);
    if (p == nullptr && PyErr_Occurred()) return -1;
    if (p != nullptr) {
      if (!PyTuple_CheckExact(want) || PyTuple_GET_SIZE(want) != 3 ||
          !is_tag(PyTuple_GET_ITEM(want, 0), s_r))
        return 0;
      const ref::RefObject& e = ref::as_ref(p);
      if (!is_int(PyTuple_GET_ITEM(want, 1), pos - e.pos) ||
          !is_int(PyTuple_GET_ITEM(want, 2), e.k))
        return 0;
      *tmpl = Py_NewRef(p);
      return 1;
    }
    if (impl_readable(a)) {
      const at::Tensor& x = THPVariable_Unpack(a);
      if (x.is_cpu() || !PyTuple_CheckExact(want) || PyTuple_GET_SIZE(want) != 5 ||
          !is_tag(PyTuple_GET_ITEM(want, 0), s_x) ||
          PyTuple_GET_ITEM(want, 4) !=
              reinterpret_cast<PyObject*>(torch::getTHPDtype(x.scalar_type())) ||
          !is_int(PyTuple_GET_ITEM(want, 3), x.storage_offset()) ||
          !is_ints(PyTuple_GET_ITEM(want, 1), x.sizes()) ||
          !is_ints(PyTuple_GET_ITEM(want, 2), x.strides()))
        return 0;   // (the key's dtype was queueable when it was stored: HOST_ONLY is fixed)
      *tmpl = Py_NewRef(a);
      return 1;
    }   // a subclass, symbolic sizes: described and compared below
  } else if (t == &PyFloat_Type && floats) {
    int eq = same(want, S.float_key);
    if (eq == 1) *tmpl = Py_NewRef(a);
    return eq;
  } else if (top && t == &PyList_Type && PyTuple_CheckExact(want) && PyTuple_GET_SIZE(want) == 2 &&
      is_tag(PyTuple_GET_ITEM(want, 0), s_ints)) {
    PyObject* values = PyTuple_GET_ITEM(want, 1);
    Py_ssize_t n = PyList_GET_SIZE(a);
    if (!PyTuple_Check(values) || PyTuple_GET_SIZE(values) != n) return 0;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* v = PyList_GET_ITEM(a, i);
      if (!PyLong_CheckExact(v)) return 0;   // not all ints: keyed item by item, not "ints"
      int eq = same(PyTuple_GET_ITEM(values, i), v);
      if (eq != 1) return eq;
    }
    *tmpl = Py_NewRef(a);
    return 1;
  }
  PyObject *k, *v;
  if (!describe_arg(a, pos, producers, floats, top, &k, &v)) {
    if (!PyErr_ExceptionMatches(S.not_queueable)) return -1;
    PyErr_Clear();   // describe raises it again on the way to the Python engine
    return 0;
  }
  int eq = same(want, k);
  Py_DECREF(k);
  if (eq == 1) *tmpl = v;
  else Py_DECREF(v);
  return eq;
}

}  // namespace

int match_key(PyObject* f, PyObject* args, PyObject* kwargs, Py_ssize_t pos,
              producers::ProducersObject* producers,
              bool floats, PyObject* key, PyObject** targs, PyObject** tkw) {
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  Py_ssize_t nkw = (kwargs != nullptr && kwargs != Py_None) ? PyDict_GET_SIZE(kwargs) : 0;
  if (!PyTuple_CheckExact(key) || PyTuple_GET_SIZE(key) != 2) return 0;
  PyObject* keys = PyTuple_GET_ITEM(key, 1);
  if (!PyTuple_CheckExact(keys) || PyTuple_GET_SIZE(keys) != n + nkw) return 0;
  int eq = same(PyTuple_GET_ITEM(key, 0), f);
  if (eq != 1) return eq;
  PyObject* ta = untracked(PyTuple_New(n));
  if (ta == nullptr) return -1;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* v;
    eq = match_arg(PyTuple_GET_ITEM(args, i), PyTuple_GET_ITEM(keys, i), pos, producers, floats,
                   true, &v);
    if (eq != 1) {
      Py_DECREF(ta);
      return eq;
    }
    PyTuple_SET_ITEM(ta, i, v);
  }
  PyObject* kw = Py_NewRef(Py_None);
  if (nkw) {   // (name, key) pairs in name order, as describe sorts them
    Py_DECREF(kw);
    kw = untracked(PyDict_New());
    PyObject* names = kw ? PyDict_Keys(kwargs) : nullptr;
    eq = names != nullptr && PyList_Sort(names) == 0 ? 1 : -1;
    for (Py_ssize_t i = 0; eq == 1 && i < nkw; ++i) {
      PyObject* name = PyList_GET_ITEM(names, i);
      PyObject* want = PyTuple_GET_ITEM(keys, n + i);
      PyObject* value = PyDict_GetItemWithError(kwargs, name);   // borrowed
      if (value == nullptr) {
        eq = -1;
        break;
      }
      if (!PyTuple_CheckExact(want) || PyTuple_GET_SIZE(want) != 2) {
        eq = 0;
        break;
      }
      eq = same(PyTuple_GET_ITEM(want, 0), name);
      PyObject* v = nullptr;
      if (eq == 1)
        eq = match_arg(value, PyTuple_GET_ITEM(want, 1), pos, producers, floats, false, &v);
      if (eq == 1 && PyDict_SetItem(kw, name, v) < 0) eq = -1;
      Py_XDECREF(v);
    }
    Py_XDECREF(names);
    if (eq != 1) {
      Py_XDECREF(kw);
      Py_DECREF(ta);
      return eq;
    }
  }
  *targs = ta;
  *tkw = kw;
  return 1;
}

// (key, templates, kwarg templates) as record.describe builds them; nullptr + exception. The
// key's tuples and the templates are untracked (python_objects.h): capture keeps them in the
// region cache for good, and none can be part of a cycle.
PyObject* describe(PyObject* f, PyObject* args, PyObject* kwargs, Py_ssize_t pos,
                   producers::ProducersObject* producers, bool floats) {
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

}  // namespace deferral

namespace {

using namespace deferral;

// The test entry points' arguments, (facts, args: tuple, kwargs, pos: int, producers: Producers,
// ...): ``pos`` and the op's floats_are_data; false with an exception set.
bool test_call(PyObject* const* argv, Py_ssize_t n, Py_ssize_t want, const char* usage,
               Py_ssize_t* pos, bool* floats) {
  if (n != want || !PyTuple_Check(argv[1]) ||
      !PyObject_TypeCheck(argv[4], &producers::ProducersType)) {
    PyErr_SetString(PyExc_TypeError, usage);
    return false;
  }
  if (S.op_bits == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "neuron_lab: configure() first");
    return false;
  }
  *pos = PyLong_AsSsize_t(argv[3]);
  if (*pos == -1 && PyErr_Occurred()) return false;
  PyObject* bits = PyObject_CallOneArg(S.op_bits_of, argv[0]);   // verdict.op_bits(facts)
  if (bits == nullptr) return false;
  long b = PyLong_AsLong(bits);
  Py_DECREF(bits);
  if (b == -1 && PyErr_Occurred()) return false;
  *floats = b & S.floats_bit;
  return true;
}

// describe(facts, args, kwargs, pos, producers): the C key builder alone (tests compare it with
// record.describe)
PyObject* describe_py(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  Py_ssize_t pos;
  bool floats;
  if (!test_call(argv, n, 5, "neuron_lab: describe(facts, args: tuple, kwargs, pos: int, "
                             "producers: Producers)", &pos, &floats))
    return nullptr;
  return describe(argv[0], argv[1], argv[2], pos,
                  reinterpret_cast<producers::ProducersObject*>(argv[4]), floats);
}

PyMethodDef describe_def = {"describe",
                            reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&describe_py)),
                            METH_FASTCALL, "describe(facts, args, kwargs, pos, producers)"};

// match_key(facts, args, kwargs, pos, producers, key): the hot path's comparison alone (tests
// compare it with record.describe's keys): (templates, kwarg templates), or None where the
// call's key is not ``key``
PyObject* match_key_py(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  Py_ssize_t pos;
  bool floats;
  if (!test_call(argv, n, 6, "neuron_lab: match_key(facts, args: tuple, kwargs, pos: int, "
                             "producers: Producers, key)", &pos, &floats))
    return nullptr;
  PyObject *targs, *tkw;
  int m = match_key(argv[0], argv[1], argv[2], pos,
                    reinterpret_cast<producers::ProducersObject*>(argv[4]), floats, argv[5], &targs,
                    &tkw);
  if (m < 0) return nullptr;
  if (m == 0) Py_RETURN_NONE;
  PyObject* out = PyTuple_Pack(2, targs, tkw);
  Py_DECREF(targs);
  Py_DECREF(tkw);
  return out;
}

PyMethodDef match_key_def = {"match_key",
                             reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&match_key_py)),
                             METH_FASTCALL, "match_key(facts, args, kwargs, pos, producers, key)"};

}  // namespace

void init_deferral_keys(py::module_& m) {
  m.add_object("describe",
               py::reinterpret_steal<py::object>(PyCFunction_New(&describe_def, nullptr)));
  m.add_object("match_key",
               py::reinterpret_steal<py::object>(PyCFunction_New(&match_key_def, nullptr)));
}

}  // namespace neuron_lab
