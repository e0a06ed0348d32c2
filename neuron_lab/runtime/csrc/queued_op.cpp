// record.QueuedOp as a C type (queued_op.h): ``_runtime_ext.QueuedOp(facts, args, kwargs, key,
// outs, metas=(), structure=None, where=None, plan=None)``.
#include "queued_op.h"

#include <pybind11/pybind11.h>
#include <structmember.h>

#include <array>

#include "c_types.h"

namespace py = pybind11;

namespace neuron_lab {
namespace queued_op {
namespace {

#define QUEUED_FIELDS(X) \
  X(facts) X(args) X(kwargs) X(key) X(outs) X(metas) X(structure) X(where) X(plan)

#define ADDRESS(f) &q.f,
std::array<PyObject**, 9> fields_of(QueuedOpObject& q) { return {QUEUED_FIELDS(ADDRESS)}; }
#undef ADDRESS

void dealloc(PyObject* self) {
  for (PyObject** f : fields_of(as_queued_op(self))) Py_CLEAR(*f);
  Py_TYPE(self)->tp_free(self);
}

PyObject* new_queued(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"facts", "args", "kwargs", "key", "outs", "metas",
                                "structure", "where", "plan", nullptr};
  PyObject* v[9] = {nullptr, nullptr, nullptr, nullptr, nullptr,
                    nullptr, Py_None, Py_None, Py_None};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|OOOO:QueuedOp", const_cast<char**>(names),
                                   &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8]))
    return nullptr;
  PyObject* fields[9];
  for (int i = 0; i < 9; ++i) fields[i] = v[i] != nullptr ? Py_NewRef(v[i]) : PyTuple_New(0);
  if (fields[5] == nullptr) {   // metas defaults to ()
    for (PyObject* f : fields) Py_XDECREF(f);
    return nullptr;
  }
  return make(fields);   // the type is not subclassable: ``type`` is QueuedOpType
}

PyObject* repr(PyObject* self) {
  PyObject* name = PyObject_GetAttrString(as_queued_op(self).facts, "name");
  if (name == nullptr) return nullptr;
  Py_ssize_t n = PyList_Check(as_queued_op(self).outs) ? PyList_GET_SIZE(as_queued_op(self).outs)
                                                       : 0;
  PyObject* r = PyUnicode_FromFormat("QueuedOp(%S, %zd outs)", name, n);
  Py_DECREF(name);
  return r;
}

#define MEMBER(f) {#f, T_OBJECT, offsetof(QueuedOpObject, f), READONLY, nullptr},
PyMemberDef members[] = {QUEUED_FIELDS(MEMBER){nullptr, 0, 0, 0, nullptr}};
#undef MEMBER

}  // namespace

PyTypeObject QueuedOpType = c_types::plain(
    "neuron_lab.runtime._runtime_ext.QueuedOp", sizeof(QueuedOpObject),
    "QueuedOp(facts, args, kwargs, key, outs, metas=(), structure=None, where=None, plan=None): "
    "one op call in the segment's queue",
    new_queued, dealloc, repr, members, nullptr);

PyObject* make(PyObject* const fields[9]) {
  PyObject* self = QueuedOpType.tp_alloc(&QueuedOpType, 0);
  if (self == nullptr) {
    for (int i = 0; i < 9; ++i) Py_XDECREF(fields[i]);
    return nullptr;
  }
  auto f = fields_of(as_queued_op(self));
  for (int i = 0; i < 9; ++i) *f[i] = fields[i];
  return self;
}

}  // namespace queued_op

void init_queued_op(py::module_& m) {
  c_types::add(m, queued_op::QueuedOpType, "QueuedOp");
}

}  // namespace neuron_lab
