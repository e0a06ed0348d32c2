// The adaptive engine's hot paths in C: ``Engine.launch`` for an op that continues a known
// region path (deferred), and for one met in the middle of a segment no known region continues
// (captured: ``capture`` below). runtime/adaptive.py and record.py hold the same logic in
// Python, the reference.
//
// On a known path a deferred op does no work of its own: it gets a pending tensor whose
// metadata the trie node predicts (output_plans.FastOut) and is appended to the queue. Here the
// steps Python took for that (building the key, the trie lookup, the tensor, two weak
// references, two producer entries, the record) are C calls on the same kinds of objects, so
// the engine's slow paths (capture, divergence, launches, materialize), the telemetry and the
// tests see exactly what the Python path would have built. The C++ reads no Python attribute
// of the runtime's own objects: the engine's segment state is a C struct (segment.h,
// ``Engine.seg``), so are a trie node (trie_node.h), a record (queued_op.h) and a Ref (ref.h),
// the producers map is a C++ object (producers.h); an op's facts come as its verdict.OP_BITS
// entry, and the engine's methods it calls back are handed over by ``configure`` (fastpath.py):
//
//   key      (facts, (arg keys...)) as record.describe builds it (deferral_keys.cpp); where the
//            trie node has one child (a region's path), compared with that child's key
//            where the arguments are instead (match_key: nothing built, hashed or freed);
//   record   QueuedOp(facts, templates, kwarg templates, node.key, [(tensor ref, storage ref)],
//            node.metas, "t", node.where, node.plan) (queued_op::make; the trie node's key
//            object: the op's own equal key dies at once);
//   producer the tensor's and its storage's entries, naming the op's Ref (producers.h: C++
//            tables keyed by TensorImpl and StorageImpl, no Python object per entry).
//
// What a deferred op keeps until its region launches (and what capture keeps for good) is
// taken off the cycle collector's lists (``untracked``, python_objects.h): none of it can be
// part of a cycle, and tracked it made CPython run ~200 ms full collections in training loops.
//
// An op whose outputs are all new but not one plain tensor (several, a list, none) or are the
// caller's own tensors (in place, out=) is deferred here too (defer_many: Engine._defer's
// loop), and so are a node's first deferral (its plan from output_plans.derive) and a
// segment's first op when a known region starts with it (launch_locked continues from the
// trie's root). An op that is plain for some calls only (attention with dropout_p 0, a cast
// staying on neuron: verdict.PLAIN_WHEN) takes the same paths when this call is one
// (plain_call). A call whose CPU scalar arguments could not be keyed is tried again with device
// copies of them (host_scalars.copied). Anything else (a boundary, a divergence, a region's
// end, an in-place op that changes its tensor's metadata (t_, resize_), a segment that starts
// a capture) goes to the Python engine (``Engine._adaptive``), under the engine's lock as
// there; its device tensors come from ``pending``/``pending_dense`` (pending_tensors.cpp). In
// eager mode an op goes to the device's execute (``Engine.launch`` first when ops are still
// queued). ``configure`` hands over the objects; attribute names are interned once.
#include <torch/csrc/Device.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>
#if PY_VERSION_HEX < 0x030B0000
#include <frameobject.h>   // PyFrameObject.f_lasti (PyFrame_GetLasti is 3.11's)
#endif

#include "deferral.h"
#include "out_meta.h"
#include "out_plan.h"
#include "queued_op.h"
#include "segment.h"
#include "trie_node.h"
#include "producers.h"
#include "record.h"   // ref_of
#include "repeated_suffix.h"
#include "weak_outputs.h"


#include <utility>

namespace py = pybind11;

namespace neuron_lab {
namespace deferral {

State S;

// interned names
PyObject *s_name, *s_d, *s_r, *s_ints, *s_t, *s_memory, *s_is_cpu,
    *s_dtype, *s_shape, *s_stride, *s_storage_offset, *s_x, *s_launches_per_op, *s_ops_per_op,
    *s_queue_limit_reason, *s_device;

}  // namespace deferral

namespace {

using namespace deferral;

// A field of trie node ``o`` (trie_node.h: the struct this extension defines), a new reference;
// nullptr with a TypeError set if ``o`` is not a node.
PyObject* node_field(PyObject* o, PyObject* trie::NodeObject::*field) {
  trie::NodeObject* n = trie::as_node(o);
  if (n == nullptr) return nullptr;
  PyObject* v = n->*field;
  return Py_NewRef(v != nullptr ? v : Py_None);
}

// Past 90% of the capacity (Engine._admit_pending set the segment's pressure): run what is
// queued right after handing this op's output out. False with an exception set.
bool flush_under_pressure() {
  if (!S.segment->pressure) return true;
  S.segment->pressure = 0;
  PyObject* r = PyObject_CallOneArg(S.flush, s_memory);
  Py_XDECREF(r);
  return r != nullptr;
}

// The segment's bound on pending bytes: ``nbytes`` more handed out (Engine._admit_pending past
// the headroom). False with an exception set (OutOfMemoryError past the capacity).
bool admit(PyObject* f, long long n) {
  if (n == 0) return true;
  segment::SegmentObject* seg = S.segment;
  seg->queued_bytes += n;
  if (static_cast<double>(seg->queued_bytes) <= seg->headroom) return true;
  PyObject* nbytes = PyLong_FromLongLong(n);
  PyObject* r = nbytes ? PyObject_CallFunctionObjArgs(S.admit, f, nbytes, nullptr) : nullptr;
  Py_XDECREF(nbytes);
  Py_XDECREF(r);
  return r != nullptr;
}

// The producer entry of a pending output's storage: output ``k`` of op ``pos`` (Ref ``r``), or
// for an identity view of output ``same_k`` of the op ``same_back`` back (same_back >= 0,
// output_plans.identity_view) the output it repeats. False with an exception set.
bool storage_producer(producers::ProducersObject* producers, const c10::Storage& st,
                      Py_ssize_t pos, PyObject* r, Py_ssize_t same_back, Py_ssize_t same_k) {
  if (same_back < 0) return producers::set_storage(producers, st, r);
  PyObject* rr = ref_of(pos - same_back, same_k);
  bool ok = rr != nullptr && producers::set_storage(producers, st, rr);
  Py_XDECREF(rr);
  return ok;
}

// A pending view's storage is held twice for its life, as an eager view's is (its base holds
// it too): output_plans.out_plan says why. Its Python object does it (tensor_data.hold_storage):
// a storage that has had one keeps a reference from it while the storage lives. False with an
// exception set.
bool hold_storage(const c10::Storage& st) {
  PyObject* o = THPStorage_Wrap(st);
  Py_XDECREF(o);
  return o != nullptr;
}

// One new pending output of op ``pos`` (an OutMeta's size, stride, offset, dtype; ``view``: the
// op returns a view of an argument), named by Ref ``r``: the tensor (new reference in ``*t``),
// its (tensor, storage) weak pair (``*pair``) and, for a dtype a later queued op may take, its
// producer entries, the tensor's and its storage's (see storage_producer). False with an
// exception set.
bool pending_output(PyObject* size, PyObject* stride, PyObject* offset, PyObject* dtype,
                    bool dense, bool queueable, bool view, Py_ssize_t pos, PyObject* r,
                    Py_ssize_t same_back, Py_ssize_t same_k,
                    producers::ProducersObject* producers, PyObject** t, PyObject** pair) {
  c10::Storage st;
  *t = *pair = nullptr;
  if (!new_pending(size, stride, offset, dtype, dense, t, &st)) return false;
  if (view && !hold_storage(st)) {
    Py_CLEAR(*t);
    return false;
  }
  PyObject* tr = weak_ref(*t);
  PyObject* sr = tr ? weak_storage_ref(st) : nullptr;
  bool ok = sr != nullptr;
  if (ok && queueable)
    ok = producers::set_tensor(producers, THPVariable_Unpack(*t), r) &&
         storage_producer(producers, st, pos, r, same_back, same_k);
  if (ok) *pair = untracked(PyTuple_Pack(2, tr, sr));
  Py_XDECREF(tr);
  Py_XDECREF(sr);
  if (*pair == nullptr) Py_CLEAR(*t);
  return *pair != nullptr;
}

// The deferred op's record, QueuedOp(facts, args, kwargs, key, outs, metas, structure, where,
// plan) with the trie node's key, metas, where and plan (this op's own equal key dies at
// once), appended to ``records``; the engine moves to ``nxt``. False with an exception set.
bool queue(PyObject* f, PyObject* targs, PyObject* tkw, PyObject* nxt, PyObject* outs,
           PyObject* structure, PyObject* records) {
  PyObject* key = node_field(nxt, &trie::NodeObject::key);
  PyObject* metas = node_field(nxt, &trie::NodeObject::metas);
  PyObject* where = node_field(nxt, &trie::NodeObject::where);
  PyObject* plan = node_field(nxt, &trie::NodeObject::plan);
  bool ok = key && metas && where && plan;
  if (ok) {
    PyObject* items[9] = {Py_NewRef(f), Py_NewRef(targs), Py_NewRef(tkw), key, Py_NewRef(outs),
                          metas, Py_NewRef(structure), where, plan};
    key = metas = where = plan = nullptr;
    PyObject* rec = queued_op::make(items);
    ok = rec && PyList_Append(records, rec) == 0;
    Py_XDECREF(rec);
  }
  Py_XDECREF(key);
  Py_XDECREF(metas);
  Py_XDECREF(where);
  Py_XDECREF(plan);
  if (ok) Py_XSETREF(S.segment->node, Py_NewRef(nxt));
  if (ok) {   // tracking.executed gets it when read (deferred_counts)
    auto it = S.deferred.find(f);
    if (it == S.deferred.end()) S.deferred.emplace(Py_NewRef(f), 1);
    else ++it->second;
  }
  return ok;
}

// Engine._defer_one: hand out one pending tensor predicted by trie node ``nxt`` (its FastOut
// ``fast``).
PyObject* defer_one(PyObject* f, PyObject* targs, PyObject* tkw, PyObject* nxt,
                    const out_plan::FastOutObject& fast, PyObject* records,
                    producers::ProducersObject* producers, Py_ssize_t pos) {
  if (!admit(f, fast.nbytes)) return nullptr;
  PyObject *t, *pair;
  if (!pending_output(fast.size, fast.stride, fast.offset, fast.dtype, fast.dense,
                      fast.queueable, fast.view, pos, fast.ref, fast.same_back, fast.same_k,
                      producers, &t, &pair))
    return nullptr;
  PyObject* outs = untracked(PyList_New(1));
  if (outs != nullptr) PyList_SET_ITEM(outs, 0, pair);
  else Py_DECREF(pair);
  bool ok = outs != nullptr && queue(f, targs, tkw, nxt, outs, s_t, records);
  Py_XDECREF(outs);
  if (!ok || !flush_under_pressure()) {
    Py_DECREF(t);
    return nullptr;
  }
  return t;
}

// The caller's tensor an in-place or out= output is (OutSpec.arg: its position in ``args`` or
// its keyword in ``kwargs``), borrowed; nullptr (no exception) where the call lacks it.
PyObject* caller_tensor(PyObject* arg, PyObject* args, PyObject* kwargs) {
  PyObject* t = nullptr;
  if (PyLong_CheckExact(arg)) {
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i >= 0 && i < PyTuple_GET_SIZE(args)) t = PyTuple_GET_ITEM(args, i);
  } else if (PyUnicode_Check(arg) && kwargs != nullptr && PyDict_Check(kwargs)) {
    t = PyDict_GetItemWithError(kwargs, arg);
  }
  if (t == nullptr) PyErr_Clear();   // an unhashable key, an int past the range
  return t != nullptr && THPVariable_Check(t) ? t : nullptr;
}

// Engine._defer's producer entry of an in-place or out= output ``t`` (output ``k`` of op
// ``pos``): later ops of the segment that take it read this op's result. A host-only dtype
// gets none (it is never a queued argument). False with an exception set.
bool caller_producer(producers::ProducersObject* producers, PyObject* t, Py_ssize_t pos,
                     Py_ssize_t k) {
  PyObject* dtype = reinterpret_cast<PyObject*>(
      torch::getTHPDtype(THPVariable_Unpack(t).scalar_type()));   // borrowed
  int host_only = PySet_Contains(S.host_only, dtype);
  if (host_only != 0) return host_only > 0;
  PyObject* r = ref_of(pos, k);
  bool ok = r != nullptr && producers::set_tensor(producers, THPVariable_Unpack(t), r);
  Py_XDECREF(r);
  return ok;
}

// Engine._defer for an op whose outputs are new tensors, not tensors or the caller's own
// tensors (in place, out=), and that is not a FastOut (several outputs, a list, none, an
// in-place op: SDPA's, nll_loss_forward's, _foreach_sqrt's list, add_, AdamW's in-place
// foreach ops that return nothing). An in-place output whose op changes its metadata (t_,
// resize_: its OutSpec keeps the new metadata) or that the call lacks stays with the Python
// engine: nullptr with no exception set. ``args``, ``kwargs``: the call's own (the caller's
// tensors). The op's return value (record.rebuild of the outputs), or nullptr with an
// exception set.
PyObject* defer_many(PyObject* f, PyObject* args, PyObject* kwargs, PyObject* targs,
                     PyObject* tkw, PyObject* nxt, PyObject* records,
                     producers::ProducersObject* producers,
                     Py_ssize_t pos) {
  PyObject* plan = node_field(nxt, &trie::NodeObject::plan);
  if (plan == nullptr) return nullptr;
  Py_ssize_t n = PyTuple_Check(plan) ? PyTuple_GET_SIZE(plan) : -1;
  long long nbytes = 0;
  std::vector<PyObject*> callers(n > 0 ? n : 0, nullptr);   // borrowed: the caller's tensors
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* spec = PyTuple_GET_ITEM(plan, k);
    long kind = out_plan::is_out_spec(spec) ? out_plan::as_out_spec(spec).kind : -1;
    if (kind == S.caller_kind) {
      const out_plan::OutSpecObject& s = out_plan::as_out_spec(spec);
      callers[k] = s.meta == Py_None ? caller_tensor(s.arg, args, kwargs) : nullptr;
      if (callers[k] == nullptr) n = -1;
    } else if (kind == S.pending_kind) {
      const out_plan::OutSpecObject& s = out_plan::as_out_spec(spec);
      if (!out_meta::is_out_meta(s.meta)) {
        PyErr_Format(PyExc_TypeError, "neuron_lab: %R: a pending output's OutSpec.meta must be "
                     "an OutMeta, got %s", f, Py_TYPE(s.meta)->tp_name);
        Py_DECREF(plan);
        return nullptr;
      }
      nbytes += s.nbytes;
    } else if (kind != S.not_tensor_kind) {
      n = -1;
    }
  }
  PyObject* structure = n < 0 ? nullptr : node_field(nxt, &trie::NodeObject::structure);
  PyObject* outs = structure ? untracked(PyList_New(n)) : nullptr;
  PyObject* pairs = outs ? untracked(PyList_New(n)) : nullptr;
  bool ok = pairs != nullptr && admit(f, nbytes);
  for (Py_ssize_t k = 0; ok && k < n; ++k) {
    const out_plan::OutSpecObject& spec = out_plan::as_out_spec(PyTuple_GET_ITEM(plan, k));
    PyObject *t = Py_NewRef(Py_None), *pair = Py_NewRef(Py_None);
    if (spec.kind == S.caller_kind) {   // the caller's own tensor, produced here: no pair
      Py_SETREF(t, Py_NewRef(callers[k]));
      ok = caller_producer(producers, t, pos, k);
    } else if (spec.kind == S.pending_kind) {
      PyObject* m = spec.meta;   // an OutMeta: checked above
      PyObject* r = spec.queueable ? ref_of(pos, k) : Py_NewRef(Py_None);
      Py_DECREF(t);
      Py_DECREF(pair);
      using out_meta::field;
      ok = r != nullptr && pending_output(field(m, out_meta::SIZE), field(m, out_meta::STRIDE),
                                          field(m, out_meta::OFFSET), field(m, out_meta::DTYPE),
                                          spec.dense, spec.queueable, spec.view, pos, r, -1, 0,
                                          producers, &t, &pair);
      Py_XDECREF(r);
      if (!ok) break;
    }
    PyList_SET_ITEM(outs, k, t);
    PyList_SET_ITEM(pairs, k, pair);
  }
  ok = ok && queue(f, targs, tkw, nxt, pairs, structure, records);
  PyObject* result = ok ? PyObject_CallFunctionObjArgs(S.rebuild, structure, outs, nullptr)
                        : nullptr;
  Py_DECREF(plan);
  Py_XDECREF(structure);
  Py_XDECREF(outs);
  Py_XDECREF(pairs);
  if (result != nullptr && !flush_under_pressure()) Py_CLEAR(result);
  return result;
}

// An op continuing the trie path to ``nxt`` (its call's templates ``targs``, ``tkw``): passed
// out here when the node's outputs are a FastOut (defer_one) or all new (defer_many); at the
// node's first deferral (``fast`` None) its plan is derived first (output_plans.derive). nullptr
// with no exception set: the Python engine's case (Engine._defer: an in-place output whose op
// changes its metadata). ``args``, ``kwargs``: the call's own.
PyObject* defer_to(PyObject* f, PyObject* args, PyObject* kwargs, PyObject* targs, PyObject* tkw,
                   PyObject* nxt, PyObject* fast, PyObject* records,
                   producers::ProducersObject* producers,
                   Py_ssize_t pos) {
  PyObject* derived = nullptr;
  if (fast == Py_None) {
    PyObject* at = PyLong_FromSsize_t(pos);
    derived = at ? PyObject_CallFunctionObjArgs(S.derive_plan, nxt, f, at, S.segment, nullptr)
                 : nullptr;
    Py_XDECREF(at);
    if (derived == nullptr) return nullptr;
    fast = derived;
  }
  PyObject* result = nullptr;
  if (out_plan::is_fast_out(fast))
    result = defer_one(f, targs, tkw, nxt, out_plan::as_fast_out(fast), records, producers, pos);
  else if (fast == Py_False)
    result = defer_many(f, args, kwargs, targs, tkw, nxt, records, producers, pos);
  Py_XDECREF(derived);
  return result;
}

// The hot path's first try: a trie node on a region's path has one child, whose key the call
// is compared with where its arguments are (match_key), without building the key, hashing it
// and comparing the two in the children dict (~0.3 us an op). 1 with ``*result`` set (the
// op's return value: deferred here, or by the Python engine with the matched key), 0 where
// the node branches or the call differs (the caller then describes it and looks it up), -1
// with an exception set.
int defer_along(PyObject* f, PyObject* args, PyObject* kwargs, PyObject* node, bool floats,
                PyObject* records, producers::ProducersObject* producers, Py_ssize_t pos,
                PyObject** result) {
  PyObject* children = node_field(node, &trie::NodeObject::children);
  if (children == nullptr) return -1;
  Py_ssize_t i = 0;
  PyObject *key, *nxt;   // borrowed
  if (!PyDict_CheckExact(children) || PyDict_GET_SIZE(children) != 1 ||
      !PyDict_Next(children, &i, &key, &nxt)) {
    Py_DECREF(children);
    return 0;
  }
  Py_INCREF(key);
  Py_INCREF(nxt);
  Py_DECREF(children);
  PyObject* fast = node_field(nxt, &trie::NodeObject::fast);
  int m = fast == nullptr ? -1 : 0;
  if (fast != nullptr) {
    PyObject *targs = nullptr, *tkw = nullptr;
    m = match_key(f, args, kwargs, pos, producers, floats, key, &targs, &tkw);
    if (m == 1) {
      *result = defer_to(f, args, kwargs, targs, tkw, nxt, fast, records, producers, pos);
      if (*result != nullptr) {
        ++S.fast;
      } else if (!PyErr_Occurred()) {   // Engine._defer's case, with the key it would build
        ++S.slow;
        PyObject* described = PyTuple_Pack(3, key, targs, tkw);
        *result = described ? PyObject_CallFunctionObjArgs(S.py_adaptive, f, args, kwargs,
                                                           described, nullptr)
                            : nullptr;
        Py_XDECREF(described);
      }
      if (*result == nullptr) m = -1;
      Py_DECREF(targs);
      Py_DECREF(tkw);
    }
  }
  Py_XDECREF(fast);
  Py_DECREF(nxt);
  Py_DECREF(key);
  return m;
}

// d[key] += 1 for an int counter; false with an exception set.
bool bump(PyObject* d, PyObject* key) {
  PyObject* v = PyDict_GetItemWithError(d, key);   // borrowed
  if (v == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
    return false;
  }
  PyObject* one = PyLong_FromLong(1);
  PyObject* w = one ? PyNumber_Add(v, one) : nullptr;
  Py_XDECREF(one);
  int bad = w == nullptr || PyDict_SetItem(d, key, w) < 0;
  Py_XDECREF(w);
  return !bad;
}

// Does ``s`` start with one of ``prefixes`` / end with one of ``suffixes`` (tuples of str)?
bool matches(PyObject* s, PyObject* affixes, int direction) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(affixes); ++i)
    if (PyUnicode_Tailmatch(s, PyTuple_GET_ITEM(affixes, i), 0, PY_SSIZE_T_MAX, direction) == 1)
      return true;
  return false;
}

// The last user line's token and what determines it: the code object (held, so its address is
// not reused) and the instruction offset in it. Consecutive ops issued from one line (the ops
// of one nn.Module call, every op of a backward pass) share it without computing the line
// number again (CPython walks the code's line table for that) or building a new token.
struct LastLine {
  PyObject* code = nullptr;
  int lasti = -1;
  PyObject* token = nullptr;
};
LastLine last_line;

// (file, line) of ``frame`` running ``code``, a new reference, from ``last_line`` when it is
// the same instruction of the same code.
PyObject* line_token(PyFrameObject* frame, PyCodeObject* code) {
#if PY_VERSION_HEX >= 0x030B0000
  const int lasti = PyFrame_GetLasti(frame);
#else
  const int lasti = frame->f_lasti;
#endif
  if (last_line.code == reinterpret_cast<PyObject*>(code) && last_line.lasti == lasti)
    return Py_NewRef(last_line.token);
  PyObject* line = PyLong_FromLong(PyFrame_GetLineNumber(frame));
  PyObject* token = line ? untracked(PyTuple_Pack(2, code->co_filename, line)) : nullptr;
  Py_XDECREF(line);
  if (token == nullptr) return nullptr;
  Py_XSETREF(last_line.code, Py_NewRef(reinterpret_cast<PyObject*>(code)));
  Py_XSETREF(last_line.token, Py_NewRef(token));
  last_line.lasti = lasti;
  return token;
}

// tracking.user_frame_token for a call with no Python frame of this package above it: (file,
// line) of the first frame that is the user's code (tracking.NOT_USER_*), walking this
// thread's frames from the top. Without one (a device thread's stack), the Python function
// decides (the line of the backward() in progress). A new reference, or nullptr.
PyObject* user_line() {
  PyFrameObject* frame = PyEval_GetFrame();   // borrowed
  Py_XINCREF(frame);
  while (frame != nullptr) {
    PyCodeObject* code = PyFrame_GetCode(frame);
    PyObject* fn = code->co_filename;
    if (PyUnicode_Check(fn) && !matches(fn, S.not_user_prefixes, -1) &&
        !matches(fn, S.not_user_files, +1)) {
      PyObject* token = line_token(frame, code);
      Py_DECREF(code);
      Py_DECREF(frame);
      return token;
    }
    Py_DECREF(code);
    PyFrameObject* back = PyFrame_GetBack(frame);
    Py_DECREF(frame);
    frame = back;
  }
  // none (a device thread's stack): the line of the backward() in progress, the last entry of
  // tracking._backward_callers (tracking._waiting_caller; the GIL is held, nothing runs between)
  PyObject *k, *v, *last = Py_None;
  Py_ssize_t i = 0;
  while (PyDict_Next(S.backward_callers, &i, &k, &v)) last = v;
  return Py_NewRef(last);
}

// kernels.run_now without its Python frame. An ``OpFacts.direct_kernel`` op: the call the direct
// kernel passed to the runtime, run there on the dispatcher's arguments, else (the direct kernel
// declines it) run_now itself. Any other op: the device's ``execute`` (run_now's only step for
// it). The op's result, or nullptr with an exception.
PyObject* run_now(PyObject* f, PyObject* args, PyObject* kwargs, bool direct) {
  if (!direct) {
    PyObject* argv[3] = {f, args, kwargs};
    return PyObject_Vectorcall(S.execute, argv, 3, nullptr);
  }
  if (S.run_boxed_call != Py_None) {
    PyObject* out = PyObject_CallOneArg(S.run_boxed_call, args);
    if (out != Py_None) return out;   // its result, or nullptr: it failed
    Py_DECREF(out);
  }
  return PyObject_CallFunctionObjArgs(S.run_now, f, args, kwargs, nullptr);
}

// Engine._capture for an op met in the middle of a segment that no known region continues: run
// it now (kernels.run_now, as eager mode would), record it (record.record_run, with the user's
// line), then the segment's rules: the repeated-suffix rule (repeated_suffix.cpp, from the
// segment's ``period_after``-th op on; a cut calls Engine._cut_repeats) and the queue limit.
// The op's result, or nullptr.
PyObject* capture(PyObject* f, PyObject* args, PyObject* kwargs, PyObject* described,
                  Py_ssize_t pos, bool direct) {
  PyObject* out = run_now(f, args, kwargs, direct);
  if (out == nullptr) return nullptr;
  segment::SegmentObject* seg = S.segment;
  PyObject* stats = seg->stats;   // borrowed
  bool ok = stats != nullptr && PyDict_Check(stats) && bump(stats, s_launches_per_op) &&
            bump(stats, s_ops_per_op);
  PyObject* where = ok ? user_line() : nullptr;
  if (where != nullptr) {
    PyObject* argv[7] = {f, PyTuple_GET_ITEM(described, 1), PyTuple_GET_ITEM(described, 2),
                         PyTuple_GET_ITEM(described, 0), out, where,
                         reinterpret_cast<PyObject*>(seg)};
    PyObject* r = PyObject_Vectorcall(S.record_run, argv, 7, nullptr);
    Py_DECREF(where);
    ok = r != nullptr;
    Py_XDECREF(r);
  } else {
    ok = false;
  }
  if (ok && pos >= seg->period_after) {   // the repeated-suffix rule; a cut ends the segment here
    Py_ssize_t start = repeated_suffix::observe(seg, pos, PyTuple_GET_ITEM(described, 0));
    if (start == -2) {
      Py_CLEAR(out);
      return out;
    }
    if (start >= 0) {
      PyObject* at = PyLong_FromSsize_t(start);
      PyObject* r = at ? PyObject_CallOneArg(S.cut_repeats, at) : nullptr;
      Py_XDECREF(at);
      if (r == nullptr) Py_CLEAR(out);
      Py_XDECREF(r);
      return out;
    }
  }
  if (ok) {   // the queue limit (read at the segment's start)
    if (pos + 1 >= seg->queue_limit) {
      PyObject* r = PyObject_CallOneArg(S.flush, s_queue_limit_reason);
      ok = r != nullptr;
      Py_XDECREF(r);
    }
  }
  if (!ok) Py_CLEAR(out);
  return out;
}

// Is this call of an op that is not plain queued like a plain op's? Engine._adaptive's per-call
// tests for the two kinds verdict.PLAIN_WHEN names: (NO_DROPOUT, i, name): the call's dropout_p
// (argument i, keyword name, else 0.0) is 0 (draws_random); (SAME_DEVICE,): a _to_copy of a
// tensor not on the CPU whose device keyword is absent, None or a neuron torch.device
// (verdict.same_device_cast; any other device value: the Python engine decides). 1 or 0; -1 with an
// exception set.
int plain_call(PyObject* f, PyObject* args, PyObject* kwargs) {
  PyObject* when = PyDict_GetItemWithError(S.plain_when, f);   // borrowed
  if (when == nullptr) return PyErr_Occurred() ? -1 : 0;
  if (!PyTuple_Check(when) || PyTuple_GET_SIZE(when) < 1) return 0;
  long kind = PyLong_AsLong(PyTuple_GET_ITEM(when, 0));
  if (kind == -1 && PyErr_Occurred()) return -1;
  bool has_kw = kwargs != nullptr && PyDict_Check(kwargs);
  if (kind == S.no_dropout && PyTuple_GET_SIZE(when) == 3) {
    Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(when, 1));
    if (i == -1 && PyErr_Occurred()) return -1;
    PyObject* p = i < PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, i)
                  : has_kw ? PyDict_GetItemWithError(kwargs, PyTuple_GET_ITEM(when, 2))
                           : nullptr;
    if (p == nullptr) return PyErr_Occurred() ? -1 : 1;   // the default, 0.0
    return PyObject_RichCompareBool(p, S.zero, Py_EQ);
  }
  if (kind == S.same_device) {
    if (PyTuple_GET_SIZE(args) < 1 || !THPVariable_Check(PyTuple_GET_ITEM(args, 0))) return 0;
    if (THPVariable_Unpack(PyTuple_GET_ITEM(args, 0)).is_cpu()) return 0;
    PyObject* dev = nullptr;
    if (has_kw) {
      dev = PyDict_GetItemWithError(kwargs, s_device);
      if (dev == nullptr && PyErr_Occurred()) return -1;
    }
    if (dev == nullptr || dev == Py_None) return 1;
    if (!THPDevice_Check(dev)) return 0;
    return reinterpret_cast<THPDevice*>(dev)->device.type() == c10::DeviceType::PrivateUse1;
  }
  return 0;
}

// Engine.launch's body with the lock held: the cases that stay in C, a plain op (it can always
// be queued: verdict.plain) or a call plain by its arguments (plain_call) continuing a known
// region path (deferred; at a segment's start the path is the root's, after
// Engine._start_segment) or met in the middle of a segment no known region continues
// (captured); every other case goes to the Python engine (Engine._adaptive), with the key when
// it was built here.
PyObject* launch_locked(PyObject* f, PyObject* args, PyObject* kwargs) {
  segment::SegmentObject* seg = S.segment;
  PyObject* node = Py_NewRef(seg->node);
  PyObject* result = nullptr;
  PyObject *records = nullptr, *map = nullptr, *described = nullptr;
  producers::ProducersObject* producers = nullptr;   // map's
  PyObject* from = nullptr;   // the trie node the call continues: the engine's, or the root
  bool capturing = false, deferring = false, starting = false;
  Py_ssize_t pos = 0;
  long bits = -1;   // verdict.OP_BITS[f]; -1: an op not seen yet (the Python engine's)
  bool plain = false;
  {
    PyObject* b = PyDict_GetItemWithError(S.op_bits, f);   // borrowed
    if (b == nullptr && PyErr_Occurred()) goto done;
    if (b != nullptr) {
      bits = PyLong_AsLong(b);
      if (bits == -1 && PyErr_Occurred()) goto done;
      plain = bits & S.plain_bit;
      if (!plain) {   // plain for some calls: a dropout_p of 0, a same-device cast
        int p = plain_call(f, args, kwargs);
        if (p < 0) goto done;
        plain = p == 1;
      }
    }
  }
  if (plain) {
    records = Py_NewRef(seg->records);
    if (PyList_Check(records)) {
      pos = PyList_GET_SIZE(records);
      if (node == Py_None) {
        capturing = pos > 0;
        starting = pos == 0;
      } else {
        trie::NodeObject* n = trie::as_node(node);
        if (n == nullptr) goto done;
        deferring = n->depth == pos;
      }
    }
  }
  if (capturing || deferring || starting) {
    int fl = (bits & S.floats_bit) ? 1 : 0;
    map = Py_NewRef(seg->producers);
    producers = producers::as_producers(map);
    if (producers == nullptr) goto done;
    if (starting) {   // Engine._adaptive's segment start: the headroom, then the root's path
      PyObject* r = PyObject_CallNoArgs(S.start_segment);
      if (r == nullptr) goto done;
      Py_DECREF(r);
      from = Py_NewRef(seg->root);
    } else if (deferring) {   // the hot path: a known region's next op, compared in place
      from = Py_NewRef(node);
      if (defer_along(f, args, kwargs, node, fl == 1, records, producers, pos, &result) != 0)
        goto done;
    }
    described = describe(f, args, kwargs, pos, producers, fl == 1);
    if (described == nullptr) {   // a host argument: the Python engine ends the segment,
      if (!PyErr_ExceptionMatches(S.not_queueable)) goto done;
      PyErr_Clear();            // unless they are CPU scalars: this call with device copies
      PyObject* copied = PyObject_CallFunctionObjArgs(S.host_copied, f, args, kwargs, nullptr);
      if (copied == nullptr) goto done;
      bool retried = copied != Py_None;
      if (retried)
        result = launch_locked(f, PyTuple_GET_ITEM(copied, 0), PyTuple_GET_ITEM(copied, 1));
      Py_DECREF(copied);
      if (retried) goto done;
    } else if (capturing) {
      result = capture(f, args, kwargs, described, pos, bits & S.direct_bit);
      if (result != nullptr) ++S.captured;
      goto done;
    } else {   // deferring along a known region (or starting one), one op at a time
      PyObject* children = node_field(from, &trie::NodeObject::children);
      if (children == nullptr) goto done;
      PyObject* nxt = PyDict_GetItemWithError(children, PyTuple_GET_ITEM(described, 0));
      Py_XINCREF(nxt);
      Py_DECREF(children);
      if (nxt == nullptr && PyErr_Occurred()) goto done;
      if (nxt != nullptr) {
        PyObject* fast = node_field(nxt, &trie::NodeObject::fast);
        if (fast != nullptr)
          result = defer_to(f, args, kwargs, PyTuple_GET_ITEM(described, 1),
                            PyTuple_GET_ITEM(described, 2),
                            nxt, fast, records, producers, pos);
        Py_XDECREF(fast);
        Py_DECREF(nxt);
        if (result != nullptr) ++S.fast;
        if (result != nullptr || PyErr_Occurred()) goto done;
      }
      ++S.slow;   // a divergence, a region's end, an op Engine._defer handles
      result = PyObject_CallFunctionObjArgs(S.py_adaptive, f, args, kwargs, described, nullptr);
      goto done;
    }
  }
  ++S.slow;
  result = PyObject_CallFunctionObjArgs(S.py_adaptive, f, args, kwargs, nullptr);
done:
  Py_DECREF(node);
  Py_XDECREF(from);
  Py_XDECREF(records);
  Py_XDECREF(map);
  Py_XDECREF(described);
  return result;
}

// launch(facts, args, kwargs): the device's runtime_interface.launch
PyObject* launch(PyObject*, PyObject* const* argv, Py_ssize_t n) {
  if (n != 3 || !PyTuple_Check(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "neuron_lab: launch(facts, args: tuple, kwargs)");
    return nullptr;
  }
  if (S.segment == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "neuron_lab: the runtime's launch before configure()");
    return nullptr;
  }
  if (!S.adaptive_mode) {   // eager mode: Engine.launch runs the op (after flushing a queue)
    PyObject* records = S.segment->records;   // borrowed
    bool empty = PyList_Check(records) && PyList_GET_SIZE(records) == 0;
    return PyObject_Vectorcall(empty ? S.execute : S.py_launch, argv, 3, nullptr);
  }
  PyObject* got = PyObject_CallNoArgs(S.acquire);
  if (got == nullptr) return nullptr;
  Py_DECREF(got);
  PyObject* result = launch_locked(argv[0], argv[1], argv[2]);
  // release with any exception of the launch kept
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
  PyObject* r = PyObject_CallNoArgs(S.release);
  if (r == nullptr) {
    Py_XDECREF(result);
    Py_XDECREF(et);
    Py_XDECREF(ev);
    Py_XDECREF(tb);
    return nullptr;
  }
  Py_DECREF(r);
  PyErr_Restore(et, ev, tb);
  return result;
}

PyMethodDef launch_def = {"launch", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(&launch)),
                          METH_FASTCALL,
                          "launch(facts, args, kwargs): Engine.launch with its hot path in C"};


// {op facts: ops deferred on the C path since the last call} (fastpath.deferred_counts)
py::dict deferred_counts() {
  py::dict out;
  for (auto& [f, n] : S.deferred) {
    if (n == 0) continue;
    out[py::handle(f)] = py::int_(n);
    n = 0;
  }
  return out;
}

void configure(py::dict o) {
  PyObject* seg = o["segment"].ptr();
  if (segment::as_segment(seg) == nullptr) throw py::error_already_set();
  hold(S.segment, o["segment"]);
  hold(S.acquire, o["lock"].attr("acquire"));
  hold(S.release, o["lock"].attr("release"));
  hold(S.op_bits, o["op_bits"]);
  hold(S.op_bits_of, o["op_bits_of"]);
  S.plain_bit = o["plain_bit"].cast<long>();
  S.floats_bit = o["floats_bit"].cast<long>();
  S.direct_bit = o["direct_bit"].cast<long>();
  hold(S.plain_when, o["plain_when"]);
  S.no_dropout = o["no_dropout"].cast<long>();
  S.same_device = o["same_device"].cast<long>();
  hold(S.host_only, o["host_only"]);
  hold(S.dtype_type, o["dtype_type"]);
  hold(S.memory_format_type, o["memory_format_type"]);
  hold(S.layout_type, o["layout_type"]);
  hold(S.device_type, o["device_type"]);
  hold(S.size_type, o["size_type"]);
  if (!PyType_IsSubtype(S.size_type, &PyTuple_Type))
    throw py::type_error("neuron_lab: size_type must be torch.Size");
  hold(S.not_queueable, o["not_queueable"]);
  hold(S.float_key, o["float_key"]);
  hold(S.rebuild, o["rebuild"]);
  S.pending_kind = o["pending_kind"].cast<long>();
  S.not_tensor_kind = o["not_tensor_kind"].cast<long>();
  S.caller_kind = o["caller_kind"].cast<long>();
  const c10::Storage& device_storage = THPStorage_Unpack(o["device_storage"].ptr());
  S.allocator = device_storage.unsafeGetStorageImpl()->allocator();
  S.device = device_storage.device();
  const c10::Storage& pending_storage = THPStorage_Unpack(o["pending_storage"].ptr());
  S.pending_marker = pending_storage.data_ptr().get_deleter();
  hold(S.tensor, o["tensor"]);
  hold(S.execute, o["execute"]);
  hold(S.py_launch, o["launch"]);
  hold(S.py_adaptive, o["adaptive"]);
  hold(S.admit, o["admit"]);
  hold(S.flush, o["flush"]);
  hold(S.cut_repeats, o["cut_repeats"]);
  hold(S.start_segment, o["start_segment"]);
  hold(S.run_now, o["run_now"]);
  hold(S.run_boxed_call, o["run_boxed_call"]);
  hold(S.host_copied, o["host_copied"]);
  hold(S.backward_callers, o["backward_callers"]);
  if (!PyDict_Check(S.backward_callers))
    throw py::type_error("neuron_lab: backward_callers must be tracking._backward_callers");
  hold(S.record_run, o["record_run"]);
  hold(S.derive_plan, o["derive_plan"]);
  hold(S.not_user_prefixes, o["not_user_prefixes"]);
  hold(S.not_user_files, o["not_user_files"]);
  if (!PyTuple_Check(S.not_user_prefixes) || !PyTuple_Check(S.not_user_files))
    throw py::type_error("neuron_lab: not_user_prefixes and not_user_files must be tuples");
  if (!PyDict_Check(S.op_bits) || !PyDict_Check(S.plain_when))
    throw py::type_error("neuron_lab: op_bits and plain_when must be dicts");
}


}  // namespace

void init_deferral(py::module_& m) {
  using namespace deferral;
  s_name = intern("name");
  s_d = intern("_d");
  s_r = intern("r");
  s_ints = intern("ints");
  s_t = intern("t");
  s_memory = intern("memory");
  s_is_cpu = intern("is_cpu");
  s_dtype = intern("dtype");
  s_shape = intern("shape");
  s_stride = intern("stride");
  s_storage_offset = intern("storage_offset");
  s_x = intern("x");
  s_launches_per_op = intern("launches_per_op");
  s_ops_per_op = intern("ops_per_op");
  s_queue_limit_reason = intern("queue-limit");
  s_device = intern("device");
  S.zero = PyFloat_FromDouble(0.0);   // held for good, as the interned names
  m.def("configure", &configure,
        "configure({engine, lock, plain, ...}): the objects the hot path uses (fastpath.py)");
  m.def("deferred_counts", &deferred_counts,
        "{op facts: ops deferred on the C path since the last call} (tracking.executed's share)");
  m.def("counts", [] { return py::make_tuple(S.fast, S.slow); },
        "(ops deferred on the C path, launches passed to the Python engine)");
  m.def("captured", [] { return S.captured; }, "ops captured on the C path (run now, recorded)");
  m.def("set_adaptive", [](bool on) { S.adaptive_mode = on; },
        "set_adaptive(on): the mode knob's value, set by the runtime whenever it changes "
        "(installation._follow_mode): adaptive (ops come here) or not (Engine.launch's)");
  m.add_object("launch", py::reinterpret_steal<py::object>(PyCFunction_New(&launch_def, nullptr)));
}

}  // namespace neuron_lab
