// accounting.cpp — how each Event moves the counters (see accounting.h).
#include "accounting/accounting.h"

namespace memalloc {

// The pool's Stat is reached through one pointer whose index is computed,
// not chosen: the compiler then reaches its current and its peak from one
// base (indexing with a choice made it compute the peak's address apart,
// about 5 instructions more per update: the callgrind gate's figure).
static_assert(kStatSmall + static_cast<int>(PoolKind::kSmall) == kStatSmall &&
                  kStatSmall + static_cast<int>(PoolKind::kLarge) == kStatLarge,
              "the per-pool index follows PoolKind");

// Inlined into apply() (an out-of-line copy cost ~5 instructions a call,
// about 9 calls a malloc/free pair: the callgrind gate's figure).
[[gnu::always_inline]] inline void Accounting::update(Stat (&stat)[kNumStatTypes], PoolKind pool, int64_t delta) {
  if (delta == 0) return;
  stat[kStatAll].update(delta);
  Stat* const of_pool = stat + kStatSmall + static_cast<int>(pool);
  of_pool->update(delta);
}

void Accounting::apply(const Event& e) {
  const int64_t size = static_cast<int64_t>(e.size);
  DeviceStats& s = stats_;
  switch (e.action) {
    case Action::kAlloc:
      if (oversize(e.size)) s.oversize_allocations.update(1);
      update(s.allocation, e.pool, 1);
      update(s.allocated_bytes, e.pool, size);
      step_allocated_.raise(s.allocated_bytes[kStatAll].current);
      update(s.requested_bytes, e.pool, static_cast<int64_t>(e.requested));
      update(s.active, e.pool, 1);
      update(s.active_bytes, e.pool, size);
      break;
    case Action::kFreeRequested:
      if (oversize(e.size)) s.oversize_allocations.update(-1);
      update(s.allocation, e.pool, -1);
      update(s.allocated_bytes, e.pool, -size);
      update(s.requested_bytes, e.pool, -static_cast<int64_t>(e.requested));
      break;
    case Action::kFreeCompleted:
      update(s.active, e.pool, -1);
      update(s.active_bytes, e.pool, -size);
      break;
    case Action::kSegmentAlloc:
      if (oversize(e.size)) s.oversize_segments.update(1);
      update(s.segment, e.pool, 1);
      update(s.reserved_bytes, e.pool, size);
      step_reserved_.raise(s.reserved_bytes[kStatAll].current);
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
      step_reserved_.raise(s.reserved_bytes[kStatAll].current);
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
      step_ooms_ += 1;
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

void Accounting::reset_peak(){
#define MEMALLOC_RESET_PEAK(name) \
  for (Stat & st : stats_.name) st.peak.restart(st.current);
    MEMALLOC_POOL_STATS(MEMALLOC_RESET_PEAK)
#undef MEMALLOC_RESET_PEAK
#define MEMALLOC_RESET_FLAT_PEAK(name) stats_.name.peak.restart(stats_.name.current);
        MEMALLOC_FLAT_STATS(MEMALLOC_RESET_FLAT_PEAK)
#undef MEMALLOC_RESET_FLAT_PEAK
}

StepWindow Accounting::take_window() {
  StepWindow taken;
  taken.peak_allocated_bytes = step_allocated_.restart(stats_.allocated_bytes[kStatAll].current);
  taken.peak_reserved_bytes = step_reserved_.restart(stats_.reserved_bytes[kStatAll].current);
  taken.num_ooms = step_ooms_;
  step_ooms_ = 0;
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
