// Per-op replay in C: replay.per_op_py in C (that is the reference, and what runs without the
// extension; tests/runtime/test_replay_native.py compares them). Each record's op runs on host
// tensors, in order, and each output still alive receives its value.
//
//   replay(records, host, fill, ref_type, device_type, host_device)
//       records      the queue (QueuedOp: facts, args, kwargs, key, outs, ...)
//       host         tensor_data.host: a tensor's host value (its cached ``_d`` read first:
// host_of)
//       fill         pending.fill(target, host value)
//       ref_type     record.Ref, the extension's (ref.h: ``pos``, ``k``, an output of an
//                    earlier op of the queue)
//       device_type  torch.device; a ``neuron`` one becomes host_device()'s
//
// An op that raises gets ``neuron_lab_failed = (index, record)`` on its exception, as the
// Python loop sets it (the engine names the op and the user's line). An op's host outputs are
// let go once the last op reading them (a Ref) has run, as eager lets an intermediate go
// (holding all of them to the end would keep a region's every intermediate alive at once).
// This loop is the Python loop in C: per op that one spent longer resolving arguments,
// flattening outputs and checking liveness than the op itself runs (docs/performance.md).
#include <torch/csrc/autograd/python_variable.h>

#include <vector>

#include "python_objects.h"   // device/csrc: intern
#include "queued_op.h"
#include "record.h"          // host_of
#include "ref.h"
#include "weak_outputs.h"     // weak_object

namespace py = pybind11;

namespace neuron_lab {
namespace {

PyObject *s_type, *s_failed, *s_neuron, *s_call;


struct Call {
  PyObject* host;
  PyObject* ref_type;
  PyObject* device_type;
  PyObject* host_device;
  std::vector<PyObject*>* vals;   // per op so far: its flattened host outputs (lists, owned;
                                  // nullptr once no later op reads them)
};

// last[j] = i for every Ref(j, .) in ``a`` (read by op i); false with an exception set.
void note_reads(PyObject* a, Py_ssize_t i, std::vector<Py_ssize_t>& last) {
  PyTypeObject* t = Py_TYPE(a);
  if (ref::is_ref(a)) {
    Py_ssize_t j = ref::as_ref(a).pos;
    if (j >= 0 && j < static_cast<Py_ssize_t>(last.size())) last[j] = i;
    return;
  }
  if (t == &PyList_Type || t == &PyTuple_Type) {
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(a); ++k)
      note_reads(PySequence_Fast_GET_ITEM(a, k), i, last);
  }
}

// replay._resolve: ``a`` with earlier outputs and device tensors replaced by host values.
// New reference, or nullptr with an exception set.
PyObject* resolve(PyObject* a, const Call& c) {
  PyTypeObject* t = Py_TYPE(a);
  if (ref::is_ref(a)) {
    const Py_ssize_t i = ref::as_ref(a).pos, j = ref::as_ref(a).k;
    if (i < 0 || i >= static_cast<Py_ssize_t>(c.vals->size()) || (*c.vals)[i] == nullptr ||
        j < 0 || j >= PyList_GET_SIZE((*c.vals)[i])) {
      PyErr_SetString(PyExc_IndexError, "neuron_lab: replay: a Ref past the outputs so far");
      return nullptr;
    }
    return Py_NewRef(PyList_GET_ITEM((*c.vals)[i], j));
  }
  if (THPVariable_Check(a)) return host_of(a, c.host);
  if (t == &PyList_Type || t == &PyTuple_Type) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
    PyObject* out = t == &PyList_Type ? PyList_New(n) : PyTuple_New(n);
    for (Py_ssize_t i = 0; out != nullptr && i < n; ++i) {
      PyObject* v = resolve(PySequence_Fast_GET_ITEM(a, i), c);
      if (v == nullptr) Py_CLEAR(out);
      else if (t == &PyList_Type) PyList_SET_ITEM(out, i, v);
      else PyTuple_SET_ITEM(out, i, v);
    }
    return out;
  }
  if (reinterpret_cast<PyObject*>(t) == c.device_type) {
    PyObject* type = PyObject_GetAttr(a, s_type);
    if (type == nullptr) return nullptr;
    int neuron = PyUnicode_Check(type) && PyUnicode_Compare(type, s_neuron) == 0;
    Py_DECREF(type);
    if (neuron) return PyObject_CallNoArgs(c.host_device);
  }
  return Py_NewRef(a);
}

// record.flatten_outputs: the tensor outputs in schema order (None where a return is not one)
PyObject* flatten(PyObject* out) {
  if (THPVariable_Check(out)) {
    PyObject* one = PyList_New(1);
    if (one != nullptr) PyList_SET_ITEM(one, 0, Py_NewRef(out));
    return one;
  }
  PyObject* res = PyList_New(0);
  if (res == nullptr || !(PyTuple_CheckExact(out) || PyList_CheckExact(out))) return res;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(out); ++i) {
    PyObject* o = PySequence_Fast_GET_ITEM(out, i);
    int bad = THPVariable_Check(o)   ? PyList_Append(res, o)
              : PyList_CheckExact(o) ? PyList_SetSlice(res, PY_SSIZE_T_MAX, PY_SSIZE_T_MAX, o)
                                     : PyList_Append(res, Py_None);
    if (bad < 0) {
      Py_DECREF(res);
      return nullptr;
    }
  }
  return res;
}

// pending.alive: the pending tensor behind (tensor weak ref, storage weak ref), or a live alias
// of its storage. A new reference; nullptr with no exception set where neither is alive, or
// with one set.
PyObject* alive(PyObject* pair) {
  if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) return nullptr;
  PyObject* t = weak_object(PyTuple_GET_ITEM(pair, 0));
  if (t != Py_None) return t;
  Py_DECREF(t);
  PyObject* sr = PyTuple_GET_ITEM(pair, 1);
  if (sr == Py_None) return nullptr;
  PyObject* st = weak_object(sr);
  if (st == Py_None) Py_CLEAR(st);
  return st;
}

// Mark the raised exception with the op that raised it: e.neuron_lab_failed = (i, rec).
void mark_failed(Py_ssize_t i, PyObject* rec) {
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
  PyErr_NormalizeException(&et, &ev, &tb);
  PyObject* where = Py_BuildValue("(nO)", i, rec);
  if (where == nullptr || ev == nullptr || PyObject_SetAttr(ev, s_failed, where) < 0)
    PyErr_Clear();   // an exception that takes no attributes: raised as it is
  Py_XDECREF(where);
  if (tb != nullptr && ev != nullptr) PyException_SetTraceback(ev, tb);
  PyErr_Restore(et, ev, tb);
}

// Record ``i``: its op run on host values (an exception it raises marked with the op), its live
// outputs filled; the flattened outputs (a new list), or nullptr with an exception set.
PyObject* run_one(Py_ssize_t i, PyObject* rec, const Call& c, PyObject* fill) {
  const queued_op::QueuedOpObject& q = queued_op::as_queued_op(rec);
  PyObject* targs = q.args;
  PyObject* tkw = q.kwargs;
  PyObject* args = resolve(targs, c);
  if (args != nullptr && !PyTuple_CheckExact(args)) Py_SETREF(args, PySequence_Tuple(args));
  PyObject* kwargs = nullptr;
  if (args != nullptr && PyDict_Check(tkw) && PyDict_GET_SIZE(tkw)) {
    kwargs = PyDict_New();
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    while (kwargs != nullptr && PyDict_Next(tkw, &pos, &k, &v)) {
      PyObject* r = resolve(v, c);
      if (r == nullptr || PyDict_SetItem(kwargs, k, r) < 0) Py_CLEAR(kwargs);
      Py_XDECREF(r);
    }
    if (kwargs == nullptr) Py_CLEAR(args);
  }
  if (args == nullptr) return nullptr;
  PyObject* call = PyObject_GetAttr(q.facts, s_call);
  PyObject* out = call ? PyObject_Call(call, args, kwargs) : nullptr;
  Py_XDECREF(call);
  Py_DECREF(args);
  Py_XDECREF(kwargs);
  PyObject* houts = out ? flatten(out) : nullptr;
  Py_XDECREF(out);
  if (houts == nullptr) {
    mark_failed(i, rec);
    return nullptr;
  }
  PyObject* outs = q.outs;
  Py_ssize_t n = PyList_Check(outs) ? PyList_GET_SIZE(outs) : 0;
  for (Py_ssize_t k = 0; k < n && k < PyList_GET_SIZE(houts); ++k) {
    PyObject* pair = PyList_GET_ITEM(outs, k);
    PyObject* h = PyList_GET_ITEM(houts, k);
    if (pair == Py_None || h == Py_None) continue;
    PyObject* tgt = alive(pair);
    if (tgt == nullptr) {
      if (!PyErr_Occurred()) continue;
      Py_DECREF(houts);
      return nullptr;
    }
    PyObject* r = PyObject_CallFunctionObjArgs(fill, tgt, h, nullptr);
    Py_DECREF(tgt);
    if (r == nullptr) {
      Py_DECREF(houts);
      return nullptr;
    }
    Py_DECREF(r);
  }
  return houts;
}

PyObject* replay(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 6 || !PyList_Check(argv[0])) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: replay(records: list, host, fill, ref_type, "
                                     "device_type, host_device)");
    return nullptr;
  }
  if (argv[3] != reinterpret_cast<PyObject*>(&ref::RefType)) {   // the fields read below
    PyErr_SetString(PyExc_TypeError, "neuron_lab: replay: ref_type must be the extension's Ref");
    return nullptr;
  }
  PyObject* records = argv[0];
  const Py_ssize_t n_rec = PyList_GET_SIZE(records);
  // last[j]: the last op that reads op j's outputs (-1: none does)
  std::vector<Py_ssize_t> last(n_rec, -1);
  for (Py_ssize_t i = 0; i < n_rec; ++i) {
    PyObject* rec = PyList_GET_ITEM(records, i);
    if (!queued_op::is_queued_op(rec)) {
      PyErr_SetString(PyExc_TypeError, "neuron_lab: replay: records must be QueuedOps");
      return nullptr;
    }
    note_reads(queued_op::as_queued_op(rec).args, i, last);
    PyObject* kw = queued_op::as_queued_op(rec).kwargs;
    if (PyDict_Check(kw)) {
      Py_ssize_t pos = 0;
      PyObject *k, *v;
      while (PyDict_Next(kw, &pos, &k, &v)) note_reads(v, i, last);
    }
  }
  // freed_after[first[i] .. first[i + 1]): the ops whose outputs are let go once op i ran
  std::vector<Py_ssize_t> first(n_rec + 1, 0), freed_after(n_rec);
  for (Py_ssize_t j = 0; j < n_rec; ++j) ++first[(last[j] < j ? j : last[j]) + 1];
  for (Py_ssize_t i = 0; i < n_rec; ++i) first[i + 1] += first[i];
  {
    std::vector<Py_ssize_t> at(first.begin(), first.end() - 1);
    for (Py_ssize_t j = 0; j < n_rec; ++j) freed_after[at[last[j] < j ? j : last[j]]++] = j;
  }
  std::vector<PyObject*> vals;
  Call c{argv[1], argv[3], argv[4], argv[5], &vals};
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < n_rec && i < PyList_GET_SIZE(records); ++i) {
    PyObject* rec = PyList_GET_ITEM(records, i);
    Py_INCREF(rec);   // the list may change under a fill's Python
    PyObject* houts = run_one(i, rec, c, argv[2]);
    if (houts == nullptr) ok = false;
    else vals.push_back(houts);
    Py_DECREF(rec);
    for (Py_ssize_t f = first[i]; ok && f < first[i + 1]; ++f) Py_CLEAR(vals[freed_after[f]]);
  }
  for (PyObject* v : vals) Py_XDECREF(v);
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

PyMethodDef replay_def = {"replay", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&replay)),
                          METH_FASTCALL,
                          "replay(records, host, fill, ref_type, device_type, host_device): "
                          "replay.per_op's loop in C"};

}  // namespace

void init_replay(py::module_& m) {
  s_type = intern("type");
  s_failed = intern("neuron_lab_failed");
  s_neuron = intern("neuron");
  s_call = intern("call");
  m.add_object("replay", py::reinterpret_steal<py::object>(PyCFunction_New(&replay_def, nullptr)));
}

}  // namespace neuron_lab
