// device_allocator.h — the caching allocator of one device.
//
// Layers inside: Backend (memory) -> FreeList/Block (caching policy) ->
// the consumers of the one Event stream (event_sink.h: the counters, then
// the subscriber, allocator/subscriber.h: the profiler above, which knows
// who allocated what) -> this facade (the lock).
//
// Locking: one plain std::mutex per device, taken only by the public member
// functions below. Every *_locked helper assumes it is held. No recursion,
// no other lock is taken while holding it except the backend's own (leaf).
// The GIL is never taken here.
//
// Parts with their own state, invariants and C++ unit tests (tests/cpp/),
// called under the lock, none holding a pointer back to this class (they
// act on blocks only through the callbacks it passes them):
//   Blocks (pool/blocks.h): the device's Block objects and node memory,
//     splitting and merging them, the default pool's free lists and the
//     list each free block belongs in;
//   StreamEvents (pool/stream_events.h): blocks freed after record_stream
//     wait for their streams' work, and during a capture for its end or its
//     graph (capture_reuse.h);
//   SegmentTable (pool/segment_table.h): every segment by address, its owner
//     and bytes, "which segment holds address a", segment counts per pool;
//   PrivatePools (pool/private_pools.h): the private pools by id, their use
//     counts, the open routes (which pool an allocation goes to) and the
//     checks of the pool calls;
//   VmArena (pool/vm_arena.h): the expandable segments' reservations, page
//     size, room search, reuse ceiling, and the free runs to unmap;
//   Limits (pool/limits.h): the memory fraction's cap, the threshold
//     policy, the device's capacity read once;
//   EventSink (event_sink.h): where every Event goes, the counters then the
//     subscriber, with the public call's caller;
//   Expandable (expandable.h): growth by mapping the room VmArena finds and
//     release of free pages, over the parts above (references to them, not
//     to this class; the capacity and the threshold policy as callbacks);
//   PoolCheckpoints (pool_checkpoints.h): a private pool's live-block check,
//     checkpoint and restore (CUDA graph trees), over the parts above, this
//     class's free path as callbacks.
// This class orchestrates them: whatever changes blocks, free lists or the
// counters across parts (the fast path, growth and release of plain
// segments, the OOM path and its use_on_oom fallback) is here.
//
// Files: allocator.cpp holds the fast path (malloc/free of cached blocks),
// growth.cpp the slow path (growth, release, OOM, empty_cache, segments),
// validate.cpp validate(), stream_uses.cpp record_stream and the
// StreamEvents part, views.cpp the read-only views of blocks (the largest
// free block, the segment of a pointer), pool_checkpoints.cpp the
// PoolCheckpoints part, expandable.cpp the Expandable part,
// messages.cpp the errors' words, subscriber.cpp set_subscriber.
// Parts the boundary drives directly, under this lock: PrivatePools
// (with_pools: create, routes, release, use counts, flags) and
// PoolCheckpoints (with_checkpoints); with_limits and with_accounting
// reach Limits and the counters the same way.
//
// Capture: while any route is open (capturing() is true) the allocator makes
// no call that a CUDA stream capture forbids: it queries and synchronizes no
// event (frees that need stream events are deferred until no route is open),
// releases no segment (no empty_cache, no garbage collection, no release-
// and-retry before an OOM), and the backend obtains new segments in the
// relaxed capture mode (backend.h).
//
// Invariants (checked by validate()):
//   reserved_bytes  == sum of segment sizes (an expandable segment's
//                      mapped bytes)
//   allocated_bytes == sum of live block sizes;  requested_bytes likewise
//   active_bytes    == allocated_bytes + pending block bytes
//   reserved_bytes  == active_bytes + free block bytes
//   inactive_split_bytes == bytes of free blocks inside split segments
//   every segment has one owner (default pool or a PrivatePool); its free
//   blocks are in that owner's lists only (private_pool.h)
//   a segment is obtained only while reserved + segment <= the memory
//   fraction's cap (limits.h); lowering the fraction later releases nothing.
//   the step window's peaks (accounting.h) >= allocated / reserved bytes
//   a free block's subscriber id is 0 (subscriber.h); the subscriber's own
//   view of the live and pending blocks agrees (Subscriber::validate)
// plus the tiling and coalescing invariants of block.h and the parts' own
// (stream_events.h, segment_table.h, private_pools.h, vm_arena.h), which
// validate() checks through each part's validate(check).
#pragma once

#include <map>
#include <memory>
#include <memory_resource>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "accounting/accounting.h"
#include "allocator/event_sink.h"
#include "allocator/expandable.h"
#include "allocator/pool_checkpoints.h"
#include "allocator/subscriber.h"
#include "backend/backend.h"
#include "pool/block.h"
#include "pool/blocks.h"
#include "common/config.h"
#include "pool/events.h"
#include "pool/limits.h"
#include "pool/private_pool.h"
#include "pool/private_pools.h"
#include "pool/segment_table.h"
#include "pool/stream_events.h"
#include "pool/vm_arena.h"

namespace memalloc {

struct BlockInfo {
  std::uintptr_t addr;
  size_t size;
  size_t requested;
  const char* state;  // "active_allocated" | "active_pending_free" | "inactive"
  uint64_t note;      // its subscriber's note (subscriber.h; 0 for an inactive one)
};

struct SegmentInfo {
  std::uintptr_t addr;
  size_t size;
  Stream stream;
  PoolKind pool;
  PoolId owner;     // kDefaultPool or the private pool that owns it
  bool expandable;  // a mapped run of an expandable segment (vm_arena.h)
  std::vector<BlockInfo> blocks;
  size_t page = 0;  // expandable: the bytes its reservation maps and unmaps at a time (0: plain)
};

class DeviceAllocator {
 public:
  DeviceAllocator(int device, Backend& backend, const Config& config);
  ~DeviceAllocator();  // returns every segment to the backend
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // Returns a block of at least `size` bytes usable on `stream`; nullptr for
  // size 0 (counted nowhere). Throws OutOfMemory when even a released cache
  // cannot satisfy it.
  // `caller`: handed to the subscriber unread (subscriber.h).
  void* malloc(size_t size, Stream stream, Caller caller = nullptr);
  // Frees a pointer returned by malloc. Throws InvalidPointer for a pointer
  // that is not live here (double free, unknown, interior); counters are
  // unchanged then. free(nullptr) does nothing.
  void free(void* ptr, Caller caller = nullptr);
  // free() of a pointer that may belong to another device: false (and
  // nothing changed) when no live block of this device starts at ptr.
  bool free_if_owned(void* ptr, Caller caller = nullptr);
  // Marks a live block as used on `stream`; its memory is reused only after
  // the work queued on `stream` when it is freed has completed.
  void record_stream(void* ptr, Stream stream);

  // Waits for pending cross-stream frees, then returns to the backend every
  // fully free segment of `pool`: for kDefaultPool (torch.cuda.empty_cache)
  // the default pool's and every freeable private pool's; for a private
  // pool its own, when it is freeable (use count 0, as native); none for an
  // unknown pool. Returns the bytes released; 0 while capturing().
  size_t empty_cache(Caller caller = nullptr, PoolId pool = kDefaultPool);

  // ---- the parts the boundary drives directly, under the device lock ------
  // Each runs f(part) with the lock held and returns what f returns; f must
  // not call back into this allocator.
  // The private pools (private_pools.h; torch's MempoolId_t calls): create
  // or add a use (create_or_incref, with a SegmentSource), routes
  // (begin_route/end_route: graph capture, use_mem_pool), release, use
  // counts, the use_on_oom and no_split flags, any_route() ("capturing").
  template <class F>
  decltype(auto) with_pools(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    return f(pools_);
  }
  // The subscriber (subscriber.h), set once before any allocation, never
  // while a block is live (InvalidArgument then); nullptr: none. It must
  // outlive this allocator's last call.
  void set_subscriber(Subscriber* s);
  // f() with the device lock held, so that the subscriber's state, which
  // only the allocator's calls change, holds still; returns what f returns.
  template <class F>
  decltype(auto) locked(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    return f();
  }
  // f(id) under the lock: `id` is the subscriber's id of the live block
  // starting at ptr, 0 when no live block starts there.
  template <class F>
  decltype(auto) with_live_id(std::uintptr_t ptr, F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(ptr);
    return f(it != live_.end() ? it->second->id : Subscriber::Id{0});
  }
  // The limits (limits.h): the memory fraction (set_fraction with the
  // device's total bytes, mem_get_info().total; fraction(), its cap()), the
  // threshold policy (set_gc_threshold, gc_threshold: before a new segment
  // would take reserved bytes above threshold * limit, every fully free
  // cached segment is released; it starts at
  // config.garbage_collection_threshold).
  template <class F>
  decltype(auto) with_limits(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    return f(limits_);
  }

  // The private pools' blocks (pool_checkpoints.h: torch's
  // checkPoolLiveAllocations, a pool's checkpoint and its restore, for CUDA
  // graph trees): f(PoolCheckpoints&) under the lock, the part made over
  // this device's parts with this allocator's free path as its callbacks;
  // `caller` is handed to the subscriber for what a restore frees and makes
  // live.
  template <class F>
  decltype(auto) with_checkpoints(F&& f, Caller caller = nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    const EventSink::CallerScope scope(sink_, caller);
    PoolCheckpoints part(
        blocks_, live_, segments_, events_, pools_, sink_, allocations_,
        [this](Block* b) { free_live_locked(live_.find(b->addr)); }, [this] { events_.synchronize(to_free_list()); });
    return f(part);
  }

  // ---- read-only views (views.cpp) ----------------------------------------------
  // Size of the largest free cached block, private pools included (bytes;
  // native's cacheInfo counts them too).
  size_t largest_free_block();
  // The segment holding the live block at ptr: {base, bytes} (in an
  // expandable segment: its mapped run, which starts on a page of it,
  // *expandable = true and its page size in *page), and the block's own
  // size in *block_bytes when asked; false when no live block of this
  // device starts at ptr. segment_of(ptr) alone asks only that (whether
  // this device owns ptr; one lookup, no walk of the run).
  bool segment_of(void* ptr, std::uintptr_t* base = nullptr, size_t* bytes = nullptr, bool* expandable = nullptr,
                  size_t* block_bytes = nullptr, size_t* page = nullptr);

  // torch.cuda.memory._set_allocator_settings at run time: the settings of
  // `from` that torch lets a running allocator change (max_split_size,
  // roundup_power2_divisions, garbage_collection_threshold,
  // expandable_segments for new segments) replace this device's.
  void apply_settings(const Config& from);
  // This device's current settings (a copy, under the lock).
  Config settings();

  DeviceStats stats();
  // The counters (accounting.h) under the lock: f(Accounting&) resets their
  // peaks (reset_peak) or accumulated figures (reset_accumulated), or takes
  // the step tracker's window (take_window: the peaks of allocated and
  // reserved bytes and the OOMs since the previous take, independent of
  // the resets).
  template <class F>
  decltype(auto) with_accounting(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    return f(sink_.accounting());
  }

  MemInfo mem_get_info();
  std::vector<SegmentInfo> segments();
  // Throws memalloc::Error naming the first broken invariant.
  void validate();

  int device() const { return device_; }

 private:
  // allocator.cpp
  void* alloc_found_locked(Block* b, bool from_cache, size_t size, size_t requested);
  // `at_once`: the free completes in the call that requested it.
  void free_block_locked(Block* b, bool at_once = false);
  // The caller freed the live block at `it`.
  void free_live_locked(LiveTable::iterator it);
  // growth.cpp
  // A block for `rounded` bytes after a cache miss in `owner`'s lists; sets
  // *from_cache when it is a cached free block (use_on_oom pools).
  Block* malloc_slow_locked(size_t rounded, size_t requested, Stream stream, PrivatePool* owner, bool* from_cache);
  Block* grow_locked(size_t rounded, Stream stream, PrivatePool* owner);
  // The "threshold" policy (limits.h) before reserved bytes grow by `bytes`:
  // releases the cache when it asks for it (never while a route is open).
  void maybe_collect_locked(size_t bytes);
  // The device's total bytes (read from the backend once: limits.h).
  size_t capacity_locked() {
    return limits_.capacity([this] { return backend_.mem_get_info(device_).total; });
  }
  // Releases the fully free segments of `only` (a private pool), or of the
  // default pool and every freeable private pool when `only` is nullptr.
  size_t release_cached_locked(PrivatePool* only = nullptr);
  bool release_segment_locked(Block* b);
  // The free lists of the default pool and of every private pool.
  std::vector<FreeLists*> all_free_lists_locked() { return pools_.all_free_lists(blocks_.lists(nullptr)); }
  // Where the StreamEvents part's completed blocks go (events_.process,
  // synchronize, reuse_in_capture): their free lists; never while a route
  // is open.
  auto to_free_list() {
    return [this](Block* b) { free_block_locked(b); };
  }

  const int device_;
  Backend& backend_;
  Config config_;  // its run-time settings change only in apply_settings (under mu_)

  std::mutex mu_;
  // Blocks and the device's node memory (blocks.h): declared before every
  // container that uses it, destroyed last.
  Blocks blocks_;
  LiveTable live_;
  SegmentTable segments_;  // every segment: addr -> bytes, owner, expandable segment
  StreamEvents events_;    // blocks freed after record_stream, waiting for their streams' work
  // The expandable segments. Declared after blocks_, whose blocks its
  // destructor still reads, and after events_: the backend sees the
  // reservations end before the events are destroyed, as it always has.
  VmArena vm_;
  PrivatePools pools_;  // the private pools and the open routes
  // Where every Event goes (event_sink.h): the counters, then the
  // subscriber, with the public call's caller.
  EventSink sink_;
  uint64_t allocations_ = 0;  // blocks made live so far (malloc, restore): the arena's clock (vm_arena.h)
  Limits limits_;             // the memory fraction, the threshold policy, the capacity
};

// Caps `a`'s reserved bytes at fraction * the device's total bytes
// (0 <= fraction <= 1; limits.h), through its public calls: the fraction is
// checked before the backend is asked for the total (InvalidArgument).
inline void set_memory_fraction(DeviceAllocator& a, double fraction) {
  Limits::check_fraction(fraction);
  const size_t total = a.mem_get_info().total;
  a.with_limits([&](Limits& limits) { limits.set_fraction(fraction, total); });
}

}  // namespace memalloc
