// The device's generic kernel called from a C++ kernel without the dispatcher's Python kernel
// holder (python_call.cpp; direct.cpp's kernel is its caller).
#pragma once

#include <Python.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

namespace neuron_lab {

// Run the op whose arguments are on `stack` through the generic kernel `generic`, a tuple
// (facts, execute, runtime_interface's globals) as registry._kernel makes it:
// ``runtime_interface.launch(facts, args,
// kwargs)``, or ``execute(facts, args, kwargs)`` without a runtime; its result replaces the
// arguments. The arguments reach Python as the holder would hand them over; a Python exception
// propagates as the holder's does (torch's python_error). Takes the GIL. The arguments stay on
// `stack` until the kernel returns; `args_out`, if given, receives the Python argument tuple
// for the call (borrowed: alive for the call only).
void call_generic(PyObject* generic, const c10::OperatorHandle& op, torch::jit::Stack* stack,
                  PyObject** args_out = nullptr);

}  // namespace neuron_lab
