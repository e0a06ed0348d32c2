// The neuron PrivateUse1 hooks (at::PrivateUse1HooksInterface), registered in place of the Python
// hooks that _setup_privateuseone_for_python_backend installs: those answer only isAvailable /
// isBuilt / hasPrimaryContext, so `DataLoader(pin_memory=True)`, `tensor.pin_memory()`,
// `is_pinned()` and `torch.Generator(device="neuron")` raised "You should register
// PrivateUse1HooksInterface ... and implement getPinnedMemoryAllocator". PyTorch's reference
// PrivateUse1 backend (OpenReg) implements the same hooks in C++.
//
// Pinned memory: on the CPU executor the "device" reads host memory directly, so page-locked
// memory is ordinary host memory from c10's CPU allocator, remembered so that isPinnedPtr can
// answer (CUDA's answers for any address inside a pinned block; so does this). On the CUDA
// executor it is CUDA's pinned allocator, as the host buffers live on that GPU.
//
// Generators: a neuron generator is a front for a host generator (random ops run on the host
// executor, see module.py): seeding, state and offsets are the host generator's, so
// `torch.Generator("neuron").manual_seed(s)` draws what `torch.Generator().manual_seed(s)` draws
// on CPU. The host generator comes from a Python factory (the executor decides its device);
// `host_generator(g)` hands it to the kernels, which pass it to the host op.
#include <ATen/core/Generator.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Storage.h>

#include <cstring>
#include <map>
#include <mutex>

namespace py = pybind11;

namespace neuron_lab {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

PyObject* generator_factory = nullptr;  // fn(default: bool) -> torch.Generator on the host
PyObject* storage_resizer = nullptr;    // fn(storage: UntypedStorage, nbytes: int), in Python
bool host_is_cuda = false;

// --- pinned memory -------------------------------------------------------------------------

std::mutex pinned_mutex;
std::map<const char*, size_t> pinned_blocks;  // start -> bytes, for interior-pointer lookups

void free_pinned(void* p) {
  {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    pinned_blocks.erase(static_cast<const char*>(p));
  }
  c10::free_cpu(p);
}

struct PinnedAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    void* p = n ? c10::alloc_cpu(n) : nullptr;
    if (p != nullptr) {
      std::lock_guard<std::mutex> lock(pinned_mutex);
      pinned_blocks[static_cast<const char*>(p)] = n;
    }
    return {p, p, &free_pinned, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_pinned; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

PinnedAllocator pinned_allocator;

bool is_pinned_cpu(const void* data) {
  if (data == nullptr) {
    return false;
  }
  auto* p = static_cast<const char*>(data);
  std::lock_guard<std::mutex> lock(pinned_mutex);
  auto it = pinned_blocks.upper_bound(p);
  if (it == pinned_blocks.begin()) {
    return false;
  }
  --it;
  return p < it->first + it->second;
}

// --- generators ----------------------------------------------------------------------------

at::Generator new_host_generator(bool is_default) {
  TORCH_CHECK(generator_factory != nullptr,
              "neuron: generators are not set up (neuron_lab.device.hooks.install was not run)");
  py::gil_scoped_acquire gil;
  py::object g = py::reinterpret_borrow<py::object>(generator_factory)(is_default);
  TORCH_CHECK(THPGenerator_Check(g.ptr()), "neuron: the host generator factory returned ",
              std::string(py::str(g.get_type())), ", not a torch.Generator");
  return reinterpret_cast<THPGenerator*>(g.ptr())->cdata;
}

struct NeuronGenerator final : public c10::GeneratorImpl {
  explicit NeuronGenerator(at::Generator host)
      : c10::GeneratorImpl(c10::Device(kType, 0), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host_(std::move(host)) {}

  void set_current_seed(uint64_t seed) override {
    std::lock_guard<std::mutex> lock(mu());
    host_.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    std::lock_guard<std::mutex> lock(mu());
    host_.set_offset(offset);
  }
  uint64_t get_offset() const override {
    std::lock_guard<std::mutex> lock(mu());
    return host_.get_offset();
  }
  uint64_t current_seed() const override { return host_.current_seed(); }
  uint64_t seed() override {
    std::lock_guard<std::mutex> lock(mu());
    return host_.seed();
  }
  void set_state(const c10::TensorImpl& state) override {
    std::lock_guard<std::mutex> lock(mu());
    host_.unsafeGetGeneratorImpl()->set_state(state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    std::lock_guard<std::mutex> lock(mu());
    return host_.unsafeGetGeneratorImpl()->get_state();
  }
  const at::Generator& host() const { return host_; }
  std::mutex& mu() const { return host_.unsafeGetGeneratorImpl()->mutex_; }

 private:
  NeuronGenerator* clone_impl() const override {
    return new NeuronGenerator(host_.clone());
  }
  at::Generator host_;
};

// --- the hooks -----------------------------------------------------------------------------

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  void init() const override {}
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  void setCurrentDevice(c10::DeviceIndex d) const override { check(d); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    check(d);
    return 0;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }

  bool isPinnedPtr(const void* data) const override {
    if (host_is_cuda) {
      return at::detail::getCUDAHooks().isPinnedPtr(data);
    }
    return is_pinned_cpu(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override {
    if (host_is_cuda) {
      return at::detail::getCUDAHooks().getPinnedMemoryAllocator();
    }
    return &pinned_allocator;
  }
  c10::Device getDeviceFromPtr(void*) const override { return c10::Device(kType, 0); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    check(d);
    // built on first use, from the host's default generator: torch.manual_seed seeds both
    static at::Generator def = at::make_generator<NeuronGenerator>(new_host_generator(true));
    return def;
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    check(d);
    return at::make_generator<NeuronGenerator>(new_host_generator(false));
  }

  // `untyped_storage().resize_(n)` (FSDP2 frees and re-allocates its unsharded parameters this
  // way): the Python side flushes queued work, resizes the host storage in place (every view of
  // it sees the new bytes), rebinds this storage's address and size, and accounts the memory.
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    TORCH_CHECK(storage_resizer != nullptr, "neuron: storage resize_ needs neuron_lab's hooks");
    py::gil_scoped_acquire gil;
    auto obj = py::reinterpret_steal<py::object>(THPStorage_Wrap(storage));
    py::reinterpret_borrow<py::object>(storage_resizer)(obj, nbytes);
  }

 private:
  static void check(c10::DeviceIndex d) {
    TORCH_CHECK(d <= 0, "neuron: invalid device index ", static_cast<int>(d),
                ": this machine has 1 neuron device (neuron:0)");
  }
};

}  // namespace

void init_hooks(py::module_& m) {
  m.def("install_hooks", [](py::object factory, bool cuda, py::object resizer) {
    Py_XINCREF(factory.ptr());   // owned for the life of the process, like the hooks
    generator_factory = factory.ptr();
    Py_XINCREF(resizer.ptr());
    storage_resizer = resizer.ptr();
    host_is_cuda = cuda;
    static NeuronHooks hooks;    // PyTorch keeps the pointer until exit
    at::RegisterPrivateUse1HooksInterface(&hooks);
  }, "Register the neuron PrivateUse1 hooks (pinned memory, generators, storage resize); "
     "factory(default) returns a host torch.Generator, resizer(storage, nbytes) resizes one. Once per process, before any other hooks.");
  m.def("host_generator", [](py::object gen) -> py::object {
    TORCH_CHECK(THPGenerator_Check(gen.ptr()), "neuron: expected a torch.Generator");
    const at::Generator& g = reinterpret_cast<THPGenerator*>(gen.ptr())->cdata;
    auto* n = dynamic_cast<NeuronGenerator*>(g.unsafeGetGeneratorImpl());
    TORCH_CHECK(n != nullptr, "neuron: expected a generator on neuron, got one on ", g.device());
    return py::reinterpret_steal<py::object>(THPGenerator_Wrap(n->host()));
  }, "The host generator behind a neuron generator (random ops run on the host).");
  m.def("is_pinned_ptr", [](uintptr_t p) {
    return is_pinned_cpu(reinterpret_cast<const void*>(p));
  });
}

}  // namespace neuron_lab
