// expandable.h — the Expandable part: the allocator's side of expandable
// segments. The arena (pool/vm_arena.h) decides where to map and how much
// to unmap; this part does it in terms of what the arena may not touch: the
// blocks and their free lists (Blocks), the segment table, the memory
// fraction (Limits), the open routes (PrivatePools) and the Events that feed
// the counters (EventSink). DeviceAllocator calls it on its slow path only:
// grow() after a cache miss in the default pool, release() from empty_cache,
// before an OOM and for the threshold policy. The fast path handles mapped
// blocks of expandable segments exactly like blocks of plain ones.
//
// Invariants (beyond vm_arena.h's and block.h's):
//   * Called only under the device lock; holds references to its sibling
//     parts, never to the allocator (which makes one per call: it owns no
//     state of its own, the arena and the lists hold it): what needs the allocator's policies
//     (the device's capacity, the threshold policy's collection) comes as
//     callbacks of the call.
//   * Mapping stays within the memory fraction: pages are mapped only while
//     reserved + their bytes <= the cap (Limits::admits).
//   * While a route is open (a capture, use_mem_pool) nothing is unmapped.
//   * Every page mapped or unmapped is one kSegmentMap / kSegmentUnmap
//     Event, with the inactive-split change of the free blocks it touched.
//   * Pages unmapped to keep reserved bytes under the reuse ceiling move:
//     they are kept (Unmapping::kKeep) for the mapping that follows, and
//     grow() drops the ones it did not take before it returns; release()
//     gives pages back to the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "allocator/event_sink.h"
#include "pool/blocks.h"
#include "pool/limits.h"
#include "pool/private_pools.h"
#include "pool/segment_table.h"
#include "pool/vm_arena.h"

namespace memalloc {

class Expandable {
 public:
  Expandable(VmArena& vm, SegmentTable& segments, Blocks& blocks, EventSink& sink, const Limits& limits,
             const PrivatePools& pools)
      : vm_(vm), segments_(segments), blocks_(blocks), sink_(sink), limits_(limits), pools_(pools) {}
  Expandable(const Expandable&) = delete;
  Expandable& operator=(const Expandable&) = delete;

  // The allocator's settings a growth reads: reuse_free_pages (config.h)
  // and the arena's clock (blocks made live so far, vm_arena.h).
  struct Policy {
    bool reuse_free_pages;
    uint64_t clock;
  };
  // A free block of >= rounded bytes on `stream`, in its free list, made by
  // mapping pages into an expandable segment (reserving one when none has
  // room); nullptr when the memory fraction or the device refuses.
  // *no_vm: no segment could be reserved (the caller falls back to a plain
  // segment). `capacity`: the device's total bytes; `collect(bytes)`: the
  // threshold policy before reserved bytes grow by `bytes`.
  Block* grow(size_t rounded, Stream stream, const Policy& policy, const std::function<size_t()>& capacity,
              const std::function<void(size_t)>& collect, bool* no_vm);
  // Unmaps every free page of every expandable segment and ends the
  // reservations left with nothing mapped (nothing while a route is open).
  // Returns bytes unmapped.
  size_t release();

 private:
  // A new reservation in the arena, entered in the segment table (nullptr:
  // none).
  VmSegment* new_segment(Stream stream, PoolKind pool, size_t page, const std::function<size_t()>& capacity);
  // Maps the room the arena found (within the memory fraction), merges it
  // with its free neighbours into the free list; nullptr when refused.
  Block* map_room(VmSegment& seg, const VmRoom& room);
  // VmArena::unmap_free_pages over the default pool's free lists (nothing
  // while a route is open). Returns bytes unmapped.
  size_t unmap_free_pages(Stream stream, size_t want, const Block* keep_a, const Block* keep_b, Unmapping how);
  // Unmaps [lo, hi) (whole pages) of the free block f: VmArena::unmap
  // between leaving and re-entering the free list, as one Event.
  void unmap_range(Block* f, std::uintptr_t lo, std::uintptr_t hi, Unmapping how);

  VmArena& vm_;
  SegmentTable& segments_;
  Blocks& blocks_;
  EventSink& sink_;
  const Limits& limits_;
  const PrivatePools& pools_;
};

}  // namespace memalloc
