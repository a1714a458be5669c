// event_sink.h — where a device's Events go: the counters (Accounting:
// torch's stats, the step window), then the subscriber if one is set
// (subscriber.h: the profiler above), with the caller word of the public
// call in progress.
//
// Invariants:
//   * Not thread-safe: used only under the owning device's lock.
//   * Every Event is recorded here exactly once, the counters first; a
//     kAlloc through record_alloc / record_restored (the subscriber gives
//     the block its id then), every other through record.
//   * The caller word is set only for the duration of a public call
//     (CallerScope) and is nullptr between calls, so no Event carries a
//     caller that has returned.
//   * Nothing here allocates host memory or takes a lock; the subscriber's
//     calls are the only virtual ones (three a malloc/free pair).
#pragma once

#include <cstddef>
#include <cstdint>

#include "accounting/accounting.h"
#include "allocator/subscriber.h"
#include "pool/events.h"

namespace memalloc {

class EventSink {
 public:
  explicit EventSink(size_t max_split_size) : accounting_(max_split_size) {}
  EventSink(const EventSink&) = delete;
  EventSink& operator=(const EventSink&) = delete;

  // Any Event but a kAlloc.
  void record(const Event& e) {
    accounting_.apply(e);
    if (sub_ != nullptr) sub_->on_event(e, caller_, accounting_.stats());
  }
  // A block became live: its kAlloc Event. Returns the block's id (0: no
  // subscriber).
  Subscriber::Id record_alloc(const Event& e) {
    accounting_.apply(e);
    return sub_ != nullptr ? sub_->on_live(e, caller_, accounting_.stats()) : 0;
  }
  // The same for a block a private pool's restore makes live again, with
  // the subscriber's note of it from the checkpoint.
  Subscriber::Id record_restored(const Event& e, uint64_t note) {
    accounting_.apply(e);
    return sub_ != nullptr ? sub_->on_restored(e, caller_, accounting_.stats(), note) : 0;
  }
  // The subscriber's note of a live block (0: none, or no subscriber).
  uint64_t note(Subscriber::Id id) const { return sub_ != nullptr && id != 0 ? sub_->note(id) : 0; }

  const DeviceStats& stats() const { return accounting_.stats(); }
  size_t reserved_bytes() const { return static_cast<size_t>(accounting_.stats().reserved_bytes[kStatAll].current); }
  size_t allocated_bytes() const { return static_cast<size_t>(accounting_.stats().allocated_bytes[kStatAll].current); }
  Accounting& accounting() { return accounting_; }
  const Accounting& accounting() const { return accounting_; }
  Subscriber* subscriber() const { return sub_; }
  void set_subscriber(Subscriber* s) { sub_ = s; }

  // The public call in progress's caller, for its duration.
  class CallerScope {
   public:
    CallerScope(EventSink& sink, Caller caller) : sink_(sink) { sink_.caller_ = caller; }
    ~CallerScope() { sink_.caller_ = nullptr; }
    CallerScope(const CallerScope&) = delete;
    CallerScope& operator=(const CallerScope&) = delete;

   private:
    EventSink& sink_;
  };

 private:
  Accounting accounting_;
  Subscriber* sub_ = nullptr;
  Caller caller_ = nullptr;
};

}  // namespace memalloc
