// expandable_test.cpp — C++ unit tests of the Expandable part
// (csrc/allocator/expandable.h) on its own, over the host backend's virtual
// memory and the real sibling parts (VmArena, SegmentTable, Blocks,
// EventSink, Limits, PrivatePools), no DeviceAllocator: every growth gives
// a free block of at least the bytes asked for, in its free list, inside a
// segment of the table; the counters' reserved bytes equal the bytes the
// Events mapped minus those they unmapped (a truth this file sums from the
// Events a recording subscriber saw); the memory fraction refuses a growth
// past its cap and nothing is mapped then; release() unmaps every free page
// and ends the reservations, and a route (a capture) stops it.
// Built by tests/cpp/test_cpp_core.py; prints failures=N, exits 0 only when N is 0.
#include <cstdint>
#include <string>
#include <vector>

#include "allocator/event_sink.h"
#include "allocator/expandable.h"
#include "backend/backend.h"
#include "common/config.h"
#include "part_test.h"

using namespace memalloc;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

// Sums what the Events mapped and unmapped.
struct Pages final : Subscriber {
  int64_t mapped = 0;
  int maps = 0, unmaps = 0;
  Id on_live(const Event&, Caller, const DeviceStats&) override { return 1; }
  Id on_restored(const Event&, Caller, const DeviceStats&, uint64_t) override { return 1; }
  void on_event(const Event& e, Caller, const DeviceStats&) noexcept override {
    if (e.action == Action::kSegmentMap) mapped += static_cast<int64_t>(e.size), ++maps;
    if (e.action == Action::kSegmentUnmap) mapped -= static_cast<int64_t>(e.size), ++unmaps;
  }
  uint64_t note(Id) const noexcept override { return 0; }
  void validate(const std::vector<SubscribedBlock>&, int64_t) const override {}
};

struct Rig {
  Config config = [] {
    Config c;
    c.host_capacity = 256 * kMiB;
    return c;
  }();
  HostBackend backend{config};
  Blocks blocks;
  SegmentTable segments{blocks.resource()};
  VmArena vm{backend, 0, blocks.resource()};
  PrivatePools pools{0, blocks.resource()};
  EventSink sink{static_cast<size_t>(-1)};
  Limits limits;
  Expandable part{vm, segments, blocks, sink, limits, pools};
  Pages pages;
  uint64_t clock = 0;
  int collections = 0;

  Rig() { sink.set_subscriber(&pages); }
  Block* grow(size_t bytes, bool* no_vm) {
    return part.grow(
        bytes, 0, Expandable::Policy{true, ++clock}, [this] { return config.host_capacity; },
        [this](size_t) { ++collections; }, no_vm);
  }
};

void growth_maps_what_it_reports_and_gives_a_listed_free_block() {
  Rig r;
  std::vector<Block*> taken;
  for (size_t mb : {3, 5, 1, 8, 2}) {
    bool no_vm = true;
    Block* b = r.grow(mb * kMiB, &no_vm);
    EXPECT(!no_vm && b != nullptr);
    if (b == nullptr) return;
    EXPECT(b->is_free() && b->size >= mb * kMiB && b->vm != nullptr);
    EXPECT(r.blocks.list_of(b).blocks().count(b) == 1);
    auto seg = r.segments.containing(b->addr);
    EXPECT(seg != r.segments.end() && seg->second.vm == b->vm);
    // Take it, as the allocator would, so that the next growth needs room.
    r.blocks.list_of(b).erase(b);
    b->allocated = true;
    taken.push_back(b);
    EXPECT(static_cast<int64_t>(r.sink.reserved_bytes()) == r.pages.mapped);
  }
  EXPECT(r.pages.maps >= 5 && r.pages.unmaps == 0);
  // Give them all back free, then release: every page unmapped.
  for (Block* b : taken) {
    b->allocated = false;
    r.blocks.list_of(b).insert(b);
  }
  // Free neighbours are merged by the allocator; release() unmaps free
  // pages of whatever free blocks the lists hold.
  const size_t released = r.part.release();
  EXPECT(released > 0);
  EXPECT(r.pages.mapped == 0 && r.sink.reserved_bytes() == 0);
  EXPECT(r.vm.empty());
}

void the_memory_fraction_refuses_and_maps_nothing() {
  Rig r;
  r.limits.set_fraction(0.05, r.config.host_capacity);  // 12.8 MiB
  bool no_vm = true;
  Block* b = r.grow(8 * kMiB, &no_vm);
  EXPECT(b != nullptr && !no_vm);
  if (b == nullptr) return;
  r.blocks.list_of(b).erase(b);
  b->allocated = true;
  const int64_t before = r.pages.mapped;
  Block* refused = r.grow(8 * kMiB, &no_vm);
  EXPECT(refused == nullptr);
  EXPECT(r.pages.mapped == before && static_cast<int64_t>(r.sink.reserved_bytes()) == before);
  EXPECT(r.sink.reserved_bytes() <= r.limits.cap());
  // The threshold policy (the allocator's) is asked before every growth
  // into existing reservations: once here, the first growth had none.
  EXPECT(r.collections == 1);
}

void a_route_stops_release() {
  Rig r;
  bool no_vm = true;
  Block* b = r.grow(4 * kMiB, &no_vm);
  EXPECT(b != nullptr);
  r.pools.begin_route(PoolId{0, 1}, [](Stream) { return true; });
  const int64_t before = r.pages.mapped;
  EXPECT(r.part.release() == 0 && r.pages.mapped == before);
  r.pools.end_route(PoolId{0, 1});
  EXPECT(r.part.release() > 0 && r.pages.mapped == 0);
}

}  // namespace

int main() {
  growth_maps_what_it_reports_and_gives_a_listed_free_block();
  the_memory_fraction_refuses_and_maps_nothing();
  a_route_stops_release();
  return part_test::finish();
}
