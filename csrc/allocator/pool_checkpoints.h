// pool_checkpoints.h — the PoolCheckpoints part: a private pool's work on
// blocks that CUDA graph trees ask of the allocator (torch's
// checkPoolLiveAllocations, getCheckpointState, setCheckpointPoolState):
// whether a pool's live blocks are exactly a given set, the layout of a pool
// (every segment and its blocks in address order) and putting a pool back
// as a layout recorded it. Creation, use counts and routes are PrivatePools'
// (pool/private_pools.h).
//
// Invariants (beyond private_pool.h's and block.h's):
//   * Called only under the device lock; made per call over references to
//     its sibling parts (Blocks, the live table, SegmentTable, StreamEvents,
//     PrivatePools, EventSink), never to the allocator, and owns no state of
//     its own. What needs the allocator's free path comes as callbacks given
//     when it is made: free_live(b) frees the live block b (its Events
//     recorded), wait_pending() completes every pending free (stream
//     events).
//   * checkpoint() changes nothing. restore() first checks that every
//     segment of the layout is still the pool's, whole (InvalidArgument, and
//     nothing changed, when one is not); then frees every block live in the
//     pool, completes the pool's pending frees, and cuts each segment (then
//     one free block) as recorded: adjacent free blocks of the layout merged,
//     the allocated ones live again at their addresses and sizes, each an
//     Event (kAlloc, recorded with the note it had), the first carrying the
//     restore's inactive-split change.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "allocator/event_sink.h"
#include "pool/blocks.h"
#include "pool/private_pools.h"
#include "pool/segment_table.h"
#include "pool/stream_events.h"

namespace memalloc {

// Every mapped block (live, pending, free: the default pool's and every
// private pool's) by address.
std::map<std::uintptr_t, Block*> mapped_blocks(const LiveTable& live, const StreamEvents& events,
                                               const std::vector<FreeLists*>& free_lists);

class PoolCheckpoints {
 public:
  PoolCheckpoints(Blocks& blocks, LiveTable& live, const SegmentTable& segments, const StreamEvents& events,
                  PrivatePools& pools, EventSink& sink, uint64_t& allocations, std::function<void(Block*)> free_live,
                  std::function<void()> wait_pending)
      : blocks_(blocks),
        live_(live),
        segments_(segments),
        events_(events),
        pools_(pools),
        sink_(sink),
        allocations_(allocations),
        free_live_(std::move(free_live)),
        wait_pending_(std::move(wait_pending)) {}
  PoolCheckpoints(const PoolCheckpoints&) = delete;
  PoolCheckpoints& operator=(const PoolCheckpoints&) = delete;

  // True iff the live blocks of `pool` are exactly the distinct pointers in
  // `expected`; false for an unknown pool.
  bool live_blocks_are(PoolId pool, const std::vector<void*>& expected) const;
  // The layout of `pool` (InvalidArgument for an unknown pool).
  PoolState checkpoint(PoolId pool) const;
  // Puts the pool of `state` back as it was then (see the invariants above).
  PoolRestore restore(const PoolState& state);

 private:
  // Replaces the one free block spanning segment `s` of `pool` by the
  // blocks of `s`; the allocated ones become live (added to *out).
  void restore_segment(const SegmentState& s, PrivatePool* pool, PoolRestore* out);

  Blocks& blocks_;
  LiveTable& live_;
  const SegmentTable& segments_;
  const StreamEvents& events_;
  PrivatePools& pools_;
  EventSink& sink_;
  uint64_t& allocations_;  // blocks made live so far: the arena's clock (vm_arena.h)
  const std::function<void(Block*)> free_live_;
  const std::function<void()> wait_pending_;
};

}  // namespace memalloc
