// vm_arena_test.cpp — C++ unit tests of the VmArena part (csrc/pool/vm_arena.h)
// on its own: the host backend's virtual memory (2 MiB pages, mapped bytes
// counted in mem_get_info, streams whose work completes only when
// synchronised), blocks made and split by hand (the test's own block
// operations, as DeviceAllocator's), and the part's invariants checked after
// every step. Expected rooms and runs are page arithmetic done here.
// Built by tests/cpp/test_cpp_core.py.
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/config.h"
#include "pool/vm_arena.h"
#include "part_test.h"

using namespace memalloc;

namespace {
using part_test::expect;

constexpr size_t MiB = size_t{1} << 20;
constexpr size_t kCapacity = 64 * MiB;

// A backend without virtual memory: Backend's own vm_* (DriverError), and a
// count of how often it was asked.
struct NoVmBackend : HostBackend {
  using HostBackend::HostBackend;
  int asked = 0;
  size_t vm_page_size(int device) override {
    ++asked;
    return Backend::vm_page_size(device);
  }
  void* vm_reserve(int device, size_t bytes, size_t page) override {
    ++asked;
    return Backend::vm_reserve(device, bytes, page);
  }
};

template <class B = HostBackend>
struct Fixture {
  explicit Fixture(const char* conf = "host_capacity_mb:64") : config(parse_config(conf)) {}
  Config config;
  B backend{config};
  std::pmr::unsynchronized_pool_resource mr;
  std::vector<std::unique_ptr<Block>> blocks;  // every block made; absorbed ones stay here, unlinked
  int absorbed = 0;
  VmArena arena{backend, 0, &mr};  // last: destroyed first, while the blocks and backend live
  size_t page = 0;

  void validate() {
    arena.validate([](bool ok, const char* what) { expect(ok, what, __LINE__); });
  }
  size_t device_free() { return backend.mem_get_info(0).free; }

  auto make() {
    return [this] {
      blocks.push_back(std::make_unique<Block>(&mr));
      return blocks.back().get();
    };
  }
  // DeviceAllocator's split_block_locked and absorb_locked, over the
  // test's blocks (an absorbed block is only counted).
  auto split() {
    return [this](Block* b, size_t offset) { return split_block(b, offset, make()()); };
  }
  auto absorb() {
    return [this](Block* b, Block* n) {
      absorb_block(b, n);
      ++absorbed;
    };
  }
  // page 0: the granularity (2 MiB on the host backend)
  VmSegment* reserve(Stream stream, PoolKind pool = PoolKind::kLarge, size_t capacity = kCapacity, size_t pg = 0) {
    VmSegment* seg = arena.reserve(stream, pool, pg != 0 ? pg : 2 * MiB, [capacity] { return capacity; }, make());
    if (seg != nullptr) page = seg->page;
    return seg;
  }
  // Maps the room for `rounded` in seg (a room that needs pages).
  Block* map(VmSegment& seg, size_t rounded, int* runs = nullptr) {
    VmRoom room = arena.find_room(seg, rounded);
    int r = 0;
    Block* m = room.hole != nullptr && room.bytes > 0 ? arena.map(seg, room, split(), &r) : nullptr;
    if (runs != nullptr) *runs = r;
    return m;
  }
  // The caller's side of an unmap: out of the free list, unmapped, pieces back.
  auto unmap_in(FreeList& list, std::vector<std::pair<std::uintptr_t, std::uintptr_t>>* done,
                Unmapping how = Unmapping::kRelease) {
    return [this, &list, done, how](Block* f, std::uintptr_t lo, std::uintptr_t hi) {
      done->emplace_back(lo, hi);
      list.erase(f);
      VmUnmapped u = arena.unmap(f, lo, hi, how, split(), absorb());
      for (Block* piece : {u.below, u.above})
        if (piece != nullptr) list.insert(piece);
    };
  }
};

void a_reservation_is_whole_pages_spanned_by_one_hole() {
  Fixture<> f;
  EXPECT(f.arena.empty() && !f.arena.unavailable());
  VmSegment* seg = f.reserve(7, PoolKind::kLarge, 5 * MiB + 1);  // rounds up to 3 pages
  EXPECT(seg != nullptr && f.page == 2 * MiB);
  if (seg == nullptr) return;
  EXPECT(seg->size == 6 * MiB && seg->base % f.page == 0 && seg->mapped == 0);
  EXPECT(seg->stream == 7 && seg->pool == PoolKind::kLarge && seg->unmapped.size() == 1);
  const Block* hole = *seg->unmapped.begin();
  EXPECT(hole->addr == seg->base && hole->size == seg->size && !hole->mapped && hole->vm == seg);
  EXPECT(f.device_free() == kCapacity);  // address space only
  EXPECT(!f.arena.empty() && f.arena.streams() == std::vector<Stream>{7});
  f.validate();
}

void rooms_follow_the_page_arithmetic() {
  Fixture<> f;
  VmSegment* seg = f.reserve(1);
  if (seg == nullptr) return EXPECT(false);
  // A fresh segment: from its start, 3 MiB rounds up to 2 pages.
  VmRoom room = f.arena.find_room(*seg, 3 * MiB);
  EXPECT(room.hole == *seg->unmapped.begin() && room.lo == seg->base && room.bytes == 2 * f.page);
  int runs = 0;
  Block* m = f.arena.map(*seg, room, f.split(), &runs);
  EXPECT(m != nullptr && m->addr == seg->base && m->size == 4 * MiB && m->mapped && runs == 1);
  if (m == nullptr) return;
  EXPECT(seg->mapped == 4 * MiB && f.device_free() == kCapacity - 4 * MiB);
  EXPECT(seg->unmapped.size() == 1 && (*seg->unmapped.begin())->addr == seg->base + 4 * MiB);
  f.validate();
  // m free (4 MiB): 5 MiB grows it by one page after it; 3 MiB fits in m as it is.
  room = f.arena.find_room(*seg, 5 * MiB);
  EXPECT(room.lo == seg->base + 4 * MiB && room.bytes == f.page && room.fit == nullptr);
  room = f.arena.find_room(*seg, 3 * MiB);
  EXPECT(room.bytes == 0 && room.fit == m);
  // m live: 5 MiB needs 3 pages of its own.
  m->allocated = true;
  room = f.arena.find_room(*seg, 5 * MiB);
  EXPECT(room.lo == seg->base + 4 * MiB && room.bytes == 3 * f.page);
  Block* n = f.arena.map(*seg, room, f.split(), &runs);
  EXPECT(n != nullptr && n->prev == m && runs == 0);  // extends m's run
  EXPECT(seg->mapped == 10 * MiB && f.device_free() == kCapacity - 10 * MiB);
  f.validate();
  // Larger than the reservation: no room.
  EXPECT(f.arena.find_room(*seg, kCapacity).hole == nullptr);
}

void a_hole_between_free_blocks_is_mapped_whole() {
  Fixture<> f;
  VmSegment* seg = f.reserve(1);
  if (seg == nullptr) return EXPECT(false);
  Block* a = f.map(*seg, 2 * MiB);  // [0, 1p)
  EXPECT(a != nullptr);
  if (a == nullptr) return;
  a->allocated = true;              // live blocks, so that the next room is not a free neighbour
  Block* b = f.map(*seg, 6 * MiB);  // [1p, 4p)
  if (b == nullptr) return EXPECT(false);
  b->allocated = true;
  Block* c = f.map(*seg, 2 * MiB);  // [4p, 5p), stays live
  EXPECT(c != nullptr && c->addr == seg->base + 4 * f.page);
  if (c == nullptr) return;
  c->allocated = true;
  b->allocated = false;
  // Unmap b's middle page: a one-page hole between two free one-page blocks.
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> done;
  FreeList list(&f.mr);
  list.insert(b);
  f.unmap_in(list, &done)(b, seg->base + 2 * f.page, seg->base + 3 * f.page);
  EXPECT(seg->unmapped.size() == 2 && seg->mapped == 4 * f.page);
  f.validate();
  // 5 MiB: neither neighbour (2 MiB each) nor one side plus the hole (4 MiB)
  // is enough; the whole hole joining both (6 MiB) is.
  VmRoom room = f.arena.find_room(*seg, 5 * MiB);
  EXPECT(room.lo == seg->base + 2 * f.page && room.bytes == f.page);
  int runs = 0;
  Block* m = f.arena.map(*seg, room, f.split(), &runs);
  EXPECT(m != nullptr && runs == -1);  // two runs become one
  EXPECT(seg->unmapped.size() == 1 && seg->mapped == 5 * f.page);
  f.validate();
}

void unmapping_splits_and_coalesces() {
  Fixture<> f;
  VmSegment* seg = f.reserve(1);
  if (seg == nullptr) return EXPECT(false);
  Block* b = f.map(*seg, 8 * MiB);  // 4 pages from the start
  if (b == nullptr) return EXPECT(false);
  const std::uintptr_t base = seg->base;
  const size_t p = f.page;
  VmUnmapped u = f.arena.unmap(b, base + p, base + 3 * p, Unmapping::kRelease, f.split(), f.absorb());
  EXPECT(u.below == b && b->addr == base && b->size == p && b->mapped);
  EXPECT(u.hole != nullptr && u.hole->addr == base + p && u.hole->size == 2 * p && !u.hole->mapped);
  EXPECT(u.above != nullptr && u.above->addr == base + 3 * p && u.above->size == p && u.above->mapped);
  EXPECT(u.runs_delta == 1);  // one run became two
  EXPECT(seg->mapped == 2 * p && f.device_free() == kCapacity - 2 * p && seg->unmapped.size() == 2);
  f.validate();
  // Unmapping the top piece whole joins both holes around it into one.
  Block* top = u.above;
  u = f.arena.unmap(top, top->addr, top->addr + top->size, Unmapping::kRelease, f.split(), f.absorb());
  EXPECT(u.below == nullptr && u.above == nullptr && u.hole == top && u.runs_delta == -1);
  EXPECT(f.absorbed == 2 && seg->unmapped.size() == 1 && top->addr == base + p && top->size == seg->size - p);
  EXPECT(seg->mapped == p && f.device_free() == kCapacity - p);
  f.validate();
}

void free_pages_go_largest_run_first_after_a_synchronisation() {
  Fixture<> f;
  VmSegment* seg = f.reserve(1);
  if (seg == nullptr) return EXPECT(false);
  const size_t p = f.page;
  const std::uintptr_t base = seg->base;
  // Each mapped while the ones before are live (else the next room would
  // be a free neighbour), then freed as the test needs.
  std::vector<Block*> made;
  for (size_t bytes : {8 * MiB, 2 * MiB, 2 * MiB, 4 * MiB}) {
    Block* b = f.map(*seg, bytes);
    if (b == nullptr) return EXPECT(false);
    b->allocated = true;
    made.push_back(b);
  }
  Block* low = made[0];   // [0, 4p)
  Block* keep = made[1];  // [4p, 5p)
  Block* live = made[2];  // [5p, 6p)
  Block* high = made[3];  // [6p, 8p)
  EXPECT(keep->addr == base + 4 * p && live->addr == base + 5 * p && high->addr == base + 6 * p);
  keep->allocated = high->allocated = false;
  // low's first half page is live: its whole free pages are [1p, 4p).
  Block* free_low = f.split()(low, MiB);
  free_low->allocated = false;
  FreeList list(&f.mr), other(&f.mr);
  list.insert(free_low);
  list.insert(keep);
  list.insert(high);
  EventHandle ev = f.backend.create_event(0);
  f.backend.record_event(0, ev, 1);  // work queued on the segment's stream
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> done;
  // Nothing free on stream 2: no synchronisation, nothing unmapped.
  EXPECT(f.arena.unmap_free_pages({&list, &other}, 2, SIZE_MAX, nullptr, nullptr, Unmapping::kRelease,
                                  f.unmap_in(list, &done)) == 0);
  EXPECT(!f.backend.query_event(0, ev) && done.empty());
  // 3 pages wanted, never from keep: the 3-page run of free_low whole (the
  // largest first), before high's 2 pages.
  size_t got =
      f.arena.unmap_free_pages({&list, &other}, 1, 3 * p, keep, nullptr, Unmapping::kRelease, f.unmap_in(list, &done));
  EXPECT(got == 3 * p && f.backend.query_event(0, ev));  // synchronised first
  EXPECT(done.size() == 1 && done[0].first == base + p && done[0].second == base + 4 * p);
  EXPECT(free_low->size == MiB && free_low->mapped && seg->mapped == 5 * p);
  f.validate();
  // One byte more: one page, the top page of the largest run left (high).
  done.clear();
  got = f.arena.unmap_free_pages({&list, &other}, 1, 1, keep, nullptr, Unmapping::kRelease, f.unmap_in(list, &done));
  EXPECT(got == p && done.size() == 1 && done[0].first == base + 7 * p && done[0].second == base + 8 * p);
  EXPECT(high->addr == base + 6 * p && high->size == p && high->mapped);
  // Everything: high's last page and keep's (keep no longer kept); free_low has no whole page.
  done.clear();
  got = f.arena.unmap_free_pages({&list, &other}, 1, SIZE_MAX, nullptr, nullptr, Unmapping::kRelease,
                                 f.unmap_in(list, &done));
  EXPECT(got == 2 * p && done.size() == 2 && done[0].first == base + 4 * p && done[1].first == base + 6 * p);
  EXPECT(seg->mapped == 2 * p && f.device_free() == kCapacity - 2 * p);
  EXPECT(f.arena.unmap_free_pages({&list}, 1, 0, nullptr, nullptr, Unmapping::kRelease, f.unmap_in(list, &done)) == 0);
  f.validate();
  f.backend.destroy_event(0, ev);
}

// A page move (Unmapping::kKeep): free pages unmapped without waiting for
// their stream, their device memory kept as the backend's spare pages; the
// next mapping of the same page size takes them (no page created, no
// memory obtained), and drop_spares() gives back the ones left.
void pages_kept_by_a_move_are_mapped_again_without_a_synchronisation() {
  Fixture<> f;
  VmSegment* seg = f.reserve(1);
  if (seg == nullptr) return EXPECT(false);
  const size_t p = f.page;
  Block* low = f.map(*seg, 4 * p);  // [0, 4p), freed below
  if (low == nullptr) return EXPECT(false);
  low->allocated = true;
  Block* live = f.map(*seg, p);  // [4p, 5p), live
  if (live == nullptr) return EXPECT(false);
  live->allocated = true;
  low->allocated = false;
  FreeList list(&f.mr);
  list.insert(low);
  EventHandle ev = f.backend.create_event(0);
  f.backend.record_event(0, ev, 1);  // work queued on the segment's stream, which may still use low
  const auto before = f.backend.vm_calls(0);
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> done;
  const size_t got = f.arena.unmap_free_pages({&list}, 1, 3 * p, nullptr, nullptr, Unmapping::kKeep,
                                              f.unmap_in(list, &done, Unmapping::kKeep));
  EXPECT(got == 3 * p && done.size() == 1 && done[0].first == seg->base + p && done[0].second == seg->base + 4 * p);
  EXPECT(!f.backend.query_event(0, ev));  // no synchronisation
  const auto moved = f.backend.vm_calls(0);
  EXPECT(moved.stream_syncs == before.stream_syncs && moved.unmap == before.unmap + 1 &&
         moved.release == before.release);
  EXPECT(seg->mapped == 2 * p && f.device_free() == kCapacity - 5 * p);  // unmapped, its memory kept
  f.validate();
  // Two pages (low's first page live again): the lowest room, both pages
  // from the spare pages.
  low->allocated = true;
  Block* up = f.map(*seg, 2 * p);
  if (up == nullptr) return EXPECT(false);
  const auto mapped = f.backend.vm_calls(0);
  EXPECT(up->addr == seg->base + p && seg->mapped == 4 * p && f.device_free() == kCapacity - 5 * p);
  EXPECT(mapped.create == moved.create && mapped.map == moved.map + 2 && mapped.set_access == moved.set_access + 1);
  // The room lies in the moved range, whose stream's work is still queued:
  // the backend waits for it (CUDA: the range's pending unmap first).
  EXPECT(mapped.waits == moved.waits + 1 && f.backend.query_event(0, ev));
  // Two more (above live: [3p, 4p) is one page): one spare page left, one created.
  up->allocated = true;
  Block* more = f.map(*seg, 2 * p);
  if (more == nullptr) return EXPECT(false);
  const auto grown = f.backend.vm_calls(0);
  EXPECT(more->addr == seg->base + 5 * p && grown.create == mapped.create + 1 && grown.map == mapped.map + 2);
  EXPECT(f.device_free() == kCapacity - 6 * p);
  // Dropping with none left changes nothing; a spare left is given back.
  f.arena.drop_spares();
  EXPECT(f.device_free() == kCapacity - 6 * p && f.backend.vm_calls(0).release == grown.release);
  more->allocated = true;
  low->allocated = false;
  list.erase(low);
  f.arena.unmap(low, low->addr, low->addr + p, Unmapping::kKeep, f.split(), f.absorb());
  EXPECT(f.device_free() == kCapacity - 6 * p);
  f.arena.drop_spares();
  EXPECT(f.device_free() == kCapacity - 5 * p && f.backend.vm_calls(0).release == grown.release + 1);
  EXPECT(f.backend.vm_calls(0).stream_syncs == before.stream_syncs);
  f.validate();
  f.backend.destroy_event(0, ev);
}

void the_reuse_ceiling_follows_the_high_water_mark() {
  Fixture<> f;
  const size_t d = VmArena::kReuseSlackDivisor;
  // 20 MiB allocated at most: ceiling 21 MiB (20 + 20 / d).
  EXPECT(f.arena.over_ceiling(0, 0, 20 * MiB, 20 * MiB, 0, 2 * MiB) == 0 && f.arena.allocated_hwm() == 20 * MiB);
  const size_t ceiling = 20 * MiB + 20 * MiB / d;
  EXPECT(f.arena.over_ceiling(0, 20 * MiB, 4 * MiB, 4 * MiB, 1, 2 * MiB) == 24 * MiB - ceiling);
  EXPECT(f.arena.allocated_hwm() == 20 * MiB);                             // 0 + 4 MiB is below it: unchanged
  EXPECT(f.arena.over_ceiling(0, 20 * MiB, 4 * MiB, 0, 2, 2 * MiB) == 0);  // no pages to map
  EXPECT(f.arena.over_ceiling(0, 40 * MiB, 2 * MiB, 2 * MiB, 3, 2 * MiB) ==
         2 * MiB);  // all of it above: capped at the room
  // A larger peak raises the ceiling: 40 + 2 MiB allocated.
  EXPECT(f.arena.over_ceiling(40 * MiB, 40 * MiB, 2 * MiB, 2 * MiB, 4, 2 * MiB) == 0 &&
         f.arena.allocated_hwm() == 42 * MiB);
  EXPECT(f.arena.slack_divisor() == d);  // no request went over twice
}

// Above 10 GiB allocated the slack is capped: the ceiling is the high-water
// mark plus kReuseSlackCap (512 MiB), not plus 5%; below it, 5% as before.
// A loop found doubles the cap as it halves the divisor.
void the_reuse_ceiling_is_capped_for_large_pools() {
  Fixture<> f;
  const size_t d = VmArena::kReuseSlackDivisor, cap = VmArena::kReuseSlackCap, GiB = size_t{1} << 30;
  EXPECT(cap == 512 * MiB && f.arena.slack_cap() == cap);
  // 8 GiB allocated at most: 5% (409.6 MiB) is under the cap
  EXPECT(f.arena.over_ceiling(0, 0, 8 * GiB, 0, 0, 20 * MiB) == 0);
  EXPECT(f.arena.over_ceiling(0, 8 * GiB, 20 * MiB, 500 * MiB, 1, 20 * MiB) ==
         8 * GiB + 500 * MiB - (8 * GiB + 8 * GiB / d));
  // 40 GiB: 5% would be 2 GiB; the ceiling is 40.5 GiB
  const size_t hwm = 40 * GiB, allocated = 36 * GiB, rounded = 2 * GiB;
  EXPECT(f.arena.over_ceiling(hwm - rounded, 0, rounded, 0, 2, 20 * MiB) == 0 && f.arena.allocated_hwm() == hwm);
  EXPECT(f.arena.over_ceiling(allocated, hwm, rounded, 500 * MiB, 3, 20 * MiB) == 0);  // 40 GiB + 500 MiB: under
  EXPECT(f.arena.over_ceiling(allocated, hwm, rounded, 600 * MiB, 4, 20 * MiB) == 600 * MiB - cap);
  // the same request over it three times, evenly spaced: a loop; twice the slack, up to 1 GiB
  EXPECT(f.arena.over_ceiling(allocated, hwm, rounded, 600 * MiB, 1004, 20 * MiB) == 600 * MiB - cap);
  EXPECT(f.arena.over_ceiling(allocated, hwm, rounded, 600 * MiB, 2004, 20 * MiB) == 0);
  EXPECT(f.arena.slack_divisor() == d / 2 && f.arena.slack_cap() == 2 * cap);
  EXPECT(f.arena.over_ceiling(allocated, hwm, rounded, 1100 * MiB, 3004, 20 * MiB) == 1100 * MiB - 2 * cap);
}

// A loop that would give pages back at every step: the same request (size,
// allocated bytes, high-water mark) over the ceiling three times, evenly
// spaced, doubles the slack on its third time; gaps that share no period
// (1000 and 1499 allocations), or another allocated figure (a layer of a
// backward, say), do not.
void a_loop_giving_pages_back_every_step_doubles_the_slack() {
  Fixture<> f;
  const size_t d = VmArena::kReuseSlackDivisor;
  const size_t hwm = 100 * MiB, allocated = 60 * MiB, reserved = 104 * MiB, rounded = 40 * MiB;
  EXPECT(f.arena.over_ceiling(hwm - rounded, 0, rounded, 0, 0, 2 * MiB) == 0 && f.arena.allocated_hwm() == hwm);
  // 104 + 8 MiB of room over a ceiling of 105 MiB: 7 MiB over, at allocations 1000 and 2000
  const size_t over = reserved + 8 * MiB - (hwm + hwm / d);
  EXPECT(f.arena.over_ceiling(allocated, reserved, rounded, 8 * MiB, 1000, 2 * MiB) == over);
  EXPECT(f.arena.over_ceiling(allocated, reserved, rounded, 8 * MiB, 2000, 2 * MiB) == over);
  EXPECT(f.arena.over_ceiling(allocated, reserved, rounded, 8 * MiB, 2000, 2 * MiB) ==
         over);  // a retry: not a third time
  // a request's first time and its retry (no spacing yet) are not a loop either
  EXPECT(f.arena.over_ceiling(allocated, reserved, rounded - 1024, 8 * MiB, 2100, 2 * MiB) == over);
  EXPECT(f.arena.over_ceiling(allocated, reserved, rounded - 1024, 8 * MiB, 2100, 2 * MiB) == over);
  EXPECT(f.arena.slack_divisor() == d);
  // other requests in between change nothing: another allocated figure, another size
  EXPECT(f.arena.over_ceiling(allocated - 8 * MiB, reserved, rounded, 8 * MiB, 2500, 2 * MiB) == over);
  EXPECT(f.arena.over_ceiling(allocated, reserved, rounded - 512, 8 * MiB, 2600, 2 * MiB) == over);
  // uneven: 1499 after, not 1000 (no common period); then 1499 again: a loop, the slack doubles
  EXPECT(f.arena.over_ceiling(allocated, reserved, rounded, 8 * MiB, 3499, 2 * MiB) == over &&
         f.arena.slack_divisor() == d);
  EXPECT(f.arena.over_ceiling(allocated, reserved, rounded, 8 * MiB, 4998, 2 * MiB) ==
         reserved + 8 * MiB - (hwm + hwm / (d / 2)));
  EXPECT(f.arena.slack_divisor() == d / 2);
  // under the wider ceiling (110 MiB) 6 MiB of room maps without giving any back
  EXPECT(f.arena.over_ceiling(allocated, reserved, rounded, 6 * MiB, 6000, 2 * MiB) == 0);
}

// A loop whose request goes over the ceiling at the same point of its step,
// but only every few steps (the pages lie otherwise from step to step): the
// gaps 5 and 3 steps of 1208 allocations share the period; 9 periods are too
// many to call one loop.
void a_loop_going_over_every_few_steps_is_a_loop() {
  const size_t d = VmArena::kReuseSlackDivisor;
  const size_t hwm = 100 * MiB, allocated = 60 * MiB, reserved = 104 * MiB, rounded = 40 * MiB;
  const auto times = [&](std::initializer_list<uint64_t> steps) {
    Fixture<> f;
    EXPECT(f.arena.over_ceiling(hwm - rounded, 0, rounded, 0, 0, 2 * MiB) == 0);
    for (uint64_t s : steps) f.arena.over_ceiling(allocated, reserved, rounded, 8 * MiB, 1208 * s + 7, 2 * MiB);
    return f.arena.slack_divisor();
  };
  EXPECT(times({1, 6}) == d);                  // twice: not yet
  EXPECT(times({1, 6, 9}) == d / 2);           // gaps of 5 and 3 steps
  EXPECT(times({1, 2, 10}) == d / 2);          // 1 and 8
  EXPECT(times({1, 2, 11}) == d);              // 1 and 9: too far apart
  EXPECT(times({1, 2, 11, 12}) == d);          // 9 then 1: still too far apart
  EXPECT(times({1, 2, 11, 12, 13}) == d / 2);  // then 1 and 1
}

// A loop that keeps a small tensor every step (512 B more allocated, and a
// high-water mark 512 B higher, each time) is still found.
void a_loop_keeping_a_little_more_each_step_is_still_a_loop() {
  Fixture<> f;
  const size_t d = VmArena::kReuseSlackDivisor;
  const size_t hwm = 100 * MiB, allocated = 60 * MiB, rounded = 40 * MiB;
  EXPECT(f.arena.over_ceiling(hwm - rounded, 0, rounded, 0, 0, 2 * MiB) == 0);
  for (size_t k = 1; k <= 3; ++k) {
    const size_t more = k * 512;  // allocated + rounded = hwm + more: the mark follows
    EXPECT(f.arena.over_ceiling(allocated + more, 104 * MiB, rounded, 8 * MiB, 1000 * k, 2 * MiB) > 0);
    EXPECT(f.arena.allocated_hwm() == hwm + more);
  }
  EXPECT(f.arena.slack_divisor() == d / 2);
}

void rooms_are_searched_per_stream_and_pool() {
  Fixture<> f;
  VmSegment* a = f.reserve(1);
  VmSegment* b = f.reserve(1);
  VmSegment* other_stream = f.reserve(2);
  VmSegment* small = f.reserve(1, PoolKind::kSmall);
  if (a == nullptr || b == nullptr || other_stream == nullptr || small == nullptr) return EXPECT(false);
  EXPECT(a->base != b->base && (f.arena.streams() == std::vector<Stream>{1, 2}));
  Block* m = f.map(*b, 4 * MiB);             // b: a free 2-page block, 5 MiB needs one more page
  Block* s = f.map(*other_stream, 4 * MiB);  // the same on stream 2
  if (m == nullptr || s == nullptr) return EXPECT(false);
  VmRoom room;
  EXPECT(f.arena.find_room(1, PoolKind::kLarge, 2 * MiB, 5 * MiB, &room) == b && room.bytes == f.page);
  EXPECT(f.arena.find_room(2, PoolKind::kLarge, 2 * MiB, 5 * MiB, &room) == other_stream && room.bytes == f.page);
  EXPECT(f.arena.find_room(1, PoolKind::kSmall, 2 * MiB, 5 * MiB, &room) == small && room.bytes == 3 * f.page);
  EXPECT(f.arena.find_room(3, PoolKind::kLarge, 2 * MiB, 5 * MiB, &room) == nullptr && room.hole == nullptr);
  // Tie (both fresh for stream 1 after m is live): the oldest.
  m->allocated = true;
  EXPECT(f.arena.find_room(1, PoolKind::kLarge, 2 * MiB, 5 * MiB, &room) == a && room.bytes == 3 * f.page);
  f.validate();
}

void the_device_refuses_a_map() {
  Fixture<> f;
  VmSegment* a = f.reserve(1);
  VmSegment* b = f.reserve(1);
  if (a == nullptr || b == nullptr) return EXPECT(false);
  EXPECT(f.map(*a, 40 * MiB) != nullptr);
  Block* hole = *b->unmapped.begin();
  int runs = 7;
  EXPECT(f.map(*b, 40 * MiB, &runs) == nullptr && runs == 0);  // 80 MiB > the device's 64
  EXPECT(b->mapped == 0 && b->unmapped.size() == 1 && *b->unmapped.begin() == hole && hole->size == b->size);
  EXPECT(f.device_free() == kCapacity - 40 * MiB);
  f.validate();
}

void reservations_with_nothing_mapped_end() {
  Fixture<> f;
  VmSegment* a = f.reserve(1);
  VmSegment* b = f.reserve(1);
  if (a == nullptr || b == nullptr) return EXPECT(false);
  const std::uintptr_t a_base = a->base;
  EXPECT(f.map(*b, 2 * MiB) != nullptr);
  std::vector<const Block*> dropped;
  f.arena.release_unmapped([&](const VmSegment& seg, Block* hole) {
    EXPECT(seg.base == a_base && hole->addr == a_base && hole->size == seg.size);
    dropped.push_back(hole);
  });
  EXPECT(dropped.size() == 1);
  int left = 0;
  f.arena.for_each_segment([&](const VmSegment& seg) { left += seg.base == b->base; });
  EXPECT(left == 1);
  f.validate();
  // a's address space is free again: the backend hands out its lowest free range.
  VmSegment* again = f.reserve(1);
  EXPECT(again != nullptr && again->base == a_base);
}

void the_arena_gives_everything_back_when_destroyed() {
  Config config = parse_config("host_capacity_mb:64");
  HostBackend backend{config};
  std::pmr::unsynchronized_pool_resource mr;
  std::vector<std::unique_ptr<Block>> blocks;
  auto make = [&] {
    blocks.push_back(std::make_unique<Block>(&mr));
    return blocks.back().get();
  };
  std::uintptr_t base = 0;
  {
    VmArena arena{backend, 0, &mr};
    VmSegment* seg = arena.reserve(1, PoolKind::kLarge, 2 * MiB, [] { return kCapacity; }, make);
    if (seg == nullptr) return EXPECT(false);
    base = seg->base;
    // Two mapped runs around a hole, and an unmapped tail.
    auto split = [&](Block* b, size_t at) { return split_block(b, at, make()); };
    int runs = 0;
    Block* m = arena.map(*seg, arena.find_room(*seg, 8 * MiB), split, &runs);
    if (m == nullptr) return EXPECT(false);
    arena.unmap(m, m->addr + 2 * MiB, m->addr + 4 * MiB, Unmapping::kRelease, split, [](Block*, Block*) {});
    EXPECT(backend.mem_get_info(0).free == kCapacity - 6 * MiB);
  }
  EXPECT(backend.mem_get_info(0).free == kCapacity);
  // The reservation ended too: the same address space is handed out again.
  VmArena arena{backend, 0, &mr};
  VmSegment* seg = arena.reserve(1, PoolKind::kLarge, 2 * MiB, [] { return kCapacity; }, make);
  EXPECT(seg != nullptr && seg->base == base);
}

void a_backend_without_virtual_memory_is_asked_once() {
  Fixture<NoVmBackend> f;
  int made = 0;
  auto make = [&] {
    ++made;
    return f.make()();
  };
  EXPECT(f.arena.reserve(1, PoolKind::kLarge, 2 * MiB, [] { return kCapacity; }, make) == nullptr);
  EXPECT(f.arena.unavailable() && f.arena.empty() && made == 0 && f.backend.asked == 1);
  EXPECT(f.arena.reserve(1, PoolKind::kLarge, 2 * MiB, [] { return kCapacity; }, make) == nullptr);
  EXPECT(f.backend.asked == 1 && made == 0);  // not asked again
  // A capacity that cannot be read counts as no virtual memory too.
  Fixture<> g;
  auto broken = []() -> size_t { throw DriverError("mem_get_info failed"); };
  EXPECT(g.arena.reserve(1, PoolKind::kLarge, 2 * MiB, broken, g.make()) == nullptr && g.arena.unavailable());
  f.validate();
}

void exhausted_address_space_is_refused_but_not_for_good() {
  Fixture<> f;
  // More than the host backend's address range for the device.
  EXPECT(f.reserve(1, PoolKind::kLarge, size_t{1} << 44) == nullptr);
  EXPECT(!f.arena.unavailable() && f.arena.empty() && f.blocks.empty());
  EXPECT(f.reserve(1) != nullptr);
  f.validate();
}

void large_requests_on_a_large_device_use_natives_large_page() {
  const size_t from = VmArena::kLargePagesFrom, req = VmArena::kLargeRequest, g = 2 * MiB;
  const size_t large = VmArena::large_page(g), mid = VmArena::mid_page(g);
  EXPECT(VmArena::page_for(PoolKind::kLarge, req, from, 0, g) == large);
  EXPECT(VmArena::page_for(PoolKind::kLarge, req - 1, from, 0, g) == g);  // a smaller request: fine pages
  EXPECT(VmArena::page_for(PoolKind::kLarge, req, from - 1, 0, g) == g);  // a smaller device: fine pages
  EXPECT(VmArena::page_for(PoolKind::kSmall, req, from, 0, g) == g);      // the small pool: fine pages
  // Once the device holds kLargePagesOnceReserved, every large-pool request
  // grows in large pages (a 20 MiB page is then at most 1/400 of the pool)
  const size_t big = VmArena::kLargePagesOnceReserved;
  EXPECT(VmArena::page_for(PoolKind::kLarge, 2 * MiB, from, big, g) == large);
  EXPECT(VmArena::page_for(PoolKind::kLarge, 2 * MiB, from, big - 1, g) != large);
  EXPECT(VmArena::page_for(PoolKind::kLarge, 2 * MiB, from - 1, big, g) == g);  // a small device: fine pages
  EXPECT(VmArena::page_for(PoolKind::kSmall, 2 * MiB, from, big, g) == g);      // the small pool: fine pages
  // From kMidPagesOnceReserved, the large pool's other requests grow in mid pages
  const size_t some = VmArena::kMidPagesOnceReserved;
  EXPECT(VmArena::page_for(PoolKind::kLarge, 2 * MiB, from, some, g) == mid);
  EXPECT(VmArena::page_for(PoolKind::kLarge, 2 * MiB, from, some - 1, g) == g);
  EXPECT(VmArena::page_for(PoolKind::kLarge, req, from, some, g) == large);      // a large request: large pages
  EXPECT(VmArena::page_for(PoolKind::kLarge, 2 * MiB, from - 1, some, g) == g);  // a small device: fine pages
  EXPECT(VmArena::page_for(PoolKind::kSmall, 2 * MiB, from, some, g) == g);      // the small pool: fine pages
  EXPECT(VmArena::large_page(2 * MiB) == 20 * MiB && VmArena::large_page(8 * MiB) == 24 * MiB);
  EXPECT(mid % g == 0 && mid > g && mid < large && VmArena::mid_page(16 * MiB) == 16 * MiB);
}

void a_large_pages_reservation_maps_and_gives_back_whole_large_pages() {
  Fixture<> f("host_capacity_mb:16384");
  const size_t big = size_t{16} << 30, p = 20 * MiB;
  VmSegment* fine = f.reserve(1, PoolKind::kLarge, big);
  VmSegment* seg = f.reserve(1, PoolKind::kLarge, big, p);
  if (seg == nullptr || fine == nullptr) return EXPECT(false);
  EXPECT(fine->page == 2 * MiB && seg->page == p);
  EXPECT(seg->size >= big && seg->size % p == 0 && seg->size - big < p);
  // rooms are searched among the reservations of the request's kind
  VmRoom room;
  EXPECT(f.arena.find_room(1, PoolKind::kLarge, p, 25 * MiB, &room) == seg && room.bytes == 2 * p);
  EXPECT(f.arena.find_room(1, PoolKind::kLarge, 2 * MiB, 25 * MiB, &room) == fine && room.bytes == 26 * MiB);
  EXPECT(f.arena.find_room(1, PoolKind::kLarge, 8 * MiB, 25 * MiB, &room) == nullptr);  // no mid-page reservation
  VmSegment* mid = f.reserve(1, PoolKind::kLarge, big, 8 * MiB);
  EXPECT(mid != nullptr && mid->page == 8 * MiB && mid->size % (8 * MiB) == 0);
  EXPECT(f.arena.find_room(1, PoolKind::kLarge, 8 * MiB, 25 * MiB, &room) == mid && room.bytes == 32 * MiB);
  f.validate();
  // 25 MiB rounds up to two 20 MiB pages, each one physical allocation.
  const auto before = f.backend.vm_calls(0);
  Block* m = f.map(*seg, 25 * MiB);
  if (m == nullptr) return EXPECT(false);
  const auto after = f.backend.vm_calls(0);
  EXPECT(m->size == 2 * p && seg->mapped == 2 * p && f.device_free() == big - 2 * p);
  EXPECT(after.create - before.create == 2 && after.map - before.map == 2 && after.set_access - before.set_access == 1);
  f.validate();
  // A free run gives back only the whole pages of its segment: [2 MiB, 40 MiB) holds one (the top).
  Block* low = f.split()(m, 2 * MiB);  // m keeps [0, 2 MiB), live
  m->allocated = true;
  FreeList list(&f.mr);
  list.insert(low);
  std::vector<std::pair<std::uintptr_t, std::uintptr_t>> done;
  const size_t got =
      f.arena.unmap_free_pages({&list}, 1, SIZE_MAX, nullptr, nullptr, Unmapping::kRelease, f.unmap_in(list, &done));
  EXPECT(got == p && done.size() == 1 && done[0].first == seg->base + p && done[0].second == seg->base + 2 * p);
  EXPECT(seg->mapped == p && f.device_free() == big - p);
  f.validate();
}
}  // namespace

int main() {
  a_reservation_is_whole_pages_spanned_by_one_hole();
  rooms_follow_the_page_arithmetic();
  a_hole_between_free_blocks_is_mapped_whole();
  unmapping_splits_and_coalesces();
  free_pages_go_largest_run_first_after_a_synchronisation();
  pages_kept_by_a_move_are_mapped_again_without_a_synchronisation();
  the_reuse_ceiling_follows_the_high_water_mark();
  the_reuse_ceiling_is_capped_for_large_pools();
  a_loop_giving_pages_back_every_step_doubles_the_slack();
  a_loop_keeping_a_little_more_each_step_is_still_a_loop();
  a_loop_going_over_every_few_steps_is_a_loop();
  rooms_are_searched_per_stream_and_pool();
  the_device_refuses_a_map();
  reservations_with_nothing_mapped_end();
  the_arena_gives_everything_back_when_destroyed();
  a_backend_without_virtual_memory_is_asked_once();
  exhausted_address_space_is_refused_but_not_for_good();
  large_requests_on_a_large_device_use_natives_large_page();
  a_large_pages_reservation_maps_and_gives_back_whole_large_pages();
  return part_test::finish();
}
