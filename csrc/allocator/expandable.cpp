// expandable.cpp — the Expandable part (expandable.h): the allocator's side
// of expandable segments (the VmArena part, vm_arena.h): growth by mapping
// pages where the arena finds room, moving free whole pages there (before
// growing above the arena's reuse ceiling, when reuse_free_pages), and
// unmapping them (on empty_cache; before an OOM; by the threshold policy).
// The arena decides where and how much; this file keeps what it may not
// touch: the free lists, the segment table, the memory fraction, the open
// routes and the Events that feed the counters. All of it is the slow path:
// the fast path (allocator.cpp) handles mapped blocks of expandable
// segments exactly like blocks of plain ones.
// Invariants: expandable.h, vm_arena.h, block.h.
#include <algorithm>
#include <limits>

#include "allocator/expandable.h"
#include "common/errors.h"

namespace memalloc {
namespace {

std::uintptr_t round_up(std::uintptr_t n, size_t to) { return (n + to - 1) / to * to; }

// Adds sign x the inactive-split bytes and count of `b` (when it is free) to e.
void add_split(Event& e, const Block* b, int sign) {
  if (b == nullptr || !b->is_free()) return;
  e.inactive_split_bytes_delta += sign * split_bytes(b);
  e.inactive_split_count_delta += sign * split_count(b);
}

}  // namespace

// A reservation of the device's whole capacity (as native) in the arena,
// entered in the segment table. nullptr (and plain segments from then on)
// when the backend has no virtual memory or no address space left.
VmSegment* Expandable::new_segment(Stream stream, PoolKind pool, size_t page, const std::function<size_t()>& capacity) {
  VmSegment* seg = vm_.reserve(stream, pool, page, capacity, [this] { return blocks_.make(); });
  if (seg != nullptr && !segments_.insert(seg->base, Segment{seg->size, nullptr, seg}))
    throw Error("memalloc internal error: the backend reserved address space that overlaps a segment");
  return seg;
}

Block* Expandable::map_room(VmSegment& seg, const VmRoom& room) {
  if (room.bytes == 0) return room.fit;  // a free neighbour that fits already
  if (!limits_.admits(sink_.reserved_bytes(), room.bytes)) return nullptr;
  int runs_delta = 0;
  Block* m = vm_.map(seg, room, [this](Block* b, size_t at) { return blocks_.split(b, at); }, &runs_delta);
  if (m == nullptr) return nullptr;
  Event e = block_event(Action::kSegmentMap, *m);
  e.segment_delta = runs_delta;
  FreeList& list = blocks_.list_of(m);
  blocks_.merge_free_neighbours(m, list, e);
  add_split(e, m, +1);
  list.insert(m);
  sink_.record(e);
  return m;
}

Block* Expandable::grow(size_t rounded, Stream stream, const Policy& policy, const std::function<size_t()>& capacity,
                        const std::function<void(size_t)>& collect, bool* no_vm) {
  *no_vm = false;
  const PoolKind pool = pool_kind_for(rounded);
  // The request's page (VmArena::page_for(), vm_arena.h): a large request
  // on a large device grows in large pages, as does every large-pool request
  // of a process that has held 8 GiB, and in mid pages one that has held
  // 2 GiB (reserved now, or allocated at its high-water mark: growing again
  // after empty_cache() is as fast as the first time). A capacity that
  // cannot be read (fine pages) and a granularity that cannot be read (page
  // 0: no room anywhere) are left to the reservation to report. The capacity
  // is read before the granularity (the order the backend sees), and only
  // for the large pool, whose page depends on it.
  size_t cap = 0;
  if (pool == PoolKind::kLarge) {
    try {
      cap = capacity();
    } catch (const DriverError&) {}
  }
  size_t page = 0;
  try {
    page =
        VmArena::page_for(pool, rounded, cap, std::max(sink_.reserved_bytes(), vm_.allocated_hwm()), vm_.granularity());
  } catch (const DriverError&) {}
  // The "threshold" empty-cache policy, as for plain segments (it may unmap
  // the free pages a room would have joined: rooms are looked for after it;
  // an arena with a segment has read the granularity, so page > 0).
  if (!vm_.empty()) collect(round_up(rounded, page));
  VmRoom room;
  VmSegment* seg = vm_.find_room(stream, pool, page, rounded, &room);
  if (seg == nullptr) {
    seg = new_segment(stream, pool, page, capacity);
    if (seg == nullptr) {
      *no_vm = true;
      return nullptr;
    }
    room = vm_.find_room(*seg, rounded);
    if (room.hole == nullptr) return nullptr;  // larger than the device
  }
  const size_t over =
      vm_.over_ceiling(sink_.allocated_bytes(), sink_.reserved_bytes(), rounded, room.bytes, policy.clock, seg->page);
  if (policy.reuse_free_pages && !pools_.any_route() && over > 0) {
    // Keep reserved bytes under the ceiling: move free pages to this
    // mapping for the part of it above the ceiling. They are unmapped
    // without a stream synchronisation (the backend keeps their memory for
    // the map below, ordered after the stream's work as a reused block is),
    // and those the map does not take are given back on the way out. A
    // steady loop stops moving pages (the loop rule, vm_arena.h).
    struct DropSpares {
      VmArena& vm;
      ~DropSpares() { vm.drop_spares(); }
    } drop{vm_};
    if (unmap_free_pages(stream, over, room.hole->prev, room.hole->next, Unmapping::kKeep) > 0)
      seg = vm_.find_room(stream, pool, page, rounded, &room);
    MEMALLOC_EXPECTS(seg != nullptr, "memalloc internal error: an expandable segment lost its room");
    return map_room(*seg, room);  // while `drop` lives: the map takes the spare pages first
  }
  return map_room(*seg, room);
}

void Expandable::unmap_range(Block* f, std::uintptr_t lo, std::uintptr_t hi, Unmapping how) {
  FreeList& list = blocks_.list_of(f);
  list.erase(f);
  Event e = block_event(Action::kSegmentUnmap, *f);
  e.addr = lo;
  e.size = hi - lo;
  add_split(e, f, -1);
  const VmUnmapped u = vm_.unmap(
      f, lo, hi, how, [this](Block* b, size_t at) { return blocks_.split(b, at); },
      [this](Block* b, Block* n) { blocks_.absorb(b, n); });
  e.segment_delta = u.runs_delta;
  for (Block* piece : {u.below, u.above}) {
    if (piece == nullptr) continue;
    add_split(e, piece, +1);
    list.insert(piece);
  }
  sink_.record(e);
}

size_t Expandable::unmap_free_pages(Stream stream, size_t want, const Block* keep_a, const Block* keep_b,
                                    Unmapping how) {
  if (pools_.any_route()) return 0;
  FreeLists& lists = blocks_.lists(nullptr);
  return vm_.unmap_free_pages(
      {&lists.small, &lists.large}, stream, want, keep_a, keep_b, how,
      [this, how](Block* f, std::uintptr_t lo, std::uintptr_t hi) { unmap_range(f, lo, hi, how); });
}

size_t Expandable::release() {
  if (vm_.empty() || pools_.any_route()) return 0;
  size_t released = 0;
  for (Stream s : vm_.streams())
    released += unmap_free_pages(s, std::numeric_limits<size_t>::max(), nullptr, nullptr, Unmapping::kRelease);
  // End the reservations with nothing mapped: one unmapped block each.
  vm_.release_unmapped([this](const VmSegment& seg, Block* hole) {
    blocks_.destroy(hole);
    segments_.erase(seg.base);
  });
  return released;
}

}  // namespace memalloc
