// What records.cpp shares with the runtime's other C files.
#pragma once
#include <Python.h>

namespace neuron_lab {

// shell.host(t) without a call where t's host view is cached (``t._d`` not None), else
// ``host(t)``; a new reference, or nullptr with an exception set
PyObject* host_of(PyObject* t, PyObject* host);

}  // namespace neuron_lab
