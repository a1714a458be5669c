// pool_checkpoints.cpp — the PoolCheckpoints part (pool_checkpoints.h: what
// it does and its invariants).
#include "allocator/pool_checkpoints.h"

#include <string>
#include <unordered_set>

#include "common/errors.h"

namespace memalloc {

std::map<std::uintptr_t, Block*> mapped_blocks(const LiveTable& live, const StreamEvents& events,
                                               const std::vector<FreeLists*>& free_lists) {
  std::map<std::uintptr_t, Block*> blocks;
  for (auto& kv : live) blocks.emplace(kv.first, kv.second);
  events.for_each_waiting([&](Block* b) { blocks.emplace(b->addr, b); });
  for (FreeLists* l : free_lists)
    for (FreeList* list : {&l->small, &l->large})
      for (Block* b : list->blocks()) blocks.emplace(b->addr, b);
  return blocks;
}

bool PoolCheckpoints::live_blocks_are(PoolId id, const std::vector<void*>& expected) const {
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

PoolState PoolCheckpoints::checkpoint(PoolId id) const {
  PrivatePool& pool = pools_.get(id, "checkpoint_pool");
  const std::map<std::uintptr_t, Block*> blocks = mapped_blocks(live_, events_, {&pool.lists});
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

PoolRestore PoolCheckpoints::restore(const PoolState& state) {
  PrivatePool& pool = pools_.get(state.id, "restore_pool");
  for (const SegmentState& s : state.segments) {
    auto it = segments_.find(s.addr);
    MEMALLOC_EXPECTS(it != segments_.end() && it->second.owner == &pool && it->second.bytes == s.size,
                     "restore_pool: the segment at " + std::to_string(s.addr) +
                         " of the checkpoint no longer "
                         "belongs to " +
                         pool_name(state.id) + "; a checkpoint can only restore its own pool's segments");
  }
  PoolRestore out;
  // 1. Free every block live in the pool now; wait for its pending ones.
  std::vector<Block*> live;
  for (auto& kv : live_)
    if (kv.second->owner == &pool) live.push_back(kv.second);
  for (Block* b : live) {
    b->stream_uses.clear();  // the graph's owner is done with them: freed at once
    out.freed.push_back(reinterpret_cast<void*>(b->addr));
    free_live_(b);
  }
  if (events_.any_waiting([&](const Block* b) { return b->owner == &pool; })) wait_pending_();
  // 2. Every segment of the state is now one free block: cut it as it was.
  for (const SegmentState& s : state.segments) restore_segment(s, &pool, &out);
  return out;
}

void PoolCheckpoints::restore_segment(const SegmentState& s, PrivatePool* pool, PoolRestore* out) {
  FreeList& list = blocks_.lists(pool).of(s.kind);
  Block* whole = nullptr;
  for (Block* b : list.blocks())
    if (b->addr == s.addr) whole = b;
  if (whole == nullptr || whole->size != s.size) {
    throw Error("memalloc invariant broken: segment " + std::to_string(s.addr) +
                " is not one free block after its pool's blocks were freed");
  }
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
