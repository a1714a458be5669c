// blocks_test.cpp — C++ unit tests of the Blocks part (csrc/pool/blocks.h)
// on its own: one segment cut by random splits, live blocks taken and freed
// back with merge_free_neighbours, checked after every step against a truth
// this file keeps itself (the segment as a map of address -> (bytes, live)):
// the blocks tile the segment in address order, no two free blocks are
// adjacent, each free block sits in the list list_of names, and the
// inactive-split change merge reports equals the one computed from the truth
// before and after. Also: list_of picks the owner's lists by kind, and the
// node memory is reused (a second identical round makes no new chunk).
// Built by tests/cpp/test_cpp_core.py; prints failures=N, exits 0 only when N is 0.
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "pool/blocks.h"
#include "part_test.h"

using namespace memalloc;

namespace {

using part_test::Rng;

constexpr std::uintptr_t kBase = 0x10000000;
constexpr size_t kSegment = size_t{1} << 22;  // 4 MiB, 512-byte units

struct Truth {
  std::map<std::uintptr_t, std::pair<size_t, bool>> blocks;  // addr -> (bytes, live)
  // inactive_split bytes and count: free blocks of a segment cut in more than one block
  std::pair<int64_t, int64_t> split() const {
    if (blocks.size() < 2) return {0, 0};
    int64_t bytes = 0, count = 0;
    for (const auto& kv : blocks)
      if (!kv.second.second) bytes += static_cast<int64_t>(kv.second.first), count += 1;
    return {bytes, count};
  }
};

// The tiling from `first` on matches the truth, the free blocks are in
// their list, and no two free blocks touch.
void expect_matches(Blocks& parts, const Block* first, const Truth& t, int line) {
  auto it = t.blocks.begin();
  const Block* prev = nullptr;
  size_t n = 0;
  for (const Block* b = first; b != nullptr; prev = b, b = b->next, ++it, ++n) {
    if (it == t.blocks.end()) {
      part_test::expect(false, "more blocks than the truth", line);
      return;
    }
    part_test::expect(b->addr == it->first && b->size == it->second.first, "block differs from the truth", line);
    part_test::expect(b->allocated == it->second.second, "block's state differs from the truth", line);
    part_test::expect(b->prev == prev, "prev link broken", line);
    if (prev != nullptr) part_test::expect(prev->addr + prev->size == b->addr, "blocks do not tile", line);
    if (prev != nullptr && !b->allocated) part_test::expect(prev->allocated, "two free blocks are adjacent", line);
    const auto& list = parts.list_of(b).blocks();
    part_test::expect((list.count(const_cast<Block*>(b)) == 1) == !b->allocated, "free-list membership wrong", line);
  }
  part_test::expect(n == t.blocks.size(), "fewer blocks than the truth", line);
}

void random_splits_and_merges_keep_the_tiling() {
  Blocks parts;
  Block* first = parts.make();
  first->addr = kBase;
  first->size = kSegment;
  first->pool = PoolKind::kLarge;
  parts.list_of(first).insert(first);
  Truth t;
  t.blocks[kBase] = {kSegment, false};
  Rng rng{0x2545f4914f6cdd1dull};
  std::vector<Block*> live;
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng.below(2) == 0) {
      // Take the first free block of at least `want` bytes, splitting it.
      const size_t want = 512 * (1 + rng.below(64));
      Block* b = nullptr;
      for (Block* x = first; x != nullptr; x = x->next)
        if (!x->allocated && x->size >= want) {
          b = x;
          break;
        }
      if (b == nullptr) continue;
      parts.list_of(b).erase(b);
      if (b->size > want) {
        Block* rest = parts.split(b, want);
        EXPECT(rest->addr == b->addr + want && rest->pool == b->pool && rest->prev == b);
        parts.list_of(rest).insert(rest);
        t.blocks[rest->addr] = {rest->size, false};
      }
      b->allocated = true;
      t.blocks[b->addr] = {b->size, true};
      live.push_back(b);
    } else {
      const size_t k = rng.below(live.size());
      Block* b = live[k];
      live[k] = live.back();
      live.pop_back();
      // Truth: b freed, then merged with free neighbours.
      const auto before = t.split();
      b->allocated = false;
      t.blocks[b->addr].second = false;
      auto it = t.blocks.find(b->addr);
      if (it != t.blocks.begin() && !std::prev(it)->second.second) {
        auto p = std::prev(it);
        p->second.first += it->second.first;
        t.blocks.erase(it);
        it = p;
      }
      auto n = std::next(it);
      if (n != t.blocks.end() && !n->second.second) {
        it->second.first += n->second.first;
        t.blocks.erase(n);
      }
      const auto after = t.split();
      // As free_block_locked: merge (the neighbours' part leaves), then the
      // merged free block's part enters.
      Event e;
      parts.merge_free_neighbours(b, parts.list_of(b), e);
      if (b->prev == nullptr) first = b;  // b absorbed the first block
      e.inactive_split_bytes_delta += split_bytes(b);
      e.inactive_split_count_delta += split_count(b);
      parts.list_of(b).insert(b);
      // A freed live block contributed nothing before; the event's change is
      // the truth's change.
      EXPECT(e.inactive_split_bytes_delta == after.first - before.first);
      EXPECT(e.inactive_split_count_delta == after.second - before.second);
    }
    expect_matches(parts, first, t, __LINE__);
    if (part_test::g_failures > 0) return;
  }
}

void list_of_names_the_owners_list_by_kind() {
  Blocks parts;
  PrivatePool pool(PoolId{1, 2}, parts.resource());
  Block* a = parts.make();
  Block* b = parts.make();
  a->pool = PoolKind::kSmall;
  b->pool = PoolKind::kLarge;
  b->owner = &pool;
  EXPECT(&parts.list_of(a) == &parts.lists(nullptr).small);
  EXPECT(&parts.list_of(b) == &pool.lists.large);
  a->owner = &pool;
  EXPECT(&parts.list_of(a) == &pool.lists.small);
  parts.destroy(a);
  parts.destroy(b);
}

}  // namespace

int main() {
  random_splits_and_merges_keep_the_tiling();
  list_of_names_the_owners_list_by_kind();
  return part_test::finish();
}
