// events.h — the one record of a state change. Every allocator state change
// is described by exactly one Event and goes through the device's EventSink
// (allocator/event_sink.h), which hands it to the counters (accounting.h)
// and then to the subscriber, if any (allocator/subscriber.h: the
// profiler's breakdown, event ring and torch's history). Policy code never
// updates a counter by hand.
//
// Field meanings per action:
//   kAlloc          a block became live: size = block bytes, requested = asked
//   kFreeRequested  the caller freed a live block (allocated/requested drop)
//   kFreeCompleted  the block stopped being active (its stream events done)
//   kSegmentAlloc   size = bytes obtained from the backend
//   kSegmentFree    size = bytes returned to the backend
//   kAllocRetry     the backend refused; the cache is released and retried
//   kOom            size = rounded request that could not be satisfied;
//                   addr = free bytes the device reported at that moment
//   kEmptyCache     size = bytes returned by an explicit empty_cache
//   kSyncAllStreams pending cross-stream frees were waited for (release path)
//   kGcRelease      size = bytes the garbage-collection threshold released
//   kSegmentFreeFailed the backend refused to take a segment back; it stays
//                   cached and reserved
//   kSegmentMap     pages [addr, addr + size) of an expandable segment were
//                   mapped (reserved grows by size); segment_delta = change
//                   of the number of mapped runs
//   kSegmentUnmap   pages [addr, addr + size) were unmapped (reserved drops)
// inactive_split_{bytes,count}_delta: change of the free bytes/blocks that
// sit inside split segments, caused by this event (kAlloc, kFreeCompleted).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/backend.h"
#include "pool/block.h"

namespace memalloc {

enum class Action : uint8_t {
  kAlloc,
  kFreeRequested,
  kFreeCompleted,
  kSegmentAlloc,
  kSegmentFree,
  kAllocRetry,
  kOom,
  kEmptyCache,
  kSyncAllStreams,
  kGcRelease,
  kSegmentFreeFailed,
  kSegmentMap,
  kSegmentUnmap,
};

// Names by Action value (exported as memalloc.recording.ACTIONS; torch's
// trace names where torch has the action).
inline const char* const* action_names(size_t* count) {
  static const char* const names[] = {
      "alloc",       "free_requested",   "free_completed", "segment_alloc",       "segment_free", "alloc_retry",  "oom",
      "empty_cache", "sync_all_streams", "gc_release",     "segment_free_failed", "segment_map",  "segment_unmap"};
  *count = sizeof(names) / sizeof(names[0]);
  return names;
}

struct Event {
  Action action = Action::kAlloc;
  PoolKind pool = PoolKind::kSmall;
  Stream stream = 0;
  std::uintptr_t addr = 0;
  size_t size = 0;
  size_t requested = 0;
  int64_t inactive_split_bytes_delta = 0;
  int64_t inactive_split_count_delta = 0;
  int64_t segment_delta = 0;  // kSegmentMap / kSegmentUnmap
  // kFreeCompleted only: the free completes in the call that requested it
  // (no stream still used the block), right after its kFreeRequested.
  bool at_once = false;
  // Block events: the id the subscriber gave the block when it became live
  // (allocator/subscriber.h; a free event the allocation's). 0 for segment,
  // OOM and count events, and when no subscriber is set.
  uint32_t id = 0;
  // The block of a block event (nullptr for kOom and the counts): for the
  // boundary's observer (its owner). Valid while the Event is recorded only.
  const Block* block = nullptr;
};

// An Event about block `b`: pool, stream, address, size and requested bytes
// taken from the block, and its subscriber id (callers adjust what differs).
inline Event block_event(Action action, const Block& b) {
  Event e;
  e.action = action;
  e.pool = b.pool;
  e.stream = b.stream;
  e.addr = b.addr;
  e.size = b.size;
  e.requested = b.requested;
  e.id = b.id;
  e.block = &b;
  return e;
}

}  // namespace memalloc
