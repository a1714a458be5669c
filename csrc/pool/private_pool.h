// private_pool.h — private pools: memory set aside for one owner (a CUDA
// graph, a torch.cuda.MemPool), torch's MempoolId_t semantics.
//
// A private pool owns whole segments. Its free blocks sit in its own free
// lists, so an allocation outside the pool can never be handed one of its
// blocks (a captured graph replays into them), and a block allocated from
// the pool returns to the pool when freed, also after the capture ended.
//
// Routes: while an owner "allocates to" a pool (torch's beginAllocateToPool
// ... endAllocateToPool, i.e. a graph capture or `use_mem_pool`), each
// allocation asks the routes' filters with its stream, newest route first
// (as native); the first that accepts sends the allocation to that pool.
// The table of pools and the routes are the PrivatePools part
// (private_pools.h); this file holds the types.
//
// Invariants (checked by DeviceAllocator::validate() and the parts'
// validate(check)):
//   use_count >= 0; a pool with use_count == 0 is "freeable": its fully
//     free segments go back to the device on the next release of the cache,
//     and it is deleted once it holds no segment and no route names it
//     (private_pools.h).
//   segments   == number of segments with owner == this pool (kept by the
//                 SegmentTable, segment_table.h, as segments come and go)
//   live_blocks == number of live blocks with owner == this pool
//   every free block with owner == this pool is in this pool's free lists,
//     and no other free list holds it.
// Pool id {0, 0} is the default pool: it is never a PrivatePool.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <memory_resource>
#include <utility>

#include "pool/block.h"

namespace memalloc {

// torch's MempoolId_t: {graph capture id, 0} or {0, MemPool id}.
using PoolId = std::pair<unsigned long long, unsigned long long>;  // exactly c10::MempoolId_t
constexpr PoolId kDefaultPool{0, 0};

// Says whether an allocation on `stream` goes to the route's pool. Called
// under the device lock: it must not take the GIL or call the allocator.
using PoolFilter = std::function<bool(Stream)>;

// The two free lists (small and large blocks) of one pool.
struct FreeLists {
  explicit FreeLists(std::pmr::memory_resource* mr) : small(mr), large(mr) {}
  FreeList& of(PoolKind k) { return k == PoolKind::kSmall ? small : large; }
  FreeList small;
  FreeList large;
};

// Where a private pool's segments come from when it is not the backend:
// torch.cuda.MemPool(allocator=...) (ncclMemAlloc, symmetric memory). The
// pool still caches, splits and accounts its blocks as any other.
struct SegmentSource {
  virtual ~SegmentSource() = default;
  virtual void* allocate(size_t bytes, Stream stream) = 0;  // nullptr: refused (OOM)
  virtual bool release(void* ptr, size_t bytes) noexcept = 0;
};

struct PrivatePool {
  PrivatePool(PoolId pool_id, std::pmr::memory_resource* mr) : id(pool_id), lists(mr) {}
  PoolId id;
  // nullptr: segments from the backend. Kept while any segment of the pool
  // lives, also after its last use (the pool object outlives them).
  std::shared_ptr<SegmentSource> source;
  int use_count = 1;
  size_t segments = 0;
  size_t live_blocks = 0;
  // torch.cuda.MemPool(use_on_oom=True): when the default pool cannot grow,
  // an allocation may take this pool's free blocks instead of failing.
  bool use_on_oom = false;
  // torch.cuda.MemPool(no_split=True): its blocks are never split.
  bool no_split = false;
  FreeLists lists;
};

struct PoolRoute {
  PoolId id;
  PrivatePool* pool;
  PoolFilter filter;
};

// A pool's layout at one moment (getCheckpointState), enough to put it
// back (setCheckpointPoolState): every segment and its blocks in address
// order. Pending blocks are recorded as free.
struct BlockState {
  std::uintptr_t addr = 0;
  size_t size = 0;
  size_t requested = 0;
  bool allocated = false;
  uint64_t note = 0;  // a live block's subscriber note (allocator/subscriber.h), given back on restore
};

struct SegmentState {
  std::uintptr_t addr = 0;
  size_t size = 0;
  Stream stream = 0;
  PoolKind kind = PoolKind::kSmall;
  std::vector<BlockState> blocks;
};

struct PoolState {
  PoolId id = kDefaultPool;
  std::vector<SegmentState> segments;
};

// What restoring a PoolState changed: the pointers that were live and were
// freed, and the pointers that are live again (a pointer may be in both).
struct PoolRestore {
  std::vector<void*> freed;
  std::vector<void*> allocated;
};

}  // namespace memalloc
