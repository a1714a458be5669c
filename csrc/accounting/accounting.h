// accounting.h — torch-compatible memory counters, driven only by Events:
// the first consumer of the Event stream (allocator/event_sink.h); it reads each Event's action, pool, size, requested
// bytes and inactive-split / segment deltas, never its provenance or its block.
//
// One counter type (Stat: current/peak/allocated/freed); the list of
// per-pool stats is written once (MEMALLOC_POOL_STATS) and drives the C++
// struct, the Python bindings and the memory_stats() key names
// ("<name>.<all|small_pool|large_pool>.<current|peak|allocated|freed>").
//
// Invariants (per device, for each pool index p in {all, small, large}):
//   stat[all] == stat[small] + stat[large]      (current, allocated, freed)
//   current == allocated - freed;  peak >= current
//   reserved_bytes == allocated_bytes + (free and pending block bytes)
//   oversize_allocations.current == live blocks of >= max_split_size bytes
//   oversize_segments.current    == segments of >= max_split_size bytes
//   active_bytes   == allocated_bytes + (pending block bytes)
//   window().peak_allocated_bytes >= allocated_bytes[all].current, likewise
//   window().peak_reserved_bytes for reserved_bytes: the step window (below)
//   is raised wherever those currents rise (and counts OOMs) and is reset
//   only by take_window(), never by reset_peak()/reset_accumulated() (those
//   belong to the user through torch.cuda.reset_peak_memory_stats...), so
//   torch-visible peaks and the step tracker's never disturb each other.
// Both windows, and the breakdown's (breakdown.h), are Peaks (peak.h): the
// rule of a window is written there once; each owner restarts only its own.
#pragma once

#include <cstdint>

#include "accounting/peak.h"
#include "pool/events.h"

namespace memalloc {

struct Stat {
  int64_t current = 0;
  Peak<int64_t> peak;     // since the last reset_peak(): torch's ".peak"
  int64_t allocated = 0;  // total ever added
  int64_t freed = 0;      // total ever removed

  void update(int64_t delta) {
    current += delta;
    if (delta > 0)
      allocated += delta;
    else
      freed -= delta;
    peak.raise(current);
  }
};

// Indices of the per-pool arrays (torch's "all", "small_pool", "large_pool").
constexpr int kStatAll = 0;
constexpr int kStatSmall = 1;
constexpr int kStatLarge = 2;
constexpr int kNumStatTypes = 3;

#define MEMALLOC_POOL_STATS(X) \
  X(allocation)                \
  X(segment)                   \
  X(active)                    \
  X(inactive_split)            \
  X(allocated_bytes)           \
  X(reserved_bytes)            \
  X(active_bytes)              \
  X(inactive_split_bytes)      \
  X(requested_bytes)

// Stats without a pool breakdown (torch: "oversize_allocations.current"...).
#define MEMALLOC_FLAT_STATS(X) \
  X(oversize_allocations)      \
  X(oversize_segments)

#define MEMALLOC_SCALAR_STATS(X) \
  X(num_alloc_retries)           \
  X(num_ooms)                    \
  X(num_sync_all_streams)        \
  X(num_device_alloc)            \
  X(num_device_free)             \
  X(num_gc_releases)             \
  X(num_device_free_failures)

struct DeviceStats {
#define MEMALLOC_DECLARE_POOL_STAT(name) Stat name[kNumStatTypes];
  MEMALLOC_POOL_STATS(MEMALLOC_DECLARE_POOL_STAT)
#undef MEMALLOC_DECLARE_POOL_STAT
#define MEMALLOC_DECLARE_FLAT_STAT(name) Stat name;
  MEMALLOC_FLAT_STATS(MEMALLOC_DECLARE_FLAT_STAT)
#undef MEMALLOC_DECLARE_FLAT_STAT
#define MEMALLOC_DECLARE_SCALAR_STAT(name) int64_t name = 0;
  MEMALLOC_SCALAR_STATS(MEMALLOC_DECLARE_SCALAR_STAT)
#undef MEMALLOC_DECLARE_SCALAR_STAT
};

// What happened over a window that only take_window() ends: the per-step
// tracker's "peak in this step" of allocated_bytes and reserved_bytes (all
// pools), and the OOMs raised in it (a copy; Accounting keeps the Peaks).
struct StepWindow {
  int64_t peak_allocated_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t num_ooms = 0;
};

class Accounting {
 public:
  // Blocks and segments of at least max_split_size bytes count as "oversize"
  // (native semantics; never, when max_split_size is unlimited).
  explicit Accounting(size_t max_split_size) : max_split_size_(max_split_size) {}
  // Applies one event to the counters. O(1), no allocation.
  void apply(const Event& e);
  const DeviceStats& stats() const { return stats_; }
  // peak = current for every per-pool stat (torch.cuda.reset_peak_memory_stats).
  void reset_peak();
  // allocated = freed = 0 and the scalar counts = 0
  // (torch.cuda.reset_accumulated_memory_stats).
  void reset_accumulated();
  // The step window so far.
  StepWindow window() const { return StepWindow{step_allocated_.value(), step_reserved_.value(), step_ooms_}; }
  // The window since the previous call; the next one starts with the peaks
  // at the current values and no OOMs. O(1), no allocation.
  StepWindow take_window();
  // A settings change (torch.cuda.memory._set_allocator_settings): the new
  // threshold, and the oversize counts moved to what is live now under it
  // (as the updates of the events that would have counted them).
  void set_max_split_size(size_t max_split_size, int64_t oversize_blocks, int64_t oversize_segments) {
    max_split_size_ = max_split_size;
    stats_.oversize_allocations.update(oversize_blocks - stats_.oversize_allocations.current);
    stats_.oversize_segments.update(oversize_segments - stats_.oversize_segments.current);
  }
  // The oversize rule above, for a threshold not yet in force (apply_settings).
  static bool oversize(size_t bytes, size_t max_split_size) { return bytes >= max_split_size; }

 private:
  void update(Stat (&stat)[kNumStatTypes], PoolKind pool, int64_t delta);
  bool oversize(size_t bytes) const { return oversize(bytes, max_split_size_); }
  size_t max_split_size_;
  DeviceStats stats_;
  // The step window: peaks of allocated_bytes / reserved_bytes (all pools)
  // and the OOMs since the last take_window().
  Peak<int64_t> step_allocated_;
  Peak<int64_t> step_reserved_;
  int64_t step_ooms_ = 0;
};

}  // namespace memalloc
