// held_call(program, inputs): a fused launch's ``program(*inputs)``, with one C++ reference held
// on every input tensor for the length of the call (fused.held_call_py is its Python reference).
//
// Why: a program built with inductor's C++ wrapper runs without the GIL, and frees each input's
// handle as soon as its last kernel has read it. PyTorch keeps a tensor's Python object alive
// while C++ holds references besides the object's own ("PyObject preservation",
// c10/util/intrusive_ptr.h): the handle's release takes the count from 2 to 1, which decrefs
// the Python object, which needs the GIL. On the device's thread (launch_queue.py) that meant
// waiting for the host's Python, input after input: a program of many small kernels took
// several times its CPU time beside the host (perf sched_switch stacks of the device's thread:
// take_gil <- ConcretePyInterpreterVTable::decref <- TensorImpl::decref_pyobject). Held here,
// the handle's release goes from 3 to 2 and touches no Python object; the holds drop after the
// call, with the GIL taken back, where the decrefs cost nothing. Memory is unchanged: the caller's list of inputs
// keeps every input alive to the end of the call anyway.
#include <torch/csrc/autograd/python_variable.h>

#include <vector>

namespace py = pybind11;

namespace neuron_lab {
namespace {

PyObject* held_call(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 2 || !PyList_Check(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "held_call(program, inputs: list)");
    return nullptr;
  }
  PyObject* inputs = argv[1];
  Py_ssize_t size = PyList_GET_SIZE(inputs);
  std::vector<at::Tensor> held;
  std::vector<PyObject*> items;   // the call's arguments: the list's items, owned
  held.reserve(static_cast<size_t>(size));
  items.reserve(static_cast<size_t>(size));
  for (Py_ssize_t i = 0; i < size; ++i) {
    PyObject* x = Py_NewRef(PyList_GET_ITEM(inputs, i));
    items.push_back(x);
    if (THPVariable_Check(x)) held.push_back(THPVariable_Unpack(x));
  }
  PyObject* out = PyObject_Vectorcall(argv[0], items.data(), static_cast<size_t>(size), nullptr);
  for (PyObject* x : items) Py_DECREF(x);
  return out;                     // ``held`` drops here, with the GIL
}

PyMethodDef held_call_def = {
    "held_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&held_call)),
    METH_FASTCALL, "held_call(program, inputs): program(*inputs), every input tensor held in "
                   "C++ for the call (fused.held_call in C)"};

}  // namespace

void init_held_call(py::module_& m) {
  m.add_object(held_call_def.ml_name,
               py::reinterpret_steal<py::object>(PyCFunction_New(&held_call_def, nullptr)));
}

}  // namespace neuron_lab
