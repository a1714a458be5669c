// segment_table_test.cpp — C++ unit tests of the SegmentTable part
// (csrc/pool/segment_table.h) on its own: segments made by hand (no
// backend), pools made by hand, and the part's invariants checked after
// every step; every expected answer is computed by the test from the ranges
// it inserted. Built by tests/cpp/test_cpp_core.py.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory_resource>
#include <string>
#include <utility>
#include <vector>

#include "pool/node_cache.h"
#include "pool/segment_table.h"
#include "part_test.h"

using namespace memalloc;

namespace {
using part_test::problems;

struct Range {
  std::uintptr_t addr;
  size_t bytes;
};

// The start of the range in `ranges` holding `a`, or 0: the truth that
// containing() must match.
std::uintptr_t holder(const std::vector<Range>& ranges, std::uintptr_t a) {
  for (const Range& r : ranges)
    if (a >= r.addr && a < r.addr + r.bytes) return r.addr;
  return 0;
}

struct Fixture {
  NodeCache mr;
  SegmentTable table{&mr};
  PrivatePool a{PoolId{1, 0}, &mr};
  PrivatePool b{PoolId{0, 2}, &mr};
};

void lookups_find_starts_and_interior_addresses() {
  Fixture f;
  const std::vector<Range> ranges = {{0x10000, 0x2000}, {0x12000, 0x200}, {0x20000, 0x100000}, {0x200000, 512}};
  for (const Range& r : ranges) EXPECT(f.table.insert(r.addr, Segment{r.bytes, nullptr, nullptr}));
  EXPECT(f.table.size() == ranges.size());
  VALID(f.table);
  // Every start, first interior, last byte, one past the end, and gaps.
  std::vector<std::uintptr_t> probes = {0, 0xffff, 0x1ffff, 0x120000, 0x1fffff, 0x200200, UINTPTR_MAX};
  for (const Range& r : ranges)
    for (std::uintptr_t a : {r.addr, r.addr + 1, r.addr + r.bytes / 2, r.addr + r.bytes - 1, r.addr + r.bytes})
      probes.push_back(a);
  for (std::uintptr_t a : probes) {
    const std::uintptr_t want = holder(ranges, a);
    auto it = f.table.containing(a);
    EXPECT((it == f.table.end()) == (want == 0));
    if (it != f.table.end()) EXPECT(it->first == want);
    // find() answers only a segment's start.
    const bool starts = std::any_of(ranges.begin(), ranges.end(), [&](const Range& r) { return r.addr == a; });
    EXPECT((f.table.find(a) != f.table.end()) == starts);
  }
  auto it = f.table.find(0x20000);
  EXPECT(it != f.table.end() && it->second.bytes == 0x100000 && it->second.owner == nullptr);
}

void overlapping_and_empty_segments_are_refused() {
  Fixture f;
  EXPECT(f.table.insert(0x10000, Segment{0x1000, &f.a, nullptr}));
  EXPECT(f.a.segments == 1);
  // Same start, starting inside, reaching into, spanning it, size 0.
  const std::vector<Range> refused = {{0x10000, 0x1000}, {0x10000, 16},     {0x10fff, 0x10},
                                      {0xf000, 0x1001},  {0x8000, 0x10000}, {0x20000, 0}};
  for (const Range& r : refused) {
    EXPECT(!f.table.insert(r.addr, Segment{r.bytes, &f.b, nullptr}));
    EXPECT(f.table.size() == 1 && f.b.segments == 0);  // nothing changed
  }
  // Touching on either side is not overlapping.
  EXPECT(f.table.insert(0xf000, Segment{0x1000, &f.b, nullptr}));
  EXPECT(f.table.insert(0x11000, Segment{0x1000, nullptr, nullptr}));
  EXPECT(f.table.size() == 3 && f.b.segments == 1);
  // A range that wraps around the address space is refused too.
  EXPECT(!f.table.insert(UINTPTR_MAX - 0xff, Segment{0x200, nullptr, nullptr}));
  VALID(f.table);
}

void erase_uncounts_and_iteration_is_in_address_order() {
  Fixture f;
  const std::vector<std::pair<std::uintptr_t, PrivatePool*>> segs = {
      {0x50000, &f.a}, {0x10000, &f.b}, {0x30000, &f.a}, {0x70000, nullptr}, {0x20000, &f.a}};
  for (auto& s : segs) EXPECT(f.table.insert(s.first, Segment{0x1000, s.second, nullptr}));
  EXPECT(f.a.segments == 3 && f.b.segments == 1);
  EXPECT(f.table.count(&f.a) == 3 && f.table.count(&f.b) == 1 && f.table.count(nullptr) == 1);
  std::vector<std::uintptr_t> order;
  for (auto& kv : f.table) order.push_back(kv.first);
  EXPECT((order == std::vector<std::uintptr_t>{0x10000, 0x20000, 0x30000, 0x50000, 0x70000}));
  VALID(f.table);
  EXPECT(!f.table.erase(0x30001));  // not a start: nothing changed
  EXPECT(f.a.segments == 3 && f.table.size() == 5);
  EXPECT(f.table.erase(0x30000));
  EXPECT(!f.table.erase(0x30000));
  EXPECT(f.a.segments == 2 && f.table.count(&f.a) == 2 && f.table.size() == 4);
  EXPECT(f.table.containing(0x30800) == f.table.end());
  // The freed range can be taken again, by another owner.
  EXPECT(f.table.insert(0x30000, Segment{0x800, &f.b, nullptr}));
  EXPECT(f.b.segments == 2 && f.table.containing(0x307ff)->first == 0x30000);
  EXPECT(f.table.containing(0x30800) == f.table.end());
  VALID(f.table);
  for (auto& s : segs) f.table.erase(s.first);
  EXPECT(f.table.empty() && f.a.segments == 0 && f.b.segments == 0);
  VALID(f.table);
}

void validate_reports_a_broken_owner_count_and_expandable_owner() {
  Fixture f;
  EXPECT(f.table.insert(0x10000, Segment{0x1000, &f.a, nullptr}));
  f.a.segments = 2;  // broken by hand
  std::vector<std::string> p = problems(f.table);
  EXPECT(p.size() == 1 && p[0] == "a private pool's segment count differs from its segments");
  f.a.segments = 1;
  VALID(f.table);
  VmSegment vm(0x100000, 0x100000, 0x100000, 0, PoolKind::kLarge, &f.mr);
  EXPECT(f.table.insert(vm.base, Segment{vm.size, &f.b, &vm}));  // a pool's expandable segment: refused by validate
  p = problems(f.table);
  EXPECT(p.size() == 1 && p[0] == "a private pool has an expandable segment");
  EXPECT(f.table.erase(vm.base));
  EXPECT(f.table.insert(vm.base, Segment{vm.size, nullptr, &vm}));
  EXPECT(f.table.containing(vm.base + vm.size - 1)->second.vm == &vm);
  VALID(f.table);
}

// Inserting and erasing after a warm-up takes no memory beyond the node
// cache's: the map's nodes come from the resource given.
struct CountingResource : std::pmr::memory_resource {
  size_t allocations = 0;
  void* do_allocate(size_t bytes, size_t align) override {
    ++allocations;
    return std::pmr::new_delete_resource()->allocate(bytes, align);
  }
  void do_deallocate(void* p, size_t bytes, size_t align) override {
    std::pmr::new_delete_resource()->deallocate(p, bytes, align);
  }
  bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override { return this == &o; }
};

void nodes_come_from_the_resource_given() {
  CountingResource counting;
  {
    SegmentTable t(&counting);
    for (std::uintptr_t i = 1; i <= 4; ++i) EXPECT(t.insert(i * 0x1000, Segment{0x1000, nullptr, nullptr}));
    EXPECT(counting.allocations == 4);  // one node each, from this resource
    EXPECT(!t.insert(0x1000, Segment{0x1000, nullptr, nullptr}));
    EXPECT(counting.allocations == 4);  // a refused insert allocates nothing
    (void)t.containing(0x2800);
    (void)t.find(0x3000);
    EXPECT(counting.allocations == 4);  // lookups allocate nothing
  }
}
}  // namespace

int main() {
  lookups_find_starts_and_interior_addresses();
  overlapping_and_empty_segments_are_refused();
  erase_uncounts_and_iteration_is_in_address_order();
  validate_reports_a_broken_owner_count_and_expandable_owner();
  nodes_come_from_the_resource_given();
  return part_test::finish();
}
