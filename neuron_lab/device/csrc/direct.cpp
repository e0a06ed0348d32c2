// The eager path without Python: a C++ PrivateUse1 kernel for the ops ``OpFacts.direct`` names:
// plain ops that return one new tensor and write no argument, views (``view``, ``t``,
// ``slice``: a new tensor on the base's storage, as tensor_data.view_of), pointwise ops that
// write their self (``add_``: the self itself), and ops returning several new tensors
// (attention's forward and backward, ``nll_loss_forward``: each wrapped as a new tensor; one
// whose only randomness is a ``dropout_p`` argument runs here when the call's is 0).
//
// Every other path to a neuron op goes through the dispatcher's Python kernel holder (the
// arguments become Python objects, the GIL is taken, registry's generic kernel runs, the result
// comes back as an IValue); for a small op that is most of its cost. Here, when the device may
// run ops at once (no runtime, or the runtime in eager mode with nothing queued:
// ``runtime_interface``'s
// ``run_directly``), the op runs without the GIL: each neuron argument's host tensor is built
// from the host storage its storage is bound to (storage.cpp), the op runs on the host, its
// output is counted (accounting.cpp; over the capacity -> the Python path, which raises the
// device's OutOfMemoryError) and wrapped in a new neuron tensor bound to the output's storage:
// what kernels.execute's short path does, with the same results. Two copies whose bytes the
// Python path checks before the host allocates (``clone``, ``cat``: sizing.DIRECT_SIZED) are
// checked here the same way first (``admits``).
//
// Anything else goes to the op's generic kernel (registry._kernel's runtime_interface.launch or
// execute),
// called from here without the dispatcher's Python kernel holder (python_call.h; every op in
// adaptive mode takes that way): a pending or unbound argument, a host-only dtype (float64,
// complex: Trainium's fallback rules are recorded in Python; so is a keyword ``dtype=`` naming
// one), a CPU tensor that is not a 0-dim scalar (the device-mismatch error), a list that is not
// a plain list of tensors, a view op whose host result is not on its base's bytes, and any
// error the host op raises (it wrote nothing — a pointwise in-place op checks its arguments
// before it writes — so the Python path runs it again and raises the device's message).
// An op that goes there is *passed* to the runtime (``BoxedCall``: the op, this kernel and the
// dispatcher's arguments, kept for the call): a runtime that runs it at once as it records it
// (the adaptive engine's capture) runs it here through ``run_boxed_call``, on those arguments,
// instead of calling the op's Python binding, which would parse them again and dispatch a
// second time (a fresh model's first step captures every op, most of them through here).
//
// The tensors made here carry no Python attributes: tensor_data.host finds their host view through
// ``host_storage`` (storage.cpp) the first time Python needs it. Runs are counted per op and
// added to tracking.executed when someone reads it (``direct_counts``).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/SmallVector.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/TensorOptions.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "python_call.h"
#include "storages.h"

namespace py = pybind11;

namespace neuron_lab {
namespace {

constexpr auto kDevice = c10::DeviceType::PrivateUse1;

std::atomic<bool> g_direct{false};        // runtime_interface.run_directly
thread_local bool t_here = false;         // inside run_here: run this thread's op directly
thread_local bool t_declined = false;     // ... and it could not
std::atomic<int64_t> g_capacity{-1};      // memory.capacity(), kept current by memory.py
std::atomic<uint64_t> g_host_only{0};     // bit per ScalarType: dtypes.HOST_ONLY
c10::Allocator* g_allocator = nullptr;    // a device storage's allocator (create_empty_tensor's)

bool host_only(c10::ScalarType t) {
  auto i = static_cast<unsigned>(t);
  return i < 64 && (g_host_only.load(std::memory_order_relaxed) >> i) & 1;
}

// A tensor on `storage` under dispatch key `key` with `like`'s dtype, sizes, strides, offset and
// conjugate/negative bits: a host view of a neuron tensor, or a neuron tensor over a host one.
at::Tensor tensor_like(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(std::move(storage),
                                                    c10::DispatchKeySet(key), like.dtype());
  t.unsafeGetTensorImpl()->set_sizes_and_strides(like.sizes(), like.strides(),
                                                 like.storage_offset());
  if (like.is_conj()) t._set_conj(true);
  if (like.is_neg()) t._set_neg(true);
  return t;
}

// The host tensor for argument `t`; false: take the Python path.
bool host_tensor(const at::Tensor& t, at::Tensor* out) {
  if (!t.defined()) {
    *out = t;
    return true;
  }
  const auto type = t.device().type();
  if (type == c10::DeviceType::CPU) {   // a 0-dim CPU tensor is an input, as on CUDA
    if (t.dim() != 0) return false;
    *out = t;
    return true;
  }
  if (type != kDevice || t.layout() != c10::kStrided || host_only(t.scalar_type()) ||
      c10::isQIntType(t.scalar_type()))
    return false;
  c10::StorageImpl* hs = bound_host(*t.storage().unsafeGetStorageImpl());
  if (hs == nullptr) return false;
  *out = tensor_like(c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(hs)),
                     c10::DispatchKey::CPU, t);
  return true;
}

bool host_value(const c10::IValue& v, c10::IValue* out) {
  if (v.isTensor()) {
    at::Tensor h;
    if (!host_tensor(v.toTensor(), &h)) return false;
    *out = std::move(h);
    return true;
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> hl;
    hl.reserve(v.toTensorList().size());
    for (const at::Tensor& t : v.toTensorList()) {
      at::Tensor h;
      if (!t.defined() || t.device().type() != kDevice || !host_tensor(t, &h)) return false;
      hl.push_back(std::move(h));
    }
    *out = std::move(hl);
    return true;
  }
  if (v.isList()) {   // Tensor?[] and the like: the Python path
    for (const c10::IValue& e : v.toListRef())
      if (e.isTensor()) return false;
  }
  *out = v;
  return true;
}

// A new neuron tensor over host tensor `h`'s storage (tensor_data.wrap).
at::Tensor wrap(const at::Tensor& h) {
  c10::StorageImpl* hs = h.storage().unsafeGetStorageImpl();
  auto st = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), hs->nbytes(),
      bound_data_ptr(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(hs)), g_allocator,
      /*resizable=*/true);
  return tensor_like(c10::Storage(std::move(st)), c10::DispatchKey::PrivateUse1, h);
}

// The Python kernel holder hands a wrapped number (the 1.01 of ``x * 1.01``: a 0-dim CPU
// tensor marked as a Python scalar) to Python as a float, by building a Python tensor for it and
// probing that for a ``_wrapped_number`` attribute: an AttributeError raised and cleared, ~1 us
// of an adaptive op's ~4. The number as a Scalar IValue becomes the same Python float, int, bool
// or complex directly. (A ``_wrapped_number`` attribute exists only on symbolic scalars under
// fake tensors, which never reach a device kernel.)
// The wrapped numbers unwrap_numbers replaced: (argument index, the original tensor).
using Unwrapped = c10::SmallVector<std::pair<size_t, c10::IValue>, 2>;

void unwrap_numbers(size_t n, torch::jit::Stack* stack, Unwrapped* originals) {
  size_t i = 0;
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(n); it != stack->end(); ++it, ++i) {
    if (!it->isTensor()) continue;
    const at::Tensor& t = it->toTensor();
    if (!t.defined() || !t.unsafeGetTensorImpl()->is_wrapped_number()) continue;
    c10::IValue number;
    switch (t.scalar_type()) {
      case at::kDouble: number = c10::IValue(*t.const_data_ptr<double>()); break;
      case at::kLong: number = c10::IValue(*t.const_data_ptr<int64_t>()); break;
      case at::kBool: number = c10::IValue(*t.const_data_ptr<bool>()); break;
      case at::kComplexDouble:
        number = c10::IValue(*t.const_data_ptr<c10::complex<double>>());
        break;
      default: continue;
    }
    originals->emplace_back(i, std::move(*it));
    *it = std::move(number);
  }
}

// What the op returns (OpFacts.direct): a new tensor, a view of argument `arg`, argument `arg`
// itself, written in place, or several new tensors.
enum class Kind : int { kNew = 0, kView = 1, kInPlace = 2, kTuple = 3 };

// How a sized op's output bytes are predicted from its arguments (sizing.DIRECT_SIZED).
enum class Size : int { kNone = 0, kSelf = 1, kTensors = 2 };

struct Direct;

// The call a direct kernel passed to the runtime (every op in adaptive mode): the op, its
// arguments as the dispatcher passed them (on its stack through the call, the wrapped numbers
// unwrapped for Python kept aside: no copy on the deferral's hot path), and the Python argument
// tuple made of them, which identifies the call while the runtime runs (``run_boxed_call``).
struct BoxedCall {
  Direct* kernel;
  const c10::OperatorHandle* op;
  const torch::jit::Stack* stack;   // the dispatcher's: its last `n` are the arguments, kept
  size_t n;                         // there through the call (call_generic drops them after),
  Unwrapped unwrapped;              // but for the wrapped numbers unwrapped for Python
  PyObject* py_args = nullptr;   // borrowed, set by call_generic for its call only

  torch::jit::Stack arguments() const {   // as the dispatcher passed them
    torch::jit::Stack args(stack->end() - static_cast<std::ptrdiff_t>(n), stack->end());
    for (const auto& [i, original] : unwrapped) args[i] = original;
    return args;
  }
};
thread_local BoxedCall* t_call = nullptr;   // the innermost passed call of this thread

struct BoxedCallScope {   // t_call = h for a call (nested calls each have their own)
  explicit BoxedCallScope(BoxedCall* h) : outer(t_call) { t_call = h; }
  ~BoxedCallScope() { t_call = outer; }
  BoxedCall* outer;
};

struct Direct final : c10::OperatorKernel {
  Direct(std::string n, Kind k, int a, int d, Size z, int p, PyObject* g)
      : name(std::move(n)), kind(k), arg(a), dtype_arg(d), size(z), dropout_arg(p), generic(g) {}

  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
    if ((g_direct.load(std::memory_order_acquire) || t_here) && run(op, stack)) {
      runs.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    if (t_here) {   // run_here's call: the caller takes its Python path instead
      t_declined = true;
      TORCH_CHECK(false, "neuron: ", name, " declined by the direct kernel");
    }
    const size_t n = op.schema().arguments().size();
    BoxedCall passed{this, &op, stack, n, {}};
    unwrap_numbers(n, stack, &passed.unwrapped);
    BoxedCallScope scope(&passed);
    call_generic(generic, op, stack, &passed.py_args);
  }

  // The op on the host, its result on the stack; false (the stack untouched, nothing written):
  // the Python path.
  bool run(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    const size_t n = op.schema().arguments().size();
    auto args = torch::jit::last(*stack, n);
    if (dtype_arg >= 0 && static_cast<size_t>(dtype_arg) < n && args[dtype_arg].isInt() &&
        host_only(static_cast<c10::ScalarType>(args[dtype_arg].toInt())))
      return false;   // dtype=float64: a fallback the Python path records
    if (size != Size::kNone && !admits(args)) return false;
    if (dropout_arg >= 0 && (static_cast<size_t>(dropout_arg) >= n ||
                             !args[dropout_arg].isDouble() || args[dropout_arg].toDouble() != 0.0))
      return false;   // draws random numbers: the Python path (host generator, fallback record)
    const at::Tensor* base = nullptr;   // the argument a view or an in-place op returns
    if (kind == Kind::kView || kind == Kind::kInPlace) {
      if (arg < 0 || static_cast<size_t>(arg) >= n || !args[arg].isTensor()) return false;
      base = &args[arg].toTensor();
      if (!base->defined() || base->device().type() != kDevice) return false;
    }
    torch::jit::Stack host;
    host.reserve(n);
    for (const c10::IValue& v : args) {
      host.emplace_back();
      if (!host_value(v, &host.back())) return false;
    }
    try {
      op.callBoxed(host);
    } catch (const std::exception&) {
      return false;   // nothing was written: the Python path runs it again and raises
    }
    if (kind == Kind::kTuple) return wrap_all(host, op.schema().returns().size(), n, stack);
    if (host.size() != 1 || !host[0].isTensor()) return false;
    const at::Tensor& out = host[0].toTensor();
    if (!out.defined() || !wrappable(out)) return false;
    at::Tensor t;
    if (kind == Kind::kNew) {
      if (!counted(out)) return false;   // past the capacity: the Python path raises OOM
      t = wrap(out);
    } else if (out.storage().unsafeGetStorageImpl() !=
               bound_host(*base->storage().unsafeGetStorageImpl())) {
      // not on the base's bytes: a view op that copied (Python's view_of wraps it); an
      // in-place op never gets here (it writes its own self)
      TORCH_CHECK(kind == Kind::kView, "neuron: ", name, " wrote a new storage in place");
      return false;
    } else if (kind == Kind::kView) {
      t = tensor_like(base->storage(), c10::DispatchKey::PrivateUse1, out);   // tensor_data.view_of
    } else {
      TORCH_CHECK(out.sizes() == base->sizes() && out.strides() == base->strides() &&
                      out.storage_offset() == base->storage_offset(),
                  "neuron: ", name, " changed its self's shape in place on device neuron:0");
      t = *base;
    }
    torch::jit::drop(*stack, n);
    stack->emplace_back(std::move(t));
    return true;
  }

  // A host output the kernel can hand out as a neuron tensor: a CPU strided tensor.
  static bool wrappable(const at::Tensor& h) {
    return h.device().is_cpu() && h.layout() == c10::kStrided;
  }

  // `h`'s storage counted as device memory; false (nothing counted) past the capacity.
  static bool counted(const at::Tensor& h) {
    return count_storage(h.storage().unsafeGetStorageImpl(),
                         g_capacity.load(std::memory_order_relaxed)) != -1;
  }

  // kTuple's outputs: each new host tensor counted and wrapped (an undefined one stays
  // undefined, as the Python path's None), then the `n` arguments replaced by them on `stack`.
  // False (nothing on the stack changed): not that many tensors, one not a CPU strided tensor,
  // or past the capacity (the outputs counted so far are uncounted as the host frees them).
  static bool wrap_all(torch::jit::Stack& host, size_t returns, size_t n,
                       torch::jit::Stack* stack) {
    if (host.size() != returns) return false;
    for (const c10::IValue& v : host) {
      if (!v.isTensor()) return false;
      const at::Tensor& h = v.toTensor();
      if (h.defined() && !wrappable(h)) return false;
    }
    for (const c10::IValue& v : host) {
      const at::Tensor& h = v.toTensor();
      if (h.defined() && !counted(h)) return false;
    }
    torch::jit::drop(*stack, n);
    for (const c10::IValue& v : host) {
      const at::Tensor& h = v.toTensor();
      stack->emplace_back(h.defined() ? wrap(h) : h);
    }
    return true;
  }

  // The capacity check before the host allocates, as kernels._admit makes it with the op's
  // sizer: argument 0's bytes (kSelf), or the sum of its tensors' numels times their largest
  // element size (kTensors). False: past the capacity (the Python path raises the device's
  // OutOfMemoryError), or arguments the rule does not read (the Python path decides).
  bool admits(c10::ArrayRef<c10::IValue> args) const {
    const int64_t capacity = g_capacity.load(std::memory_order_relaxed);
    if (capacity < 0) return true;
    if (args.empty()) return false;
    int64_t need = 0;
    if (size == Size::kSelf) {
      if (!args[0].isTensor()) return false;
      const at::Tensor& t = args[0].toTensor();
      need = t.numel() * static_cast<int64_t>(t.element_size());
    } else {
      if (!args[0].isTensorList()) return false;
      int64_t numel = 0, item = 0;
      for (const at::Tensor& t : args[0].toTensorList()) {
        if (!t.defined()) return false;
        numel += t.numel();
        item = std::max(item, static_cast<int64_t>(t.element_size()));
      }
      need = numel * item;
    }
    return need == 0 || counted_total() + need <= capacity;
  }

  const std::string name;
  const Kind kind;
  const int arg;
  const int dtype_arg;   // the keyword-only ``dtype`` argument's position, or -1
  const Size size;       // how the bytes are checked before the host allocates, if they are
  const int dropout_arg; // the ``dropout_p`` argument's position (runs here only when 0), or -1
  PyObject* const generic;   // the op's generic kernel, (facts, execute, runtime_interface
                             // globals): held for the process's life, like the registration
  std::atomic<int64_t> runs{0};
};

std::mutex g_mu;
std::vector<Direct*> g_kernels;          // owned by their registrations
torch::Library* g_lib = nullptr;         // lives as long as the process

void configure(py::list host_only_dtypes, py::handle device_storage) {
  uint64_t mask = 0;
  for (py::handle d : host_only_dtypes) {
    TORCH_CHECK(THPDtype_Check(d.ptr()), "neuron: configure_direct expects torch.dtype values");
    auto i = static_cast<unsigned>(reinterpret_cast<THPDtype*>(d.ptr())->scalar_type);
    if (i < 64) mask |= uint64_t{1} << i;
  }
  g_host_only.store(mask);
  TORCH_CHECK(THPStorage_Check(device_storage.ptr()), "neuron: configure_direct expects a storage");
  g_allocator = THPStorage_Unpack(device_storage.ptr()).unsafeGetStorageImpl()->allocator();
}

// Register the direct kernel for aten op `name` ("add.Tensor") under PrivateUse1; `counted_as`
// is its name in tracking.executed ("aten::add.Tensor"); `kind` and `arg`: what it returns.
void register_op(const std::string& name, const std::string& counted_as, int kind, int arg,
                 int dtype_arg, int size, int dropout_arg, py::tuple generic) {
  TORCH_CHECK(kind >= 0 && kind <= 3, "neuron: register_direct: kind 0, 1, 2 or 3");
  TORCH_CHECK(size >= 0 && size <= 2, "neuron: register_direct: size 0, 1 or 2");
  TORCH_CHECK(size == 0 || kind == 0, "neuron: register_direct: only a new tensor is sized");
  TORCH_CHECK(generic.size() == 3 && PyDict_Check(generic[2].ptr()),
              "neuron: register_direct: generic is (facts, execute, runtime_interface globals)");
  std::lock_guard<std::mutex> g(g_mu);
  if (g_lib == nullptr)
    g_lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                               __FILE__, __LINE__);
  auto k = std::make_unique<Direct>(counted_as, static_cast<Kind>(kind), arg, dtype_arg,
                                    static_cast<Size>(size), dropout_arg,
                                    generic.inc_ref().ptr());
  Direct* raw = k.get();
  g_lib->impl(name.c_str(), torch::CppFunction::makeFromBoxedFunctor(std::move(k)));
  g_kernels.push_back(raw);
}

// {op name: runs since the last call} (runs are counted in C++ and read here)
py::dict counts() {
  py::dict out;
  std::lock_guard<std::mutex> g(g_mu);
  for (Direct* k : g_kernels) {
    int64_t n = k->runs.exchange(0, std::memory_order_relaxed);
    if (n) out[py::str(k->name)] = n;
  }
  return out;
}

// run_here(op, args, kwargs): ``op(*args, **kwargs)`` on the direct kernel now, whatever the
// switch, or None where the direct kernel declines it (the caller runs its Python path). For a
// runtime that runs an op at once while it records it (the adaptive engine's capture).
PyObject* run_here(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 3 || !PyTuple_Check(argv[1]) || (argv[2] != Py_None && !PyDict_Check(argv[2]))) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: run_here(op, args: tuple, kwargs: dict|None)");
    return nullptr;
  }
  PyObject* kwargs = argv[2] != Py_None && PyDict_GET_SIZE(argv[2]) ? argv[2] : nullptr;
  const bool outer = t_here;
  t_here = true;
  t_declined = false;
  PyObject* out = PyObject_Call(argv[0], argv[1], kwargs);
  t_here = outer;
  if (out == nullptr && t_declined) {
    t_declined = false;
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  return out;
}

// run_boxed_call(args): the op of the call this thread's direct kernel passed to the runtime, run
// on
// the direct kernel now, on the arguments the dispatcher passed (no Python argument parsing, no
// second dispatch: what run_here's call costs), if ``args`` is that call's Python argument
// tuple (the runtime runs the call it was passed: the adaptive engine's capture); its result
// as run_here returns it. None: not the passed call, or one the direct kernel declines (the
// caller runs it as before). A passed call runs here at most once.
PyObject* run_boxed_call(PyObject*, PyObject* args) {
  BoxedCall* h = t_call;
  if (h == nullptr || h->py_args == nullptr || h->py_args != args) Py_RETURN_NONE;
  h->py_args = nullptr;
  torch::jit::Stack stack = h->arguments();
  bool ran = false;
  try {
    py::gil_scoped_release no_gil;   // as a call through the op's Python binding runs it
    ran = h->kernel->run(*h->op, &stack);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  if (!ran) Py_RETURN_NONE;
  h->kernel->runs.fetch_add(1, std::memory_order_relaxed);
  auto one = [](const c10::IValue& v) -> PyObject* {
    if (!v.toTensor().defined()) Py_RETURN_NONE;
    return THPVariable_Wrap(v.toTensor());
  };
  if (stack.size() == 1) return one(stack[0]);
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(stack.size()));
  for (size_t i = 0; out != nullptr && i < stack.size(); ++i) {
    PyObject* o = one(stack[i]);
    if (o == nullptr) Py_CLEAR(out);
    else PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), o);
  }
  return out;
}

// tensor_data._recover in C: the host view of neuron tensor `t` (its storage's bound host bytes,
// with
// t's dtype, sizes, strides, offset and conj/neg bits), or None when its storage has no host
// storage bound (pending, or not the device's). For tensors whose Python object autograd made
// anew (a gradient detached by AccumulateGrad): no cached _d, ~6 us of Python each.
py::object host_view(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != kDevice || t.layout() != c10::kStrided)
    return py::none();
  c10::StorageImpl* hs = bound_host(*t.storage().unsafeGetStorageImpl());
  if (hs == nullptr) return py::none();
  const auto key = c10::computeDispatchKey(t.scalar_type(), c10::kStrided, hs->device());
  return py::cast(
      tensor_like(c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(hs)), key, t));
}

// tensor_data.view_of: a neuron tensor for host view `h` of neuron tensor `base`'s bytes, on
// `base`'s own StorageImpl (as the direct kernel's views are), or None when `h` is not on
// those bytes. Made in C++: the storage gets no Python object (storage.cpp says why).
py::object view_on(const at::Tensor& base, const at::Tensor& h) {
  TORCH_CHECK(base.defined() && base.device().type() == kDevice, "neuron: view_on takes a "
              "neuron tensor as its base");
  c10::StorageImpl* hs = bound_host(*base.storage().unsafeGetStorageImpl());
  if (hs == nullptr || !h.defined() || h.storage().unsafeGetStorageImpl() != hs)
    return py::none();
  return py::cast(tensor_like(base.storage(), c10::DispatchKey::PrivateUse1, h));
}

PyMethodDef run_boxed_call_def = {
    "run_boxed_call", &run_boxed_call, METH_O,
    "run_boxed_call(args): the passed call on the direct kernel now, or None"};

PyMethodDef run_here_def = {"run_here",
                            reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&run_here)),
                            METH_FASTCALL,
                            "run_here(op, args, kwargs): op on the direct kernel now, or None"};

}  // namespace

void init_direct(py::module_& m) {
  m.def("configure_direct", &configure, py::arg("host_only"), py::arg("device_storage"),
        "configure_direct(host_only dtypes, a device tensor's storage): what the direct kernel "
        "checks and the allocator its storages carry");
  m.def("register_direct", &register_op, py::arg("name"), py::arg("counted_as"),
        py::arg("kind"), py::arg("arg"), py::arg("dtype_arg"), py::arg("size"),
        py::arg("dropout_arg"), py::arg("generic"),
        "Register the direct eager kernel for aten op `name` under PrivateUse1; kind 0: it "
        "returns a new tensor, 1: a view of argument `arg`, 2: argument `arg`, written in "
        "place, 3: several new tensors; `dtype_arg`: the position of its keyword-only dtype "
        "argument, or -1; "
        "`size`: 0, or how a new tensor's bytes are checked before the host allocates them "
        "(1: argument 0's, 2: argument 0's tensors', sizing.DIRECT_SIZED); `dropout_arg`: "
        "the position of a dropout_p argument (the kernel runs calls where it is 0), or -1; "
        "`generic`: (facts, execute, runtime_interface globals), what it calls for an op it does "
        "not run (python_call.h)");
  m.def("set_direct", [](bool on) { g_direct.store(on, std::memory_order_release); },
        py::arg("on"), "Let the direct kernel run ops (no runtime to call) or not");
  m.def("direct_enabled", []() { return g_direct.load(); });
  m.def("set_direct_capacity", [](int64_t c) { g_capacity.store(c); }, py::arg("capacity"),
        "The modelled capacity the direct kernel counts against");
  m.def("direct_counts", &counts, "{op name: direct runs since the last call}");
  m.def("view_on", &view_on, py::arg("base"), py::arg("h"),
        "A neuron tensor for host view `h` on neuron tensor `base`'s storage, or None when `h` "
        "is not on base's bytes (tensor_data.view_of)");
  m.def("host_view", &host_view, py::arg("tensor"),
        "The host tensor viewing a neuron tensor's bound host bytes, or None "
        "(tensor_data._recover)");
  m.add_object("run_here",
               py::reinterpret_steal<py::object>(PyCFunction_New(&run_here_def, nullptr)));
  m.add_object("run_boxed_call",
               py::reinterpret_steal<py::object>(PyCFunction_New(&run_boxed_call_def, nullptr)));
}

}  // namespace neuron_lab
