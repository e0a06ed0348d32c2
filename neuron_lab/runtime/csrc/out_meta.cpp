// record.OutMeta as a C type (out_meta.h): ``_runtime_ext.OutMeta(size, stride, offset, dtype)``,
// a tuple subclass with the Python reference's field names and order. Equal to, and hashed as,
// the tuple of its fields (tuple's own slots); pickles as that call.
#include "out_meta.h"

#include <pybind11/pybind11.h>

#include "c_types.h"
#include "python_objects.h"   // device/csrc: untracked

namespace py = pybind11;

namespace neuron_lab {
namespace out_meta {
namespace {

const char* const kNames[N_FIELDS] = {"size", "stride", "offset", "dtype"};

PyObject* meta_new(PyTypeObject*, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {"size", "stride", "offset", "dtype", nullptr};
  PyObject *size = nullptr, *stride = nullptr, *offset = nullptr, *dtype = nullptr;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO:OutMeta", const_cast<char**>(names),
                                   &size, &stride, &offset, &dtype))
    return nullptr;
  return make(Py_NewRef(size), Py_NewRef(stride), Py_NewRef(offset), Py_NewRef(dtype));
}

PyObject* meta_repr(PyObject* self) {
  return PyUnicode_FromFormat("OutMeta(size=%R, stride=%R, offset=%R, dtype=%R)",
                              field(self, SIZE), field(self, STRIDE), field(self, OFFSET),
                              field(self, DTYPE));
}

PyObject* meta_reduce(PyObject* self, PyObject*) {
  return Py_BuildValue("(O(OOOO))", reinterpret_cast<PyObject*>(Py_TYPE(self)),
                       field(self, SIZE), field(self, STRIDE), field(self, OFFSET),
                       field(self, DTYPE));
}

template <Field F>
PyObject* get(PyObject* self, void*) {
  return Py_NewRef(field(self, F));
}

PyMethodDef meta_methods[] = {
    {"__reduce__", meta_reduce, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};

PyGetSetDef meta_getset[] = {
    {kNames[SIZE], get<SIZE>, nullptr, "the output's sizes (a tuple of ints)", nullptr},
    {kNames[STRIDE], get<STRIDE>, nullptr, "its strides (a tuple of ints)", nullptr},
    {kNames[OFFSET], get<OFFSET>, nullptr, "its storage offset (an int)", nullptr},
    {kNames[DTYPE], get<DTYPE>, nullptr, "its torch.dtype", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject make_type() {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "neuron_lab.runtime._runtime_ext.OutMeta";
  t.tp_basicsize = PyTuple_Type.tp_basicsize;
  t.tp_itemsize = PyTuple_Type.tp_itemsize;
  t.tp_flags = Py_TPFLAGS_DEFAULT;   // a tuple's GC slots, hash and comparison are inherited
  t.tp_doc = "OutMeta(size, stride, offset, dtype): what a pending output must look like";
  t.tp_base = &PyTuple_Type;
  t.tp_new = meta_new;
  t.tp_repr = meta_repr;
  t.tp_methods = meta_methods;
  t.tp_getset = meta_getset;
  return t;
}

}  // namespace

PyTypeObject OutMetaType = make_type();

PyObject* make(PyObject* size, PyObject* stride, PyObject* offset, PyObject* dtype) {
  PyObject* items[N_FIELDS] = {size, stride, offset, dtype};
  PyObject* o = nullptr;
  if (size != nullptr && stride != nullptr && offset != nullptr && dtype != nullptr)
    o = OutMetaType.tp_alloc(&OutMetaType, N_FIELDS);
  if (o == nullptr) {
    for (PyObject* p : items) Py_XDECREF(p);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < N_FIELDS; ++i) PyTuple_SET_ITEM(o, i, items[i]);
  return untracked(o);
}

}  // namespace out_meta

void init_out_meta(py::module_& m) {
  PyObject* fields = Py_BuildValue("(ssss)", out_meta::kNames[0], out_meta::kNames[1],
                                   out_meta::kNames[2], out_meta::kNames[3]);
  if (fields == nullptr) throw py::error_already_set();
  c_types::add(m, out_meta::OutMetaType, "OutMeta");
  // ``_fields``, as a NamedTuple has: code that lists the fields finds the same names
  int bad = PyDict_SetItemString(out_meta::OutMetaType.tp_dict, "_fields", fields);
  Py_DECREF(fields);
  if (bad) throw py::error_already_set();
  PyType_Modified(&out_meta::OutMetaType);
}

}  // namespace neuron_lab
