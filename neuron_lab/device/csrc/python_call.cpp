// The generic kernel called from C++ (python_call.h): what the dispatcher's Python kernel
// holder does for a Python-registered kernel, without its layers.
//
// An op the direct kernel does not run itself (every op in adaptive mode, a fallback dtype, an
// error to raise) used to be redispatched to the generic kernel registered in Python under
// PrivateUse2. The holder then turns the arguments into a Python tuple and keyword dict, calls
// the kernel through pybind11's argument unpacking (a second tuple and dict), and the kernel
// (csrc/kernel.cpp) calls ``runtime_interface.launch``: ~1.5 us of an adaptive op's ~10 on the
// benchmark
// machine (perf: 18 % of a chain of deferred views). Here the arguments are converted once and
// ``runtime_interface.launch`` (or ``execute``) is called directly.
//
// The conversion is the holder's (torch/csrc/autograd/python_variable.cpp,
// parseIValuesToPyArgsKwargs, not exported): positional arguments up to the last one that is
// not its schema default; keyword-only arguments that are not their default, by name; a dtype,
// layout or memory format (ints in the IValue) as its torch object; anything else as
// torch::jit::toPyObject makes it. Tensors, ints, floats, bools and None are converted inline
// (toPyObject's result for each). The result comes back as pushPyOutToStack takes it.
#include "python_call.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/tensor_memoryformats.h>

#include "python_objects.h"   // call_generic_kernel

namespace torch::jit {   // exported by libtorch_python (torch/csrc/jit/python/pybind_utils.h)
TORCH_PYTHON_API py::object toPyObject(c10::IValue ivalue);
TORCH_PYTHON_API c10::IValue toIValue(py::handle obj, const c10::TypePtr& type,
                                      std::optional<int32_t> N);
}  // namespace torch::jit

namespace neuron_lab {
namespace {

// Does the schema argument's type (or its Optional's element type) have `kind`?
bool is_kind(const c10::Argument& arg, c10::TypeKind kind) {
  const auto& t = arg.real_type();
  if (t->kind() == kind) return true;
  auto opt = t->cast<c10::OptionalType>();
  return opt && opt->getElementType()->kind() == kind;
}

// A new reference to argument `v` as the holder hands it to Python; nullptr with an exception.
PyObject* to_python(const c10::Argument& arg, const c10::IValue& v) {
  if (v.isNone()) Py_RETURN_NONE;
  if (v.isTensor()) return THPVariable_Wrap(v.toTensor());   // wrapped numbers: unwrap_numbers
  if (v.isInt()) {
    if (is_kind(arg, c10::ScalarTypeType::Kind))
      return Py_NewRef(reinterpret_cast<PyObject*>(
          torch::getTHPDtype(static_cast<c10::ScalarType>(v.toInt()))));
    if (is_kind(arg, c10::LayoutType::Kind))
      return Py_NewRef(
          reinterpret_cast<PyObject*>(torch::getTHPLayout(static_cast<c10::Layout>(v.toInt()))));
    if (is_kind(arg, c10::MemoryFormatType::Kind))
      return Py_NewRef(torch::utils::getTHPMemoryFormat(static_cast<c10::MemoryFormat>(v.toInt())));
    return PyLong_FromLongLong(v.toInt());
  }
  if (v.isDouble()) return PyFloat_FromDouble(v.toDouble());
  if (v.isBool()) return PyBool_FromLong(v.toBool());
  try {
    return torch::jit::toPyObject(v).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
    return nullptr;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
}

// Does argument i hold its schema default?
bool is_default(const c10::Argument& arg, const c10::IValue& v) {
  return arg.default_value().has_value() && *arg.default_value() == v;
}

// (args, kwargs) for the op's arguments; false with an exception set.
bool python_arguments(const c10::FunctionSchema& schema, c10::ArrayRef<c10::IValue> values,
                      PyObject** args, PyObject** kwargs) {
  const auto& params = schema.arguments();
  const size_t n = values.size();
  size_t kw_start = n;   // the first of the trailing keyword-only arguments
  while (kw_start > 0 && params[kw_start - 1].kwarg_only()) --kw_start;
  size_t npos = kw_start;   // positional arguments up to the last one that is not its default
  while (npos > 0 && is_default(params[npos - 1], values[npos - 1])) --npos;
  *args = PyTuple_New(static_cast<Py_ssize_t>(npos));
  *kwargs = *args ? PyDict_New() : nullptr;
  if (*kwargs == nullptr) {
    Py_CLEAR(*args);
    return false;
  }
  for (size_t i = 0; i < npos; ++i) {
    PyObject* o = to_python(params[i], values[i]);
    if (o == nullptr) return false;
    PyTuple_SET_ITEM(*args, static_cast<Py_ssize_t>(i), o);
  }
  for (size_t i = kw_start; i < n; ++i) {
    if (is_default(params[i], values[i])) continue;
    PyObject* o = to_python(params[i], values[i]);
    PyObject* name = o ? PyUnicode_FromStringAndSize(params[i].name().data(),
                                                     static_cast<Py_ssize_t>(params[i].name().size()))
                       : nullptr;
    bool ok = name != nullptr && PyDict_SetItem(*kwargs, name, o) == 0;
    Py_XDECREF(name);
    Py_XDECREF(o);
    if (!ok) return false;
  }
  return true;
}

// The kernel's Python result onto the stack (pushPyOutToStack's conversion).
void push_result(const c10::FunctionSchema& schema, PyObject* out, torch::jit::Stack* stack) {
  const auto& returns = schema.returns();
  if (returns.empty()) {
    TORCH_CHECK(out == Py_None, "neuron: the kernel of ", schema.name(),
                " returned a value where its schema returns nothing");
    return;
  }
  if (returns.size() == 1) {
    if (THPVariable_Check(out) && returns[0].real_type()->kind() == c10::TypeKind::TensorType)
      stack->emplace_back(THPVariable_Unpack(out));
    else
      stack->push_back(torch::jit::toIValue(out, returns[0].real_type(), std::nullopt));
    return;
  }
  auto outs = py::reinterpret_borrow<py::sequence>(out);
  TORCH_CHECK(outs.size() == returns.size(), "neuron: the kernel of ", schema.name(),
              " returned ", outs.size(), " values, its schema ", returns.size());
  for (size_t i = 0; i < returns.size(); ++i)
    stack->push_back(torch::jit::toIValue(outs[i], returns[i].real_type(), std::nullopt));
}

struct Gil {   // PyGILState_Ensure/Release as a scope (the holder takes the GIL the same way)
  PyGILState_STATE state = PyGILState_Ensure();
  ~Gil() { PyGILState_Release(state); }
};

}  // namespace

void call_generic(PyObject* generic, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                  PyObject** args_out) {
  const auto& schema = op.schema();
  const size_t n = schema.arguments().size();
  Gil gil;
  PyObject *args = nullptr, *kwargs = nullptr;
  if (!python_arguments(schema, torch::jit::last(*stack, n), &args, &kwargs)) {
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    throw python_error();
  }
  if (args_out != nullptr) *args_out = args;
  PyObject* out = call_generic_kernel(generic, args, kwargs);   // the arguments stay on the
  if (args_out != nullptr) *args_out = nullptr;                 // stack for the call (a passed
  Py_DECREF(args);                                              // call runs on them)
  Py_DECREF(kwargs);
  if (out == nullptr) throw python_error();
  torch::jit::drop(*stack, n);
  try {
    push_result(schema, out, stack);
  } catch (...) {
    Py_DECREF(out);
    throw;
  }
  Py_DECREF(out);
}

void init_python_call(py::module_&) {}

}  // namespace neuron_lab
