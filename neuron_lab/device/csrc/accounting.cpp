// Device memory accounting kept in the host storage itself (memory.py's counter when built).
//
// Counting a host storage wraps its DataPtr: the same address and device, with a context that
// holds the original DataPtr and the counted size. When the storage frees its bytes (it dies,
// or a resize replaces them) the wrapper's deleter uncounts them and frees the original. So
// "is it counted" is one pointer compare (`get_deleter() == &uncount`), a free is exact
// wherever and in whatever thread it happens, and nothing runs in Python per storage: the
// Python counter (weak references with a callback, a lock and a dict per storage) cost
// ~1.8 us per new tensor, this ~0.2 us.
//
// Used on the CPU executor only: CUDA's caching allocator recognises its blocks by their
// DataPtr's deleter (record_stream, stream-ordered frees), which a wrapper would hide; there
// memory.py keeps the Python counter.
//
// Copy-on-write storages are materialized first (``mutable_data_ptr``): their deleter is how
// PyTorch recognises them, and a wrapped one would let a write reach the buffer they share.
//
// Totals are guarded by a mutex (uncounts happen in any thread: autograd's device thread, a
// DataLoader's pin thread). `count` is the only way in; the peaks follow what is counted, and
// `observe` raises them to a value the Python side reported (counted + pending outputs).
#include <c10/core/StorageImpl.h>
#include <pybind11/pybind11.h>
#include <torch/csrc/Storage.h>

#include "storages.h"

#include <mutex>
#include <tuple>

namespace py = pybind11;

namespace neuron_lab {
namespace {

constexpr int64_t kSegment = 2 << 20;   // reserved memory rounds up to 2 MiB, as memory.py says

struct Totals {
  int64_t allocated = 0, peak = 0, reserved = 0, reserved_peak = 0;
  int64_t n_alloc = 0, n_free = 0, bytes_alloc = 0, bytes_freed = 0, live = 0, peak_live = 0;
};

std::mutex mu;
Totals tot;

struct Counted {
  c10::DataPtr inner;
  int64_t nbytes;
};

int64_t round_up(int64_t n) { return (n + kSegment - 1) / kSegment * kSegment; }

void raise_peaks(int64_t current) {   // with mu held
  if (current > tot.peak) tot.peak = current;
  if (tot.live > tot.peak_live) tot.peak_live = tot.live;
  if (current > tot.reserved) {
    tot.reserved = round_up(current);
    if (tot.reserved > tot.reserved_peak) tot.reserved_peak = tot.reserved;
  }
}

void uncount(void* ctx) {
  auto* c = static_cast<Counted*>(ctx);
  {
    std::lock_guard<std::mutex> g(mu);
    tot.allocated -= c->nbytes;
    tot.n_free += 1;
    tot.bytes_freed += c->nbytes;
    tot.live -= 1;
  }
  delete c;   // frees the bytes through the original deleter
}

c10::StorageImpl* unpack(py::handle storage) {
  TORCH_CHECK(THPStorage_Check(storage.ptr()), "neuron: expected an UntypedStorage");
  return THPStorage_Unpack(storage.ptr()).unsafeGetStorageImpl();
}

int64_t count(py::handle storage, int64_t capacity) {
  return count_storage(unpack(storage), capacity);
}

int64_t counted_bytes(py::handle storage) {
  const c10::DataPtr& dp = unpack(storage)->data_ptr();
  return dp.get_deleter() == &uncount ? static_cast<Counted*>(dp.get_context())->nbytes : -1;
}

py::tuple totals() {
  std::lock_guard<std::mutex> g(mu);
  return py::make_tuple(tot.allocated, tot.peak, tot.reserved, tot.reserved_peak, tot.n_alloc,
                        tot.n_free, tot.bytes_alloc, tot.bytes_freed, tot.live, tot.peak_live);
}

void observe(int64_t current) {
  std::lock_guard<std::mutex> g(mu);
  raise_peaks(current);
}

void reset_peaks(int64_t current) {
  std::lock_guard<std::mutex> g(mu);
  tot.peak = current;
  tot.reserved_peak = tot.reserved;
  tot.peak_live = tot.live;
}

void set_reserved(int64_t current) {
  std::lock_guard<std::mutex> g(mu);
  tot.reserved = round_up(current);
}

void reset_accumulated() {
  std::lock_guard<std::mutex> g(mu);
  tot.n_alloc = tot.n_free = tot.bytes_alloc = tot.bytes_freed = 0;
}

}  // namespace

// Make the bytes counted for `s` match its size. Returns the bytes added (0 if nothing changed;
// negative if it shrank in place), or -1 if that would pass `capacity` (>= 0): then nothing
// changes.
int64_t count_storage(c10::StorageImpl* s, int64_t capacity) {
  const int64_t n = static_cast<int64_t>(s->nbytes());
  const c10::DataPtr& dp = s->data_ptr();
  if (dp.get_deleter() == &uncount) {
    auto* c = static_cast<Counted*>(dp.get_context());
    const int64_t grow = n - c->nbytes;
    if (grow == 0) return 0;
    std::lock_guard<std::mutex> g(mu);
    if (grow > 0 && capacity >= 0 && tot.allocated + grow > capacity) return -1;
    c->nbytes = n;
    tot.allocated += grow;
    (grow > 0 ? tot.bytes_alloc : tot.bytes_freed) += grow > 0 ? grow : -grow;
    raise_peaks(tot.allocated);
    return grow;
  }
  {
    std::lock_guard<std::mutex> g(mu);
    if (capacity >= 0 && tot.allocated + n > capacity) return -1;
  }
  void* addr = s->mutable_data_ptr().get();   // materializes a copy-on-write storage first
  const c10::Device dev = s->data_ptr().device();
  auto* c = new Counted{c10::DataPtr(), n};
  c->inner = s->set_data_ptr(c10::DataPtr(addr, c, &uncount, dev));
  std::lock_guard<std::mutex> g(mu);
  tot.allocated += n;
  tot.n_alloc += 1;
  tot.bytes_alloc += n;
  tot.live += 1;
  raise_peaks(tot.allocated);
  return n;
}

int64_t counted_total() {
  std::lock_guard<std::mutex> g(mu);
  return tot.allocated;
}

void init_accounting(py::module_& m) {
  m.def("count_storage", &count, py::arg("storage"), py::arg("capacity"),
        "Count host storage `storage` as device memory until its bytes are freed (or recount "
        "its new size); bytes added, or -1 if that would pass `capacity` (>= 0).");
  m.def("counted_bytes", &counted_bytes, py::arg("storage"),
        "The bytes `storage` is counted with, or -1.");
  m.def("allocated_bytes", &counted_total);
  m.def("memory_totals", &totals,
        "(allocated, peak, reserved, reserved_peak, n_alloc, n_free, bytes_alloc, bytes_freed, "
        "live, peak_live)");
  m.def("observe_allocated", &observe, py::arg("current"));
  m.def("reset_peaks", &reset_peaks, py::arg("current"));
  m.def("set_reserved", &set_reserved, py::arg("current"));
  m.def("reset_accumulated", &reset_accumulated);
}

}  // namespace neuron_lab
