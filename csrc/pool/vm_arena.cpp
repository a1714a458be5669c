// vm_arena.cpp — the VmArena part's members that are not templates
// (vm_arena.h): the page size, the room search, the reuse-free-pages slack
// rule, the choice of free runs to unmap, and the end of every reservation.
// Invariants: vm_arena.h.
#include "pool/vm_arena.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <numeric>

namespace memalloc {

VmArena::~VmArena() {
  // Unmap each mapped run (the gaps between unmapped blocks), then end the
  // reservation. The blocks themselves live in the caller's node resource.
  for (auto& vm : segments_) {
    try {
      std::uintptr_t at = vm->base;
      for (const Block* hole : vm->unmapped) {
        if (hole->addr > at) backend_.vm_unmap(device_, reinterpret_cast<void*>(at), hole->addr - at);
        at = hole->addr + hole->size;
      }
      if (vm->base + vm->size > at) backend_.vm_unmap(device_, reinterpret_cast<void*>(at), vm->base + vm->size - at);
      backend_.vm_free(device_, reinterpret_cast<void*>(vm->base));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "memalloc: could not give back expandable segment 0x%llx on device %d: %s\n",
                   static_cast<unsigned long long>(vm->base), device_, e.what());
    }
  }
}

size_t VmArena::granularity() {
  if (granularity_ == 0) granularity_ = backend_.vm_page_size(device_);
  return granularity_;
}

void VmArena::report_unavailable(const char* why) {
  std::fprintf(stderr,
               "memalloc: expandable segments are unavailable on device %d (%s); using plain "
               "segments\n",
               device_, why);
  unavailable_ = true;
}

VmRoom VmArena::find_room(const VmSegment& seg, size_t rounded) {
  const size_t pg = seg.page;
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
    const size_t from_start = round_up(rounded - left, pg);
    if (from_start <= hole->size) offer(hole, hole->addr, from_start);
    const size_t from_end = round_up(rounded - right, pg);
    if (from_end <= hole->size) offer(hole, hole->addr + hole->size - from_end, from_end);
    if (left + hole->size + right >= rounded) offer(hole, hole->addr, hole->size);
  }
  return best;
}

VmSegment* VmArena::find_room(Stream stream, PoolKind pool, size_t page, size_t rounded, VmRoom* room) {
  VmSegment* seg = nullptr;
  *room = VmRoom{};
  size_t best = std::numeric_limits<size_t>::max();
  for (auto& s : segments_) {
    if (s->stream != stream || s->pool != pool || s->page != page) continue;
    VmRoom r = find_room(*s, rounded);
    if (r.hole != nullptr && r.bytes < best) {
      seg = s.get();
      *room = r;
      best = r.bytes;
    }
  }
  return seg;
}

size_t VmArena::over_ceiling(size_t allocated, size_t reserved, size_t rounded, size_t room_bytes, uint64_t at,
                             size_t pg) {
  allocated_hwm_ = std::max(allocated_hwm_, allocated + rounded);
  const auto over = [&] {
    const size_t ceiling = allocated_hwm_ + std::min(allocated_hwm_ / slack_divisor_, slack_cap_);
    return room_bytes == 0 || reserved + room_bytes <= ceiling ? size_t{0}
                                                               : std::min(room_bytes, reserved + room_bytes - ceiling);
  };
  if (over() == 0) return 0;
  // the same request: its size exactly, bytes allocated and the high-water
  // mark within a page (a loop that keeps a small tensor every step is
  // still the same loop)
  const auto near = [pg](size_t a, size_t b) { return (a > b ? a - b : b - a) <= pg; };
  auto same = std::find_if(triggers_.begin(), triggers_.end(), [&](const Trigger& t) {
    return t.rounded == rounded && near(t.allocated, allocated) && near(t.hwm, allocated_hwm_);
  });
  if (same == triggers_.end()) {
    triggers_[next_trigger_] = Trigger{rounded, allocated, allocated_hwm_, at, 0};
    next_trigger_ = (next_trigger_ + 1) % kTriggerMemory;
    return over();
  }
  const uint64_t gap = at - same->at;
  if (gap == 0) return over();  // a retry of the same request (after an out-of-memory release)
  // a loop: the two gaps are whole multiples (kLoopPeriods at most) of one
  // period, a training step's allocations: a loop's state may differ from
  // step to step (which pages are mapped where), so a request can go over
  // the ceiling at the same point of the step only every few steps
  const uint64_t period = std::gcd(same->gap, gap);
  const bool loop = same->gap != 0 && std::max(same->gap, gap) / period <= kLoopPeriods;
  *same = Trigger{rounded, allocated, allocated_hwm_, at, loop ? 0 : gap};
  // a loop's third time: twice the slack (as a loop would come back to
  // it, it is found again only if that is not yet enough)
  if (loop && slack_divisor_ > 1) slack_divisor_ /= 2;
  if (loop && slack_cap_ <= std::numeric_limits<size_t>::max() / 2) slack_cap_ *= 2;
  return over();
}

std::vector<VmArena::Run> VmArena::free_runs(std::initializer_list<const FreeList*> lists, Stream stream,
                                             const Block* keep_a, const Block* keep_b) {
  std::vector<Run> found;
  for (const FreeList* list : lists) {
    for (Block* b : list->blocks()) {
      if (b->vm == nullptr || b->stream != stream || b == keep_a || b == keep_b) continue;
      // whole pages of its segment, which count from the segment's base
      const std::uintptr_t base = b->vm->base, pg = b->vm->page;
      const std::uintptr_t lo = base + round_up(b->addr - base, pg), hi = base + (b->addr + b->size - base) / pg * pg;
      if (hi > lo) found.push_back(Run{b, lo, hi});
    }
  }
  // Largest runs first: fewest blocks cut; ties by address, so replays repeat.
  std::sort(found.begin(), found.end(), [](const Run& a, const Run& b) {
    return a.hi - a.lo != b.hi - b.lo ? a.hi - a.lo > b.hi - b.lo : a.lo < b.lo;
  });
  return found;
}

std::vector<Stream> VmArena::streams() const {
  std::vector<Stream> out;
  for (auto& s : segments_)
    if (std::find(out.begin(), out.end(), s->stream) == out.end()) out.push_back(s->stream);
  return out;
}

}  // namespace memalloc
