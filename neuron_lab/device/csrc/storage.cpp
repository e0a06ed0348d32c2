// A neuron storage's state lives in its C++ DataPtr: bound to a host buffer, pending, or neither.
//
// Bound: the DataPtr points at the host buffer that holds the storage's bytes. Libraries tell
// shared storage from distinct storage by address: safetensors and Transformers' save_pretrained
// (`storage.data_ptr()`, `nbytes()`), parametrize, DDP's bucketing. So a device storage
// (tensor_data.py) is bound to its host storage: the DataPtr carries the host buffer's address
// (non-zero, unique per buffer, stable for the buffer's life, the same for every view of it, as
// on any device) and holds a reference to the host StorageImpl, so the address can never outlive
// the bytes. The device never reads through it: kernels reach the bytes through the host tensor.
//
// Pending: an output of the adaptive runtime whose value its region has not computed yet. Its
// DataPtr has no address and `pending_marker` as its deleter (never called: there is no
// context). The state is C++'s, not a Python attribute on the storage's Python object, because a
// storage that has had a Python object keeps a use count of two for good, and autograd then
// accumulates gradients in it out of place (a new buffer per accumulation, where eager adds in
// place). Nothing on the device's or the runtime's paths wraps a device storage in a Python
// object; Python asks through the functions here, which take tensors or storages.
#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include "storages.h"

namespace py = pybind11;

namespace neuron_lab {
namespace {

void release(void* ctx) {
  // the reference taken in bind: drops the host StorageImpl when the neuron storage dies
  c10::intrusive_ptr<c10::StorageImpl>::reclaim(static_cast<c10::StorageImpl*>(ctx));
}

// The StorageImpl of `o`, a tensor (its storage) or a storage, as Python passes them.
c10::StorageImpl* unpack(py::handle o, const char* fn) {
  if (THPVariable_Check(o.ptr()))
    return THPVariable_Unpack(o.ptr()).storage().unsafeGetStorageImpl();
  TORCH_CHECK_TYPE(THPStorage_Check(o.ptr()), "neuron: ", fn, " takes tensors or storages, not ",
                   Py_TYPE(o.ptr())->tp_name);
  return THPStorage_Unpack(o.ptr()).unsafeGetStorageImpl();
}

c10::StorageImpl* unpack_device(py::handle o, const char* fn) {
  c10::StorageImpl* s = unpack(o, fn);
  TORCH_CHECK(s->device_type() == c10::DeviceType::PrivateUse1, "neuron: ", fn,
              " takes a neuron tensor or storage, got one on ", s->device());
  return s;
}

void bind_py(py::handle device, py::handle host) {
  bind(unpack_device(device, "bind_storage"), unpack(host, "bind_storage"));
}

// The host storage `device` is bound to, as a Python storage; None while it is pending;
// `missing` for a storage the device did not make.
py::object host_storage(py::handle device, py::object missing) {
  c10::StorageImpl* s = unpack(device, "host_storage");
  c10::StorageImpl* host = bound_host(*s);
  if (host == nullptr) return is_pending(*s) ? py::none() : missing;
  auto ref = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(host);
  PyObject* o = THPStorage_Wrap(c10::Storage(std::move(ref)));
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

void mark_pending_py(py::handle device) {
  c10::StorageImpl* s = unpack_device(device, "mark_pending");
  s->set_data_ptr_noswap(pending_data_ptr(s->device()));
}

bool is_pending_py(py::handle device) { return is_pending(*unpack(device, "is_pending")); }

}  // namespace

void bind(c10::StorageImpl* device, c10::StorageImpl* host) {
  size_t nbytes = host->nbytes();
  device->set_data_ptr_noswap(
      bound_data_ptr(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(host)));
  device->set_nbytes(nbytes);
}

void pending_marker(void*) {}

c10::DataPtr pending_data_ptr(c10::Device device) {
  return c10::DataPtr(nullptr, nullptr, &pending_marker, device);
}

bool is_pending(const c10::StorageImpl& s) {
  return s.data_ptr().get_deleter() == &pending_marker;
}

c10::DataPtr bound_data_ptr(c10::intrusive_ptr<c10::StorageImpl> host) {
  void* addr = const_cast<void*>(host->data_ptr().get());
  return c10::DataPtr(addr, host.release(), &release, c10::Device(c10::DeviceType::PrivateUse1, 0));
}

c10::StorageImpl* bound_host(const c10::StorageImpl& s) {
  const c10::DataPtr& dp = s.data_ptr();
  return dp.get_deleter() == &release ? static_cast<c10::StorageImpl*>(dp.get_context()) : nullptr;
}

void init_storage(py::module_& m) {
  m.def("bind_storage", &bind_py, py::arg("device"), py::arg("host"),
        "Point the neuron storage of `device` (a tensor or storage) at the bytes of `host`'s "
        "(its address and size), keeping the host storage alive as long as the neuron storage.");
  m.def("host_storage", &host_storage, py::arg("device"), py::arg("missing") = py::none(),
        "The host storage the neuron storage of `device` (a tensor or storage) is bound to; None "
        "while it is pending; `missing` for a storage the device did not make.");
  m.def("mark_pending", &mark_pending_py, py::arg("device"),
        "Mark the neuron storage of `device` (a tensor or storage) pending: no bytes, no "
        "address, until bind_storage gives it its value.");
  m.def("is_pending", &is_pending_py, py::arg("device"),
        "Is the storage of `device` (a tensor or storage) a pending output's?");
}

}  // namespace neuron_lab
