// private_pools.h — the private pools of one device as one part (torch's
// MempoolId_t calls): the table of PrivatePools (private_pool.h) by id,
// their use counts, and the open routes ("allocate to pool": a graph
// capture, use_mem_pool) that send allocations to them.
//
// The part decides which pool an allocation goes to (route: the newest
// open route whose filter accepts the stream), creates, counts and deletes
// pools, and checks the callers' mistakes with the messages Python tests
// match. It changes no block, free list content or counter: the work on
// blocks is DeviceAllocator's (releases of segments) and PoolCheckpoints'
// (allocator/pool_checkpoints.h: checkpoints and restores); oom_fallback()
// only finds the block that the allocator then takes.
//
// Invariants:
//   * Every key is its pool's id, never kDefaultPool (the default pool is
//     no PrivatePool); use_count >= 0 for every pool.
//   * A pool with use_count == 0 is "freeable": DeviceAllocator releases its
//     fully free segments with the cache, and delete_unused() deletes it
//     once it holds no segment (segments == 0, kept by the SegmentTable)
//     and no open route names it. No other call deletes a pool, so a pool's
//     address stays valid while any segment, block or route names it.
//   * routes_ are the open routes, oldest first; each names a pool of the
//     table (its pool pointer is that entry's), has a filter, and no two
//     name one pool. route() asks them newest first (as native).
//   * begin_route() counts one use of its pool (create_or_incref);
//     end_route() drops the route, not the use (release_pool does).
//   * No lock of its own: DeviceAllocator calls it under the device lock.
//     route() and any_route() are inline and allocate nothing (the fast
//     path's calls); creating a pool or a route allocates (never in a
//     steady state). The pools' free lists use the allocator's node
//     resource.
#pragma once

#include <map>
#include <memory>
#include <memory_resource>
#include <string>
#include <vector>

#include "pool/private_pool.h"

namespace memalloc {

// "private pool (a, b)": how messages name a pool.
std::string pool_name(PoolId id);

class PrivatePools {
 public:
  using Table = std::map<PoolId, std::unique_ptr<PrivatePool>>;

  // `device` names the device in messages; `mr` backs the pools' free lists.
  PrivatePools(int device, std::pmr::memory_resource* mr) : device_(device), mr_(mr) {}
  PrivatePools(const PrivatePools&) = delete;
  PrivatePools& operator=(const PrivatePools&) = delete;

  // ---- routes ---------------------------------------------------------------
  // True while any route is open (DeviceAllocator::capturing()).
  bool any_route() const { return !routes_.empty(); }
  // The pool an allocation on `stream` goes to: the newest open route whose
  // filter accepts it; nullptr: the default pool.
  PrivatePool* route(Stream stream) const {
    for (auto r = routes_.rbegin(); r != routes_.rend(); ++r)
      if (r->filter(stream)) return r->pool;
    return nullptr;
  }
  // create_or_incref(id), then opens a route to it. InvalidArgument (and
  // nothing changed) for kDefaultPool, an empty filter, or a pool that
  // already has an open route.
  PrivatePool& begin_route(PoolId id, PoolFilter filter);
  // Closes the route to `id`; InvalidArgument when none is open.
  void end_route(PoolId id);
  // Whether an open route names `pool`.
  bool routed(const PrivatePool& pool) const;

  // ---- pools ----------------------------------------------------------------
  // The pool `id`, or nullptr.
  PrivatePool* find(PoolId id) const {
    auto it = pools_.find(id);
    return it == pools_.end() ? nullptr : it->second.get();
  }
  // The pool `id`; InvalidArgument naming `call` when it does not exist.
  PrivatePool& get(PoolId id, const char* call) const;
  // Creates the pool with use count 1 (and `source`), or adds one use. A
  // pool that exists keeps its source: InvalidArgument (and nothing
  // changed) when another non-null one is given, or for kDefaultPool.
  PrivatePool& create_or_incref(PoolId id, std::shared_ptr<SegmentSource> source = nullptr);
  // Drops one use (at 0 the pool is freeable). InvalidArgument for an
  // unknown pool or one already at 0.
  void release(PoolId id);
  // The use count of `id` (0 for an unknown or freeable pool).
  int use_count(PoolId id) const {
    const PrivatePool* p = find(id);
    return p == nullptr ? 0 : p->use_count;
  }
  static bool freeable(const PrivatePool& p) { return p.use_count == 0; }
  // Deletes the freeable pools that hold no segment and that no route names.
  void delete_unused();

  // Every pool, in id order (entries: {id, unique_ptr<PrivatePool>}).
  Table::const_iterator begin() const { return pools_.begin(); }
  Table::const_iterator end() const { return pools_.end(); }
  size_t size() const { return pools_.size(); }
  // `default_lists` (the default pool's), then every pool's, in id order.
  std::vector<FreeLists*> all_free_lists(FreeLists& default_lists) const;
  // The use_on_oom fallback: the best-fitting free block of `rounded` bytes
  // on `stream` in the first use_on_oom pool that has one (in id order;
  // FreeList::best_fit under max_split_size), for a default-pool
  // allocation that could not grow; nullptr when none has.
  Block* oom_fallback(size_t rounded, Stream stream, size_t max_split_size) const;

  // Checks the invariants above: check(condition, what is wrong).
  template <class Check>
  void validate(Check&& check) const;

 private:
  const int device_;
  std::pmr::memory_resource* mr_;
  Table pools_;
  std::vector<PoolRoute> routes_;  // open routes, oldest first
};

template <class Check>
void PrivatePools::validate(Check&& check) const {
  for (const auto& kv : pools_) {
    check(kv.first == kv.second->id && kv.first != kDefaultPool, "pool table key differs from its pool's id");
    check(kv.second->use_count >= 0, "a private pool's use count is negative");
  }
  for (size_t i = 0; i < routes_.size(); ++i) {
    const PoolRoute& r = routes_[i];
    check(find(r.id) != nullptr && find(r.id) == r.pool, "an open route names no pool of the table");
    check(static_cast<bool>(r.filter), "an open route has no filter");
    for (size_t j = 0; j < i; ++j) check(routes_[j].id != r.id, "two open routes name one pool");
  }
}

}  // namespace memalloc
