// expandable.h — expandable segments (MEMALLOC_CONF=expandable_segments:True,
// torch's name): one range of address space per (stream, pool kind) of the
// default pool, backed by device memory one page at a time (backend.h,
// "Virtual memory"), so that a segment grows where a request needs room and
// gives back the free pages inside it instead of whole segments.
//
// Invariants (checked by DeviceAllocator::validate()):
//   * The blocks of a VmSegment tile [base, base + size) in address order
//     (block.h's tiling rule, over the whole reservation): every block is
//     mapped (live, pending or free, as in a plain segment) or unmapped.
//   * Unmapped blocks start and end on page boundaries, are never live,
//     pending or in a free list, are exactly the members of `unmapped`, and
//     are coalesced: no unmapped block has an unmapped prev/next. (A free
//     mapped block and an unmapped neighbour stay apart.)
//   * mapped == sum of the sizes of its mapped blocks == the bytes the
//     backend has mapped in the reservation.
//   * reserved_bytes counts mapped bytes (torch's accounting); the segment
//     statistic counts maximal mapped runs, which are also the segments that
//     segments() and snapshots report.
//   * Only the default pool has expandable segments: private pools (CUDA
//     graphs, MemPool) keep plain segments, whose layout graph trees
//     checkpoint; a segment reservation that the backend refuses falls back
//     to a plain segment.
//   * Pages are unmapped only while no route is open (no capture), after
//     the segment's stream has been synchronised: work queued before the
//     free may still touch them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <set>

#include "pool/block.h"

namespace memalloc {

struct BlockByAddr {
  bool operator()(const Block* a, const Block* b) const { return a->addr < b->addr; }
};

struct VmSegment {
  VmSegment(std::uintptr_t base_, size_t size_, Stream stream_, PoolKind pool_, std::pmr::memory_resource* mr)
      : base(base_), size(size_), stream(stream_), pool(pool_), unmapped(mr) {}
  std::uintptr_t base;  // start of the reservation
  size_t size;          // bytes of address space reserved
  Stream stream;
  PoolKind pool;
  size_t mapped = 0;    // bytes backed by device memory
  std::pmr::set<Block*, BlockByAddr> unmapped;
};

// Where a request can be given room in a segment: pages [lo, lo + bytes)
// of the unmapped block `hole`; bytes == 0: its free neighbour `fit` is
// large enough already (best fit refused it: max_split_size).
struct VmRoom {
  Block* hole = nullptr;
  Block* fit = nullptr;
  std::uintptr_t lo = 0;
  size_t bytes = 0;
};

}  // namespace memalloc
