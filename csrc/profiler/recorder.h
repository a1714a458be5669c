// recorder.h — the event ring: every Event, as a fixed-size binary record,
// in a preallocated per-device buffer that overwrites its oldest records.
//
// Record layout (64 bytes, little-endian, no padding surprises):
//   int64  time_ns    steady clock, nanoseconds
//   uint64 addr       block or segment address (oom: device free bytes)
//   uint64 size       bytes (block size, segment size, or released bytes)
//   uint64 requested  bytes the caller asked for (alloc/free) else 0
//   uint64 stream     cudaStream_t value
//   uint32 stack_id   interned call stack (0 = none); frees carry the alloc's
//   uint32 tag_id     interned user tag path (0 = none); frees carry the alloc's
//   uint32 thread     small per-thread index (registry.cpp)
//   uint32 step       memalloc.step() count when the event happened
//   uint8  action     memalloc::Action
//   uint8  device
//   uint8  pool       0 small, 1 large
//   uint8  pad[5]     zero
//
// Invariants (per ring):
//   size() == min(total(), capacity());  dropped() == total() - size()
//   the records in order are the last size() pushed, oldest first
//   push_with() (only while enabled(): capacity > 0) never allocates and
//   never throws; capacity changes only in
//   reset() and attach() (slow path, under the device lock like every
//   other call).
//   Attached to a flight file (attach(): the slots and their sequence
//   numbers live in a MAP_SHARED mapping, profiler/flight_map.h), slot i's
//   sequence number is 0 while its record is being written and, once
//   written, the record's 1-based position in the stream (total() at the
//   time it was pushed, plus 1), stored after the record with release
//   ordering: a reader (memalloc/trace/flight_files.py) takes a record whose
//   number reads the same before and after it and is not 0, and knows a
//   torn one. push_with() stays free of allocation, locks and system calls.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace memalloc {

struct TraceRecord {
  int64_t time_ns;
  uint64_t addr;
  uint64_t size;
  uint64_t requested;
  uint64_t stream;
  uint32_t stack_id;
  uint32_t tag_id;
  uint32_t thread;
  uint32_t step;
  uint8_t action;
  uint8_t device;
  uint8_t pool;
  uint8_t pad[5];
};
static_assert(sizeof(TraceRecord) == 64, "TraceRecord is a 64-byte wire format");

class TraceRing {
 public:
  // capacity 0 disables recording and frees the buffer.
  void reset(size_t capacity) {
    std::vector<TraceRecord>(capacity).swap(own_);
    keep_.reset();
    use(own_.data(), nullptr, capacity);
  }
  // Records into `slots` (and their sequence numbers into `seqs`), `capacity`
  // of each, memory that `keep` keeps alive (a flight file's mapping).
  void attach(TraceRecord* slots, uint64_t* seqs, size_t capacity, std::shared_ptr<void> keep) {
    std::vector<TraceRecord>().swap(own_);
    keep_ = std::move(keep);
    for (size_t i = 0; i < capacity; ++i) __atomic_store_n(&seqs[i], 0, __ATOMIC_RELAXED);
    use(slots, seqs, capacity);
  }
  bool enabled() const { return cap_ != 0; }
  bool attached() const { return seqs_ != nullptr; }
  // Records one record, which `fill(TraceRecord&)` writes into its slot in
  // place (every field: the slot holds an older record), so that it is not
  // copied on the way.
  template <class Fill>
  void push_with(Fill&& fill) noexcept {
    // Asks the CPU for the cache lines of the slot kAhead records on and of
    // its sequence number, for writing, so that the push kAhead records from
    // now finds them in cache: a ring is written once per wrap and a training
    // step evicts it between records, so each new line would otherwise stall
    // the push on a read-for-ownership. A prefetch never faults and changes
    // no memory. (Written here, not in a helper: GCC deletes a call to a
    // function whose only effect is a prefetch.)
    size_t ahead = head_ + kAhead;
    if (ahead >= cap_) ahead %= cap_;
    __builtin_prefetch(&slots_[ahead], 1, 3);
    if (seqs_) __builtin_prefetch(&seqs_[ahead], 1, 3);
    if (seqs_) {
      __atomic_store_n(&seqs_[head_], 0, __ATOMIC_RELAXED);  // being written
      __atomic_thread_fence(__ATOMIC_RELEASE);
      fill(slots_[head_]);
      __atomic_store_n(&seqs_[head_], total_ + 1, __ATOMIC_RELEASE);  // published
    } else {
      fill(slots_[head_]);
    }
    head_ = head_ + 1 == cap_ ? 0 : head_ + 1;
    ++total_;
  }
  size_t capacity() const { return cap_; }
  uint64_t total() const { return total_; }
  size_t size() const { return total_ < cap_ ? static_cast<size_t>(total_) : cap_; }
  uint64_t dropped() const { return total_ - size(); }
  // The stored records, oldest first.
  std::vector<TraceRecord> in_order() const {
    std::vector<TraceRecord> out;
    out.reserve(size());
    size_t start = total_ < cap_ ? 0 : head_;
    for (size_t i = 0; i < size(); ++i) out.push_back(slots_[(start + i) % cap_]);
    return out;
  }

 private:
  static constexpr size_t kAhead = 4;  // records (push_with's prefetch)
  void use(TraceRecord* slots, uint64_t* seqs, size_t capacity) {
    slots_ = slots;
    seqs_ = seqs;
    cap_ = capacity;
    head_ = 0;
    total_ = 0;
  }
  std::vector<TraceRecord> own_;  // the slots when not attached to a file
  std::shared_ptr<void> keep_;    // the file's mapping, while attached
  TraceRecord* slots_ = nullptr;
  uint64_t* seqs_ = nullptr;
  size_t cap_ = 0;
  size_t head_ = 0;
  uint64_t total_ = 0;
};

// Who caused an allocator call: computed by the entry point (outside the
// device lock, possibly under the GIL) and carried into the records.
struct CallContext {
  uint32_t stack_id = 0;
  uint32_t tag_id = 0;
  uint32_t thread = 0;
  uint32_t step = 0;
};

}  // namespace memalloc
