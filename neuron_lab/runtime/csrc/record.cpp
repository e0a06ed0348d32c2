// The engine's record keeping in C: what Python does once per captured op and once per launch,
// done on the same Python objects (the Python function named with each is the reference, and
// what runs without the extension; tests/runtime/test_record_native.py compares them):
//
//   record_run(facts, targs, tkw, key, out, where, seg)                  record.record_run
//       capture's record of an op that ran now: QueuedOp(facts, targs, tkw, key, [None] * n,
//       (OutMeta or None,) * n, structure, where, None) queued on segment ``seg``, and the
//       producer entries (producers.h) of each output and of its storage seen with its
//       metadata, naming ref(pos, k). For a tensor, None, a tuple of tensors and Nones (``native_layer_norm``) or a
//       list of tensors (``_foreach_sqrt``); any other return value goes to the Python function.
//   live_outputs(records)                                                  pending.live_outputs
//       {(op, output)} whose pending storage is still alive.
//   scalar_values(scalars, records)                                        compiler.scalar_values
//       the region's data floats in plan order.
//   packed_scalars(scalars, records)                                      compiler.packed_scalars
//       the same, as the float64 host tensor a program takes them in.
//   host_inputs(occurrences, pattern, records, host)                       fused.host_inputs
//       a launch's program inputs: each distinct tensor at the plan's argument paths, as its
//       host tensor (``_d``, else ``host(t)``: tensor_data.host), or None if they alias otherwise.
//
// For the runtime's other C files (record.h): ``host_of`` (a tensor's cached host view),
// ``ref_of`` (the shared Ref of an output) and ``out_meta_of``.
//
// In Python these were microseconds per op (flatten, out_meta, structure_of, the record, two
// producer entries) on every captured op and on every launch (docs/performance.md).
#include <ATen/ops/empty.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <unordered_map>
#include <vector>

#include "python_objects.h"   // device/csrc: intern, hold
#include "out_meta.h"
#include "producers.h"
#include "queued_op.h"
#include "record.h"
#include "ref.h"
#include "segment.h"
#include "weak_outputs.h"

namespace py = pybind11;

namespace neuron_lab {
namespace {

struct Records {
  PyObject* host_only = nullptr;     // dtypes.HOST_ONLY
  PyObject* python = nullptr;        // record.record_run's Python body (other return values)
};
Records R;
PyObject *s_t, *s_d, *s_tuple, *s_list, *s_v_none;

// A tuple of ints, untracked (the cycle collector would untrack it at its first pass anyway)
PyObject* int_tuple(c10::IntArrayRef v) {
  PyObject* t = untracked(PyTuple_New(static_cast<Py_ssize_t>(v.size())));
  if (t == nullptr) return nullptr;
  for (size_t i = 0; i < v.size(); ++i) {
    PyObject* x = PyLong_FromLongLong(v[i]);
    if (x == nullptr) {
      Py_DECREF(t);
      return nullptr;
    }
    PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), x);
  }
  return t;
}

}  // namespace

namespace {

// The metadata of output ``ref`` (a record.Ref) of an earlier record: borrowed, or nullptr with
// an exception set
PyObject* meta_of_ref(PyObject* records, PyObject* ref) {
  const Py_ssize_t i = ref::as_ref(ref).pos, j = ref::as_ref(ref).k;
  PyObject* rec = i >= 0 && i < PyList_GET_SIZE(records) ? PyList_GET_ITEM(records, i) : nullptr;
  PyObject* metas = rec && queued_op::is_queued_op(rec) ? queued_op::as_queued_op(rec).metas
                                                        : nullptr;
  if (metas == nullptr || !PyTuple_Check(metas) || j < 0 || j >= PyTuple_GET_SIZE(metas)) {
    PyErr_SetString(PyExc_IndexError, "neuron_lab: record_run: a Ref past the records");
    return nullptr;
  }
  return PyTuple_GET_ITEM(metas, j);
}

// record._keeps_storage_entry: does captured output ``out`` (its metadata ``meta``) leave its
// storage's entry as it is? The caller's own tensor does (in place, out=), and so does an
// identity view: the op's one output (``single``), a view of argument 0 (a Ref) with its
// metadata, over a storage with a live entry. 1, 0, or -1 with an exception set.
int keeps_storage_entry(PyObject* out, PyObject* meta, bool single, PyObject* targs,
                        PyObject* tkw, PyObject* records, producers::ProducersObject* producers) {
  const Py_ssize_t n = PyTuple_Check(targs) ? PyTuple_GET_SIZE(targs) : 0;
  for (Py_ssize_t i = 0; i < n; ++i)
    if (PyTuple_GET_ITEM(targs, i) == out) return 1;
  if (tkw != nullptr && PyDict_Check(tkw)) {
    PyObject *name, *value;
    Py_ssize_t at = 0;
    while (PyDict_Next(tkw, &at, &name, &value))
      if (value == out) return 1;
  }
  if (!single || n == 0 || !ref::is_ref(PyTuple_GET_ITEM(targs, 0))) return 0;
  PyObject* src = meta_of_ref(records, PyTuple_GET_ITEM(targs, 0));
  if (src == nullptr) return -1;
  int same = PyObject_RichCompareBool(src, meta, Py_EQ);
  if (same <= 0) return same;
  if (producers::of_storage(producers, THPVariable_Unpack(out).storage(), meta) != nullptr)
    return 1;
  return PyErr_Occurred() ? -1 : 0;
}

// OutMeta(size, stride, offset, dtype) of tensor `t` (record.out_meta), untracked
PyObject* meta_of(const at::Tensor& t) {
  PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));  // borrowed
  return out_meta::make(int_tuple(t.sizes()), int_tuple(t.strides()),
                        PyLong_FromLongLong(t.storage_offset()), Py_NewRef(dtype));
}

// The tensor outputs of `out` in schema order (record.flatten_outputs: borrowed, nullptr where
// a return is None) and a new reference to its structure (record.structure_of), for the returns
// recorded here: a tensor, None, a tuple of tensors and Nones, a list of tensors. False without
// an exception: another return value (the Python function records it); with one: it failed.
bool flat_outputs(PyObject* out, std::vector<PyObject*>* flat, PyObject** structure) {
  if (THPVariable_CheckExact(out)) {
    flat->push_back(out);
    *structure = Py_NewRef(s_t);
    return true;
  }
  if (out == Py_None) {
    *structure = Py_NewRef(s_v_none);
    return true;
  }
  const bool is_tuple = PyTuple_CheckExact(out);
  if (!is_tuple && !PyList_CheckExact(out)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(out);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = PySequence_Fast_GET_ITEM(out, i);
    if (THPVariable_CheckExact(o)) flat->push_back(o);
    else if (o == Py_None && is_tuple) flat->push_back(nullptr);
    else return false;
  }
  if (!is_tuple) {
    *structure = Py_BuildValue("(On)", s_list, n);
    return *structure != nullptr;
  }
  PyObject* items = PyTuple_New(n);
  for (Py_ssize_t i = 0; items != nullptr && i < n; ++i)
    PyTuple_SET_ITEM(items, i, Py_NewRef((*flat)[i] != nullptr ? s_t : s_v_none));
  *structure = items != nullptr ? PyTuple_Pack(2, s_tuple, items) : nullptr;
  Py_XDECREF(items);
  return *structure != nullptr;
}

}  // namespace

PyObject* ref_of(Py_ssize_t pos, Py_ssize_t k) { return ref::shared(pos, k); }

namespace {

PyObject* record_run(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  segment::SegmentObject* seg = n == 7 ? segment::as_segment(argv[6]) : nullptr;
  if (seg == nullptr || !PyList_Check(seg->records) ||
      !PyObject_TypeCheck(seg->producers, &producers::ProducersType)) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: record_run(facts, targs, tkw, key, out, where, "
                                     "seg: Segment)");
    return nullptr;
  }
  if (R.python == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "neuron_lab: configure_records() first");
    return nullptr;
  }
  PyObject* records = seg->records;       // borrowed: the segment's own
  PyObject* map = seg->producers;
  std::vector<PyObject*> flat;
  PyObject* structure = nullptr;
  if (!flat_outputs(argv[4], &flat, &structure)) {
    if (PyErr_Occurred()) return nullptr;
    return PyObject_Vectorcall(R.python, argv, n, nullptr);
  }
  const auto m = static_cast<Py_ssize_t>(flat.size());
  const bool single = THPVariable_CheckExact(argv[4]);   // structure "t": one tensor returned
  PyObject* metas = untracked(PyTuple_New(m));
  PyObject* outs = metas ? untracked(PyList_New(m)) : nullptr;
  for (Py_ssize_t k = 0; outs != nullptr && k < m; ++k) {
    PyObject* meta =
        flat[k] != nullptr ? meta_of(THPVariable_Unpack(flat[k])) : Py_NewRef(Py_None);
    if (meta == nullptr) Py_CLEAR(outs);
    else PyTuple_SET_ITEM(metas, k, meta);
    if (outs != nullptr) PyList_SET_ITEM(outs, k, Py_NewRef(Py_None));
  }
  if (outs == nullptr) {
    Py_XDECREF(metas);
    Py_DECREF(structure);
    return nullptr;
  }
  Py_ssize_t p = PyList_GET_SIZE(records);
  PyObject* items[9] = {Py_NewRef(argv[0]), Py_NewRef(argv[1]), Py_NewRef(argv[2]),
                        Py_NewRef(argv[3]), outs, metas, structure, Py_NewRef(argv[5]),
                        Py_NewRef(Py_None)};
  PyObject* rec = queued_op::make(items);
  if (rec == nullptr) return nullptr;
  Py_INCREF(records);   // the appended-to list, whatever Python code run below does to ``seg``
  Py_INCREF(map);
  int bad = PyList_Append(records, rec);
  Py_DECREF(rec);
  if (bad) {
    Py_DECREF(records);
    Py_DECREF(map);
    return nullptr;
  }
  auto* producers = reinterpret_cast<producers::ProducersObject*>(map);
  bool ok = true;
  for (Py_ssize_t k = 0; ok && k < m; ++k) {
    PyObject* out = flat[k];
    if (out == nullptr) continue;
    PyObject* dtype = reinterpret_cast<PyObject*>(
        torch::getTHPDtype(THPVariable_Unpack(out).scalar_type()));   // borrowed
    int host_only = PySet_Contains(R.host_only, dtype);   // never a queued argument
    if (host_only) {
      ok = host_only > 0;
      continue;
    }
    PyObject* r = ref_of(p, k);
    PyObject* meta = PyTuple_GET_ITEM(metas, k);
    const at::Tensor& t = THPVariable_Unpack(out);
    ok = r != nullptr && producers::set_tensor(producers, t, r);
    int keep = ok ? keeps_storage_entry(out, meta, single, argv[1], argv[2], records, producers)
                  : -1;
    ok = keep == 1 || (keep == 0 && producers::set_view_storage(producers, t.storage(), meta, r));
    Py_XDECREF(r);
  }
  Py_DECREF(records);
  Py_DECREF(map);
  return ok ? Py_NewRef(Py_None) : nullptr;
}

PyObject* live_outputs(PyObject*, PyObject* records) {
  if (!PyList_Check(records)) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: live_outputs(records: list)");
    return nullptr;
  }
  PyObject* live = PySet_New(nullptr);
  if (live == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); ++i) {
    PyObject* rec = PyList_GET_ITEM(records, i);
    PyObject* outs = queued_op::is_queued_op(rec) ? queued_op::as_queued_op(rec).outs : nullptr;
    if (outs == nullptr || !PyList_Check(outs)) {
      Py_DECREF(live);
      PyErr_SetString(PyExc_TypeError, "neuron_lab: live_outputs: records must be QueuedOps");
      return nullptr;
    }
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(outs); ++k) {
      PyObject* pair = PyList_GET_ITEM(outs, k);
      if (pair == Py_None) continue;
      PyObject* sr = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2
                         ? PyTuple_GET_ITEM(pair, 1) : nullptr;
      int is_alive = sr != nullptr ? weak_alive(sr) : -1;
      if (is_alive < 0) {
        Py_DECREF(live);
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError,
                        "neuron_lab: live_outputs: an output must be None or (weak ref, weak ref)");
        return nullptr;
      }
      if (!is_alive) continue;
      PyObject* ik = Py_BuildValue("(nn)", i, k);
      if (ik == nullptr || PySet_Add(live, ik) < 0) {
        Py_XDECREF(ik);
        Py_DECREF(live);
        return nullptr;
      }
      Py_DECREF(ik);
    }
  }
  return live;
}

// records[i].args[where] (an int) or records[i].kwargs[where] (a name), then [sub] unless None;
// a new reference
PyObject* arg_at(PyObject* records, PyObject* entry) {
  PyObject *i_obj, *path, *where, *sub;
  if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2) goto bad;
  i_obj = PyTuple_GET_ITEM(entry, 0);
  path = PyTuple_GET_ITEM(entry, 1);
  if (!PyTuple_Check(path) || PyTuple_GET_SIZE(path) != 2) goto bad;
  where = PyTuple_GET_ITEM(path, 0);
  sub = PyTuple_GET_ITEM(path, 1);
  {
    Py_ssize_t i = PyLong_AsSsize_t(i_obj);
    if (i == -1 && PyErr_Occurred()) return nullptr;
    if (i < 0 || i >= PyList_GET_SIZE(records)) {
      PyErr_SetString(PyExc_IndexError, "neuron_lab: scalar_values: op index out of range");
      return nullptr;
    }
    PyObject* rec = PyList_GET_ITEM(records, i);
    if (!queued_op::is_queued_op(rec)) goto bad;
    const queued_op::QueuedOpObject& q = queued_op::as_queued_op(rec);
    PyObject* a = PyObject_GetItem(PyLong_CheckExact(where) ? q.args : q.kwargs, where);
    if (a == nullptr || sub == Py_None) return a;
    PyObject* v = PyObject_GetItem(a, sub);
    Py_DECREF(a);
    return v;
  }
bad:
  PyErr_SetString(PyExc_TypeError,
                  "neuron_lab: scalar_values(((op, (where, sub)), ...), records: [QueuedOp])");
  return nullptr;
}

PyObject* scalar_values(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 2 || !PyList_Check(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: scalar_values(scalars, records: list)");
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(argv[0], "neuron_lab: scalar_values: scalars must be a sequence");
  if (seq == nullptr) return nullptr;
  Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
  PyObject* out = PyList_New(m);
  for (Py_ssize_t j = 0; out != nullptr && j < m; ++j) {
    PyObject* v = arg_at(argv[1], PySequence_Fast_GET_ITEM(seq, j));
    if (v == nullptr) {
      Py_CLEAR(out);
      break;
    }
    PyList_SET_ITEM(out, j, v);
  }
  Py_DECREF(seq);
  return out;
}

// packed_scalars(scalars, records): the same floats as a float64 host tensor, written in place
// (torch.tensor of a Python list costs a Python call per float, on every launch)
PyObject* packed_scalars(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 2 || !PyList_Check(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: packed_scalars(scalars, records: list)");
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(argv[0], "neuron_lab: packed_scalars: scalars must be a sequence");
  if (seq == nullptr) return nullptr;
  const Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
  at::Tensor out;
  try {
    out = at::empty({m}, at::TensorOptions().dtype(at::kDouble));
  } catch (const std::exception& e) {
    Py_DECREF(seq);
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  double* data = out.data_ptr<double>();
  for (Py_ssize_t j = 0; j < m; ++j) {
    PyObject* v = arg_at(argv[1], PySequence_Fast_GET_ITEM(seq, j));
    double d = v ? PyFloat_AsDouble(v) : -1.0;
    Py_XDECREF(v);
    if (v == nullptr || (d == -1.0 && PyErr_Occurred())) {
      Py_DECREF(seq);
      return nullptr;
    }
    data[j] = d;
  }
  Py_DECREF(seq);
  return THPVariable_Wrap(std::move(out));
}

PyObject* host_inputs(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 4 || !PyTuple_Check(argv[0]) || !PyTuple_Check(argv[1]) || !PyList_Check(argv[2]) ||
      PyTuple_GET_SIZE(argv[0]) != PyTuple_GET_SIZE(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: host_inputs(occurrences: tuple, pattern: tuple "
                                     "of the same length, records: list, host)");
    return nullptr;
  }
  PyObject* inputs = PyList_New(0);
  if (inputs == nullptr) return nullptr;
  std::unordered_map<PyObject*, Py_ssize_t> slots;   // tensor -> its input slot (the records
                                                     // hold every tensor alive meanwhile)
  for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(argv[0]); ++j) {
    PyObject* t = arg_at(argv[2], PyTuple_GET_ITEM(argv[0], j));
    Py_ssize_t want = t ? PyLong_AsSsize_t(PyTuple_GET_ITEM(argv[1], j)) : -1;
    if (t == nullptr || (want == -1 && PyErr_Occurred())) {
      Py_XDECREF(t);
      Py_DECREF(inputs);
      return nullptr;
    }
    auto found = slots.emplace(t, static_cast<Py_ssize_t>(slots.size()));
    Py_ssize_t got = found.first->second;
    if (got != want) {   // the inputs alias otherwise than when the program was compiled
      Py_DECREF(t);
      Py_DECREF(inputs);
      Py_RETURN_NONE;
    }
    if (found.second) {
      PyObject* h = host_of(t, argv[3]);
      if (h == nullptr || PyList_Append(inputs, h) < 0) {
        Py_XDECREF(h);
        Py_DECREF(t);
        Py_DECREF(inputs);
        return nullptr;
      }
      Py_DECREF(h);
    }
    Py_DECREF(t);
  }
  return inputs;
}

PyMethodDef record_run_def = {
    "record_run", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&record_run)),
    METH_FASTCALL, "record_run(facts, targs, tkw, key, out, where, seg): "
                   "record.record_run in C"};
PyMethodDef live_outputs_def = {"live_outputs", reinterpret_cast<PyCFunction>(&live_outputs),
                                METH_O, "live_outputs(records): pending.live_outputs in C"};
PyMethodDef scalar_values_def = {
    "scalar_values", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&scalar_values)),
    METH_FASTCALL, "scalar_values(scalars, records): compiler.scalar_values in C"};
PyMethodDef packed_scalars_def = {
    "packed_scalars", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&packed_scalars)),
    METH_FASTCALL, "packed_scalars(scalars, records): compiler.packed_scalars in C"};
PyMethodDef host_inputs_def = {
    "host_inputs", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&host_inputs)),
    METH_FASTCALL, "host_inputs(occurrences, pattern, records, host): fused.host_inputs in C"};

void configure_records(py::dict o) {
  hold(R.host_only, o["host_only"]);
  hold(R.python, o["python"]);
}

}  // namespace

PyObject* out_meta_of(PyObject* t) {
  return meta_of(THPVariable_Unpack(t));
}

PyObject* host_of(PyObject* t, PyObject* host) {
  PyObject** dictptr = _PyObject_GetDictPtr(t);
  if (dictptr != nullptr && *dictptr != nullptr) {
    PyObject* d = PyDict_GetItemWithError(*dictptr, s_d);   // borrowed
    if (d != nullptr && d != Py_None) return Py_NewRef(d);
    if (d == nullptr && PyErr_Occurred()) return nullptr;
  }
  return PyObject_CallOneArg(host, t);
}

void init_record(py::module_& m) {
  s_t = intern("t");
  s_tuple = intern("tuple");
  s_list = intern("list");
  s_v_none = Py_BuildValue("(sO)", "v", Py_None);   // structure_of(None), and of a None return
  s_d = intern("_d");
  m.def("configure_records", &configure_records,
        "configure_records({host_only, python}) (record.py)");
  for (PyMethodDef* d : {&record_run_def, &live_outputs_def, &scalar_values_def,
                         &packed_scalars_def, &host_inputs_def})
    m.add_object(d->ml_name, py::reinterpret_steal<py::object>(PyCFunction_New(d, nullptr)));
}

}  // namespace neuron_lab
