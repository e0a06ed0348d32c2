// The device's generic kernel and the eager path's short cut as C callables (registry._kernel
// and kernels.execute hold the Python reference of each).
//
// ``kernel``: every ATen op called on neuron tensors reaches one of these through the
// dispatcher's Python kernel holder: ``kernel(*args, **kwargs)`` =
// ``runtime_interface.launch(facts, args,
// kwargs)`` when a runtime is installed, else ``execute(facts, args, kwargs)``. In Python that
// was one more interpreter frame per op (packing ``*args``/``**kwargs`` again, two global
// lookups); here the dispatcher's argument tuple and keyword dict are passed on as they are.
//
// ``execute``: kernels.execute's short path (an ``OpFacts.plain`` op called with positional
// arguments: no per-call checks, one new tensor): host arguments (a neuron tensor's cached host
// view ``_d``, else tensor_data.host), the host op, memory.track, and tensor_data.wrap's contiguous
// case.
// Anything else, and every error, goes to the Python functions, which stay the reference.
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include "python_objects.h"
#include "storages.h"

namespace py = pybind11;

namespace neuron_lab {
namespace {


struct Eager {
  PyObject* execute = nullptr;     // kernels.execute (the reference; the general path)
  PyObject* host = nullptr;        // tensor_data.host
  PyObject* host_error = nullptr;  // kernels.raise_host_error(e, facts, args): always raises
  PyObject* track = nullptr;       // memory.track(storage, op)
  PyObject* wrap = nullptr;        // tensor_data.wrap(h, hs)
  PyObject* wrap_result = nullptr; // kernels.wrap_result(facts, out, args, kwargs)
  PyObject* executed = nullptr;    // tracking.executed (a Counter)
  PyObject* create = nullptr;      // torch._C._acc.create_empty_tensor
  PyObject* host_only = nullptr;   // dtypes.HOST_ONLY
  PyTypeObject* tensor = nullptr;  // torch.Tensor
};
Eager E;
PyObject *s_plain, *s_call, *s_name, *s_d, *s_is_cpu, *s_dim, *s_dtype, *s_shape, *s_stride,
    *s_is_contiguous, *s_storage_offset, *s_untyped_storage, *s_is_conj, *s_is_neg;

PyObject* general(PyObject* f, PyObject* args, PyObject* kwargs) {
  PyObject* argv[3] = {f, args, kwargs};
  return PyObject_Vectorcall(E.execute, argv, 3, nullptr);
}

int truth_of_method(PyObject* o, PyObject* name) {
  PyObject* r = PyObject_CallMethodNoArgs(o, name);
  if (r == nullptr) return -1;
  int t = PyObject_IsTrue(r);
  Py_DECREF(r);
  return t;
}

// a.name() == b.name(): 1, 0, or -1 with an exception set
int equal_method(PyObject* a, PyObject* b, PyObject* name) {
  PyObject* x = PyObject_CallMethodNoArgs(a, name);
  PyObject* y = x ? PyObject_CallMethodNoArgs(b, name) : nullptr;
  int eq = y ? PyObject_RichCompareBool(x, y, Py_EQ) : -1;
  Py_XDECREF(x);
  Py_XDECREF(y);
  return eq;
}

// A host argument for ``a``; nullptr without an exception: take the general path.
PyObject* host_arg(PyObject* a, bool* general_path) {
  PyTypeObject* t = Py_TYPE(a);
  if (t == &PyList_Type || t == &PyTuple_Type) {
    *general_path = true;
    return nullptr;
  }
  if (!(t == E.tensor || PyType_IsSubtype(t, E.tensor))) return Py_NewRef(a);
  PyObject* cpu = PyObject_GetAttr(a, s_is_cpu);
  if (cpu == nullptr) return nullptr;
  int is_cpu = PyObject_IsTrue(cpu);
  Py_DECREF(cpu);
  if (is_cpu < 0) return nullptr;
  if (is_cpu) {   // a CPU scalar (0-dim) is an input, as on CUDA; anything else is checked there
    PyObject* dim = PyObject_CallMethodNoArgs(a, s_dim);
    if (dim == nullptr) return nullptr;
    long d = PyLong_AsLong(dim);
    Py_DECREF(dim);
    if (d == -1 && PyErr_Occurred()) return nullptr;
    if (d) {
      *general_path = true;
      return nullptr;
    }
    return Py_NewRef(a);
  }
  PyObject* dtype = PyObject_GetAttr(a, s_dtype);
  if (dtype == nullptr) return nullptr;
  int host_only = PySet_Contains(E.host_only, dtype);
  Py_DECREF(dtype);
  if (host_only) {
    if (host_only > 0) *general_path = true;
    return nullptr;
  }
  PyObject** dictptr = _PyObject_GetDictPtr(a);
  if (dictptr != nullptr && *dictptr != nullptr) {
    PyObject* d = PyDict_GetItemWithError(*dictptr, s_d);   // borrowed
    if (d != nullptr && d != Py_None) return Py_NewRef(d);
    if (d == nullptr && PyErr_Occurred()) return nullptr;
  }
  return PyObject_CallOneArg(E.host, a);   // recovered from the storage, or materialized
}

// tensor_data.wrap for a new host tensor ``h`` with storage ``hs``
PyObject* wrap_new(PyObject* h, PyObject* hs) {
  int contiguous = truth_of_method(h, s_is_contiguous);
  if (contiguous < 0) return nullptr;
  PyObject* off = contiguous ? PyObject_CallMethodNoArgs(h, s_storage_offset) : nullptr;
  if (contiguous && off == nullptr) return nullptr;
  bool simple = contiguous && PyLong_Check(off) && PyLong_AsLong(off) == 0;
  Py_XDECREF(off);
  if (simple) {
    int conj = truth_of_method(h, s_is_conj);
    int neg = conj == 0 ? truth_of_method(h, s_is_neg) : 1;
    if (conj < 0 || neg < 0) return nullptr;
    simple = !conj && !neg;
  }
  if (!simple) {
    PyObject* argv[2] = {h, hs};
    return PyObject_Vectorcall(E.wrap, argv, 2, nullptr);
  }
  PyObject* shape = PyObject_GetAttr(h, s_shape);
  PyObject* dtype = shape ? PyObject_GetAttr(h, s_dtype) : nullptr;
  PyObject* s = dtype ? PyObject_CallFunctionObjArgs(E.create, shape, dtype, nullptr) : nullptr;
  Py_XDECREF(shape);
  Py_XDECREF(dtype);
  if (s == nullptr) return nullptr;
  int same = equal_method(s, h, s_stride);   // size-1 dimensions' strides too (tensor_data.wrap)
  if (same <= 0) {
    Py_DECREF(s);
    if (same < 0) return nullptr;
    PyObject* argv[2] = {h, hs};
    return PyObject_Vectorcall(E.wrap, argv, 2, nullptr);
  }
  // bound in C++, with no Python object for the device storage (storage.cpp says why); ``hs``
  // is the host tensor's untyped_storage()
  bind(THPVariable_Unpack(s).storage().unsafeGetStorageImpl(),
       THPStorage_Unpack(hs).unsafeGetStorageImpl());
  if (PyObject_SetAttr(s, s_d, h) < 0) {
    Py_DECREF(s);
    return nullptr;
  }
  return s;
}

// kernels.execute(facts, args, kwargs)
PyObject* execute(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 3 || !PyTuple_Check(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: execute(facts, args: tuple, kwargs)");
    return nullptr;
  }
  PyObject *f = argv[0], *args = argv[1], *kwargs = argv[2];
  if (kwargs != Py_None && (!PyDict_Check(kwargs) || PyDict_GET_SIZE(kwargs)))
    return general(f, args, kwargs);
  PyObject* plain = PyObject_GetAttr(f, s_plain);
  if (plain == nullptr) return nullptr;
  Py_DECREF(plain);
  if (plain != Py_True) return general(f, args, kwargs);
  Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  PyObject* small[8];
  PyObject** hargs = nargs <= 8 ? small : static_cast<PyObject**>(PyMem_Malloc(nargs * sizeof(PyObject*)));
  if (hargs == nullptr) return PyErr_NoMemory();
  Py_ssize_t done = 0;
  bool general_path = false;
  PyObject* result = nullptr;
  for (; done < nargs; ++done) {
    hargs[done] = host_arg(PyTuple_GET_ITEM(args, done), &general_path);
    if (hargs[done] == nullptr) break;
  }
  if (done == nargs) {
    PyObject* name = PyObject_GetAttr(f, s_name);
    PyObject* call = name ? PyObject_GetAttr(f, s_call) : nullptr;
    bool ok = call != nullptr && count_executed(E.executed, name);
    PyObject* out = ok ? PyObject_Vectorcall(call, hargs, nargs, nullptr) : nullptr;
    if (out == nullptr && ok && PyErr_ExceptionMatches(PyExc_RuntimeError)) {
      // the device's error for a host kernel's error (OOM, a dtype the host lacks)
      PyObject *et, *ev, *tb;
      PyErr_Fetch(&et, &ev, &tb);
      PyErr_NormalizeException(&et, &ev, &tb);
      if (tb != nullptr) PyException_SetTraceback(ev, tb);
      PyObject* r = PyObject_CallFunctionObjArgs(E.host_error, ev, f, args, nullptr);
      Py_XDECREF(r);   // it raises
      Py_XDECREF(et);
      Py_XDECREF(ev);
      Py_XDECREF(tb);
    } else if (out != nullptr) {
      if (Py_TYPE(out) == E.tensor) {
        PyObject* hs = PyObject_CallMethodNoArgs(out, s_untyped_storage);
        PyObject* r = hs ? PyObject_CallFunctionObjArgs(E.track, hs, name, nullptr) : nullptr;
        if (r != nullptr) {
          Py_DECREF(r);
          result = wrap_new(out, hs);
        }
        Py_XDECREF(hs);
      } else {
        PyObject* w[4] = {f, out, args, kwargs};
        result = PyObject_Vectorcall(E.wrap_result, w, 4, nullptr);
      }
      Py_DECREF(out);
    }
    Py_XDECREF(name);
    Py_XDECREF(call);
  }
  for (Py_ssize_t i = 0; i < done; ++i) Py_DECREF(hargs[i]);
  if (hargs != small) PyMem_Free(hargs);
  if (general_path && !PyErr_Occurred()) return general(f, args, kwargs);
  return result;
}

PyMethodDef execute_def = {"execute",
                           reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&execute)),
                           METH_FASTCALL, "execute(facts, args, kwargs): kernels.execute in C"};

void configure_execute(py::dict o) {
  hold(E.execute, o["execute"]);
  hold(E.host, o["host"]);
  hold(E.host_error, o["host_error"]);
  hold(E.track, o["track"]);
  hold(E.wrap, o["wrap"]);
  hold(E.wrap_result, o["wrap_result"]);
  hold(E.executed, o["executed"]);
  hold(E.create, o["create"]);
  hold(E.host_only, o["host_only"]);
  hold(E.tensor, o["tensor"]);
  if (!PyDict_Check(E.executed)) throw py::type_error("neuron_lab: executed must be a dict");
}

// self: (facts, execute, runtime_interface module's __dict__)
PyObject* call(PyObject* self, PyObject* args, PyObject* kwargs) {
  PyObject* kw = kwargs != nullptr ? Py_NewRef(kwargs) : PyDict_New();
  if (kw == nullptr) return nullptr;
  PyObject* out = call_generic_kernel(self, args, kw);
  Py_DECREF(kw);
  return out;
}

PyMethodDef call_def = {"kernel",
                        reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&call)),
                        METH_VARARGS | METH_KEYWORDS,
                        "kernel(*args, **kwargs): the device's generic kernel for one op"};

py::object make(py::object facts, py::object execute, py::dict interface_globals) {
  PyObject* self = PyTuple_Pack(3, facts.ptr(), execute.ptr(), interface_globals.ptr());
  if (self == nullptr) throw py::error_already_set();
  PyObject* fn = PyCFunction_New(&call_def, self);
  Py_DECREF(self);
  if (fn == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(fn);
}

}  // namespace

void init_kernel(py::module_& m) {
  s_plain = intern("plain");
  s_call = intern("call");
  s_name = intern("name");
  s_d = intern("_d");
  s_is_cpu = intern("is_cpu");
  s_dim = intern("dim");
  s_dtype = intern("dtype");
  s_shape = intern("shape");
  s_stride = intern("stride");
  s_is_contiguous = intern("is_contiguous");
  s_storage_offset = intern("storage_offset");
  s_untyped_storage = intern("untyped_storage");
  s_is_conj = intern("is_conj");
  s_is_neg = intern("is_neg");
  m.def("configure_execute", &configure_execute,
        "configure_execute({execute, host, host_error, ...}): what the C execute calls");
  m.add_object("execute",
               py::reinterpret_steal<py::object>(PyCFunction_New(&execute_def, nullptr)));
  m.def("kernel", &make, py::arg("facts"), py::arg("execute"), py::arg("interface_globals"),
        "The generic kernel for the op described by `facts`: calls "
        "`runtime_interface.launch(facts, args, kwargs)` (read from `interface_globals` at each "
        "call) or, without a runtime, "
        "`execute(facts, args, kwargs)`.");
}

}  // namespace neuron_lab
