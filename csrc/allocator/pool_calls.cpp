// pool_calls.cpp — DeviceAllocator's private-pool work on blocks: the
// use_on_oom fallback, live-block checks, and checkpoints of a pool and
// their restores (CUDA graph trees). Creation and use counts, routes (graph
// capture, use_mem_pool) and their checks are the PrivatePools part's
// (private_pools.h), which the boundary drives through with_pools.
// Invariants: private_pools.h, private_pool.h and device_allocator.h.
#include <algorithm>
#include <unordered_set>

#include "allocator/device_allocator.h"
#include "common/errors.h"

namespace memalloc {

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
  PrivatePool* pool = pools_.find(id);
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

bool DeviceAllocator::segment_of(void* ptr, std::uintptr_t* base, size_t* bytes, bool* expandable,
                                 size_t* block_bytes, size_t* page) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  auto live = live_.find(addr);
  if (live == live_.end()) return false;
  const Block* b = live->second;
  if (expandable != nullptr) *expandable = b->vm != nullptr;
  if (block_bytes != nullptr) *block_bytes = b->size;
  if (b->vm != nullptr) {  // its mapped run
    if (page != nullptr) *page = b->vm->page;
    const Block* first = b;
    while (first->prev != nullptr && first->prev->mapped) first = first->prev;
    *base = first->addr;
    *bytes = 0;
    for (const Block* m = first; m != nullptr && m->mapped; m = m->next) *bytes += m->size;
    return true;
  }
  auto it = segments_.containing(addr);  // a live block lies in a segment
  *base = it->first;
  *bytes = it->second.bytes;
  return true;
}

PoolState DeviceAllocator::checkpoint_pool(PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  PrivatePool& pool = pools_.get(id, "checkpoint_pool");
  const std::map<std::uintptr_t, Block*> blocks = blocks_by_addr_locked();
  PoolState state;
  state.id = id;
  for (auto& seg : segments_) {
    if (seg.second.owner != &pool) continue;
    const Block* first = blocks.at(seg.first);
    SegmentState s{seg.first, seg.second.bytes, first->stream, first->pool, {}};
    for (const Block* b = first; b != nullptr; b = b->next)
      s.blocks.push_back(BlockState{b->addr, b->size, b->allocated ? b->requested : 0, b->allocated,
                                    b->allocated ? sink_.note(b->id) : 0});
    state.segments.push_back(std::move(s));
  }
  return state;
}

PoolRestore DeviceAllocator::restore_pool(const PoolState& state, Caller caller) {
  std::lock_guard<std::mutex> lock(mu_);
  const EventSink::CallerScope scope(sink_, caller);
  PrivatePool& pool = pools_.get(state.id, "restore_pool");
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
    free_live_locked(live_.find(b->addr));
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
  for (Block* b : blocks_.lists(pool).of(s.kind).blocks())
    if (b->addr == s.addr) whole = b;
  if (whole == nullptr || whole->size != s.size) {
    throw Error("memalloc invariant broken: segment " + std::to_string(s.addr) +
                " is not one free block after its pool's blocks were freed");
  }
  FreeList& list = blocks_.lists(pool).of(s.kind);
  list.erase(whole);  // a whole segment: no inactive_split contribution
  blocks_.destroy(whole);
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
    Block* b = blocks_.make();
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
    ++allocations_;
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
    // Live again now (the subscriber: step, sequence number, phase),
    // allocated by whom it was (its note).
    made[i]->id = sink_.record_restored(e, cut[i].note);
  }
}

}  // namespace memalloc
