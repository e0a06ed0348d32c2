// Pending tensors in C (tensor_data.pending). A deferred op's output is a PrivateUse1 tensor with
// the predicted metadata on a storage without bytes, marked pending in its DataPtr (the
// device's pending_data_ptr, storages.h); its values come when its region runs. The tensor
// gets ``_d = None``; the storage gets no Python object (storage.cpp says why).
// ``new_pending`` serves the hot path (deferral.cpp, from a trie node's FastOut), ``pending`` and
// ``pending_dense`` the Python engine's device tensors for ops with several outputs
// (Engine._defer).
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>

#include "deferral.h"

namespace py = pybind11;

namespace neuron_lab {
namespace deferral {
namespace {

bool int_vector(PyObject* tuple, std::vector<int64_t>* out) {
  if (!PyTuple_Check(tuple)) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: a FastOut's size and stride must be tuples");
    return false;
  }
  out->resize(static_cast<size_t>(PyTuple_GET_SIZE(tuple)));
  for (size_t i = 0; i < out->size(); ++i) {
    (*out)[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, static_cast<Py_ssize_t>(i)));
    if ((*out)[i] == -1 && PyErr_Occurred()) return false;
  }
  return true;
}

// A pending tensor as tensor_data.pending makes it, without a Python call: a PrivateUse1 tensor of
// the predicted size, stride and offset on a pending storage (its bytes come when the region
// runs): dense, create_empty_tensor's (an empty storage of the device's storage allocator);
// strided, an unresizable storage of the bytes the strides span
// (_construct_storage_from_data_pointer's). The tensor (a new reference, ``_d = None``) and its
// storage, or false with an exception set. `strides` and `off` are read only when not dense.
bool make_pending(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                  int64_t off, PyObject* dtype, bool dense, PyObject** t, c10::Storage* st) {
  if (Py_TYPE(dtype) != S.dtype_type) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: a FastOut's dtype must be a torch.dtype");
    return false;
  }
  const c10::ScalarType type = reinterpret_cast<THPDtype*>(dtype)->scalar_type;
  try {
    size_t nbytes = 0;
    if (!dense && c10::multiply_integers(sizes) > 0) {
      int64_t span = 1;
      for (size_t i = 0; i < sizes.size(); ++i) span += (sizes[i] - 1) * strides[i];
      nbytes = static_cast<size_t>(off + span) * c10::elementSize(type);
    }
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                         c10::DataPtr(nullptr, nullptr, S.pending_marker, S.device),
                         dense ? S.allocator : nullptr, /*resizable=*/dense);
    at::Tensor tensor = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
        c10::scalarTypeToTypeMeta(type));
    if (dense) tensor.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
    else tensor.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, off);
    *t = THPVariable_Wrap(std::move(tensor));
    *st = std::move(storage);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return false;
  }
  if (*t != nullptr && set_attr_none(*t, s_d) == nullptr) Py_CLEAR(*t);
  return *t != nullptr;
}

}  // namespace

// make_pending from a FastOut's Python size, stride and offset (tuples and an int).
bool new_pending(PyObject* size, PyObject* stride, PyObject* offset, PyObject* dtype, bool dense,
                 PyObject** t, c10::Storage* st) {
  std::vector<int64_t> sizes, strides;
  if (!int_vector(size, &sizes) || (!dense && !int_vector(stride, &strides))) return false;
  int64_t off = dense ? 0 : PyLong_AsLongLong(offset);
  if (off == -1 && PyErr_Occurred()) return false;
  return make_pending(sizes, strides, off, dtype, dense, t, st);
}

PyObject* set_attr_none(PyObject* o, PyObject* name) {
  return PyObject_SetAttr(o, name, Py_None) < 0 ? nullptr : o;
}

}  // namespace deferral

namespace {

using namespace deferral;

// tensor_data.pending(size, stride, dtype, offset=0) and tensor_data.pending_dense(size, dtype) in
// C: the
// device tensors Engine._defer hands out for ops with several outputs (SDPA's, a foreach op's
// list),
// ~20 us (strided) and ~2 us (dense) of Python each. Dense: offset 0 and torch's contiguous
// strides (size-1 dimensions' strides included), as tensor_data.pending decides.
PyObject* pending_tensor(PyObject* size, PyObject* stride, PyObject* dtype, PyObject* offset) {
  if (S.allocator == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "neuron_lab: configure() first");
    return nullptr;
  }
  std::vector<int64_t> sizes, strides;
  int64_t off = 0;
  if (!int_vector(size, &sizes)) return nullptr;
  bool dense = true;
  if (stride != nullptr) {
    if (!int_vector(stride, &strides)) return nullptr;
    if (strides.size() != sizes.size()) {
      PyErr_SetString(PyExc_ValueError, "neuron_lab: pending: size and stride lengths differ");
      return nullptr;
    }
    off = PyLong_AsLongLong(offset);
    if (off == -1 && PyErr_Occurred()) return nullptr;
    int64_t expect = 1;
    dense = off == 0;
    for (size_t i = sizes.size(); i-- > 0 && dense;) {
      dense = strides[i] == expect;
      expect *= std::max<int64_t>(sizes[i], 1);
    }
  }
  PyObject* t = nullptr;
  c10::Storage st;
  if (!make_pending(sizes, strides, off, dtype, dense, &t, &st)) return nullptr;
  return t;
}

PyObject* pending_py(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 3 && n != 4) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: pending(size, stride, dtype, offset=0)");
    return nullptr;
  }
  static PyObject* zero = PyLong_FromLong(0);
  PyObject* size = PySequence_Tuple(argv[0]);     // tuples as they are; lists, torch.Size
  PyObject* stride = size ? PySequence_Tuple(argv[1]) : nullptr;
  PyObject* t = stride ? pending_tensor(size, stride, argv[2], n == 4 ? argv[3] : zero) : nullptr;
  Py_XDECREF(size);
  Py_XDECREF(stride);
  return t;
}

PyObject* pending_dense_py(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 2) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: pending_dense(size, dtype)");
    return nullptr;
  }
  PyObject* size = PySequence_Tuple(argv[0]);
  PyObject* t = size ? pending_tensor(size, nullptr, argv[1], nullptr) : nullptr;
  Py_XDECREF(size);
  return t;
}

PyMethodDef pending_def = {"pending",
                           reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&pending_py)),
                           METH_FASTCALL,
                           "pending(size, stride, dtype, offset=0): tensor_data.pending"};
PyMethodDef pending_dense_def = {
    "pending_dense", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&pending_dense_py)),
    METH_FASTCALL, "pending_dense(size, dtype): tensor_data.pending_dense"};


}  // namespace

void init_pending_tensors(py::module_& m) {
  for (PyMethodDef* d : {&pending_def, &pending_dense_def})
    m.add_object(d->ml_name, py::reinterpret_steal<py::object>(PyCFunction_New(d, nullptr)));
}

}  // namespace neuron_lab
