// event_trace.h — one subscriber of the allocator's Event stream: the event
// ring (profiler/recorder.h), in memory or in a flight file. It turns each
// Event into a 64-byte TraceRecord stamped with the time and the call's
// thread and step, and keeps the ring's state (its buffer or file, the last
// time stamped) to itself.
//
// Invariants:
//   * take() runs under the device lock (Profiler::on_event),
//     only while enabled(); it allocates nothing, takes no lock, makes no
//     system call and cannot throw (push_with's guarantees, and clock.h's
//     once calibrated).
//   * The clock is calibrated (clock::calibrate) before a ring is turned on
//     (reset with capacity > 0, attach), never on the record path.
//   * Times never go back within a ring; a free that completes at once
//     (its kFreeCompleted Event says so: at_once) stamps that record with
//     the time of the record before it, its kFreeRequested.
//   * Capacity is 0 (off) to kMaxTraceRecords per device; reset() and
//     attach() check it before changing anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/config.h"
#include "common/errors.h"
#include "pool/events.h"
#include "profiler/recorder.h"

namespace memalloc {

class EventTrace {
 public:
  explicit EventTrace(int device) : device_(static_cast<uint8_t>(device)) {}

  // A ring of `capacity` records in memory; 0 turns recording off and frees it.
  void reset(size_t capacity) {
    MEMALLOC_EXPECTS(capacity <= kMaxTraceRecords,
                     "recording capacity " + std::to_string(capacity) + " records is too large: at most " +
                         std::to_string(kMaxTraceRecords) + " (64 bytes each) per device");
    if (capacity > 0) clock::calibrate();
    ring_.reset(capacity);
  }
  // A ring in a flight file: `capacity` records at `slots`, their sequence
  // numbers at `seqs`, memory `keep` keeps alive.
  void attach(TraceRecord* slots, uint64_t* seqs, size_t capacity, std::shared_ptr<void> keep) {
    MEMALLOC_EXPECTS(capacity > 0 && capacity <= kMaxTraceRecords,
                     "flight recorder capacity " + std::to_string(capacity) + " records: use 1 to " +
                         std::to_string(kMaxTraceRecords) + " per device");
    clock::calibrate();
    ring_.attach(slots, seqs, capacity, std::move(keep));
  }
  bool enabled() const { return ring_.enabled(); }

  // One Event as a record: who (`stack`, `tag`: its block's allocation's,
  // or the call's), the call's `thread` and `step`.
  void take(const Event& e, uint32_t stack, uint32_t tag, uint32_t thread, uint32_t step) noexcept {
    const int64_t t = e.at_once && e.action == Action::kFreeCompleted ? last_ns_ : clock::now_ns();
    last_ns_ = t;
    ring_.push_with([&](TraceRecord& r) {
      r = TraceRecord{t,        e.addr,
                      e.size,   e.requested,
                      e.stream, stack,
                      tag,      thread,
                      step,     static_cast<uint8_t>(e.action),
                      device_,  static_cast<uint8_t>(e.pool),
                      {}};
    });
  }

  // The stored records oldest first, and how many were overwritten.
  std::vector<TraceRecord> records() const { return ring_.in_order(); }
  uint64_t dropped() const { return ring_.dropped(); }

 private:
  const uint8_t device_;
  TraceRing ring_;
  int64_t last_ns_ = 0;  // the time of the last record pushed
};

}  // namespace memalloc
