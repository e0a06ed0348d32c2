// The adaptive engine's deferral hot path in C, the pieces deferral.cpp (Engine.launch) is built
// from: the state ``configure`` hands over and the interned attribute names (defined in
// deferral.cpp), an op call's key and templates (deferral_keys.cpp: record.describe in C) and
// pending tensors (pending_tensors.cpp: tensor_data.pending in C).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <torch/csrc/Dtype.h>

#include <unordered_map>
#include <vector>

#include "python_objects.h"   // device/csrc: intern, hold, untracked
#include "producers.h"
#include "segment.h"

namespace neuron_lab::deferral {

struct State {
  segment::SegmentObject* segment = nullptr;   // the installed engine's Engine.seg
  PyObject* acquire = nullptr;       // engine.lock.acquire / .release, bound (an RLock, the
                                     // same object for the engine's life)
  PyObject* release = nullptr;
  PyObject* op_bits = nullptr;       // verdict.OP_BITS: {OpFacts: int}, these bits:
  long plain_bit = 0, floats_bit = 0, direct_bit = 0;   // verdict.PLAIN_BIT, FLOATS_BIT, ...
  PyObject* op_bits_of = nullptr;    // verdict.op_bits(facts): the entry, made if missing
  PyObject* plain_when = nullptr;    // verdict.PLAIN_WHEN: {OpFacts: (kind, ...) or None}
  long no_dropout = -1, same_device = -1;   // its kinds (verdict.NO_DROPOUT, SAME_DEVICE)
  PyObject* zero = nullptr;          // 0.0 (a dropout_p that draws nothing)
  PyObject* host_only = nullptr;     // dtypes.HOST_ONLY (a frozenset)
  PyTypeObject* dtype_type = nullptr;          // torch.dtype, torch.memory_format, ...
  PyTypeObject* memory_format_type = nullptr;
  PyTypeObject* layout_type = nullptr;
  PyTypeObject* device_type = nullptr;
  PyTypeObject* size_type = nullptr;           // torch.Size (a tuple subclass)
  PyObject* not_queueable = nullptr; // record.NotQueueable
  PyObject* float_key = nullptr;     // record.FLOAT
  PyObject* rebuild = nullptr;       // record.rebuild(structure, outs): an op's return value
  long pending_kind = -1;            // output_plans.PENDING, NOT_TENSOR, CALLER (OutSpec.kind)
  long not_tensor_kind = -1;
  long caller_kind = -1;
  bool adaptive_mode = false;        // knobs.MODE is "adaptive" (set_adaptive)
  c10::Allocator* allocator = nullptr;   // create_empty_tensor's storages: their allocator and
  c10::Device device{c10::DeviceType::PrivateUse1, 0};   // device (an empty DataPtr's)
  c10::DeleterFnPtr pending_marker = nullptr;   // a pending storage's DataPtr deleter (the
                                                // device's storages.h), read off one it marked
  PyTypeObject* tensor = nullptr;    // torch.Tensor
  PyObject* execute = nullptr;       // the device's kernels.execute (eager mode)
  PyObject* py_launch = nullptr;     // Engine.launch (the Python path), bound
  PyObject* py_adaptive = nullptr;   // Engine._adaptive, bound
  PyObject* admit = nullptr;         // Engine._admit_pending, bound
  PyObject* flush = nullptr;         // Engine.flush, bound
  PyObject* cut_repeats = nullptr;   // Engine._cut_repeats, bound
  PyObject* start_segment = nullptr; // Engine._start_segment, bound
  PyObject* run_now = nullptr;       // kernels.run_now (capture runs the op now)
  PyObject* run_boxed_call = nullptr;    // kernels._run_boxed_call (the direct kernel's), or None
  PyObject* host_copied = nullptr;   // host_scalars.copied (CPU scalar arguments)
  PyObject* backward_callers = nullptr;   // tracking._backward_callers (a dict)
  PyObject* not_user_prefixes = nullptr;   // tracking.NOT_USER_PREFIXES / _FILES (tuples of str)
  PyObject* not_user_files = nullptr;
  PyObject* record_run = nullptr;    // record.record_run (record.cpp's, where built)
  PyObject* derive_plan = nullptr;   // output_plans.derive (a trie node's first deferral)
  long fast = 0, slow = 0;           // ops deferred here / passed to Python (tests read them)
  long captured = 0;                 // ops captured here (run now and recorded)
  std::unordered_map<PyObject*, long long> deferred;   // facts -> ops deferred here since the
                                     // last deferred_counts() (held: OpFacts live for good)
};

extern State S;

// interned strings (init_deferral): tensor API names, the device tensor's attributes (_h, _d), key
// tags, counter keys and flush reasons
extern PyObject *s_name, *s_d, *s_r, *s_ints, *s_t, *s_memory,
    *s_is_cpu, *s_dtype, *s_shape, *s_stride, *s_storage_offset, *s_x, *s_launches_per_op,
    *s_ops_per_op, *s_queue_limit_reason, *s_device;

// deferral_keys.cpp: (key, templates, kwarg templates) of a call as record.describe builds them;
// nullptr with an exception set (record.NotQueueable: a call that cannot be queued).
PyObject* describe(PyObject* f, PyObject* args, PyObject* kwargs, Py_ssize_t pos,
                   producers::ProducersObject* producers, bool floats);

// deferral_keys.cpp: does this call's key equal ``key`` (a trie child's), compared without
// building it? 1 with the templates set (``*tkw``: None or a dict), 0 where it differs or the
// call cannot be queued (describe then says which), -1 with an exception set.
int match_key(PyObject* f, PyObject* args, PyObject* kwargs, Py_ssize_t pos,
              producers::ProducersObject* producers, bool floats, PyObject* key, PyObject** targs,
              PyObject** tkw);
// pending_tensors.cpp: a pending tensor of a FastOut's size, stride, offset and dtype (a new
// reference in ``*t``), with ``_d = None``, and its storage (``*st``, which gets no Python
// object); false with an exception set.
bool new_pending(PyObject* size, PyObject* stride, PyObject* offset, PyObject* dtype, bool dense,
                 PyObject** t, c10::Storage* st);

// ``o.name = None``: ``o``, or nullptr with an exception set.
PyObject* set_attr_none(PyObject* o, PyObject* name);

}  // namespace neuron_lab::deferral
