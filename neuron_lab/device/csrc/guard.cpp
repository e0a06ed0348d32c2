// The neuron device guard: PyTorch's per-backend interface for devices, streams and events
// (c10::impl::DeviceGuardImplInterface), registered for PrivateUse1 over the Python guard that
// _setup_privateuseone_for_python_backend installs (that one only knows the device type:
// torch.Event("neuron").record() raised "Backend doesn't support synchronizing events").
//
// What a stream is here (docs/device-contract.md): an ordered queue of work. The emulated device
// has one engine that runs queued work in issue order, whatever its stream: a valid schedule
// of CUDA's semantics (only order within a stream and across recorded events is promised), so
// wait_event/wait_stream are satisfied when issued. Recording an event first flushes the queued
// work (the Python callback: the adaptive runtime's flush, then the host executor's sync), then
// stamps the host clock: the event's work is complete when record returns, so query() is true
// and elapsed_time() is the host time between the two markers.
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <string>

namespace py = pybind11;

namespace neuron_lab {
namespace {

constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;

std::atomic<int64_t> next_stream_id{1};   // 0 is the default stream
thread_local c10::StreamId current_stream_id = 0;
PyObject* flush_callback = nullptr;       // fn(reason: str), owned (never released)
std::atomic<int64_t> n_flushes{0};

struct Event {
  std::chrono::steady_clock::time_point when;
  c10::StreamId stream = 0;
  bool recorded = false;
  bool timing = false;
};

void flush(const char* reason) {
  if (flush_callback == nullptr || !Py_IsInitialized()) {
    return;
  }
  py::gil_scoped_acquire gil;
  n_flushes++;
  py::reinterpret_borrow<py::object>(flush_callback)(reason);
}

void check(c10::Device d) {
  TORCH_CHECK(d.type() == kType, "neuron: expected a neuron device, got ", d);
  TORCH_CHECK(d.index() <= 0, "neuron: invalid device ", d,
              ": this machine has 1 neuron device (neuron:0)");
}

c10::Stream make(c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(kType, 0), id);
}

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    check(d);
    return c10::Device(kType, 0);
  }
  c10::Device getDevice() const override { return c10::Device(kType, 0); }
  void setDevice(c10::Device d) const override { check(d); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }

  c10::Stream getStream(c10::Device) const override { return make(current_stream_id); }
  c10::Stream getDefaultStream(c10::Device) const override { return make(0); }
  c10::Stream getStreamFromGlobalPool(c10::Device, bool) const override {
    return make(next_stream_id++);
  }
  c10::Stream getNewStream(c10::Device, int) const override { return make(next_stream_id++); }
  c10::Stream exchangeStream(c10::Stream s) const override {
    check(s.device());
    auto old = current_stream_id;
    current_stream_id = s.id();
    return make(old);
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex,
              const c10::EventFlag flag) const override {
    check(stream.device());
    auto* e = static_cast<Event*>(*event);
    if (e == nullptr) {
      e = new Event();
      *event = e;
    }
    flush("event");
    e->stream = stream.id();
    e->timing = flag == c10::EventFlag::BACKEND_DEFAULT;
    e->when = std::chrono::steady_clock::now();
    e->recorded = true;
  }
  // Work issued later on any stream runs after the recorded work: nothing to wait for.
  void block(void*, const c10::Stream& stream) const override { check(stream.device()); }
  bool queryEvent(void*) const override { return true; }
  void synchronizeEvent(void*) const override {}
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<Event*>(event);
  }
  double elapsedTime(void* a, void* b, const c10::DeviceIndex) const override {
    auto* e1 = static_cast<Event*>(a);
    auto* e2 = static_cast<Event*>(b);
    TORCH_CHECK(e1 != nullptr && e2 != nullptr && e1->recorded && e2->recorded,
                "neuron: both events must be recorded before calculating elapsed time "
                "(call event.record() on each)");
    TORCH_CHECK(e1->timing && e2->timing,
                "neuron: both events must be created with enable_timing=True to calculate "
                "elapsed time");
    return std::chrono::duration<double, std::milli>(e2->when - e1->when).count();
  }

  bool queryStream(const c10::Stream& s) const override {
    check(s.device());
    flush("stream-query");
    return true;
  }
  void synchronizeStream(const c10::Stream& s) const override {
    check(s.device());
    flush("stream-sync");
  }
  void synchronizeDevice(const c10::DeviceIndex) const override { flush("synchronize"); }
  // Memory lifetime is exact (a storage dies with its last reference, and queued work holds
  // references to what it reads): no caching allocator to tell.
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
};

}  // namespace

void init_guard(py::module_& m) {
  m.def("install_guard", [] {
    static NeuronGuardImpl impl;   // leaked on purpose: PyTorch may use it during shutdown
    c10::impl::DeviceGuardImplRegistrar(kType, &impl);
  }, "Register the neuron guard for PrivateUse1 (replacing the Python one).");
  m.def("set_flush", [](py::object fn) {
    Py_XINCREF(fn.ptr());
    flush_callback = fn.ptr();
  }, "fn(reason): run everything queued on the device (called by event record, "
     "stream query/synchronize, device synchronize).");
  m.def("guard_flushes", [] { return n_flushes.load(); });
}

}  // namespace neuron_lab
