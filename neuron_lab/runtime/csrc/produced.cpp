// record.Produced as a C type (produced.h): ``_runtime_ext.Produced(pos, k, obj, ref)``.
#include "produced.h"

#include <pybind11/pybind11.h>
#include <structmember.h>

#include "c_types.h"

namespace py = pybind11;

namespace neuron_lab {
namespace produced {
namespace {

void dealloc(PyObject* self) {
  ProducedObject& p = as_produced(self);
  Py_CLEAR(p.obj);
  Py_CLEAR(p.ref);
  Py_TYPE(self)->tp_free(self);
}

PyObject* new_produced(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"pos", "k", "obj", "ref", nullptr};
  Py_ssize_t pos = 0, k = 0;
  PyObject *obj = nullptr, *ref = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "nnOO:Produced", const_cast<char**>(names),
                                   &pos, &k, &obj, &ref))
    return nullptr;
  return make(pos, k, Py_NewRef(obj), ref);
}

PyObject* repr(PyObject* self) {
  const ProducedObject& p = as_produced(self);
  return PyUnicode_FromFormat("Produced(pos=%zd, k=%zd, obj=%R, ref=%R)", p.pos, p.k, p.obj,
                              p.ref);
}

PyMemberDef members[] = {
    {"pos", T_PYSSIZET, offsetof(ProducedObject, pos), READONLY, "the op's position"},
    {"k", T_PYSSIZET, offsetof(ProducedObject, k), READONLY, "which of its outputs"},
    {"obj", T_OBJECT, offsetof(ProducedObject, obj), READONLY, "weak reference to the object"},
    {"ref", T_OBJECT, offsetof(ProducedObject, ref), READONLY, "the Ref naming it"},
    {nullptr, 0, 0, 0, nullptr}};

}  // namespace

PyTypeObject ProducedType = c_types::plain(
    "neuron_lab.runtime._runtime_ext.Produced", sizeof(ProducedObject),
    "Produced(pos, k, obj, ref): a producers-map entry (output k of op pos of the segment)",
    new_produced, dealloc, repr, members, nullptr);

PyObject* make(Py_ssize_t pos, Py_ssize_t k, PyObject* obj, PyObject* ref) {
  PyObject* self = ProducedType.tp_alloc(&ProducedType, 0);
  if (self == nullptr) {
    Py_XDECREF(obj);
    return nullptr;
  }
  ProducedObject& p = as_produced(self);
  p.pos = pos;
  p.k = k;
  p.obj = obj;
  p.ref = Py_NewRef(ref);
  return self;
}

}  // namespace produced

void init_produced(py::module_& m) {
  c_types::add(m, produced::ProducedType, "Produced");
}

}  // namespace neuron_lab
