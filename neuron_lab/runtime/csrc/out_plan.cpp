// output_plans.OutSpec and output_plans.FastOut as C types (out_plan.h):
// ``_runtime_ext.OutSpec(kind, arg, meta, nbytes, dense=False, queueable=True, view=False)`` and
// ``_runtime_ext.FastOut(size, stride, offset, dtype, nbytes, dense, queueable, ref,
// same_as=None, view=False)``, with the Python references' field names and order; they pickle as those
// calls.
#include "out_plan.h"

#include <pybind11/pybind11.h>
#include <structmember.h>

#include "c_types.h"

namespace py = pybind11;

namespace neuron_lab {
namespace out_plan {
namespace {

// --- OutSpec -------------------------------------------------------------------------------
void spec_dealloc(PyObject* self) {
  auto* s = reinterpret_cast<OutSpecObject*>(self);
  Py_CLEAR(s->arg);
  Py_CLEAR(s->meta);
  Py_TYPE(self)->tp_free(self);
}

PyObject* spec_new(PyTypeObject*, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"kind", "arg", "meta", "nbytes", "dense", "queueable", "view",
                                nullptr};
  long kind = 0;
  PyObject *arg = nullptr, *meta = nullptr;
  Py_ssize_t nbytes = 0;
  int dense = 0, queueable = 1, view = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "lOOn|ppp:OutSpec", const_cast<char**>(names),
                                   &kind, &arg, &meta, &nbytes, &dense, &queueable, &view))
    return nullptr;
  PyObject* self = OutSpecType.tp_alloc(&OutSpecType, 0);
  if (self == nullptr) return nullptr;
  auto* s = reinterpret_cast<OutSpecObject*>(self);
  s->kind = kind;
  s->arg = Py_NewRef(arg);
  s->meta = Py_NewRef(meta);
  s->nbytes = nbytes;
  s->dense = dense;
  s->queueable = queueable;
  s->view = view;
  return self;
}

PyObject* spec_repr(PyObject* self) {
  const OutSpecObject& s = as_out_spec(self);
  return PyUnicode_FromFormat("OutSpec(kind=%ld, arg=%R, meta=%R, nbytes=%zd, dense=%s, "
                              "queueable=%s, view=%s)", s.kind, s.arg, s.meta, s.nbytes,
                              s.dense ? "True" : "False", s.queueable ? "True" : "False",
                              s.view ? "True" : "False");
}

PyObject* spec_reduce(PyObject* self, PyObject*) {
  const OutSpecObject& s = as_out_spec(self);
  return Py_BuildValue("(O(lOOnNNN))", reinterpret_cast<PyObject*>(Py_TYPE(self)), s.kind,
                       s.arg, s.meta, s.nbytes, PyBool_FromLong(s.dense),
                       PyBool_FromLong(s.queueable), PyBool_FromLong(s.view));
}

PyMethodDef spec_methods[] = {
    {"__reduce__", spec_reduce, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};

PyMemberDef spec_members[] = {
    {"kind", T_LONG, offsetof(OutSpecObject, kind), READONLY, "CALLER, NOT_TENSOR or PENDING"},
    {"arg", T_OBJECT, offsetof(OutSpecObject, arg), READONLY, "the caller's argument (CALLER)"},
    {"meta", T_OBJECT, offsetof(OutSpecObject, meta), READONLY, "the output's OutMeta"},
    {"nbytes", T_PYSSIZET, offsetof(OutSpecObject, nbytes), READONLY, "fresh bytes"},
    {"dense", T_BOOL, offsetof(OutSpecObject, dense), READONLY, "contiguous at offset 0"},
    {"queueable", T_BOOL, offsetof(OutSpecObject, queueable), READONLY,
     "a later queued op may take it"},
    {"view", T_BOOL, offsetof(OutSpecObject, view), READONLY, "a view of an argument"},
    {nullptr, 0, 0, 0, nullptr}};

// --- FastOut -------------------------------------------------------------------------------
void fast_dealloc(PyObject* self) {
  auto* f = reinterpret_cast<FastOutObject*>(self);
  Py_CLEAR(f->size);
  Py_CLEAR(f->stride);
  Py_CLEAR(f->offset);
  Py_CLEAR(f->dtype);
  Py_CLEAR(f->ref);
  Py_TYPE(self)->tp_free(self);
}

PyObject* fast_new(PyTypeObject*, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"size", "stride", "offset", "dtype", "nbytes", "dense",
                                "queueable", "ref", "same_as", "view", nullptr};
  PyObject *size = nullptr, *stride = nullptr, *offset = nullptr, *dtype = nullptr;
  PyObject *ref = nullptr, *same_as = Py_None;
  Py_ssize_t nbytes = 0, back = -1, k = 0;
  int dense = 0, queueable = 0, view = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!OOnppO|Op:FastOut",
                                   const_cast<char**>(names), &PyTuple_Type, &size,
                                   &PyTuple_Type, &stride, &offset, &dtype, &nbytes, &dense,
                                   &queueable, &ref, &same_as, &view))
    return nullptr;
  if (same_as != Py_None && !PyArg_ParseTuple(same_as, "nn:FastOut.same_as", &back, &k))
    return nullptr;
  if (same_as != Py_None && back < 0) {
    PyErr_SetString(PyExc_ValueError, "neuron_lab: FastOut.same_as needs a distance >= 0");
    return nullptr;
  }
  PyObject* self = FastOutType.tp_alloc(&FastOutType, 0);
  if (self == nullptr) return nullptr;
  auto* f = reinterpret_cast<FastOutObject*>(self);
  f->size = Py_NewRef(size);
  f->stride = Py_NewRef(stride);
  f->offset = Py_NewRef(offset);
  f->dtype = Py_NewRef(dtype);
  f->nbytes = nbytes;
  f->dense = dense;
  f->queueable = queueable;
  f->ref = Py_NewRef(ref);
  f->same_back = back;
  f->same_k = k;
  f->view = view;
  return self;
}

PyObject* same_as_of(const FastOutObject& f) {
  if (f.same_back < 0) return Py_NewRef(Py_None);
  return Py_BuildValue("(nn)", f.same_back, f.same_k);
}

PyObject* fast_same_as(PyObject* self, void*) { return same_as_of(as_fast_out(self)); }

PyObject* fast_repr(PyObject* self) {
  const FastOutObject& f = as_fast_out(self);
  PyObject* same = same_as_of(f);
  if (same == nullptr) return nullptr;
  PyObject* r = PyUnicode_FromFormat(
      "FastOut(size=%R, stride=%R, offset=%R, dtype=%R, nbytes=%zd, dense=%s, queueable=%s, "
      "ref=%R, same_as=%R, view=%s)", f.size, f.stride, f.offset, f.dtype, f.nbytes,
      f.dense ? "True" : "False", f.queueable ? "True" : "False", f.ref, same,
      f.view ? "True" : "False");
  Py_DECREF(same);
  return r;
}

PyObject* fast_reduce(PyObject* self, PyObject*) {
  const FastOutObject& f = as_fast_out(self);
  return Py_BuildValue("(O(OOOOnNNONN))", reinterpret_cast<PyObject*>(Py_TYPE(self)), f.size,
                       f.stride, f.offset, f.dtype, f.nbytes, PyBool_FromLong(f.dense),
                       PyBool_FromLong(f.queueable), f.ref, same_as_of(f),
                       PyBool_FromLong(f.view));
}

PyMethodDef fast_methods[] = {
    {"__reduce__", fast_reduce, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};

PyMemberDef fast_members[] = {
    {"size", T_OBJECT, offsetof(FastOutObject, size), READONLY, "the output's size"},
    {"stride", T_OBJECT, offsetof(FastOutObject, stride), READONLY, "its stride"},
    {"offset", T_OBJECT, offsetof(FastOutObject, offset), READONLY, "its storage offset"},
    {"dtype", T_OBJECT, offsetof(FastOutObject, dtype), READONLY, "its dtype"},
    {"nbytes", T_PYSSIZET, offsetof(FastOutObject, nbytes), READONLY, "fresh bytes"},
    {"dense", T_BOOL, offsetof(FastOutObject, dense), READONLY, "contiguous at offset 0"},
    {"queueable", T_BOOL, offsetof(FastOutObject, queueable), READONLY,
     "a later queued op may take it"},
    {"ref", T_OBJECT, offsetof(FastOutObject, ref), READONLY, "the Ref naming it"},
    {"view", T_BOOL, offsetof(FastOutObject, view), READONLY, "a view of an argument"},
    {nullptr, 0, 0, 0, nullptr}};

PyGetSetDef fast_getset[] = {
    {"same_as", fast_same_as, nullptr,
     "None, or (distance back, output) of the earlier output this one is an identity view of",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject fast_type() {
  PyTypeObject t = c_types::plain(
      "neuron_lab.runtime._runtime_ext.FastOut", sizeof(FastOutObject),
      "FastOut(size, stride, offset, dtype, nbytes, dense, queueable, ref, same_as=None, "
      "view=False): a "
      "trie node's op that hands out one new pending tensor",
      fast_new, fast_dealloc, fast_repr, fast_members, fast_methods);
  t.tp_getset = fast_getset;
  return t;
}

}  // namespace

PyTypeObject OutSpecType = c_types::plain(
    "neuron_lab.runtime._runtime_ext.OutSpec", sizeof(OutSpecObject),
    "OutSpec(kind, arg, meta, nbytes, dense=False, queueable=True, view=False): how one output "
    "of a trie "
    "node's op is handed out when the op is deferred",
    spec_new, spec_dealloc, spec_repr, spec_members, spec_methods);

PyTypeObject FastOutType = fast_type();

}  // namespace out_plan

void init_out_plan(py::module_& m) {
  c_types::add(m, out_plan::OutSpecType, "OutSpec");
  c_types::add(m, out_plan::FastOutType, "FastOut");
}

}  // namespace neuron_lab
