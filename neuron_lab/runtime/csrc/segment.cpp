// The engine's segment state as a C type (segment.h): ``_runtime_ext.Segment``. deferral.cpp
// reads and writes its fields in its struct; Python reads and sets them through members.
#include "segment.h"

#include <pybind11/pybind11.h>
#include <structmember.h>

#include "c_types.h"
#include "producers.h"
#include "queued_op.h"

namespace py = pybind11;

namespace neuron_lab {
namespace segment {
namespace {

// the object fields Python reads and sets as members; ``records`` is the segment's own, read
// through ``depth``, ``record(i)`` and ``records`` (a copy) and changed by ``append`` and
// ``clear``, and so is the ``producers`` map (a read-only member: ``clear`` starts a new one)
#define MEMBER_OBJECTS(X) X(node) X(root) X(stats) X(suffix_last)

int segment_init(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* names[] = {nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, ":Segment", const_cast<char**>(names)))
    return -1;
  auto* s = reinterpret_cast<SegmentObject*>(self);
  PyObject* records = PyList_New(0);
  PyObject* producers = records ? producers::make() : nullptr;
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
using Fields = c_types::ObjectFields<SegmentObject, &SegmentObject::records,
                                     &SegmentObject::producers MEMBER_OBJECTS(FIELD)>;
#undef FIELD

PyObject* records_list(PyObject* self) {
  PyObject* records = reinterpret_cast<SegmentObject*>(self)->records;
  if (records == nullptr || !PyList_CheckExact(records)) {
    PyErr_SetString(PyExc_RuntimeError, "neuron_lab: a Segment used before its __init__");
    return nullptr;
  }
  return records;
}

// seg.depth: how many ops are queued
PyObject* segment_depth(PyObject* self, void*) {
  PyObject* records = records_list(self);
  return records ? PyLong_FromSsize_t(PyList_GET_SIZE(records)) : nullptr;
}

// seg.records: a new list of the queued records, in issue order (the segment's own is not
// handed out: appending to the copy queues nothing)
PyObject* segment_records(PyObject* self, void*) {
  PyObject* records = records_list(self);
  return records ? PyList_GetSlice(records, 0, PyList_GET_SIZE(records)) : nullptr;
}

// seg.record(i): the i-th queued record (i < 0 counts from the end)
PyObject* segment_record(PyObject* self, PyObject* arg) {
  PyObject* records = records_list(self);
  Py_ssize_t i = records ? PyNumber_AsSsize_t(arg, PyExc_IndexError) : -1;
  if (records == nullptr || (i == -1 && PyErr_Occurred())) return nullptr;
  Py_ssize_t n = PyList_GET_SIZE(records);
  if (i < 0) i += n;
  if (i < 0 || i >= n) {
    PyErr_Format(PyExc_IndexError, "neuron_lab: Segment.record(%zd): %zd ops are queued", i, n);
    return nullptr;
  }
  return Py_NewRef(PyList_GET_ITEM(records, i));
}

// seg.append(rec): queue one more op's record (a QueuedOp)
PyObject* segment_append(PyObject* self, PyObject* rec) {
  PyObject* records = records_list(self);
  if (records == nullptr) return nullptr;
  if (!queued_op::is_queued_op(rec)) {
    PyErr_Format(PyExc_TypeError, "neuron_lab: Segment.append takes a QueuedOp, got %s",
                 Py_TYPE(rec)->tp_name);
    return nullptr;
  }
  if (PyList_Append(records, rec) < 0) return nullptr;
  Py_RETURN_NONE;
}

// seg.clear(): no op queued and no producer entry (the segment ends). A new list and map: C++
// that still holds the ended segment's (a launch in progress) keeps reading its records.
PyObject* segment_clear(PyObject* self, PyObject*) {
  PyObject* records = records_list(self) ? PyList_New(0) : nullptr;
  PyObject* producers = records ? producers::make() : nullptr;
  if (producers == nullptr) {
    Py_XDECREF(records);
    return nullptr;
  }
  auto* s = reinterpret_cast<SegmentObject*>(self);
  Py_SETREF(s->records, records);
  Py_SETREF(s->producers, producers);
  Py_RETURN_NONE;
}

PyGetSetDef segment_getset[] = {
    {"depth", segment_depth, nullptr, "how many ops are queued", nullptr},
    {"records", segment_records, nullptr, "a copy of the queued records, in issue order", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyMethodDef segment_methods[] = {
    {"record", segment_record, METH_O, "record(i): the i-th queued record"},
    {"append", segment_append, METH_O, "append(rec): queue one more op's record (a QueuedOp)"},
    {"clear", segment_clear, METH_NOARGS, "clear(): no op queued, no producer entry"},
    {nullptr, nullptr, 0, nullptr}};

#define MEMBER(f) {#f, T_OBJECT, offsetof(SegmentObject, f), 0, nullptr},
PyMemberDef segment_members[] = {
    MEMBER_OBJECTS(MEMBER)
    {"producers", T_OBJECT, offsetof(SegmentObject, producers), READONLY,
     "the queued ops' outputs (a Producers map)"},
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

PyTypeObject make_type() {
  PyTypeObject t = c_types::collected<Fields>(
      "neuron_lab.runtime._runtime_ext.Segment", sizeof(SegmentObject),
      "Segment(): the adaptive engine's queued ops and their place on the region trie",
      segment_init, segment_members, false);
  t.tp_getset = segment_getset;
  t.tp_methods = segment_methods;
  return t;
}

}  // namespace

PyTypeObject SegmentType = make_type();

}  // namespace segment

void init_segment(py::module_& m) {
  c_types::add(m, segment::SegmentType, "Segment");
}

}  // namespace neuron_lab
