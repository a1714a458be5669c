// messages.h — the words of the allocator's errors, from the figures the
// caller read under the device lock: the out-of-memory message (native's
// wording, with memalloc's hints) and why a pointer is not a live
// allocation. Invariants: plain functions of their arguments; the only
// outside call is backend.mem_get_info (the device's free and total bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "accounting/accounting.h"
#include "backend/backend.h"
#include "pool/block.h"  // kMaxRequest
#include "pool/limits.h"

namespace memalloc {

// "1.50 MiB": bytes for a message.
std::string format_bytes(size_t bytes);
// "0x7f00...": an address for a message.
std::string hex_address(std::uintptr_t addr);
// The OutOfMemory message for a request of `requested` bytes (`rounded`
// after rounding) on `device`: the device's total and free bytes, the
// counters `s`, the memory fraction's cap, the policy's hint.
std::string oom_message(Backend& backend, int device, const DeviceStats& s, const Limits& limits, bool expandable,
                        size_t requested, size_t rounded);
// Why `addr` is not a live allocation for the failed `call` ("free",
// "record_stream"); `inside`: it lies inside one of the device's segments.
// Starts "<call> of 0x...".
std::string unknown_pointer_message(const char* call, std::uintptr_t addr, int device, bool inside);

}  // namespace memalloc
