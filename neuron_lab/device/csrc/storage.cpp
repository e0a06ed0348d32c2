// A neuron storage's address: its DataPtr points at the host buffer that holds its bytes.
//
// Libraries tell shared storage from distinct storage by address: safetensors and Transformers'
// save_pretrained (`storage.data_ptr()`, `nbytes()`), parametrize, DDP's bucketing. A neuron
// storage used to report data_ptr() == 0 and nbytes() == 0 (a fresh output) or raise (a view),
// so every weight looked like one shared tensor. Here a shell storage (shell.py) is bound to its
// host storage: the DataPtr carries the host buffer's address (non-zero, unique per buffer,
// stable for the buffer's life, the same for every view of it, as on any device) and holds a
// reference to the host StorageImpl, so the address can never outlive the bytes. The device
// never reads through it: kernels reach the bytes through the host tensor.
//
// Storages are passed as their `_cdata` (the StorageImpl address PyTorch's Python binding
// exposes), so this file needs only c10 headers.
#include <c10/core/Device.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace neuron_lab {
namespace {

void release(void* ctx) {
  // the reference taken in bind: drops the host StorageImpl when the neuron storage dies
  c10::intrusive_ptr<c10::StorageImpl>::reclaim(static_cast<c10::StorageImpl*>(ctx));
}

void bind(uintptr_t device_cdata, uintptr_t host_cdata) {
  auto* dev = reinterpret_cast<c10::StorageImpl*>(device_cdata);
  auto host = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(
      reinterpret_cast<c10::StorageImpl*>(host_cdata));
  TORCH_CHECK(dev->device_type() == c10::DeviceType::PrivateUse1,
              "neuron: bind_storage expects a neuron storage, got one on ", dev->device());
  void* addr = const_cast<void*>(host->data_ptr().get());
  size_t nbytes = host->nbytes();
  dev->set_data_ptr_noswap(
      c10::DataPtr(addr, host.release(), &release, c10::Device(c10::DeviceType::PrivateUse1, 0)));
  dev->set_nbytes(nbytes);
}

}  // namespace

void init_storage(py::module_& m) {
  m.def("bind_storage", &bind, py::arg("device_cdata"), py::arg("host_cdata"),
        "Point neuron storage `device_cdata` at host storage `host_cdata`'s bytes (its address "
        "and size), keeping the host storage alive as long as the neuron storage.");
}

}  // namespace neuron_lab
