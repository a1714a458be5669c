// block.h — blocks, the size rules, and the free lists (one per pool kind).
//
// A segment is one allocation obtained from the backend. It is tiled, without
// gaps or overlaps, by Blocks linked through prev/next in address order:
//   for b in segment: b.next == nullptr || b.addr + b.size == b.next->addr
//   sum(b.size for b in segment) == segment size
// A block is in exactly one state:
//   live      (allocated)                         -> in the live table
//   pending   (!allocated, event_count > 0)       -> waiting on stream events
//   free      (!allocated, event_count == 0)      -> in its pool's FreeList
// (its pool: the default pool's lists, or its owner's: private_pool.h).
// Every block of a segment has the same owner, stream and kind.
// Free neighbours are always coalesced: no free block has a free prev/next.
// Blocks of an expandable segment (vm_arena.h) have a fourth state,
//   unmapped  (!mapped: no device memory behind it) -> in its segment's
//             `unmapped` set, never in a free list, never coalesced with a
//             mapped block;
// every other block is mapped.
// A live or pending block's `id` is the one its allocator's subscriber gave
// it (allocator/subscriber.h: the profiler's record of who allocated it);
// the pool never reads it. A free block's id is 0.
// All Block objects and container nodes come from the owning device's
// NodeCache (node_cache.h): no host allocation in steady state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <set>
#include <vector>

#include "backend/backend.h"

namespace memalloc {

constexpr size_t kMinBlockSize = 512;                // every size is a multiple
constexpr size_t kSmallSize = size_t{1} << 20;       // <= 1 MiB: small pool
constexpr size_t kSmallBuffer = size_t{2} << 20;     // small segments are 2 MiB
constexpr size_t kLargeBuffer = size_t{20} << 20;    // 1-10 MiB requests: 20 MiB segments
constexpr size_t kMinLargeAlloc = size_t{10} << 20;  // >= 10 MiB: own segment...
constexpr size_t kRoundLarge = size_t{2} << 20;      // ...rounded up to 2 MiB
constexpr size_t kMaxRequest = size_t{1} << 60;      // beyond this, nothing can fit

enum class PoolKind : uint8_t { kSmall = 0, kLarge = 1 };

struct PrivatePool;  // private_pool.h
struct VmSegment;    // vm_arena.h

struct Block {
  std::uintptr_t addr = 0;
  size_t size = 0;       // bytes this block spans (a multiple of 512)
  size_t requested = 0;  // bytes the caller asked for (live blocks only)
  Stream stream = 0;     // allocation stream: reuse is restricted to it
  PoolKind pool = PoolKind::kSmall;
  bool allocated = false;
  bool mapped = true;            // false: an unmapped run of an expandable segment
  int event_count = 0;           // outstanding cross-stream events (pending state)
  uint32_t id = 0;               // the subscriber's id of it (live and pending blocks); 0 = none
  PrivatePool* owner = nullptr;  // the private pool of its segment; nullptr = default pool
  VmSegment* vm = nullptr;       // its expandable segment; nullptr = a plain segment
  Block* prev = nullptr;
  Block* next = nullptr;
  std::pmr::vector<Stream> stream_uses;  // other streams that used it (record_stream)

  explicit Block(std::pmr::memory_resource* mr) : stream_uses(mr) {}
  bool is_split() const { return prev != nullptr || next != nullptr; }
  // Free: in a free list (not live, no pending events, mapped).
  bool is_free() const { return !allocated && event_count == 0 && mapped; }
};

// Bytes and blocks a free block contributes to inactive_split_* (accounting.h).
inline int64_t split_bytes(const Block* b) { return b->is_split() ? static_cast<int64_t>(b->size) : 0; }
inline int64_t split_count(const Block* b) { return b->is_split() ? 1 : 0; }

// The tiling's two edits; DeviceAllocator's split_block_locked and
// absorb_locked add its node cache (making and deleting the Block), parts'
// unit tests use them as they are.
// Makes the fresh block `upper` the part of `b` from `offset` bytes on (same
// stream, pool, owner, segment, mapping; in no list) and returns it.
inline Block* split_block(Block* b, size_t offset, Block* upper) {
  upper->addr = b->addr + offset;
  upper->size = b->size - offset;
  upper->stream = b->stream;
  upper->pool = b->pool;
  upper->owner = b->owner;
  upper->vm = b->vm;
  upper->mapped = b->mapped;
  upper->prev = b;
  upper->next = b->next;
  if (upper->next != nullptr) upper->next->prev = upper;
  b->next = upper;
  b->size = offset;
  return upper;
}
// Merges the neighbour `n` (b's prev or next, in no list) into `b`; n is
// left unlinked from the tiling, for the caller to delete.
inline void absorb_block(Block* b, Block* n) {
  if (n == b->prev) {
    b->addr = n->addr;
    b->prev = n->prev;
    if (b->prev != nullptr) b->prev->next = b;
  } else {
    b->next = n->next;
    if (b->next != nullptr) b->next->prev = b;
  }
  b->size += n->size;
}

// Best-fit order: by stream, then size, then address (lowest first).
struct BlockBySize {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->addr < b->addr;
  }
};

// The free blocks of one pool kind (small or large) on one device.
class FreeList {
 public:
  explicit FreeList(std::pmr::memory_resource* mr) : blocks_(mr) {}

  // Smallest free block on `stream` with size >= `size`, honouring
  // max_split_size the way native does: an oversize block (>= max_split) is
  // never used for a request below max_split, and serves a larger request
  // only when it wastes less than kLargeBuffer. nullptr when none fits.
  Block* best_fit(Stream stream, size_t size, size_t max_split) const;
  void insert(Block* b) { blocks_.insert(b); }
  void erase(Block* b) { blocks_.erase(b); }
  bool empty() const { return blocks_.empty(); }
  const std::pmr::set<Block*, BlockBySize>& blocks() const { return blocks_; }

 private:
  std::pmr::set<Block*, BlockBySize> blocks_;
};

// Size rules (native semantics, docs/architecture.md).
size_t round_size(size_t size, size_t roundup_power2_divisions);
inline PoolKind pool_kind_for(size_t rounded) { return rounded <= kSmallSize ? PoolKind::kSmall : PoolKind::kLarge; }
size_t segment_size_for(size_t rounded);
// Whether taking `size` bytes from `block` leaves a remainder worth splitting
// (native's rule, which depends on whether expandable segments are on).
bool should_split(const Block& block, size_t size, size_t max_split, bool expandable_segments);

}  // namespace memalloc
