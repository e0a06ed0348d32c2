// The adaptive engine's segment state (``adaptive.Engine.seg``): the ops queued since the last
// boundary and where they stand on the region trie. A C type the runtime's C++ reads and
// writes field by field (segment.cpp), and the engine's Python through its members and, for
// the queued records, typed accessors (depth, record(i), records, append, clear).
#pragma once

#include <Python.h>

#include "c_types.h"

namespace neuron_lab::segment {

struct SegmentObject {
  PyObject_HEAD
  PyObject* records;         // [record.QueuedOp]: the segment's ops, in issue order; its own
                             // list, never handed to Python (which reads copies: segment.cpp)
  PyObject* producers;       // the queued ops' outputs (producers.h: a Producers map);
                             // read-only for Python, a new map at each ``clear``
  PyObject* node;            // the trie node of the last deferred op (cache.Node), or None
  PyObject* root;            // the region trie's root (the engine's cache.root)
  PyObject* stats;           // the engine's counters (a dict: launches_per_op, ops_per_op)
  long long queued_bytes;    // bytes of every pending output handed out this segment
  double headroom;           // queued_bytes past which Engine._admit_pending counts exactly
  char pressure;             // past 90% of the capacity: flush after this op
  Py_ssize_t period_after;   // the repeated-suffix rule looks from this many ops on
  Py_ssize_t queue_limit;    // ops queued before a forced flush
  // the repeated-suffix rule (repeated_suffix.py, repeated_suffix.cpp)
  PyObject* suffix_last;     // {key: its last position in the segment}
  Py_ssize_t suffix_period;  // candidate period (0: none)
  Py_ssize_t suffix_match;   // ops that have repeated with it so far
  Py_ssize_t suffix_min;     // NEURON_LAB_MIN_PERIOD_OPS, read at the segment's start
  Py_ssize_t suffix_max;     // NEURON_LAB_MAX_PERIOD, likewise
};

extern PyTypeObject SegmentType;

// ``o`` as a segment, or nullptr with a TypeError set.
inline SegmentObject* as_segment(PyObject* o) {
  return c_types::as<SegmentObject>(o, SegmentType, "an engine segment");
}

}  // namespace neuron_lab::segment
