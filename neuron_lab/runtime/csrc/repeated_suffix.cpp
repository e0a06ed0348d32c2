// The repeated-suffix rule (repeated_suffix.py, whose ``observe_py`` is the reference and the
// docstring the rule): a long segment without a sync point is cut where its ops repeat. Its
// state is the segment's (segment.h: suffix_last, suffix_period, suffix_match, suffix_min,
// suffix_max). deferral.cpp's capture calls ``observe`` for each op past the segment's
// ``period_after``; ``observe_repeats(segment, n, key)`` is the same for Python.
#include "repeated_suffix.h"

#include <pybind11/pybind11.h>

#include "queued_op.h"

namespace py = pybind11;

namespace neuron_lab {
namespace repeated_suffix {
namespace {

// records[i].key == key: 1, 0, or -1 with an exception set
int key_at_is(PyObject* records, Py_ssize_t i, PyObject* key) {
  PyObject* rec = PyList_GET_ITEM(records, i);
  if (!queued_op::is_queued_op(rec)) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: the repeated-suffix rule reads QueuedOps");
    return -1;
  }
  return PyObject_RichCompareBool(queued_op::as_queued_op(rec).key, key, Py_EQ);
}

}  // namespace

Py_ssize_t observe(segment::SegmentObject* seg, Py_ssize_t n, PyObject* key) {
  PyObject* records = seg->records;   // borrowed: the segment's own
  if (!PyList_Check(records) || n < 0 || n >= PyList_GET_SIZE(records) ||
      !PyDict_Check(seg->suffix_last)) {
    PyErr_SetString(PyExc_TypeError,
                    "neuron_lab: observe_repeats(segment, n, key) with n < segment.depth");
    return -2;
  }
  const Py_ssize_t L = seg->suffix_period;
  int same = L && n - L >= 0 ? key_at_is(records, n - L, key) : 0;
  if (same < 0) return -2;
  if (same) {
    ++seg->suffix_match;
  } else {
    PyObject* p = PyDict_GetItemWithError(seg->suffix_last, key);   // borrowed
    if (p == nullptr && PyErr_Occurred()) return -2;
    const Py_ssize_t last = p != nullptr ? PyLong_AsSsize_t(p) : -1;
    if (last == -1 && PyErr_Occurred()) return -2;
    if (p != nullptr && 1 <= n - last && n - last <= seg->suffix_max) {
      seg->suffix_period = n - last;
      seg->suffix_match = 1;
    } else {
      seg->suffix_period = seg->suffix_match = 0;
    }
  }
  PyObject* at = PyLong_FromSsize_t(n);
  const int bad = at == nullptr || PyDict_SetItem(seg->suffix_last, key, at) < 0;
  Py_XDECREF(at);
  if (bad) return -2;
  const Py_ssize_t period = seg->suffix_period;
  if (period == 0) return -1;
  const Py_ssize_t min_ops = seg->suffix_min > 0 ? seg->suffix_min : 1;
  const Py_ssize_t R = period * ((min_ops + period - 1) / period);   // whole periods
  if (seg->suffix_match >= R && R <= seg->suffix_max) return n - R + 1;
  return -1;
}

}  // namespace repeated_suffix

void init_repeated_suffix(py::module_& m) {
  m.def("observe_repeats", [](py::object seg, Py_ssize_t n, py::object key) {
    segment::SegmentObject* s = segment::as_segment(seg.ptr());
    if (s == nullptr) throw py::error_already_set();
    Py_ssize_t start = repeated_suffix::observe(s, n, key.ptr());
    if (start == -2) throw py::error_already_set();
    return start;
  }, "observe_repeats(segment, n, key) -> start of the cut, or -1 "
     "(repeated_suffix.observe_py)");
}

}  // namespace neuron_lab
