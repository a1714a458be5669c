// validate.cpp — checks every invariant of device_allocator.h and block.h
// against the live state, and the parts' own (StreamEvents, SegmentTable,
// PrivatePools, VmArena: each part's validate(check); the subscriber's
// Subscriber::validate, given the live and pending blocks). For tests
// (called after every operation) and debugging; O(blocks), takes the
// device lock.
#include <algorithm>
#include <map>
#include <set>

#include "allocator/device_allocator.h"
#include "common/errors.h"

namespace memalloc {
namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw Error("memalloc invariant broken: " + what);
}

struct Totals {
  int64_t allocated[kNumStatTypes] = {};
  int64_t requested[kNumStatTypes] = {};
  int64_t active[kNumStatTypes] = {};
  int64_t active_count[kNumStatTypes] = {};
  int64_t live_count[kNumStatTypes] = {};
  int64_t reserved[kNumStatTypes] = {};
  int64_t segments[kNumStatTypes] = {};
  int64_t split_bytes[kNumStatTypes] = {};
  int64_t split_count[kNumStatTypes] = {};

  static void add(int64_t (&a)[kNumStatTypes], PoolKind k, int64_t v) {
    a[kStatAll] += v;
    a[k == PoolKind::kSmall ? kStatSmall : kStatLarge] += v;
  }
};

void check_stat(const Stat (&s)[kNumStatTypes], const int64_t (&want)[kNumStatTypes], const char* name) {
  for (int i = 0; i < kNumStatTypes; ++i) {
    check(s[i].current == want[i], std::string(name) + "[" + std::to_string(i) + "].current == " +
                                       std::to_string(s[i].current) + ", expected " + std::to_string(want[i]));
    check(s[i].peak.value() >= s[i].current, std::string(name) + " peak < current");
  }
}

}  // namespace

void DeviceAllocator::validate() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::uintptr_t, const Block*> blocks;
  std::vector<SubscribedBlock> held;  // live and pending blocks, for the subscriber's check
  for (auto& kv : live_) {
    const Block* b = kv.second;
    check(kv.first == b->addr && b->allocated, "live table entry is not a live block");
    blocks.emplace(kv.first, b);
    held.push_back(SubscribedBlock{b->addr, b->size, b->requested, b->id, false});
  }
  events_.validate([&](bool ok, const char* what) { check(ok, what); });
  events_.for_each_waiting([&](const Block* b) {  // a block once per stream it waits for
    if (blocks.emplace(b->addr, b).second) held.push_back(SubscribedBlock{b->addr, b->size, b->requested, b->id, true});
  });
  for (const SubscribedBlock& h : held)
    check(sink_.subscriber() == nullptr ? h.id == 0 : h.id != 0,
          "a live or pending block's subscriber id is 0 (or not 0 with none)");
  pools_.validate([&](bool ok, const char* what) { check(ok, what); });
  segments_.validate([&](bool ok, const char* what) { check(ok, what); });
  for (FreeLists* lists_of_pool : all_free_lists_locked()) {
    for (FreeList* list : {&lists_of_pool->small, &lists_of_pool->large}) {
      for (const Block* b : list->blocks()) {
        check(b->is_free(), "free list holds a non-free block");
        check(b->id == 0, "a free block keeps an allocation's subscriber id");
        check(&blocks_.list_of(b) == list, "free block in the wrong pool's list");
        check(blocks.emplace(b->addr, b).second, "free block overlaps another block");
      }
    }
  }
  std::map<const PrivatePool*, size_t> pool_live;
  for (auto& kv : live_)
    if (kv.second->owner != nullptr) pool_live[kv.second->owner] += 1;
  // Unmapped blocks of expandable segments (vm_arena.h) join the map; the
  // arena checks its own invariants, this the segment table's side.
  vm_.validate([&](bool ok, const char* what) { check(ok, what); });
  vm_.for_each_segment([&](const VmSegment& vm) {
    for (const Block* b : vm.unmapped)
      check(blocks.emplace(b->addr, b).second, "an unmapped block overlaps another block");
    auto seg = segments_.find(vm.base);
    check(seg != segments_.end() && seg->second.vm == &vm, "an expandable segment is not in the segment table");
  });
  Totals t;
  size_t covered = 0;
  for (auto& seg : segments_) {
    auto it = blocks.find(seg.first);
    check(it != blocks.end(), "segment has no block at its start");
    const Block* first = it->second;
    const VmSegment* vm = seg.second.vm;
    check(first->prev == nullptr, "first block of a segment has a prev");
    check(first->owner == seg.second.owner, "a segment's first block has another owner than the segment");
    if (seg.second.owner != nullptr)
      check(pools_.find(seg.second.owner->id) == seg.second.owner, "a segment's owner is not in the pool table");
    if (vm == nullptr) {
      Totals::add(t.reserved, first->pool, static_cast<int64_t>(seg.second.bytes));
      Totals::add(t.segments, first->pool, 1);
    }
    std::uintptr_t end = seg.first;
    size_t mapped = 0;
    for (const Block* b = first; b != nullptr; b = b->next) {
      check(b->addr == end, "blocks of a segment are not contiguous");
      check(blocks.count(b->addr) && blocks[b->addr] == b, "a segment's block is in no table");
      check(b->stream == first->stream && b->pool == first->pool && b->owner == first->owner && b->vm == vm,
            "blocks of a segment differ in stream/pool/owner/segment");
      check(b->size % kMinBlockSize == 0 && b->size > 0, "block size is not a positive multiple of 512");
      check(b->mapped || vm != nullptr, "a plain segment has an unmapped block");
      if (b->next) check(b->next->prev == b, "next->prev link broken");
      if (b->is_free() && b->next) check(!b->next->is_free(), "two adjacent free blocks are not coalesced");
      if (!b->mapped && b->next) check(b->next->mapped, "two adjacent unmapped blocks are not coalesced");
      if (b->mapped && vm != nullptr) {
        mapped += b->size;
        Totals::add(t.reserved, b->pool, static_cast<int64_t>(b->size));
        if (b->prev == nullptr || !b->prev->mapped) Totals::add(t.segments, b->pool, 1);  // a run starts
      }
      if (b->allocated) {
        check(b->requested <= b->size, "a live block's requested bytes exceed its size");
        Totals::add(t.allocated, b->pool, static_cast<int64_t>(b->size));
        Totals::add(t.requested, b->pool, static_cast<int64_t>(b->requested));
        Totals::add(t.live_count, b->pool, 1);
      }
      if (b->mapped && !b->is_free()) {
        Totals::add(t.active, b->pool, static_cast<int64_t>(b->size));
        Totals::add(t.active_count, b->pool, 1);
      } else if (b->is_free() && b->is_split()) {
        Totals::add(t.split_bytes, b->pool, static_cast<int64_t>(b->size));
        Totals::add(t.split_count, b->pool, 1);
      }
      end += b->size;
      ++covered;
    }
    check(end == seg.first + seg.second.bytes, "blocks do not tile their segment");
    if (vm != nullptr) check(mapped == vm->mapped, "an expandable segment's mapped bytes differ from its blocks");
  }
  for (auto& kv : pools_) {
    const PrivatePool* p = kv.second.get();
    check(p->segments == segments_.count(p), "a private pool's segment count differs from its segments");
    check(p->live_blocks == pool_live[p], "a private pool's live block count differs from its live blocks");
  }
  check(covered == blocks.size(), "a block lies outside every segment");
  const DeviceStats& s = sink_.stats();
  check_stat(s.allocated_bytes, t.allocated, "allocated_bytes");
  check_stat(s.requested_bytes, t.requested, "requested_bytes");
  check_stat(s.allocation, t.live_count, "allocation");
  check_stat(s.active_bytes, t.active, "active_bytes");
  check_stat(s.active, t.active_count, "active");
  check_stat(s.reserved_bytes, t.reserved, "reserved_bytes");
  check_stat(s.segment, t.segments, "segment");
  check_stat(s.inactive_split_bytes, t.split_bytes, "inactive_split_bytes");
  check_stat(s.inactive_split, t.split_count, "inactive_split");
  const StepWindow& w = sink_.accounting().window();
  check(w.peak_allocated_bytes >= s.allocated_bytes[kStatAll].current, "step window: peak allocated < current");
  check(w.peak_reserved_bytes >= s.reserved_bytes[kStatAll].current, "step window: peak reserved < current");
  if (Subscriber* sub = sink_.subscriber()) sub->validate(held, s.allocated_bytes[kStatAll].current);
}

}  // namespace memalloc
