// private_pools.cpp — PrivatePools' members that are not inline
// (private_pools.h): pool creation, use counts, routes, deletion of unused
// pools, and the messages of the callers' mistakes (Python tests match
// them). Invariants: private_pools.h.
#include "pool/private_pools.h"

#include <algorithm>

#include "common/errors.h"

namespace memalloc {

std::string pool_name(PoolId id) {
  return "private pool (" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}

PrivatePool& PrivatePools::get(PoolId id, const char* call) const {
  PrivatePool* pool = find(id);
  MEMALLOC_EXPECTS(pool != nullptr, std::string(call) + ": " + pool_name(id) + " does not exist on device " +
                                        std::to_string(device_) +
                                        "; create it first (torch.cuda.MemPool or a graph "
                                        "capture)");
  return *pool;
}

PrivatePool& PrivatePools::create_or_incref(PoolId id, std::shared_ptr<SegmentSource> source) {
  MEMALLOC_EXPECTS(id != kDefaultPool, "pool id (0, 0) is the default pool; a private pool needs another id");
  PrivatePool* pool = find(id);
  if (pool == nullptr) {
    pool = pools_.emplace(id, std::make_unique<PrivatePool>(id, mr_)).first->second.get();
    pool->source = std::move(source);
    return *pool;
  }
  MEMALLOC_EXPECTS(source == nullptr || pool->source == source,
                   pool_name(id) + " already exists with another segment source");
  pool->use_count += 1;
  return *pool;
}

PrivatePool& PrivatePools::begin_route(PoolId id, PoolFilter filter) {
  MEMALLOC_EXPECTS(id != kDefaultPool, "allocate to pool (0, 0): the default pool takes no route");
  MEMALLOC_EXPECTS(static_cast<bool>(filter), "begin_allocate_to_pool: no filter given");
  for (const PoolRoute& r : routes_)
    MEMALLOC_EXPECTS(r.id != id, "begin_allocate_to_pool: allocations already go to " + pool_name(id) +
                                     "; end that (endAllocateToPool) before beginning another");
  routes_.reserve(routes_.size() + 1);  // nothing changes when it throws
  PrivatePool& pool = create_or_incref(id);
  routes_.push_back(PoolRoute{id, &pool, std::move(filter)});
  return pool;
}

void PrivatePools::end_route(PoolId id) {
  auto it = std::find_if(routes_.begin(), routes_.end(), [&](const PoolRoute& r) { return r.id == id; });
  MEMALLOC_EXPECTS(it != routes_.end(), "end_allocate_to_pool: allocations do not go to " + pool_name(id));
  routes_.erase(it);
}

bool PrivatePools::routed(const PrivatePool& pool) const {
  return std::any_of(routes_.begin(), routes_.end(), [&](const PoolRoute& r) { return r.pool == &pool; });
}

void PrivatePools::release(PoolId id) {
  PrivatePool& pool = get(id, "release_pool");
  MEMALLOC_EXPECTS(pool.use_count > 0, "release_pool: " + pool_name(id) + " was already released");
  pool.use_count -= 1;
}

void PrivatePools::delete_unused() {
  for (auto it = pools_.begin(); it != pools_.end();) {
    const PrivatePool& p = *it->second;
    if (freeable(p) && p.segments == 0 && !routed(p)) {
      it = pools_.erase(it);
    } else {
      ++it;
    }
  }
}

Block* PrivatePools::oom_fallback(size_t rounded, Stream stream, size_t max_split_size) const {
  for (const auto& kv : pools_) {
    PrivatePool& p = *kv.second;
    if (!p.use_on_oom) continue;
    Block* b = p.lists.of(pool_kind_for(rounded)).best_fit(stream, rounded, max_split_size);
    if (b != nullptr) return b;
  }
  return nullptr;
}

std::vector<FreeLists*> PrivatePools::all_free_lists(FreeLists& default_lists) const {
  std::vector<FreeLists*> all{&default_lists};
  for (auto& kv : pools_) all.push_back(&kv.second->lists);
  return all;
}

}  // namespace memalloc
