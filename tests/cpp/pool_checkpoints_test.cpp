// pool_checkpoints_test.cpp — C++ unit tests of the PoolCheckpoints part
// (csrc/allocator/pool_checkpoints.h) on its own, over the real sibling
// parts (Blocks, the live table, SegmentTable, StreamEvents, PrivatePools,
// EventSink) and the host backend's events, no DeviceAllocator: the test
// takes and frees blocks of a private pool's segment as the allocator does
// and keeps its own truth (which pointers are live, their sizes, requested
// bytes and the notes a subscriber gave them). Checked against it:
// live_blocks_are for the exact set, a missing, an extra and a repeated
// pointer, and an unknown pool; checkpoint's layout (tiling the segment in
// address order, allocation flags, requested bytes, notes); restore after
// random takes and frees: what it reports freed and made live, the live
// set, layout and notes afterwards, allocated bytes in the counters, and
// the parts' invariants; a pool with a block waiting on a stream is waited
// for; and a checkpoint of a segment that is no longer the pool's is
// refused with nothing changed.
// Built by tests/cpp/test_cpp_core.py; prints failures=N, exits 0 only when N is 0.
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "allocator/event_sink.h"
#include "allocator/pool_checkpoints.h"
#include "backend/backend.h"
#include "common/config.h"
#include "common/errors.h"
#include "part_test.h"

using namespace memalloc;

namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr std::uintptr_t kBase = std::uintptr_t{1} << 40;  // the segment's address (never touched)
const PoolId kPool{1, 0};

// Gives ids 1, 2, ... and the note 1000 + id; remembers restored notes.
struct Notes final : Subscriber {
  Id next = 0;
  std::map<Id, uint64_t> note_of;
  Id on_live(const Event&, Caller, const DeviceStats&) override {
    ++next;
    note_of[next] = 1000 + next;
    return next;
  }
  Id on_restored(const Event&, Caller, const DeviceStats&, uint64_t note) override {
    ++next;
    note_of[next] = note;
    return next;
  }
  void on_event(const Event&, Caller, const DeviceStats&) noexcept override {}
  uint64_t note(Id id) const noexcept override {
    auto it = note_of.find(id);
    return it == note_of.end() ? 0 : it->second;
  }
  void validate(const std::vector<SubscribedBlock>&, int64_t) const override {}
};

struct Truth {
  size_t size, requested;
  uint64_t note;
};

struct Rig {
  Config config;
  HostBackend backend{config};
  Blocks blocks;
  LiveTable live{blocks.resource()};
  SegmentTable segments{blocks.resource()};
  StreamEvents events{backend, 0, blocks.resource()};
  PrivatePools pools{0, blocks.resource()};
  EventSink sink{static_cast<size_t>(-1)};
  Notes notes;
  uint64_t allocations = 0;
  PrivatePool* pool = nullptr;
  std::map<std::uintptr_t, Truth> truth;  // the live blocks as the test knows them
  int waits = 0;

  explicit Rig(size_t segment = 64 * kMiB) {
    sink.set_subscriber(&notes);
    pool = &pools.create_or_incref(kPool);
    EXPECT(segments.insert(kBase, Segment{segment, pool, nullptr}));
    Block* b = blocks.make();
    b->addr = kBase;
    b->size = segment;
    b->pool = PoolKind::kLarge;
    b->owner = pool;
    Event e = block_event(Action::kSegmentAlloc, *b);
    sink.record(e);
    blocks.list_of(b).insert(b);
  }
  // What DeviceAllocator::alloc_found_locked does with a cached block.
  std::uintptr_t take(size_t size) {
    Block* b = blocks.lists(pool).of(PoolKind::kLarge).best_fit(0, size, static_cast<size_t>(-1));
    if (b == nullptr) return 0;
    Event e = block_event(Action::kAlloc, *b);
    blocks.list_of(b).erase(b);
    e.inactive_split_bytes_delta -= split_bytes(b);
    e.inactive_split_count_delta -= split_count(b);
    if (b->size > size) {
      Block* rest = blocks.split(b, size);
      blocks.list_of(rest).insert(rest);
      e.inactive_split_bytes_delta += split_bytes(rest);
      e.inactive_split_count_delta += split_count(rest);
    }
    b->allocated = true;
    b->requested = size - 7;
    ++allocations;
    live.emplace(b->addr, b);
    pool->live_blocks += 1;
    Event a = block_event(Action::kAlloc, *b);
    a.inactive_split_bytes_delta = e.inactive_split_bytes_delta;
    a.inactive_split_count_delta = e.inactive_split_count_delta;
    b->id = sink.record_alloc(a);
    truth[b->addr] = Truth{b->size, b->requested, notes.note(b->id)};
    return b->addr;
  }
  // A free block back in its list, merged (DeviceAllocator::free_block_locked).
  void to_list(Block* b) {
    FreeList& list = blocks.list_of(b);
    Event e = block_event(Action::kFreeCompleted, *b);
    b->id = 0;
    blocks.merge_free_neighbours(b, list, e);
    b->requested = 0;
    e.inactive_split_bytes_delta += split_bytes(b);
    e.inactive_split_count_delta += split_count(b);
    list.insert(b);
    sink.record(e);
  }
  // What DeviceAllocator::free_live_locked does (no capture is open).
  void free_live(Block* b) {
    live.erase(b->addr);
    truth.erase(b->addr);
    b->allocated = false;
    pool->live_blocks -= 1;
    sink.record(block_event(Action::kFreeRequested, *b));
    if (b->stream_uses.empty()) {
      to_list(b);
    } else {
      events.insert(b);
    }
  }
  PoolCheckpoints part() {
    return PoolCheckpoints(
        blocks, live, segments, events, pools, sink, allocations, [this](Block* b) { free_live(b); },
        [this] {
          ++waits;
          events.synchronize([this](Block* b) { to_list(b); });
        });
  }
  std::vector<void*> live_ptrs() const {
    std::vector<void*> out;
    for (auto& kv : truth) out.push_back(reinterpret_cast<void*>(kv.first));
    return out;
  }
  void expect_sound(int line) {
    part_test::expect(
        static_cast<size_t>(sink.allocated_bytes()) ==
            [&] {
              size_t sum = 0;
              for (auto& kv : truth) sum += kv.second.size;
              return sum;
            }(),
        "allocated bytes in the counters == the live blocks' bytes", line);
    part_test::expect(live.size() == truth.size() && pool->live_blocks == truth.size(),
                      "the live table and the pool's count == the truth's blocks", line);
    for (auto& kv : truth) {
      auto it = live.find(kv.first);
      part_test::expect(it != live.end() && it->second->size == kv.second.size &&
                            it->second->requested == kv.second.requested &&
                            notes.note(it->second->id) == kv.second.note,
                        "a live block as the truth has it (size, requested, note)", line);
    }
    part_test::expect_valid(segments, line);
    part_test::expect_valid(pools, line);
  }
};

// The state's blocks tile its one segment in address order; allocated ones
// are the truth's, with its sizes, requested bytes and notes.
void expect_layout(const PoolState& s, const std::map<std::uintptr_t, Truth>& truth, size_t segment, int line) {
  part_test::expect(s.id == kPool && s.segments.size() == 1, "one segment in the state", line);
  if (s.segments.size() != 1) return;
  const SegmentState& seg = s.segments[0];
  std::uintptr_t at = kBase;
  size_t allocated = 0;
  for (const BlockState& b : seg.blocks) {
    part_test::expect(b.addr == at, "the blocks tile the segment in address order", line);
    at += b.size;
    if (!b.allocated) continue;
    ++allocated;
    auto t = truth.find(b.addr);
    part_test::expect(
        t != truth.end() && t->second.size == b.size && t->second.requested == b.requested && t->second.note == b.note,
        "an allocated block of the state is the truth's", line);
  }
  part_test::expect(seg.addr == kBase && seg.size == segment && at == kBase + segment, "the segment's extent", line);
  part_test::expect(allocated == truth.size(), "the state's allocated blocks are the truth's", line);
}

void live_blocks_are_is_the_exact_set() {
  Rig r;
  for (size_t mb : {1, 3, 2, 5}) EXPECT(r.take(mb * kMiB) != 0);
  std::vector<void*> ptrs = r.live_ptrs();
  EXPECT(r.part().live_blocks_are(kPool, ptrs));
  std::vector<void*> repeated = ptrs;
  repeated.push_back(ptrs[0]);
  EXPECT(r.part().live_blocks_are(kPool, repeated));  // distinct pointers count
  std::vector<void*> missing(ptrs.begin() + 1, ptrs.end());
  EXPECT(!r.part().live_blocks_are(kPool, missing));
  std::vector<void*> extra = missing;
  extra.push_back(reinterpret_cast<void*>(kBase + 63 * kMiB));  // not live
  EXPECT(!r.part().live_blocks_are(kPool, extra));
  EXPECT(!r.part().live_blocks_are(PoolId{9, 9}, ptrs));  // unknown pool
  EXPECT(!r.part().live_blocks_are(kPool, {}));
}

void restore_puts_back_what_the_checkpoint_saw() {
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    part_test::Rng rng(seed * 0x9e3779b97f4a7c15ull);
    Rig r;
    auto churn = [&](int n) {
      for (int i = 0; i < n; ++i) {
        if (!r.truth.empty() && rng.below(3) == 0) {
          auto it = r.truth.begin();
          std::advance(it, static_cast<long>(rng.below(r.truth.size())));
          r.free_live(r.live.at(it->first));
        } else {
          r.take((1 + rng.below(6)) * kMiB);
        }
      }
    };
    churn(12);
    const std::map<std::uintptr_t, Truth> saved = r.truth;
    const PoolState state = r.part().checkpoint(kPool);
    expect_layout(state, saved, 64 * kMiB, __LINE__);
    churn(10);
    std::set<void*> before;
    for (void* p : r.live_ptrs()) before.insert(p);
    const PoolRestore out = r.part().restore(state);
    EXPECT(std::set<void*>(out.freed.begin(), out.freed.end()) == before && out.freed.size() == before.size());
    std::set<std::uintptr_t> made, want;
    for (void* p : out.allocated) made.insert(reinterpret_cast<std::uintptr_t>(p));
    for (auto& kv : saved) want.insert(kv.first);
    EXPECT(made == want && out.allocated.size() == saved.size());
    // The test's truth is the checkpoint's now (the allocator's callers put
    // it back the same way: the restore's blocks are live again).
    r.truth = saved;
    r.expect_sound(__LINE__);
    expect_layout(r.part().checkpoint(kPool), saved, 64 * kMiB, __LINE__);
    EXPECT(r.waits == 0);  // nothing waited on a stream
  }
}

void a_block_waiting_on_a_stream_is_waited_for() {
  Rig r;
  const std::uintptr_t a = r.take(2 * kMiB);
  r.take(3 * kMiB);
  const PoolState state = r.part().checkpoint(kPool);
  Block* b = r.live.at(a);
  b->stream_uses.push_back(5);  // record_stream on another stream
  r.free_live(b);
  EXPECT(r.events.any_waiting([](const Block*) { return true; }));
  r.part().restore(state);
  EXPECT(r.waits == 1 && r.events.idle());
  EXPECT(r.live.count(a) == 1 && r.live.size() == 2);
}

void a_segment_no_longer_the_pools_is_refused_with_nothing_changed() {
  Rig r;
  r.take(4 * kMiB);
  PoolState state = r.part().checkpoint(kPool);
  state.segments[0].size += 2 * kMiB;  // not the segment the pool has
  const std::map<std::uintptr_t, Truth> before = r.truth;
  const uint64_t allocations = r.allocations;
  bool refused = false;
  try {
    r.part().restore(state);
  } catch (const InvalidArgument& e) {
    refused = std::string(e.what()).find("no longer belongs to private pool") != std::string::npos;
  }
  EXPECT(refused);
  EXPECT(r.live.size() == before.size() && r.allocations == allocations);
  r.expect_sound(__LINE__);
  bool unknown = false;
  try {
    r.part().checkpoint(PoolId{9, 9});
  } catch (const InvalidArgument&) {
    unknown = true;
  }
  EXPECT(unknown);
}

}  // namespace

int main() {
  live_blocks_are_is_the_exact_set();
  restore_puts_back_what_the_checkpoint_saw();
  a_block_waiting_on_a_stream_is_waited_for();
  a_segment_no_longer_the_pools_is_refused_with_nothing_changed();
  return part_test::finish();
}
