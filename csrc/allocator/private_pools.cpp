// private_pools.cpp — DeviceAllocator's private pools (private_pool.h):
// creation and use counts, routes (graph capture, use_mem_pool), the
// use_on_oom fallback, and checkpoints of a pool (CUDA graph trees).
// Invariants: private_pool.h and device_allocator.h.
#include <algorithm>
#include <unordered_set>

#include "allocator/device_allocator.h"
#include "common/errors.h"

namespace memalloc {
namespace {

std::string pool_name(PoolId id) {
  return "private pool (" + std::to_string(id.first) + ", " + std::to_string(id.second) + ")";
}

}  // namespace

PrivatePool* DeviceAllocator::find_pool_locked(PoolId id) {
  auto it = pools_.find(id);
  return it == pools_.end() ? nullptr : it->second.get();
}

PrivatePool& DeviceAllocator::pool_or_throw_locked(PoolId id, const char* call) {
  PrivatePool* pool = find_pool_locked(id);
  MEMALLOC_EXPECTS(pool != nullptr, std::string(call) + ": " + pool_name(id) + " does not exist on device " +
                                        std::to_string(device_) + "; create it first (torch.cuda.MemPool or a graph "
                                        "capture)");
  return *pool;
}

PrivatePool* DeviceAllocator::route_locked(Stream stream) {
  for (auto r = routes_.rbegin(); r != routes_.rend(); ++r)
    if (r->filter(stream)) return r->pool;
  return nullptr;
}

PrivatePool* DeviceAllocator::create_or_incref_locked(PoolId id) {
  PrivatePool* pool = find_pool_locked(id);
  if (pool == nullptr) return pools_.emplace(id, std::make_unique<PrivatePool>(id, &mr_)).first->second.get();
  pool->use_count += 1;
  return pool;
}

void DeviceAllocator::create_or_incref_pool(PoolId id, std::shared_ptr<SegmentSource> source) {
  MEMALLOC_EXPECTS(id != kDefaultPool, "pool id (0, 0) is the default pool; a private pool needs another id");
  std::lock_guard<std::mutex> lock(mu_);
  const bool existed = find_pool_locked(id) != nullptr;
  PrivatePool* pool = create_or_incref_locked(id);
  if (source == nullptr) return;
  if (!existed) {
    pool->source = std::move(source);
  } else if (pool->source != source) {
    pool->use_count -= 1;  // nothing changed
    MEMALLOC_EXPECTS(false, pool_name(id) + " already exists with another segment source");
  }
}

void DeviceAllocator::begin_allocate_to_pool(PoolId id, PoolFilter filter) {
  MEMALLOC_EXPECTS(id != kDefaultPool, "allocate to pool (0, 0): the default pool takes no route");
  MEMALLOC_EXPECTS(static_cast<bool>(filter), "begin_allocate_to_pool: no filter given");
  std::lock_guard<std::mutex> lock(mu_);
  for (const PoolRoute& r : routes_)
    MEMALLOC_EXPECTS(r.id != id, "begin_allocate_to_pool: allocations already go to " + pool_name(id) +
                                     "; end that (endAllocateToPool) before beginning another");
  routes_.push_back(PoolRoute{id, create_or_incref_locked(id), std::move(filter)});
}

void DeviceAllocator::end_allocate_to_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(routes_.begin(), routes_.end(), [&](const PoolRoute& r) { return r.id == id; });
  MEMALLOC_EXPECTS(it != routes_.end(), "end_allocate_to_pool: allocations do not go to " + pool_name(id));
  routes_.erase(it);
}

void DeviceAllocator::release_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  PrivatePool& pool = pool_or_throw_locked(id, "release_pool");
  MEMALLOC_EXPECTS(pool.use_count > 0, "release_pool: " + pool_name(id) + " was already released");
  pool.use_count -= 1;
}

int DeviceAllocator::pool_use_count(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  PrivatePool* pool = find_pool_locked(id);
  return pool == nullptr ? 0 : pool->use_count;
}

void DeviceAllocator::set_pool_use_on_oom(PoolId id, bool use_on_oom) {
  std::lock_guard<std::mutex> lock(mu_);
  pool_or_throw_locked(id, "set_use_on_oom").use_on_oom = use_on_oom;
}

void DeviceAllocator::set_pool_no_split(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  pool_or_throw_locked(id, "set_no_split").no_split = true;
}

bool DeviceAllocator::capturing() {
  std::lock_guard<std::mutex> lock(mu_);
  return !routes_.empty();
}

// Deletes freeable pools that hold no segment and that no route names.
void DeviceAllocator::delete_unused_pools_locked() {
  for (auto it = pools_.begin(); it != pools_.end();) {
    const PrivatePool& p = *it->second;
    const bool routed =
        std::any_of(routes_.begin(), routes_.end(), [&](const PoolRoute& r) { return r.pool == &p; });
    if (p.use_count == 0 && p.segments == 0 && !routed) {
      it = pools_.erase(it);
    } else {
      ++it;
    }
  }
}

// The smallest fitting free block of a use_on_oom pool, for a default-pool
// allocation that could not grow.
Block* DeviceAllocator::take_from_oom_pools_locked(size_t rounded, Stream stream) {
  for (auto& kv : pools_) {
    PrivatePool& p = *kv.second;
    if (!p.use_on_oom) continue;
    Block* b = p.lists.of(pool_kind_for(rounded)).best_fit(stream, rounded, config_.max_split_size);
    if (b != nullptr) return b;
  }
  return nullptr;
}

bool DeviceAllocator::pool_live_blocks_are(PoolId id, const std::vector<void*>& expected) {
  std::lock_guard<std::mutex> lock(mu_);
  PrivatePool* pool = find_pool_locked(id);
  if (pool == nullptr) return false;
  std::unordered_set<void*> distinct(expected.begin(), expected.end());
  if (distinct.size() != pool->live_blocks) return false;
  for (void* p : distinct) {
    auto it = live_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == live_.end() || it->second->owner != pool) return false;
  }
  return true;
}

size_t DeviceAllocator::largest_free_block() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t largest = 0;
  for (FreeLists* l : all_free_lists_locked())
    for (FreeList* list : {&l->small, &l->large})
      for (const Block* b : list->blocks()) largest = std::max(largest, b->size);
  return largest;
}

bool DeviceAllocator::segment_of(void* ptr, std::uintptr_t* base, size_t* bytes, bool* expandable) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  auto live = live_.find(addr);
  if (live == live_.end()) return false;
  const Block* b = live->second;
  if (expandable != nullptr) *expandable = b->vm != nullptr;
  if (b->vm != nullptr) {  // its mapped run
    const Block* first = b;
    while (first->prev != nullptr && first->prev->mapped) first = first->prev;
    *base = first->addr;
    *bytes = 0;
    for (const Block* m = first; m != nullptr && m->mapped; m = m->next) *bytes += m->size;
    return true;
  }
  auto it = std::prev(segments_.upper_bound(addr));  // a live block lies in a segment
  *base = it->first;
  *bytes = it->second.bytes;
  return true;
}

PoolState DeviceAllocator::checkpoint_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  PrivatePool& pool = pool_or_throw_locked(id, "checkpoint_pool");
  const std::map<std::uintptr_t, Block*> blocks = blocks_by_addr_locked();
  PoolState state;
  state.id = id;
  for (auto& seg : segments_) {
    if (seg.second.owner != &pool) continue;
    const Block* first = blocks.at(seg.first);
    SegmentState s{seg.first, seg.second.bytes, first->stream, first->pool, {}};
    for (const Block* b = first; b != nullptr; b = b->next)
      s.blocks.push_back(BlockState{b->addr, b->size, b->allocated ? b->requested : 0, b->allocated,
                                    b->allocated ? b->prov : Provenance{}});
    state.segments.push_back(std::move(s));
  }
  return state;
}

PoolRestore DeviceAllocator::restore_pool(const PoolState& state) {
  std::lock_guard<std::mutex> lock(mu_);
  PrivatePool& pool = pool_or_throw_locked(state.id, "restore_pool");
  for (const SegmentState& s : state.segments) {
    auto it = segments_.find(s.addr);
    MEMALLOC_EXPECTS(it != segments_.end() && it->second.owner == &pool && it->second.bytes == s.size,
                     "restore_pool: the segment at " + std::to_string(s.addr) + " of the checkpoint no longer "
                     "belongs to " + pool_name(state.id) + "; a checkpoint can only restore its own pool's segments");
  }
  PoolRestore out;
  // 1. Free every block live in the pool now; wait for its pending ones.
  std::vector<Block*> live;
  for (auto& kv : live_)
    if (kv.second->owner == &pool) live.push_back(kv.second);
  for (Block* b : live) {
    b->stream_uses.clear();  // the graph's owner is done with them: freed at once
    out.freed.push_back(reinterpret_cast<void*>(b->addr));
    free_live_locked(live_.find(b->addr), ctx_);
  }
  if (events_.any_waiting([&](const Block* b) { return b->owner == &pool; })) synchronize_events_locked();
  // 2. Every segment of the state is now one free block: cut it as it was.
  for (const SegmentState& s : state.segments) restore_segment_locked(s, &pool, &out);
  return out;
}

// Replaces the single free block spanning segment `s` by the blocks of `s`
// (adjacent free ones merged); the allocated ones become live.
void DeviceAllocator::restore_segment_locked(const SegmentState& s, PrivatePool* pool, PoolRestore* out) {
  Block* whole = nullptr;
  for (Block* b : lists(pool).of(s.kind).blocks())
    if (b->addr == s.addr) whole = b;
  if (whole == nullptr || whole->size != s.size) {
    throw Error("memalloc invariant broken: segment " + std::to_string(s.addr) +
                " is not one free block after its pool's blocks were freed");
  }
  FreeList& list = lists(pool).of(s.kind);
  list.erase(whole);  // a whole segment: no inactive_split contribution
  delete_block(whole);
  // Merge adjacent free entries (a pending block recorded as free).
  std::vector<BlockState> cut;
  for (const BlockState& b : s.blocks) {
    if (!b.allocated && !cut.empty() && !cut.back().allocated) {
      cut.back().size += b.size;
    } else {
      cut.push_back(b);
    }
  }
  Block* prev = nullptr;
  std::vector<Block*> made;
  for (const BlockState& bs : cut) {
    Block* b = new_block();
    b->addr = bs.addr;
    b->size = bs.size;
    b->stream = s.stream;
    b->pool = s.kind;
    b->owner = pool;
    b->prev = prev;
    if (prev != nullptr) prev->next = b;
    prev = b;
    made.push_back(b);
  }
  // The segment's free blocks now sit inside a split segment (when it is
  // cut at all): that is the inactive_split change of the restore.
  int64_t split_bytes_delta = 0, split_count_delta = 0;
  bool deltas_recorded = false;
  for (size_t i = 0; i < made.size(); ++i) {
    Block* b = made[i];
    if (!cut[i].allocated) {
      split_bytes_delta += split_bytes(b);
      split_count_delta += split_count(b);
      list.insert(b);
      continue;
    }
    b->allocated = true;
    b->requested = cut[i].requested;
    // Live again now (step, sequence number, phase), allocated by whom it was.
    b->prov = new_provenance_locked();
    b->prov.stack_id = cut[i].prov.stack_id;
    b->prov.tag_id = cut[i].prov.tag_id;
    live_.emplace(b->addr, b);
    pool->live_blocks += 1;
    out->allocated.push_back(reinterpret_cast<void*>(b->addr));
  }
  for (size_t i = 0; i < made.size(); ++i) {
    if (!cut[i].allocated) continue;
    Event e = block_event(Action::kAlloc, *made[i]);
    if (!deltas_recorded) {
      e.inactive_split_bytes_delta = split_bytes_delta;
      e.inactive_split_count_delta = split_count_delta;
      deltas_recorded = true;
    }
    record_locked(e);
  }
}

}  // namespace memalloc
