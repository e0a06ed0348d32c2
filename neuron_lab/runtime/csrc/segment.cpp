// The engine's segment state as a C type (segment.h): ``_runtime_ext.Segment``. deferral.cpp
// reads and writes its fields in its struct; Python reads and sets them through members.
#include "segment.h"

#include <pybind11/pybind11.h>
#include <structmember.h>

#include "c_types.h"

namespace py = pybind11;

namespace neuron_lab {
namespace segment {
namespace {

#define SEGMENT_OBJECTS(X) X(records) X(producers) X(node) X(root) X(stats) X(suffix_last)

int segment_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, ":Segment", const_cast<char**>(names)))
    return -1;
  auto* s = reinterpret_cast<SegmentObject*>(self);
  PyObject* records = PyList_New(0);
  PyObject* producers = records ? PyDict_New() : nullptr;
  PyObject* last = producers ? PyDict_New() : nullptr;
  if (last == nullptr) {
    Py_XDECREF(records);
    Py_XDECREF(producers);
    return -1;
  }
  Py_XSETREF(s->records, records);
  Py_XSETREF(s->producers, producers);
  Py_XSETREF(s->node, Py_NewRef(Py_None));
  Py_XSETREF(s->root, Py_NewRef(Py_None));
  Py_XSETREF(s->stats, Py_NewRef(Py_None));
  Py_XSETREF(s->suffix_last, last);
  s->queued_bytes = 0;
  s->headroom = 0.0;
  s->pressure = 0;
  s->period_after = 0;
  s->queue_limit = 0;
  s->suffix_period = s->suffix_match = s->suffix_min = s->suffix_max = 0;
  return 0;
}

#define FIELD(f) , &SegmentObject::f
using Fields = c_types::ObjectFields<SegmentObject SEGMENT_OBJECTS(FIELD)>;
#undef FIELD

#define MEMBER(f) {#f, T_OBJECT, offsetof(SegmentObject, f), 0, nullptr},
PyMemberDef segment_members[] = {
    SEGMENT_OBJECTS(MEMBER)
    {"queued_bytes", T_LONGLONG, offsetof(SegmentObject, queued_bytes), 0, nullptr},
    {"headroom", T_DOUBLE, offsetof(SegmentObject, headroom), 0, nullptr},
    {"pressure", T_BOOL, offsetof(SegmentObject, pressure), 0, nullptr},
    {"period_after", T_PYSSIZET, offsetof(SegmentObject, period_after), 0, nullptr},
    {"queue_limit", T_PYSSIZET, offsetof(SegmentObject, queue_limit), 0, nullptr},
    {"suffix_period", T_PYSSIZET, offsetof(SegmentObject, suffix_period), 0, nullptr},
    {"suffix_match", T_PYSSIZET, offsetof(SegmentObject, suffix_match), 0, nullptr},
    {"suffix_min", T_PYSSIZET, offsetof(SegmentObject, suffix_min), 0, nullptr},
    {"suffix_max", T_PYSSIZET, offsetof(SegmentObject, suffix_max), 0, nullptr},
    {nullptr, 0, 0, 0, nullptr}};
#undef MEMBER

}  // namespace

PyTypeObject SegmentType = c_types::collected<Fields>(
    "neuron_lab.runtime._runtime_ext.Segment", sizeof(SegmentObject),
    "Segment(): the adaptive engine's queued ops and their place on the region trie",
    segment_init, segment_members, false);

}  // namespace segment

void init_segment(py::module_& m) {
  c_types::add(m, segment::SegmentType, "Segment");
}

}  // namespace neuron_lab
