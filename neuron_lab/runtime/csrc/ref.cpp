// record.Ref as a C type (ref.h): ``_runtime_ext.Ref(pos, k)``. Not collected (it holds no
// objects), not subclassable, compared and hashed by identity as the Python reference class
// is (``record.ref`` shares one per (pos, k)); pickles as ``Ref(pos, k)``.
#include "ref.h"

#include <pybind11/pybind11.h>
#include <structmember.h>

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

}  // namespace ref

void init_ref(py::module_& m) {
  c_types::add(m, ref::RefType, "Ref");
}

}  // namespace neuron_lab
