// What the C++ kernels share about storages (storage.cpp and accounting.cpp define them; the
// direct eager kernel, direct.cpp, uses both).
#pragma once

#include <c10/core/StorageImpl.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>

namespace neuron_lab {

// A neuron storage's DataPtr for host storage `host`: the host buffer's address, on the neuron
// device, holding a reference to `host` (storage.cpp, "bind").
c10::DataPtr bound_data_ptr(c10::intrusive_ptr<c10::StorageImpl> host);

// The host StorageImpl neuron storage `s` is bound to (borrowed), or nullptr: a pending output
// (no value yet) or a storage the device did not make.
c10::StorageImpl* bound_host(const c10::StorageImpl& s);

// Bind neuron storage `device` to `host` (bound_data_ptr), with the host storage's size.
void bind(c10::StorageImpl* device, c10::StorageImpl* host);

// The deleter that marks a pending storage's DataPtr (never called: the DataPtr has no
// context). The runtime's extension reads it off a storage the device marked pending.
void pending_marker(void*);

// A pending output's DataPtr on `device`: no address, `pending_marker` as its deleter.
c10::DataPtr pending_data_ptr(c10::Device device);

// Is neuron storage `s` a pending output's (pending_data_ptr), with no value yet?
bool is_pending(const c10::StorageImpl& s);

// Count host storage `s` as device memory (accounting.cpp): the bytes added, or -1 if that
// would pass `capacity` (>= 0; -1: no limit). Python's count_storage is this.
int64_t count_storage(c10::StorageImpl* s, int64_t capacity);

// The bytes counted as device memory now (accounting.cpp).
int64_t counted_total();

}  // namespace neuron_lab
