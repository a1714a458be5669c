// vm_arena.h — expandable segments (MEMALLOC_CONF=expandable_segments:True,
// torch's name) as one part: reservations of address space per (stream,
// pool kind) of the default pool, backed by device memory one page at a
// time (backend.h, "Virtual memory"), so that a segment grows where a
// request needs room and gives back the free pages inside it instead of
// whole segments.
//
// A page is one physical allocation of the driver (cuMemCreate + cuMemMap
// + its share of cuMemSetAccess: about 30 microseconds each, whatever the
// size, the set-access most of it; the driver serialises them, so threads
// do not help: benchmarks/speed/driver_costs.py), so its size sets what
// growing costs, and what can be given back (a free run gives back only its
// whole pages). Reservations come in three page sizes (page_for()): the
// backend's granularity (2 MiB); on a device of kLargePagesFrom (8 GiB) or
// more, kLargePage (20 MiB: native's large-pool page, torch's kLargeBuffer)
// for the large pool's requests of kLargeRequest (256 MiB) or more, and for
// all of them once the allocator holds kLargePagesOnceReserved (8 GiB:
// reserved now, or allocated at the arena's high-water mark, so after
// empty_cache() too), a page then being at most 1/400 of the pool; and
// kMidPage (8 MiB) for the large pool's other requests once it holds
// kMidPagesOnceReserved (2 GiB), at most 1/256 of the pool. Each page size
// grows in reservations of its own. A fresh 16 GiB tensor takes 820
// physical allocations, as native's, where 2 MiB pages took 8,192; the
// H200's ~1B Llama trained at lengths of 256 to 2048 (its trace
// benchmarks/traces/llama1b_growth.mtrace.gz) takes 4,362 (native's rule:
// 3,058), where 2 MiB pages below 256 MiB took 22,461 (its first step:
// 1.5 s against native expandable's 0.85-0.93 s).
// Why not coarser pages sooner (issue 38; every rule replayed on the host:
// benchmarks/results/2026-12-05-host-page-rules.json and
// 2026-12-06-host-page-rules.json): the reuse ceiling gives back only
// whole pages, and under coarse pages the free memory rarely is (at the
// varlen replay's peak under native's rule: 177 MiB free, no whole 20 MiB
// page), so its varlen replay reserves 1.0527 per allocated byte, over
// issue 14's 1.05 (tests/integration/test_replay.py); 20 MiB pages from
// 4 GiB take the transformer replay to 1.068, 8 MiB pages from the start
// the random one to 1.070; no uniform rule tried (8-20 MiB pages, other
// slacks, page-aware placement) keeps every replay within 1.05 at native's
// page count. Physical allocations sized to the growth keep both in a host
// prototype, but a CUDA tensor shared with another process goes as the
// physical allocations it spans, in torch's 'e' handle of one page size
// (native's receiver maps handle i at i x page): a span of mixed sizes
// would reach only a memalloc receiver. So pages stay uniform per
// reservation.
//
// The arena owns the reservations (VmSegment: address range, mapped bytes,
// its unmapped blocks), the page size and whether the backend has virtual
// memory at all, the "where is room" search, the reuse-free-pages slack
// rule with its high-water mark, and the choice of free pages to unmap.
// It changes blocks only by carving and coalescing the runs it maps and
// unmaps, through the caller's block operations (split, absorb, make,
// drop: DeviceAllocator's, passed per call); free lists, the segment table
// and the counters stay with the caller (expandable.cpp).
//
// Invariants (validate(); DeviceAllocator::validate() checks the rest
// against its blocks and segment table):
//   * The blocks of a VmSegment tile [base, base + size) in address order
//     (block.h's tiling rule, over the whole reservation): every block is
//     mapped (live, pending or free, as in a plain segment) or unmapped.
//   * base and size are whole pages of the segment's own page size: the
//     backend's granularity, or for the large pool also mid_page() or
//     large_page() (each a multiple of the granularity). Unmapped blocks
//     start and end on page boundaries inside [base, base + size), have
//     vm == their segment, are
//     never live, pending or in a free list, are exactly the members of
//     `unmapped`, and are coalesced: no unmapped block has an unmapped
//     prev/next. (A free mapped block and an unmapped neighbour stay apart.)
//   * mapped == size - the unmapped blocks' bytes == the sum of the sizes
//     of its mapped blocks == the bytes the backend has mapped in it.
//   * reserved_bytes counts mapped bytes (torch's accounting); the segment
//     statistic counts maximal mapped runs (map() and unmap() report how
//     many runs they add), which are also the segments that segments() and
//     snapshots report.
//   * Only the default pool has expandable segments (serves()): private
//     pools (CUDA graphs, MemPool) keep plain segments, whose layout graph
//     trees checkpoint; a reservation that the backend refuses falls back to
//     a plain segment; a backend without virtual memory is asked once
//     (unavailable() from then on).
//   * Pages are unmapped only while no route is open (no capture: the
//     caller checks). Work queued before the free may still touch them:
//     pages given back to the device (Unmapping::kRelease) are unmapped
//     after the segment's stream has been synchronised; pages kept
//     (kKeep: a page move, before growing above the reuse ceiling) are
//     unmapped without it, their device memory kept by the backend as spare
//     pages (Backend::vm_detach) for the map() that follows on the same
//     stream, ordered after that work as a reused free block is; the
//     caller drops the spares no map() took (drop_spares()) before it
//     returns.
//   * No lock of its own: DeviceAllocator calls it under the device lock.
//     Its sets use the allocator's node resource. All of it is the slow
//     path: the fast path (allocator.cpp) handles mapped blocks of
//     expandable segments exactly like blocks of plain ones. The destructor
//     unmaps every mapped run and ends every reservation.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <memory>
#include <memory_resource>
#include <set>
#include <vector>

#include "backend/backend.h"
#include "common/errors.h"
#include "pool/block.h"

namespace memalloc {

struct PrivatePool;  // private_pool.h

struct BlockByAddr {
  bool operator()(const Block* a, const Block* b) const { return a->addr < b->addr; }
};

struct VmSegment {
  VmSegment(std::uintptr_t base_, size_t size_, size_t page_, Stream stream_, PoolKind pool_,
            std::pmr::memory_resource* mr)
      : base(base_), size(size_), page(page_), stream(stream_), pool(pool_), unmapped(mr) {}
  std::uintptr_t base;  // start of the reservation
  size_t size;          // bytes of address space reserved
  size_t page;          // bytes mapped and unmapped at a time (one physical allocation each): page_for()'s
  Stream stream;
  PoolKind pool;
  size_t mapped = 0;  // bytes backed by device memory
  std::pmr::set<Block*, BlockByAddr> unmapped;
};

// Where a request can be given room in a segment: pages [lo, lo + bytes)
// of the unmapped block `hole`; bytes == 0: its free neighbour `fit` is
// large enough already (best fit refused it: max_split_size).
struct VmRoom {
  Block* hole = nullptr;
  Block* fit = nullptr;
  std::uintptr_t lo = 0;
  size_t bytes = 0;
};

// What becomes of the pages unmap() takes: given back to the device (the
// stream synchronised first), or kept as the backend's spare pages for the
// next map() (a page move: no synchronisation, no new device memory).
enum class Unmapping { kRelease, kKeep };

// What unmap() made of a free block: the unmapped run `hole` (coalesced with
// its unmapped neighbours), and the free mapped pieces left below and above
// it (nullptr: none), in no list.
struct VmUnmapped {
  Block* below = nullptr;
  Block* hole = nullptr;
  Block* above = nullptr;
  int runs_delta = 0;  // mapped runs added (the segment statistic's change)
};

class VmArena {
 public:
  // reuse_free_pages: free pages move (Unmapping::kKeep) before growing only above
  // a ceiling of hwm + min(hwm / slack_divisor(), slack_cap()) reserved
  // bytes (hwm: the most bytes allocated at once that growth has served);
  // the divisor starts at kReuseSlackDivisor (5%), the cap at
  // kReuseSlackCap (512 MiB: the slack of a pool of more than 10 GiB, where
  // 5% would be GiBs lying free; a ~1B Llama at lengths of 256 to 2048,
  // benchmarks/traces/llama1b_growth.mtrace.gz, reserves 1.044 per
  // allocated byte at its peak under the 5% alone, 1.0098 with the cap, on
  // the host and on an H100, with 44 page moves over 13 steps: with a
  // stream synchronisation each, the run took 1.03x native's on an H100;
  // moved without one, 1.00-1.03x). A loop: one request (its rounded size, and
  // bytes allocated and high-water mark within a page of its last time)
  // over the ceiling three times, the two gaps between them (in
  // allocations) whole multiples, kLoopPeriods at most, of one period (a
  // training step's worth: a loop's pages may lie otherwise from step to
  // step, so it may go over only every few steps; found in a bf16
  // transformer whose 132 MiB request went over after 1, 5, 3, 1, 2 steps),
  // would move pages at every step or every few (the driver's unmap and
  // map calls each time); its third time halves the divisor and doubles the cap (twice
  // the slack: 10% up to 1 GiB, then 20% up to 2 GiB... while loops are
  // still found), so that the loop's pages stay mapped. kTriggerMemory
  // such requests are remembered, the oldest forgotten first; a retry of
  // the same request (the same allocation count) is not another time.
  static constexpr size_t kReuseSlackDivisor = 20;
  static constexpr size_t kReuseSlackCap = size_t{512} << 20;
  // Large pages: kLargePage, for large-pool requests of kLargeRequest bytes
  // or more, and for every large-pool request once kLargePagesOnceReserved
  // bytes are held, on devices of kLargePagesFrom bytes or more. Mid pages:
  // kMidPage, for the other large-pool requests once kMidPagesOnceReserved
  // bytes are held, on the same devices.
  static constexpr size_t kLargePage = size_t{20} << 20;
  static constexpr size_t kLargeRequest = size_t{256} << 20;
  static constexpr size_t kLargePagesFrom = size_t{8} << 30;
  static constexpr size_t kLargePagesOnceReserved = size_t{8} << 30;
  static constexpr size_t kMidPage = size_t{8} << 20;
  static constexpr size_t kMidPagesOnceReserved = size_t{2} << 30;
  static constexpr size_t kTriggerMemory = 16;
  static constexpr uint64_t kLoopPeriods = 8;

  VmArena(Backend& backend, int device, std::pmr::memory_resource* mr) : backend_(backend), device_(device), mr_(mr) {}
  ~VmArena();  // unmaps every mapped run and ends every reservation
  VmArena(const VmArena&) = delete;
  VmArena& operator=(const VmArena&) = delete;

  // Whether a request of `owner` (nullptr: the default pool) grows in an
  // expandable segment: only the default pool's, and only when configured.
  static bool serves(bool expandable_segments, const PrivatePool* owner) {
    return expandable_segments && owner == nullptr;
  }

  // The page a request of `rounded` bytes of `pool` grows in, on a device of
  // `capacity` bytes whose allocator holds `held` bytes (the more of its
  // reserved bytes now and its allocated high-water mark), for a backend of
  // `granularity`: the granularity for the small pool and on devices under
  // kLargePagesFrom; large_page() for large requests or once
  // kLargePagesOnceReserved is held; mid_page() once kMidPagesOnceReserved
  // is held; the granularity otherwise. Always a multiple of the granularity.
  static size_t page_for(PoolKind pool, size_t rounded, size_t capacity, size_t held, size_t granularity) {
    if (pool != PoolKind::kLarge || capacity < kLargePagesFrom) return granularity;
    if (rounded >= kLargeRequest || held >= kLargePagesOnceReserved) return large_page(granularity);
    if (held >= kMidPagesOnceReserved) return mid_page(granularity);
    return granularity;
  }
  // The large page: kLargePage rounded up to the granularity.
  static size_t large_page(size_t granularity) {
    return static_cast<size_t>(round_up(std::max(kLargePage, granularity), granularity));
  }
  // The mid page: kMidPage rounded up to the granularity.
  static size_t mid_page(size_t granularity) {
    return static_cast<size_t>(round_up(std::max(kMidPage, granularity), granularity));
  }
  // Whether `page` is one that page_for() gives `pool` (the granularity, or
  // for the large pool also the mid or large page): what reserve() accepts
  // and validate() checks.
  static bool page_of_pool(PoolKind pool, size_t page, size_t granularity) {
    return page > 0 && (page == granularity || (pool == PoolKind::kLarge &&
                                                (page == mid_page(granularity) || page == large_page(granularity))));
  }

  bool empty() const { return segments_.empty(); }
  // The backend refused virtual memory once: plain segments from then on.
  bool unavailable() const { return unavailable_; }
  // The backend's granularity, read once (throws the backend's DriverError
  // when it has no virtual memory).
  size_t granularity();
  size_t allocated_hwm() const { return allocated_hwm_; }
  size_t slack_divisor() const { return slack_divisor_; }
  size_t slack_cap() const { return slack_cap_; }

  // A reservation of capacity() bytes (rounded up to whole pages) for
  // (stream, pool) in pages of `page` bytes (page_for()'s; 0 only when the
  // granularity could not be read), oldest last, spanned by one unmapped
  // block from make_block(). nullptr when the address space is exhausted (a
  // plain segment this time), or when the backend has no virtual memory (a
  // message on stderr; unavailable() from then on; capacity() runs inside
  // that guard, so its DriverError counts as none too).
  template <class Capacity, class MakeBlock>
  VmSegment* reserve(Stream stream, PoolKind pool, size_t page, Capacity&& capacity, MakeBlock&& make_block);

  // The cheapest room for `rounded` bytes in `seg`: an unmapped block
  // extended from its start (growing its free prev) or from its end
  // (growing its free next), or mapped whole (joining both); fewest pages
  // first, then lowest address. room.hole == nullptr: none.
  VmRoom find_room(const VmSegment& seg, size_t rounded);
  // The same over every segment of (stream, pool) in pages of `page` bytes,
  // the oldest first on a tie; nullptr (and *room empty) when none has room.
  VmSegment* find_room(Stream stream, PoolKind pool, size_t page, size_t rounded, VmRoom* room);

  // The reuse-free-pages rule: records allocated + rounded in the
  // high-water mark, then returns how many of the room_bytes about to be
  // mapped would take reserved bytes above the ceiling (0: none), after
  // the loop rule above. `at`: the allocator's count of allocations so far
  // (the request's position); `page`: the page of the room's segment.
  size_t over_ceiling(size_t allocated, size_t reserved, size_t rounded, size_t room_bytes, uint64_t at, size_t page);

  // Maps room (room.bytes > 0) of seg: carves [lo, lo + bytes) out of its
  // hole with split(b, offset) -> upper part, and returns that block, now
  // mapped (in no list, not yet merged with its free neighbours);
  // *runs_delta: mapped runs added. nullptr when the device is out of memory.
  template <class Split>
  Block* map(VmSegment& seg, const VmRoom& room, Split&& split, int* runs_delta);

  // Unmaps [lo, hi) (whole pages) of the free block f (in no list), its
  // pages given back or kept (`how`): split carves it out, absorb(b, n)
  // merges the unmapped neighbour n into b (and deletes n).
  template <class Split, class Absorb>
  VmUnmapped unmap(Block* f, std::uintptr_t lo, std::uintptr_t hi, Unmapping how, Split&& split, Absorb&& absorb);

  // Unmaps free whole pages of the expandable blocks on `stream` in `lists`,
  // at least `want` bytes when there are that many (SIZE_MAX: all), never
  // from keep_a/keep_b: the largest runs first (fewest blocks cut; ties by
  // address, so replays repeat), the top pages of each (the block keeps its
  // start). kRelease synchronises the stream first; unmap_range(f, lo, hi)
  // does each (the caller's free-list bookkeeping around unmap(), with the
  // same `how`). Returns the bytes.
  template <class UnmapRange>
  size_t unmap_free_pages(std::initializer_list<const FreeList*> lists, Stream stream, size_t want, const Block* keep_a,
                          const Block* keep_b, Unmapping how, UnmapRange&& unmap_range);
  // Gives back the device memory of the pages kept (Unmapping::kKeep) that
  // no map() took since.
  void drop_spares() noexcept { backend_.vm_drop_spares(device_); }

  // The streams that have segments, each once, in segment order.
  std::vector<Stream> streams() const;
  // Ends every reservation with nothing mapped; drop(seg, hole) first takes
  // its one unmapped block (and the caller's record of it).
  template <class Drop>
  void release_unmapped(Drop&& drop);

  template <class F>
  void for_each_segment(F&& f) const {
    for (const auto& s : segments_) f(static_cast<const VmSegment&>(*s));
  }
  // Checks the invariants above that need no other state: check(condition,
  // what is wrong).
  template <class Check>
  void validate(Check&& check) const;

 private:
  struct Run {
    Block* block;
    std::uintptr_t lo, hi;  // its whole pages
  };
  // The free runs unmap_free_pages() takes from, in the order it takes them.
  std::vector<Run> free_runs(std::initializer_list<const FreeList*> lists, Stream stream, const Block* keep_a,
                             const Block* keep_b);
  void report_unavailable(const char* why);

  static std::uintptr_t round_up(std::uintptr_t n, size_t to) { return (n + to - 1) / to * to; }

  Backend& backend_;
  const int device_;
  std::pmr::memory_resource* mr_;
  std::vector<std::unique_ptr<VmSegment>> segments_;  // oldest first
  size_t granularity_ = 0;                            // the backend's granularity, read once
  bool unavailable_ = false;                          // the backend has no virtual memory: plain segments
  size_t allocated_hwm_ = 0;                          // not reset by reset_peak_stats
  size_t slack_divisor_ = kReuseSlackDivisor;         // halved by each loop found
  size_t slack_cap_ = kReuseSlackCap;                 // doubled by each loop found
  // The last requests that went over the ceiling (a ring at next_trigger_;
  // rounded 0: an empty entry): the bytes allocated and high-water mark
  // they went over at, the allocation count at their last time and its
  // distance from the time before (0: once only).
  struct Trigger {
    size_t rounded = 0;
    size_t allocated = 0;
    size_t hwm = 0;
    uint64_t at = 0;
    uint64_t gap = 0;
  };
  std::array<Trigger, kTriggerMemory> triggers_{};
  size_t next_trigger_ = 0;
};

template <class Capacity, class MakeBlock>
VmSegment* VmArena::reserve(Stream stream, PoolKind pool, size_t page, Capacity&& capacity, MakeBlock&& make_block) {
  if (unavailable_) return nullptr;
  size_t bytes = 0;
  std::uintptr_t base = 0;
  const size_t pg = page;
  try {
    const size_t cap = capacity();  // before granularity(): the order the backend sees
    const size_t g = granularity();
    MEMALLOC_EXPECTS(page_of_pool(pool, pg, g),
                     "memalloc internal error: an expandable segment's page is not one of its pool's");
    bytes = round_up(cap, pg);
    base = reinterpret_cast<std::uintptr_t>(backend_.vm_reserve(device_, bytes, pg));
  } catch (const DriverError& e) {
    report_unavailable(e.what());
    return nullptr;
  }
  if (base == 0) return nullptr;  // address space exhausted: a plain segment this time
  segments_.push_back(std::make_unique<VmSegment>(base, bytes, pg, stream, pool, mr_));
  VmSegment* seg = segments_.back().get();
  Block* hole = make_block();
  hole->addr = base;
  hole->size = bytes;
  hole->stream = stream;
  hole->pool = pool;
  hole->vm = seg;
  hole->mapped = false;
  seg->unmapped.insert(hole);
  return seg;
}

template <class Split>
Block* VmArena::map(VmSegment& seg, const VmRoom& room, Split&& split, int* runs_delta) {
  Block* hole = room.hole;
  if (!backend_.vm_map(device_, reinterpret_cast<void*>(room.lo), room.bytes)) return nullptr;
  // Carve [lo, lo + bytes) out of the hole; the rest of the hole stays unmapped.
  seg.unmapped.erase(hole);
  Block* m = hole;
  if (room.lo > hole->addr) {
    m = split(hole, room.lo - hole->addr);
    seg.unmapped.insert(hole);
  }
  if (m->size > room.bytes) seg.unmapped.insert(split(m, room.bytes));
  m->mapped = true;
  seg.mapped += room.bytes;
  *runs_delta = 1 - (m->prev != nullptr && m->prev->mapped) - (m->next != nullptr && m->next->mapped);
  return m;
}

template <class Split, class Absorb>
VmUnmapped VmArena::unmap(Block* f, std::uintptr_t lo, std::uintptr_t hi, Unmapping how, Split&& split,
                          Absorb&& absorb) {
  VmSegment& seg = *f->vm;
  VmUnmapped out;
  Block* u = f;
  if (lo > f->addr) {
    u = split(f, lo - f->addr);
    out.below = f;
  }
  if (hi < u->addr + u->size) out.above = split(u, hi - u->addr);
  if (how == Unmapping::kKeep)
    backend_.vm_detach(device_, reinterpret_cast<void*>(lo), hi - lo, seg.stream);
  else
    backend_.vm_unmap(device_, reinterpret_cast<void*>(lo), hi - lo);
  u->mapped = false;
  seg.mapped -= hi - lo;
  // Counted before the coalescing below, which would hide an unmapped
  // neighbour (it stops no run).
  out.runs_delta = -1 + (u->prev != nullptr && u->prev->mapped) + (u->next != nullptr && u->next->mapped);
  for (Block* n : {u->prev, u->next}) {
    if (n == nullptr || n->mapped) continue;
    seg.unmapped.erase(n);
    absorb(u, n);
  }
  seg.unmapped.insert(u);
  out.hole = u;
  return out;
}

template <class UnmapRange>
size_t VmArena::unmap_free_pages(std::initializer_list<const FreeList*> lists, Stream stream, size_t want,
                                 const Block* keep_a, const Block* keep_b, Unmapping how, UnmapRange&& unmap_range) {
  if (want == 0) return 0;
  const std::vector<Run> runs = free_runs(lists, stream, keep_a, keep_b);
  if (runs.empty()) return 0;
  if (how == Unmapping::kRelease) backend_.synchronize_stream(device_, stream);  // queued work may use these pages
  size_t done = 0;
  for (const Run& r : runs) {
    if (done >= want) break;
    const size_t run = r.hi - r.lo, rest = want - done;
    const size_t take = rest >= run ? run : std::min<size_t>(run, round_up(rest, r.block->vm->page));
    unmap_range(r.block, r.hi - take, r.hi);  // the top pages: the block keeps its start
    done += take;
  }
  return done;
}

template <class Drop>
void VmArena::release_unmapped(Drop&& drop) {
  for (auto it = segments_.begin(); it != segments_.end();) {
    VmSegment& seg = **it;
    if (seg.mapped != 0) {
      ++it;
      continue;
    }
    Block* hole = *seg.unmapped.begin();
    seg.unmapped.clear();
    drop(seg, hole);
    backend_.vm_free(device_, reinterpret_cast<void*>(seg.base));
    it = segments_.erase(it);
  }
}

template <class Check>
void VmArena::validate(Check&& check) const {
  check(segments_.empty() || granularity_ > 0, "an expandable segment exists but the granularity was never read");
  for (const auto& s : segments_) {
    const VmSegment& seg = *s;
    const size_t pg = seg.page;
    check(page_of_pool(seg.pool, pg, granularity_), "an expandable segment's page is not one of its pool's");
    check(pg > 0 && pg % granularity_ == 0 && seg.base % granularity_ == 0 && seg.size % pg == 0 && seg.size > 0,
          "an expandable segment is not whole pages");
    size_t unmapped = 0;
    for (const Block* b : seg.unmapped) {
      check(!b->mapped && !b->allocated && b->event_count == 0 && b->vm == &seg,
            "an expandable segment's unmapped set holds a mapped or used block");
      check((b->addr - seg.base) % pg == 0 && b->size % pg == 0, "an unmapped block is not whole pages");
      check(b->addr >= seg.base && b->addr + b->size <= seg.base + seg.size,
            "an unmapped block lies outside its reservation");
      check(b->stream == seg.stream && b->pool == seg.pool,
            "an unmapped block differs from its segment in stream/pool");
      check((b->prev == nullptr || b->prev->mapped) && (b->next == nullptr || b->next->mapped),
            "two adjacent unmapped blocks are not coalesced");
      check(b->prev == nullptr ? b->addr == seg.base : b->prev->addr + b->prev->size == b->addr,
            "an unmapped block does not follow its prev");
      check(b->next == nullptr ? b->addr + b->size == seg.base + seg.size : b->next->addr == b->addr + b->size,
            "an unmapped block does not precede its next");
      unmapped += b->size;
    }
    check(unmapped <= seg.size && seg.mapped == seg.size - unmapped,
          "an expandable segment's mapped bytes differ from its unmapped blocks");
  }
}

}  // namespace memalloc
