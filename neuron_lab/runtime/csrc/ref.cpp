// record.Ref as a C type (ref.h): ``_runtime_ext.Ref(pos, k)``. Not collected (it holds no
// objects), not subclassable, compared and hashed by identity as the Python reference class
// is (``shared``, which is ``record.ref``, keeps one per (pos, k)); pickles as ``Ref(pos, k)``.
#include "ref.h"

#include <pybind11/pybind11.h>
#include <structmember.h>

#include <vector>

#include "c_types.h"

namespace py = pybind11;

namespace neuron_lab {
namespace ref {
namespace {

PyObject* ref_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"pos", "k", nullptr};
  Py_ssize_t pos = 0, k = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nn:Ref", const_cast<char**>(names), &pos, &k))
    return nullptr;
  return make(pos, k);
}

PyObject* ref_repr(PyObject* self) {
  const RefObject& r = as_ref(self);
  return PyUnicode_FromFormat("Ref(%zd, %zd)", r.pos, r.k);
}

PyObject* ref_reduce(PyObject* self, PyObject*) {
  const RefObject& r = as_ref(self);
  return Py_BuildValue("(O(nn))", reinterpret_cast<PyObject*>(Py_TYPE(self)), r.pos, r.k);
}

PyMethodDef ref_methods[] = {
    {"__reduce__", ref_reduce, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};

PyMemberDef ref_members[] = {
    {"pos", T_PYSSIZET, offsetof(RefObject, pos), READONLY, "the earlier op's position"},
    {"k", T_PYSSIZET, offsetof(RefObject, k), READONLY, "which of its outputs"},
    {nullptr, 0, 0, 0, nullptr}};

}  // namespace

PyObject* make(Py_ssize_t pos, Py_ssize_t k) {
  PyObject* self = RefType.tp_alloc(&RefType, 0);
  if (self == nullptr) return nullptr;
  auto* r = reinterpret_cast<RefObject*>(self);
  r->pos = pos;
  r->k = k;
  return self;
}

PyTypeObject RefType = c_types::plain(
    "neuron_lab.runtime._runtime_ext.Ref", sizeof(RefObject),
    "Ref(pos, k): an argument that is output k of op pos of the same segment", ref_new, nullptr,
    ref_repr, ref_members, ref_methods);

namespace {

// shared's table: the Ref of (pos, k) at [pos][k], nullptr until made (held for good, as the
// Python reference's ``record._refs`` holds its)
std::vector<std::vector<PyObject*>> table;

// ref(pos, k): ``shared`` for Python (record.ref)
PyObject* py_shared(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 2) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: ref(pos, k) takes two ints");
    return nullptr;
  }
  Py_ssize_t pos = PyNumber_AsSsize_t(argv[0], PyExc_OverflowError);
  if (pos == -1 && PyErr_Occurred()) return nullptr;
  Py_ssize_t k = PyNumber_AsSsize_t(argv[1], PyExc_OverflowError);
  if (k == -1 && PyErr_Occurred()) return nullptr;
  return shared(pos, k);
}

PyMethodDef shared_def = {"ref", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&py_shared)),
                          METH_FASTCALL,
                          "ref(pos, k): the shared Ref of output k of op pos (record.ref)"};

}  // namespace

PyObject* shared(Py_ssize_t pos, Py_ssize_t k) {
  if (pos < 0 || k < 0) {
    PyErr_Format(PyExc_ValueError, "neuron_lab: ref(%zd, %zd): a position and an output index "
                 "are never negative", pos, k);
    return nullptr;
  }
  const auto p = static_cast<size_t>(pos), j = static_cast<size_t>(k);
  if (p >= table.size()) table.resize(p + 1);
  std::vector<PyObject*>& row = table[p];
  if (j >= row.size()) row.resize(j + 1, nullptr);
  if (row[j] == nullptr) row[j] = make(pos, k);
  return Py_XNewRef(row[j]);
}

}  // namespace ref

void init_ref(py::module_& m) {
  c_types::add(m, ref::RefType, "Ref");
  m.add_object("ref",
               py::reinterpret_steal<py::object>(PyCFunction_New(&ref::shared_def, nullptr)));
}

}  // namespace neuron_lab
