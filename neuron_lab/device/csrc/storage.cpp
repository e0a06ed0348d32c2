// A neuron storage's address: its DataPtr points at the host buffer that holds its bytes.
//
// Libraries tell shared storage from distinct storage by address: safetensors and Transformers'
// save_pretrained (`storage.data_ptr()`, `nbytes()`), parametrize, DDP's bucketing. A neuron
// storage used to report data_ptr() == 0 and nbytes() == 0 (a fresh output) or raise (a view),
// so every weight looked like one shared tensor. Here a device storage (tensor_data.py) is bound to
// its
// host storage: the DataPtr carries the host buffer's address (non-zero, unique per buffer,
// stable for the buffer's life, the same for every view of it, as on any device) and holds a
// reference to the host StorageImpl, so the address can never outlive the bytes. The device
// never reads through it: kernels reach the bytes through the host tensor.
//
// Storages are passed as Python storage objects (unpacked here: no `_cdata` lookups on the
// path of every op's output).
#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Storage.h>

#include "storages.h"

namespace py = pybind11;

namespace neuron_lab {
namespace {

void release(void* ctx) {
  // the reference taken in bind: drops the host StorageImpl when the neuron storage dies
  c10::intrusive_ptr<c10::StorageImpl>::reclaim(static_cast<c10::StorageImpl*>(ctx));
}

c10::StorageImpl* unpack(py::handle storage) {
  TORCH_CHECK(THPStorage_Check(storage.ptr()), "neuron: bind_storage expects storages");
  return THPStorage_Unpack(storage.ptr()).unsafeGetStorageImpl();
}

void bind(py::handle device_storage, py::handle host_storage) {
  auto* dev = unpack(device_storage);
  auto host = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(unpack(host_storage));
  TORCH_CHECK(dev->device_type() == c10::DeviceType::PrivateUse1,
              "neuron: bind_storage expects a neuron storage, got one on ", dev->device());
  size_t nbytes = host->nbytes();
  dev->set_data_ptr_noswap(bound_data_ptr(std::move(host)));
  dev->set_nbytes(nbytes);
}

// The host storage `device_storage` is bound to, as a Python storage, or None.
py::object host_storage(py::handle device_storage) {
  c10::StorageImpl* host = bound_host(*unpack(device_storage));
  if (host == nullptr) return py::none();
  auto ref = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(host);
  PyObject* o = THPStorage_Wrap(c10::Storage(std::move(ref)));
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

}  // namespace

c10::DataPtr bound_data_ptr(c10::intrusive_ptr<c10::StorageImpl> host) {
  void* addr = const_cast<void*>(host->data_ptr().get());
  return c10::DataPtr(addr, host.release(), &release, c10::Device(c10::DeviceType::PrivateUse1, 0));
}

c10::StorageImpl* bound_host(const c10::StorageImpl& s) {
  const c10::DataPtr& dp = s.data_ptr();
  return dp.get_deleter() == &release ? static_cast<c10::StorageImpl*>(dp.get_context()) : nullptr;
}

void init_storage(py::module_& m) {
  m.def("bind_storage", &bind, py::arg("device_storage"), py::arg("host_storage"),
        "Point neuron storage `device_storage` at `host_storage`'s bytes (its address and "
        "size), keeping the host storage alive as long as the neuron storage.");
  m.def("host_storage", &host_storage, py::arg("device_storage"),
        "The host storage neuron storage `device_storage` is bound to, or None (a pending "
        "output, or a storage the device did not make).");
}

}  // namespace neuron_lab
