// expandable.cpp — expandable segments (expandable.h): growth by mapping
// pages where a request finds room, and unmapping of free whole pages
// (before growing above 1.05 x the most ever allocated, when
// reuse_free_pages; on empty_cache; before an OOM; by the threshold policy).
// All of it is the slow path: the fast path (allocator.cpp) handles mapped
// blocks of expandable segments exactly like blocks of plain ones.
// Invariants: expandable.h, device_allocator.h, block.h.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <vector>

#include "allocator/device_allocator.h"
#include "common/errors.h"

namespace memalloc {
namespace {

std::uintptr_t round_up(std::uintptr_t n, size_t to) { return (n + to - 1) / to * to; }
std::uintptr_t round_down(std::uintptr_t n, size_t to) { return n / to * to; }
void* ptr(std::uintptr_t addr) { return reinterpret_cast<void*>(addr); }

// Adds sign x the inactive-split bytes and count of `b` (when it is free) to e.
void add_split(Event& e, const Block* b, int sign) {
  if (b == nullptr || !b->is_free()) return;
  e.inactive_split_bytes_delta += sign * split_bytes(b);
  e.inactive_split_count_delta += sign * split_count(b);
}

}  // namespace

size_t DeviceAllocator::vm_page_locked() {
  if (vm_page_ == 0) vm_page_ = backend_.vm_page_size(device_);
  return vm_page_;
}

// A reservation of the device's whole capacity (as native), one unmapped
// block spanning it. nullptr (and plain segments from then on) when the
// backend has no virtual memory or no address space left.
VmSegment* DeviceAllocator::new_vm_segment_locked(Stream stream, PoolKind pool) {
  if (vm_unavailable_) return nullptr;
  void* base = nullptr;
  size_t bytes = 0;
  try {
    if (capacity_ == 0) capacity_ = backend_.mem_get_info(device_).total;
    bytes = round_up(capacity_, vm_page_locked());
    base = backend_.vm_reserve(device_, bytes);
  } catch (const DriverError& e) {
    std::fprintf(stderr, "memalloc: expandable segments are unavailable on device %d (%s); using plain "
                 "segments\n", device_, e.what());
    vm_unavailable_ = true;
    return nullptr;
  }
  if (base == nullptr) return nullptr;  // address space exhausted: a plain segment this time
  const auto addr = reinterpret_cast<std::uintptr_t>(base);
  vm_segments_.push_back(std::make_unique<VmSegment>(addr, bytes, stream, pool, &mr_));
  VmSegment* seg = vm_segments_.back().get();
  Block* hole = new_block();
  hole->addr = addr;
  hole->size = bytes;
  hole->stream = stream;
  hole->pool = pool;
  hole->vm = seg;
  hole->mapped = false;
  seg->unmapped.insert(hole);
  segments_.emplace(addr, Segment{bytes, nullptr, seg});
  return seg;
}

// The cheapest room for `rounded` bytes: an unmapped block extended from its
// start (growing its free prev) or from its end (growing its free next), or
// mapped whole (joining both); fewest pages first, then lowest address.
VmRoom DeviceAllocator::find_room_locked(const VmSegment& seg, size_t rounded) {
  const size_t page = vm_page_locked();
  VmRoom best;
  size_t best_bytes = std::numeric_limits<size_t>::max();
  auto offer = [&](Block* hole, std::uintptr_t lo, size_t bytes) {
    if (bytes < best_bytes) {
      best = VmRoom{hole, nullptr, lo, bytes};
      best_bytes = bytes;
    }
  };
  for (Block* hole : seg.unmapped) {
    const size_t left = hole->prev != nullptr && hole->prev->is_free() ? hole->prev->size : 0;
    const size_t right = hole->next != nullptr && hole->next->is_free() ? hole->next->size : 0;
    if (left >= rounded || right >= rounded) {  // a neighbour alone fits (max_split_size refused it)
      offer(hole, hole->addr, 0);
      best.fit = left >= rounded ? hole->prev : hole->next;
      return best;
    }
    const size_t from_start = round_up(rounded - left, page);
    if (from_start <= hole->size) offer(hole, hole->addr, from_start);
    const size_t from_end = round_up(rounded - right, page);
    if (from_end <= hole->size) offer(hole, hole->addr + hole->size - from_end, from_end);
    if (left + hole->size + right >= rounded) offer(hole, hole->addr, hole->size);
  }
  return best;
}

Block* DeviceAllocator::map_room_locked(VmSegment& seg, const VmRoom& room) {
  Block* hole = room.hole;
  if (room.bytes == 0) return room.fit;  // a free neighbour that fits already
  const auto reserved = static_cast<size_t>(accounting_.stats().reserved_bytes[kStatAll].current);
  if (room.bytes > allowed_max_ || reserved > allowed_max_ - room.bytes) return nullptr;
  if (!backend_.vm_map(device_, ptr(room.lo), room.bytes)) return nullptr;
  // Carve [lo, lo + bytes) out of the hole; the rest of the hole stays unmapped.
  seg.unmapped.erase(hole);
  Block* m = hole;
  if (room.lo > hole->addr) {
    m = split_block_locked(hole, room.lo - hole->addr);
    seg.unmapped.insert(hole);
  }
  if (m->size > room.bytes) seg.unmapped.insert(split_block_locked(m, room.bytes));
  m->mapped = true;
  seg.mapped += room.bytes;
  Event e = block_event(Action::kSegmentMap, *m);
  e.segment_delta = 1 - (m->prev != nullptr && m->prev->mapped) - (m->next != nullptr && m->next->mapped);
  e.prov = call_provenance_locked();
  FreeList& list = free_list(m);
  merge_free_neighbours_locked(m, list, e);
  add_split(e, m, +1);
  list.insert(m);
  record_locked(e);
  return m;
}

Block* DeviceAllocator::grow_vm_locked(size_t rounded, Stream stream, bool* no_vm) {
  *no_vm = false;
  const PoolKind pool = pool_kind_for(rounded);
  // The "threshold" empty-cache policy, as for plain segments (it may unmap
  // the free pages a room would have joined: rooms are looked for after it).
  if (gc_threshold_ > 0.0 && routes_.empty() && !vm_segments_.empty())
    maybe_collect_locked(round_up(rounded, vm_page_locked()));
  VmSegment* seg = nullptr;
  VmRoom room;
  auto find = [&] {
    seg = nullptr;
    room = VmRoom{};
    size_t best = std::numeric_limits<size_t>::max();
    for (auto& s : vm_segments_) {
      if (s->stream != stream || s->pool != pool) continue;
      VmRoom r = find_room_locked(*s, rounded);
      if (r.hole != nullptr && r.bytes < best) {
        seg = s.get();
        room = r;
        best = r.bytes;
      }
    }
  };
  find();
  if (seg == nullptr) {
    seg = new_vm_segment_locked(stream, pool);
    if (seg == nullptr) {
      *no_vm = true;
      return nullptr;
    }
    room = find_room_locked(*seg, rounded);
    if (room.hole == nullptr) return nullptr;  // larger than the device
  }
  const DeviceStats& s = accounting_.stats();
  const auto allocated = static_cast<size_t>(s.allocated_bytes[kStatAll].current);
  const auto reserved = static_cast<size_t>(s.reserved_bytes[kStatAll].current);
  vm_allocated_hwm_ = std::max(vm_allocated_hwm_, allocated + rounded);
  const size_t ceiling = vm_allocated_hwm_ + vm_allocated_hwm_ / kReuseSlackDivisor;
  if (config_.reuse_free_pages && routes_.empty() && room.bytes > 0 && reserved + room.bytes > ceiling) {
    // Keep reserved bytes under the ceiling: give back free pages for the
    // part of this mapping above it (below it, pages are mapped without a
    // stream synchronisation, so a steady loop stops moving pages).
    const size_t over = std::min(room.bytes, reserved + room.bytes - ceiling);
    if (unmap_free_pages_locked(stream, over, room.hole->prev, room.hole->next) > 0) find();
    MEMALLOC_EXPECTS(seg != nullptr, "memalloc internal error: an expandable segment lost its room");
  }
  return map_room_locked(*seg, room);
}

void DeviceAllocator::unmap_range_locked(Block* f, std::uintptr_t lo, std::uintptr_t hi) {
  VmSegment& seg = *f->vm;
  FreeList& list = free_list(f);
  list.erase(f);
  Event e = block_event(Action::kSegmentUnmap, *f);
  e.addr = lo;
  e.size = hi - lo;
  e.prov = call_provenance_locked();
  add_split(e, f, -1);
  Block* u = f;
  if (lo > f->addr) u = split_block_locked(f, lo - f->addr);
  Block* above = hi < u->addr + u->size ? split_block_locked(u, hi - u->addr) : nullptr;
  backend_.vm_unmap(device_, ptr(lo), hi - lo);
  u->mapped = false;
  seg.mapped -= hi - lo;
  e.segment_delta = -1 + (u->prev != nullptr && u->prev->mapped) + (u->next != nullptr && u->next->mapped);
  for (Block* piece : {u != f ? f : nullptr, above}) {
    if (piece == nullptr) continue;
    add_split(e, piece, +1);
    list.insert(piece);
  }
  // Coalesce the new hole with unmapped neighbours.
  for (Block* n : {u->prev, u->next}) {
    if (n == nullptr || n->mapped) continue;
    seg.unmapped.erase(n);
    absorb_locked(u, n);
  }
  seg.unmapped.insert(u);
  record_locked(e);
}

size_t DeviceAllocator::unmap_free_pages_locked(Stream stream, size_t want, const Block* keep_a,
                                                const Block* keep_b) {
  if (!routes_.empty() || want == 0) return 0;
  const size_t page = vm_page_locked();
  struct Candidate {
    Block* block;
    std::uintptr_t lo, hi;  // its whole pages
  };
  std::vector<Candidate> found;
  for (FreeList* list : {&default_lists_.small, &default_lists_.large}) {
    for (Block* b : list->blocks()) {
      if (b->vm == nullptr || b->stream != stream || b == keep_a || b == keep_b) continue;
      const std::uintptr_t lo = round_up(b->addr, page), hi = round_down(b->addr + b->size, page);
      if (hi > lo) found.push_back(Candidate{b, lo, hi});
    }
  }
  if (found.empty()) return 0;
  // Largest runs first: fewest blocks cut; ties by address, so replays repeat.
  std::sort(found.begin(), found.end(), [](const Candidate& a, const Candidate& b) {
    return a.hi - a.lo != b.hi - b.lo ? a.hi - a.lo > b.hi - b.lo : a.lo < b.lo;
  });
  backend_.synchronize_stream(device_, stream);  // queued work may still use these pages
  size_t done = 0;
  for (const Candidate& c : found) {
    if (done >= want) break;
    const size_t run = c.hi - c.lo, rest = want - done;
    const size_t take = rest >= run ? run : std::min<size_t>(run, round_up(rest, page));
    unmap_range_locked(c.block, c.hi - take, c.hi);  // the top pages: the block keeps its start
    done += take;
  }
  return done;
}

size_t DeviceAllocator::release_vm_locked() {
  if (vm_segments_.empty() || !routes_.empty()) return 0;
  std::vector<Stream> streams;
  for (auto& s : vm_segments_)
    if (std::find(streams.begin(), streams.end(), s->stream) == streams.end()) streams.push_back(s->stream);
  size_t released = 0;
  for (Stream s : streams)
    released += unmap_free_pages_locked(s, std::numeric_limits<size_t>::max(), nullptr, nullptr);
  // End the reservations with nothing mapped: one unmapped block each.
  for (auto it = vm_segments_.begin(); it != vm_segments_.end();) {
    VmSegment& seg = **it;
    if (seg.mapped != 0) {
      ++it;
      continue;
    }
    Block* hole = *seg.unmapped.begin();
    seg.unmapped.clear();
    delete_block(hole);
    segments_.erase(seg.base);
    backend_.vm_free(device_, ptr(seg.base));
    it = vm_segments_.erase(it);
  }
  return released;
}

}  // namespace memalloc
