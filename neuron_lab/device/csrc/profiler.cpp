// The neuron device's events in torch.profiler: a Kineto IActivityProfiler registered with
// PyTorch's PrivateUse1 profiler registry (REGISTER_PRIVATEUSE1_PROFILER, torch >= 2.13,
// torch/csrc/profiler/standalone/privateuse1_profiler.h), the extension point OpenReg and other
// out-of-tree backends use. With ProfilerActivity.PrivateUse1 requested, Kineto configures a
// session of this profiler beside its CPU tracing; torch then turns the session's activities into
// DeviceType.PrivateUse1 events: key_averages() gets device-time columns, export_chrome_trace a
// device track (pid 0, "neuron:0"), tensorboard_trace_handler the same trace.
//
// What a launch is, and who records it:
// - eager mode: each leaf op on a neuron tensor (an op with a neuron tensor argument none of
//   whose nested ops has one) runs as one kernel, synchronously: a global RecordFunction
//   callback, installed only while a session records, times it and prices it (bytes in and out,
//   FLOPs of matmuls, the roofline with the chip's parameters set from Python);
// - adaptive mode: the runtime opens a `neuron::fused[region N]` / `neuron::per-op[region N]`
//   range around each region launch; the callback notes its times and correlation id, and the
//   telemetry layer (which knows the region: its ops, modelled cost, the user's line) completes
//   the record right after (`profiler_record_launch`).
// Each launch becomes two activities, as CUDA's kernels do: a PRIVATEUSE1_RUNTIME event on the
// launching host thread (inside the launching op) that starts a flow, and a CONCURRENT_KERNEL
// event on the device (pid 0, resource 1 = the executor's stream) that ends it, with its
// measured executor time as duration and the model's figures in its args. Both are linked to the
// launching CPU op by its correlation id: torch pushes that id to every session on op entry.
//
// The flow of an event's correlation: torch's profiler callback is thread-local and runs after
// global callbacks, so at this callback's exit the op's own id is still on the stack that the
// session's pushCorrelationId keeps for the thread.
//
// Include path: privateuse1_profiler.h includes <IActivityProfiler.h> from Kineto's header
// directory (torch/include/kineto), which torch's own build has on its path; the
// `IActivityProfiler.h` beside this file forwards to it, so the device's build needs no extra
// flag. USE_KINETO is what torch's build defines (the CPU wheels are built with Kineto).
#ifndef NDEBUG  // libtorch's build: at::RecordFunction's layout has debug-only fields without it
#define NDEBUG
#endif
// GenericTraceActivity::addMetadata formats with fmt, whose symbols libtorch does not export
#ifndef FMT_HEADER_ONLY
#define FMT_HEADER_ONLY
#endif
#ifndef USE_KINETO
#define USE_KINETO 1
#endif
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <kineto/GenericTraceActivity.h>
#include <kineto/libkineto.h>
#include <kineto/output_base.h>

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/util/ApproximateClock.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <cmath>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace py = pybind11;

namespace neuron_lab {
namespace {

namespace lk = libkineto;

constexpr int32_t kDevicePid = 0;       // the trace's pid for neuron:0 (as CUDA's device index)
constexpr int32_t kStream = 1;          // the executor's one stream

struct Launch {            // one device launch, as recorded
  std::string name;
  std::string kind;        // "op" (eager) | "fused" | "per-op" (a region run op by op)
  int64_t start_ns = 0, end_ns = 0;   // measured on the host executor
  uint64_t corr = 0;       // the launching CPU op's correlation id (0: none open)
  int32_t thread = 0;      // the launching host thread (system id)
  double modelled_s = 0, flops = 0;
  int64_t bytes = 0, region = -1, ops = 1;
  std::string location, op_names;    // the user's line; JSON list of the op names it ran
};

std::mutex mu;
std::vector<Launch> launches;          // the current (or last finished) session's
std::atomic<bool> recording{false};
std::atomic<bool> eager_ops{false};    // eager mode: leaf ops on neuron tensors are launches
at::CallbackHandle callback_handle = 0;
struct Chip { double hbm_bytes_per_s = 2.9e12, overhead_s = 15e-6, peak_flops = 181e12; };
Chip chip;
std::string chip_name = "trn2";
std::string device_properties;          // the trace's deviceProperties entry (JSON object)
PyObject* locator = nullptr;           // fn() -> the user's line (str), for eager ops
PyObject* on_session = nullptr;        // fn(started: bool): a session starts or stops

thread_local std::vector<uint64_t> corr_stack;
std::atomic<int64_t> pushes{0};   // torch's correlation ids of the open ops
struct RangeSeen { int64_t start_ns = 0, end_ns = 0; uint64_t corr = 0; bool set = false; };
thread_local RangeSeen last_range;     // the last region launch range that closed here

// One open op on this thread. Shared: an op's range can end out of order (a user range closed by
// the `_record_function_exit` op nested in it) or on another thread, so the stack of open ops
// never holds a pointer that its owner may free.
struct Frame {
  bool neuron = false, child = false;
  std::string name;        // a neuron op's (its nested ops compare theirs with it)
  uint64_t inner = 0;      // the id of a nested op of the same name (the host executor's op)
};
constexpr size_t kMaxOpen = 4096;      // past this, ranges that never closed here: forget them
thread_local std::vector<std::shared_ptr<Frame>> open_ops;

struct OpContext : at::ObserverContext {
  int64_t start_ns = 0;
  size_t depth = 0;        // corr_stack's size when the op was entered
  bool range = false;
  int64_t in_bytes = 0, k = 0;   // read at entry: RecordFunction's inputs are valid only there
  std::vector<const c10::TensorImpl*> in_tensors;     // its neuron inputs (views are no launch)
  std::vector<const c10::StorageImpl*> in_storages;
  std::shared_ptr<Frame> frame = std::make_shared<Frame>();
};

bool has_neuron(const c10::IValue& v) {
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
  }
  if (v.isTensorList()) {
    for (const auto& t : v.toTensorList()) {
      const at::Tensor& tt = t;
      if (tt.defined() && tt.device().type() == c10::DeviceType::PrivateUse1) return true;
    }
  }
  return false;
}

int64_t tensor_bytes(const c10::IValue& v) {
  int64_t n = 0;
  if (v.isTensor()) {
    const auto& t = v.toTensor();
    if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
  } else if (v.isTensorList()) {
    for (const auto& t : v.toTensorList()) {
      const at::Tensor& tt = t;
      if (tt.defined()) n += tt.numel() * static_cast<int64_t>(tt.element_size());
    }
  }
  return n;
}

double numel_out(c10::ArrayRef<c10::IValue> outs) {
  double n = 0;
  for (const auto& v : outs)
    if (v.isTensor() && v.toTensor().defined()) n += static_cast<double>(v.toTensor().numel());
  return n;
}

// The contraction length of a matmul-like op (0: not one): torch.utils.flop_counter counts
// 2*M*N*K for them; every other op is counted one FLOP per output element.
int64_t contraction(const std::string& name, c10::ArrayRef<const c10::IValue> ins) {
  if ((name == "aten::mm" || name == "aten::bmm") && !ins.empty() && ins[0].isTensor())
    return ins[0].toTensor().size(-1);
  if ((name == "aten::addmm" || name == "aten::baddbmm") && ins.size() > 1 && ins[1].isTensor())
    return ins[1].toTensor().size(-1);
  return 0;
}

double roofline(int64_t bytes, double flops) {
  return chip.overhead_s + std::max(bytes / chip.hbm_bytes_per_s, flops / chip.peak_flops);
}

std::string call_locator() {
  if (locator == nullptr || !Py_IsInitialized()) return "";
  py::gil_scoped_acquire gil;
  try {
    return py::reinterpret_borrow<py::object>(locator)().cast<std::string>();
  } catch (const std::exception&) {
    return "";
  }
}

void call_on_session(bool started) {
  if (on_session == nullptr || !Py_IsInitialized()) return;
  py::gil_scoped_acquire gil;
  try {
    py::reinterpret_borrow<py::object>(on_session)(started);
  } catch (py::error_already_set& e) {
    e.discard_as_unraisable("neuron_lab profiler session start/stop");
  }
}

bool is_launch_range(const std::string& name) {
  return name.rfind("neuron::fused[", 0) == 0 || name.rfind("neuron::per-op[", 0) == 0;
}

// A view op returns new tensors on an input's storage; an in-place op returns the input itself
// (a kernel ran); anything else has storage of its own.
bool is_view(c10::ArrayRef<c10::IValue> outs, const OpContext& ctx) {
  bool any = false;
  for (const auto& v : outs) {
    if (!v.isTensor() || !v.toTensor().defined() || !v.toTensor().has_storage()) continue;
    const auto& t = v.toTensor();
    const auto* impl = t.unsafeGetTensorImpl();
    const auto* st = t.storage().unsafeGetStorageImpl();
    bool same_tensor = std::find(ctx.in_tensors.begin(), ctx.in_tensors.end(), impl) !=
                       ctx.in_tensors.end();
    bool shared = std::find(ctx.in_storages.begin(), ctx.in_storages.end(), st) !=
                  ctx.in_storages.end();
    if (same_tensor || !shared) return false;
    any = true;
  }
  return any;
}

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  if (!recording.load(std::memory_order_relaxed)) return nullptr;
  auto ctx = std::make_unique<OpContext>();
  Frame& f = *ctx->frame;
  ctx->depth = corr_stack.size();
  if (fn.scope() == at::RecordScope::USER_SCOPE) {
    ctx->range = is_launch_range(fn.name());
  } else {
    auto ins = fn.needsInputs() ? fn.inputs() : c10::ArrayRef<const c10::IValue>();
    for (const auto& v : ins)
      if (has_neuron(v)) { f.neuron = true; break; }
    if (f.neuron) {
      f.name = fn.name();
      for (const auto& v : ins) {
        ctx->in_bytes += tensor_bytes(v);
        if (v.isTensor() && v.toTensor().defined() && v.toTensor().has_storage()) {
          ctx->in_tensors.push_back(v.toTensor().unsafeGetTensorImpl());
          ctx->in_storages.push_back(v.toTensor().storage().unsafeGetStorageImpl());
        }
      }
      ctx->k = contraction(fn.name(), ins);
    }
  }
  if (open_ops.size() >= kMaxOpen) open_ops.clear();
  if (f.neuron && !open_ops.empty()) open_ops.back()->child = true;
  open_ops.push_back(ctx->frame);
  ctx->start_ns = c10::getTime();
  return ctx;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext* c) {
  auto* ctx = static_cast<OpContext*>(c);
  if (ctx == nullptr) return;
  int64_t end = c10::getTime();
  const Frame& f = *ctx->frame;
  std::shared_ptr<Frame> parent;       // the op it was nested in, if it closed in order here
  for (size_t i = open_ops.size(); i-- > 0;) {
    if (open_ops[i] == ctx->frame) {
      if (i > 0) parent = open_ops[i - 1];
      open_ops.erase(open_ops.begin() + static_cast<std::ptrdiff_t>(i));
      break;
    }
  }
  // this op's id: pushed after our entry (torch's callback runs after global ones)
  uint64_t corr = corr_stack.size() > ctx->depth ? corr_stack[ctx->depth] : 0;
  if (ctx->range) {
    last_range = RangeSeen{ctx->start_ns, end, corr, true};
    return;
  }
  // The neuron kernel runs the same op on the executor's tensors, nested. torch's tables fold an
  // op into its parent of the same name (EventList._remove_dup_nodes keeps the inner op's
  // device time only): link the launch to the inner op then.
  if (parent != nullptr && parent->neuron && parent->inner == 0 && corr != 0 &&
      parent->name == fn.name())
    parent->inner = corr;
  if (!f.neuron || f.child || !eager_ops.load(std::memory_order_relaxed) ||
      !recording.load(std::memory_order_relaxed))
    return;
  Launch l;
  l.name = fn.name();
  l.kind = "op";
  l.start_ns = ctx->start_ns;
  l.end_ns = end;
  l.corr = f.inner != 0 ? f.inner : corr;
  l.thread = lk::systemThreadId();
  auto outs = fn.needsOutputs() ? fn.outputs() : c10::ArrayRef<c10::IValue>();
  if (is_view(outs, *ctx)) return;     // a view of an input (t, view, slice...): no kernel
  l.bytes = ctx->in_bytes;
  for (const auto& v : outs) l.bytes += tensor_bytes(v);
  double n = numel_out(outs);
  l.flops = ctx->k > 0 ? 2.0 * n * static_cast<double>(ctx->k) : n;
  l.modelled_s = roofline(l.bytes, l.flops);
  l.op_names = "[\"" + l.name + "\"]";
  l.location = call_locator();
  std::lock_guard<std::mutex> g(mu);
  launches.push_back(std::move(l));
}

void install_callback() {
  if (callback_handle != 0) return;
  callback_handle = at::addGlobalCallback(
      at::RecordFunctionCallback(on_enter, on_exit)
          .needsInputs(true)
          .needsOutputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
}

void remove_callback() {
  if (callback_handle == 0) return;
  at::removeCallback(callback_handle);
  callback_handle = 0;
}

// Kineto copies metadata strings into JSON unescaped: keep them plain.
std::string plain(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) out.push_back(ch == '"' || ch == '\\' || ch == '\n' ? '\'' : ch);
  return out;
}

class NeuronSession : public lk::IActivityProfilerSession {
 public:
  explicit NeuronSession(bool device) : device_(device) {}

  void start() override {
    {
      std::lock_guard<std::mutex> g(mu);
      launches.clear();
    }
    if (device_) {
      call_on_session(true);
      install_callback();
      recording = true;
    }
    status_ = lk::TraceStatus::RECORDING;
  }

  void stop() override {
    recording = false;
    remove_callback();
    if (device_) call_on_session(false);
    status_ = lk::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(lk::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const lk::ITraceActivity* { return nullptr; }, 0,
                 INT64_MAX);
  }

  void processTrace(lk::ActivityLogger& logger, lk::getLinkedActivityCallback linked,
                    int64_t start, int64_t end) override {
    std::vector<Launch> copy;
    {
      std::lock_guard<std::mutex> g(mu);
      copy = launches;
    }
    int32_t flow = 0;
    for (const auto& l : copy) {
      if (l.end_ns < start || (end > 0 && l.start_ns > end)) continue;
      ++flow;
      const lk::ITraceActivity* op = l.corr ? linked(static_cast<int32_t>(l.corr)) : nullptr;
      // the host side: the launch call, inside the launching op (as cudaLaunchKernel)
      buffer_->emplace_activity(buffer_->span, lk::ActivityType::PRIVATEUSE1_RUNTIME,
                                "neuronLaunchKernel");
      auto& rt = lk::CpuTraceBuffer::toRef(buffer_->activities.back());
      // this callback's entry ran before torch's: start a little later, inside the launching op
      int64_t inside = l.start_ns + std::min<int64_t>(20000, (l.end_ns - l.start_ns) / 4);
      rt.startTime = inside;
      rt.endTime = inside + std::min<int64_t>(1000, std::max<int64_t>(0, l.end_ns - inside));
      rt.id = static_cast<int32_t>(l.corr);
      rt.device = lk::processId();
      rt.resource = l.thread;
      rt.threadId = l.thread;
      rt.linked = op;
      rt.flow.id = flow;
      rt.flow.type = lk::kLinkAsyncCpuGpu;
      rt.flow.start = true;
      rt.addMetadata("correlation", flow);
      rt.log(logger);
      // the device side: the kernel or fused program on neuron:0
      buffer_->emplace_activity(buffer_->span, lk::ActivityType::CONCURRENT_KERNEL, l.name);
      auto& k = lk::CpuTraceBuffer::toRef(buffer_->activities.back());
      k.startTime = l.start_ns;
      k.endTime = l.end_ns;
      k.id = static_cast<int32_t>(l.corr);
      k.device = kDevicePid;
      k.resource = kStream;
      k.linked = op;
      k.flow.id = flow;
      k.flow.type = lk::kLinkAsyncCpuGpu;
      k.flow.start = false;
      k.addMetadata("device", 0);
      k.addMetadata("stream", kStream);
      k.addMetadata("correlation", flow);
      k.addMetadataQuoted("kind", l.kind);
      k.addMetadata("ops", l.ops);
      if (l.region >= 0) k.addMetadata("region", l.region);
      k.addMetadata("executor_us", static_cast<double>(l.end_ns - l.start_ns) / 1e3);
      k.addMetadata("modelled_us", l.modelled_s * 1e6);
      k.addMetadataQuoted("chip", chip_name);
      k.addMetadata("bytes", l.bytes);
      k.addMetadata("flops", l.flops);
      if (!l.location.empty()) k.addMetadataQuoted("source", plain(l.location));
      if (!l.op_names.empty() && l.kind != "op") k.addMetadataQuoted("op_names", plain(l.op_names));
      k.log(logger);
    }
  }

  std::unique_ptr<lk::DeviceInfo> getDeviceInfo() override {
    if (!device_) return nullptr;
    return std::make_unique<lk::DeviceInfo>(
        lk::DeviceInfo{kDevicePid, kDevicePid, "neuron:0", "neuron " + chip_name + " (emulated)"});
  }

  std::vector<lk::ResourceInfo> getResourceInfos() override {
    if (!device_) return {};
    return {lk::ResourceInfo{kStream, kStream, kDevicePid, "executor stream"}};
  }

  std::unique_ptr<lk::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  // torch pushes every op's id on entry (user ranges through the "user" pair), pops on exit
  void pushCorrelationId(uint64_t id) override { corr_stack.push_back(id); ++pushes; }
  void popCorrelationId() override {
    if (!corr_stack.empty()) corr_stack.pop_back();
  }
  void pushUserCorrelationId(uint64_t id) override { corr_stack.push_back(id); ++pushes; }
  void popUserCorrelationId() override {
    if (!corr_stack.empty()) corr_stack.pop_back();
  }

  std::string getDeviceProperties() override { return device_ ? device_properties : ""; }

 private:
  bool device_;
  std::unique_ptr<lk::CpuTraceBuffer> buffer_ = std::make_unique<lk::CpuTraceBuffer>();
};

class NeuronActivityProfiler : public lk::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<lk::ActivityType>& availableActivities() const override { return types_; }

  std::unique_ptr<lk::IActivityProfilerSession> configure(
      const std::set<lk::ActivityType>& activity_types, const lk::Config&) override {
    bool device = activity_types.count(lk::ActivityType::CONCURRENT_KERNEL) > 0;
    if (!device) return nullptr;
    return std::make_unique<NeuronSession>(device);
  }

  std::unique_ptr<lk::IActivityProfilerSession> configure(
      int64_t, int64_t, const std::set<lk::ActivityType>& activity_types,
      const lk::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  std::string name_{"neuron"};
  std::set<lk::ActivityType> types_{lk::ActivityType::CONCURRENT_KERNEL,
                                    lk::ActivityType::PRIVATEUSE1_RUNTIME};
};

}  // namespace
}  // namespace neuron_lab

using NeuronActivityProfiler = neuron_lab::NeuronActivityProfiler;
REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);

namespace neuron_lab {

void init_profiler(py::module_& m) {
  m.def("profiler_registered", [] {
    return torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().hasFactory();
  });
  m.def("profiler_recording", [] { return recording.load(); });
  m.def("profiler_pushes", [] { return pushes.load(); });
  m.def("profiler_set_eager", [](bool on) { eager_ops = on; },
        "eager mode: record each leaf op on a neuron tensor as a launch");
  m.def("profiler_set_chip",
        [](const std::string& name, double bps, double overhead_s, double peak,
           const std::string& properties_json) {
          chip = Chip{bps, overhead_s, peak};
          chip_name = name;
          device_properties = properties_json;
        },
        "the modelled chip: its name, HBM bytes/s, launch overhead, FP32 peak FLOP/s, and the "
        "trace's deviceProperties entry");
  m.def("profiler_set_locator", [](py::object fn) {
    Py_XDECREF(locator);
    locator = fn.is_none() ? nullptr : fn.release().ptr();
  });
  m.def("profiler_set_on_session", [](py::object fn) {
    Py_XDECREF(on_session);
    on_session = fn.is_none() ? nullptr : fn.release().ptr();
  }, "fn(started: bool), called when a session with device activities starts and stops");
  m.def("profiler_record_launch",
        [](const std::string& name, const std::string& kind, int64_t region, int64_t ops,
           double seconds, double modelled_s, int64_t bytes, double flops,
           const std::string& location, const std::string& op_names) {
          if (!recording.load()) return false;
          Launch l;
          l.name = name;
          l.kind = kind;
          l.region = region;
          l.ops = ops;
          l.thread = lk::systemThreadId();
          if (last_range.set) {      // the launch range that just closed on this thread
            l.start_ns = last_range.start_ns;
            l.end_ns = last_range.end_ns;
            l.corr = last_range.corr;
            last_range.set = false;
          } else {
            l.end_ns = c10::getTime();
            l.start_ns = l.end_ns - static_cast<int64_t>(seconds * 1e9);
            l.corr = corr_stack.empty() ? 0 : corr_stack.back();
          }
          l.modelled_s = modelled_s;
          l.bytes = bytes;
          l.flops = flops;
          l.location = location;
          l.op_names = op_names;
          std::lock_guard<std::mutex> g(mu);
          launches.push_back(std::move(l));
          return true;
        });
  m.def("profiler_launches", [] {
    std::lock_guard<std::mutex> g(mu);
    py::list out;
    for (const auto& l : launches) {
      py::dict d;
      d["name"] = l.name;
      d["kind"] = l.kind;
      d["start_ns"] = l.start_ns;
      d["end_ns"] = l.end_ns;
      d["correlation"] = l.corr;
      d["thread"] = l.thread;
      d["modelled_s"] = l.modelled_s;
      d["bytes"] = l.bytes;
      d["flops"] = l.flops;
      d["region"] = l.region;
      d["ops"] = l.ops;
      d["location"] = l.location;
      d["op_names"] = l.op_names;
      out.append(d);
    }
    return out;
  });
}

}  // namespace neuron_lab
