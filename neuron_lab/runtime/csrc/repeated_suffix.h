// The repeated-suffix rule in C (repeated_suffix.py is the reference): capture applies it to
// every op once a segment is long, without calling Python.
#pragma once
#include <Python.h>

#include "segment.h"

namespace neuron_lab::repeated_suffix {

// Op ``n`` of ``seg`` (its ``n``-th queued record, a record.QueuedOp) was captured with
// ``key``: the position from which to cut the segment's ops into a region, -1 for none, or -2
// with an exception set. Updates the rule's state in ``seg``.
Py_ssize_t observe(segment::SegmentObject* seg, Py_ssize_t n, PyObject* key);

}  // namespace neuron_lab::repeated_suffix
