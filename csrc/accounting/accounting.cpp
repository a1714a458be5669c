// accounting.cpp — how each Event moves the counters (see accounting.h).
#include "accounting/accounting.h"

namespace memalloc {
namespace {
// One compare where a current rises: the step window's peaks (accounting.h).
inline void raise_to(int64_t& peak, int64_t value) {
  if (value > peak) peak = value;
}
}  // namespace

void Accounting::update(Stat (&stat)[kNumStatTypes], PoolKind pool, int64_t delta) {
  if (delta == 0) return;
  stat[kStatAll].update(delta);
  stat[pool == PoolKind::kSmall ? kStatSmall : kStatLarge].update(delta);
}

void Accounting::apply(const Event& e) {
  const int64_t size = static_cast<int64_t>(e.size);
  DeviceStats& s = stats_;
  switch (e.action) {
    case Action::kAlloc:
      if (oversize(e.size)) s.oversize_allocations.update(1);
      update(s.allocation, e.pool, 1);
      update(s.allocated_bytes, e.pool, size);
      raise_to(window_.peak_allocated_bytes, s.allocated_bytes[kStatAll].current);
      update(s.requested_bytes, e.pool, static_cast<int64_t>(e.requested));
      update(s.active, e.pool, 1);
      update(s.active_bytes, e.pool, size);
      breakdown_.on_alloc(size, e.block->phase, e.block->category, e.block->seq);
      break;
    case Action::kFreeRequested:
      if (oversize(e.size)) s.oversize_allocations.update(-1);
      update(s.allocation, e.pool, -1);
      update(s.allocated_bytes, e.pool, -size);
      update(s.requested_bytes, e.pool, -static_cast<int64_t>(e.requested));
      breakdown_.on_free(size, e.block->phase, e.block->category, e.block->seq);
      break;
    case Action::kFreeCompleted:
      update(s.active, e.pool, -1);
      update(s.active_bytes, e.pool, -size);
      break;
    case Action::kSegmentAlloc:
      if (oversize(e.size)) s.oversize_segments.update(1);
      update(s.segment, e.pool, 1);
      update(s.reserved_bytes, e.pool, size);
      raise_to(window_.peak_reserved_bytes, s.reserved_bytes[kStatAll].current);
      s.num_device_alloc += 1;
      break;
    case Action::kSegmentFree:
      if (oversize(e.size)) s.oversize_segments.update(-1);
      update(s.segment, e.pool, -1);
      update(s.reserved_bytes, e.pool, -size);
      s.num_device_free += 1;
      break;
    case Action::kSegmentMap:
      update(s.segment, e.pool, e.segment_delta);
      update(s.reserved_bytes, e.pool, size);
      raise_to(window_.peak_reserved_bytes, s.reserved_bytes[kStatAll].current);
      s.num_device_alloc += 1;
      break;
    case Action::kSegmentUnmap:
      update(s.segment, e.pool, e.segment_delta);
      update(s.reserved_bytes, e.pool, -size);
      s.num_device_free += 1;
      break;
    case Action::kAllocRetry:
      s.num_alloc_retries += 1;
      break;
    case Action::kOom:
      s.num_ooms += 1;
      window_.num_ooms += 1;
      break;
    case Action::kSyncAllStreams:
      s.num_sync_all_streams += 1;
      break;
    case Action::kGcRelease:
      s.num_gc_releases += 1;
      break;
    case Action::kSegmentFreeFailed:
      s.num_device_free_failures += 1;
      break;
    case Action::kEmptyCache:
      break;
  }
  update(s.inactive_split, e.pool, e.inactive_split_count_delta);
  update(s.inactive_split_bytes, e.pool, e.inactive_split_bytes_delta);
}

void Accounting::reset_peak() {
#define MEMALLOC_RESET_PEAK(name) \
  for (Stat & st : stats_.name) st.peak = st.current;
  MEMALLOC_POOL_STATS(MEMALLOC_RESET_PEAK)
#undef MEMALLOC_RESET_PEAK
#define MEMALLOC_RESET_FLAT_PEAK(name) stats_.name.peak = stats_.name.current;
  MEMALLOC_FLAT_STATS(MEMALLOC_RESET_FLAT_PEAK)
#undef MEMALLOC_RESET_FLAT_PEAK
}

StepWindow Accounting::take_window() {
  const StepWindow taken = window_;
  window_.peak_allocated_bytes = stats_.allocated_bytes[kStatAll].current;
  window_.peak_reserved_bytes = stats_.reserved_bytes[kStatAll].current;
  window_.num_ooms = 0;
  return taken;
}

void Accounting::reset_accumulated() {
#define MEMALLOC_RESET_ACC(name) \
  for (Stat & st : stats_.name) st.allocated = st.freed = 0;
  MEMALLOC_POOL_STATS(MEMALLOC_RESET_ACC)
#undef MEMALLOC_RESET_ACC
#define MEMALLOC_RESET_FLAT_ACC(name) stats_.name.allocated = stats_.name.freed = 0;
  MEMALLOC_FLAT_STATS(MEMALLOC_RESET_FLAT_ACC)
#undef MEMALLOC_RESET_FLAT_ACC
#define MEMALLOC_RESET_SCALAR(name) stats_.name = 0;
  MEMALLOC_SCALAR_STATS(MEMALLOC_RESET_SCALAR)
#undef MEMALLOC_RESET_SCALAR
}

}  // namespace memalloc
