// The key of an op call in C: record.describe's twin (the same keys, so the trie built by either
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

namespace py = pybind11;

namespace neuron_lab {
namespace deferral {
namespace {

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

// Can a value of ``dtype`` be queued? Host-only dtypes (dtypes.HOST_ONLY: float64, complex)
// cannot: false with record.NotQueueable set (or another error of the lookup).
bool queueable_dtype(PyObject* dtype) {
  int host_only = PySet_Contains(S.host_only, dtype);
  if (host_only > 0) PyErr_SetNone(S.not_queueable);
  return host_only == 0;
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
    if (THPVariable_CheckTypeExact(t) &&
        !THPVariable_Unpack(a).unsafeGetTensorImpl()->has_symbolic_sizes_strides())
      return input_key(a, key, tmpl);
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

}  // namespace

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

}  // namespace deferral

namespace {

using namespace deferral;

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

PyMethodDef describe_def = {"describe",
                            reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&describe_py)),
                            METH_FASTCALL, "describe(facts, args, kwargs, pos, producers)"};


}  // namespace

void init_deferral_keys(py::module_& m) {
  m.add_object("describe",
               py::reinterpret_steal<py::object>(PyCFunction_New(&describe_def, nullptr)));
}

}  // namespace neuron_lab
