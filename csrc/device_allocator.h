// device_allocator.h — the caching allocator of one device.
//
// Layers inside: Backend (memory) -> FreeList/Block (caching policy) ->
// Accounting (counters, fed by record_locked) -> this facade (the lock).
//
// Locking: one plain std::mutex per device, taken only by the public member
// functions below. Every *_locked helper assumes it is held. No recursion,
// no other lock is taken while holding it except the backend's own (leaf).
// The GIL is never taken here.
//
// Files: allocator.cpp holds the fast path (malloc/free of cached blocks),
// pool.cpp the slow path (growth, release, OOM, empty_cache, validate,
// segments), stream_uses.cpp the cross-stream rules (record_stream, events).
//
// Invariants (checked by validate()):
//   reserved_bytes  == sum of segment sizes
//   allocated_bytes == sum of live block sizes;  requested_bytes likewise
//   active_bytes    == allocated_bytes + pending block bytes
//   reserved_bytes  == active_bytes + free block bytes
//   inactive_split_bytes == bytes of free blocks inside split segments
//   a segment is obtained only while reserved + segment <= allowed_max_
//   (memory fraction); lowering the fraction later releases nothing.
//   the step window's peaks (accounting.h) >= allocated / reserved bytes
// plus the tiling and coalescing invariants of block.h.
#pragma once

#include <map>
#include <memory_resource>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "accounting.h"
#include "backend.h"
#include "block.h"
#include "config.h"
#include "events.h"
#include "node_cache.h"
#include "recorder.h"

namespace memalloc {

struct BlockInfo {
  std::uintptr_t addr;
  size_t size;
  size_t requested;
  const char* state;  // "active_allocated" | "active_pending_free" | "inactive"
  uint32_t stack_id;  // who allocated it (live and pending blocks)
  uint32_t tag_id;
};

// One live allocation (a block the caller has not freed), for leak tracking.
struct LiveBlock {
  std::uintptr_t addr;
  size_t size;
  size_t requested;
  uint32_t stack_id;
  uint32_t tag_id;
  uint32_t step;  // step count when it was allocated
};

struct SegmentInfo {
  std::uintptr_t addr;
  size_t size;
  Stream stream;
  PoolKind pool;
  std::vector<BlockInfo> blocks;
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
  void* malloc(size_t size, Stream stream, const CallContext& ctx = CallContext{});
  // Frees a pointer returned by malloc. Throws InvalidPointer for a pointer
  // that is not live here (double free, unknown, interior); counters are
  // unchanged then. free(nullptr) does nothing.
  void free(void* ptr, const CallContext& ctx = CallContext{});
  // Marks a live block as used on `stream`; its memory is reused only after
  // the work queued on `stream` when it is freed has completed.
  void record_stream(void* ptr, Stream stream);
  // True when `ptr` is the start of a live block of this device.
  bool owns(void* ptr);

  // Waits for pending cross-stream frees, then returns every fully free
  // segment to the backend. Returns the bytes released.
  size_t empty_cache(const CallContext& ctx = CallContext{});
  // Caps reserved bytes at fraction * device capacity (0 < fraction <= 1).
  void set_memory_fraction(double fraction);
  double memory_fraction();
  // Empty-cache policy "threshold": before a new segment would take reserved
  // bytes above threshold * limit (the memory-fraction limit when one is set,
  // else the device capacity), every fully free cached segment is released.
  // 0 disables (0 <= threshold < 1). Starts at config.garbage_collection_threshold.
  void set_gc_threshold(double threshold);
  double gc_threshold();

  DeviceStats stats();
  void reset_peak_stats();
  void reset_accumulated_stats();
  // Peaks of allocated/reserved bytes and OOMs since the previous call (the
  // step tracker's window, independent of reset_peak_stats and
  // reset_accumulated_stats); starts the next window at the current values.
  StepWindow take_window();
  MemInfo mem_get_info();
  std::vector<SegmentInfo> segments();
  // Throws memalloc::Error naming the first broken invariant.
  void validate();

  int device() const { return device_; }

  // Event recording into the ring (recorder.h): capacity 0 turns it off.
  // Enabling allocates the ring once; recording itself never allocates.
  void set_recording(size_t capacity);
  // Stored records oldest first, and how many were overwritten.
  std::vector<TraceRecord> trace(uint64_t* dropped);
  // (stack_id, tag_id) of the live block at ptr; false when none.
  bool block_origin(void* ptr, uint32_t* stack_id, uint32_t* tag_id);
  // Every live allocation, in no particular order (copied under the lock).
  std::vector<LiveBlock> live_blocks();

 private:
  struct Pending {
    EventHandle event;
    Block* block;
  };

  // allocator.cpp
  void* alloc_found_locked(Block* b, bool from_cache, size_t size, size_t requested);
  void free_block_locked(Block* b);
  void record_locked(const Event& e) {
    accounting_.apply(e);
    if (ring_.enabled()) trace_locked(e);
  }
  void trace_locked(const Event& e) noexcept;
  FreeList& free_list(PoolKind k) { return k == PoolKind::kSmall ? small_ : large_; }
  Block* new_block();
  void delete_block(Block* b);
  // pool.cpp
  Block* malloc_slow_locked(size_t rounded, size_t requested, Stream stream);
  Block* grow_locked(size_t rounded, Stream stream);
  void maybe_collect_locked(size_t bytes);
  size_t release_cached_locked();
  bool release_segment_locked(Block* b);
  std::string oom_message_locked(size_t requested, size_t rounded);
  // Why `addr` is not a live allocation, for the failed `call` ("free",
  // "record_stream"): the message starts "<call> of 0x...".
  std::string unknown_pointer_message_locked(const char* call, std::uintptr_t addr);
  // stream_uses.cpp
  void insert_events_locked(Block* b);
  void process_events_locked();
  void synchronize_events_locked();

  const int device_;
  Backend& backend_;
  const Config config_;

  std::mutex mu_;
  // Declared before every container that uses it: destroyed last.
  NodeCache mr_;
  FreeList small_;
  FreeList large_;
  std::pmr::unordered_map<std::uintptr_t, Block*> live_;
  std::pmr::map<std::uintptr_t, size_t> segments_;  // addr -> bytes
  std::pmr::vector<Pending> pending_;
  std::pmr::vector<EventHandle> spare_events_;
  Accounting accounting_;
  TraceRing ring_;
  CallContext ctx_;  // the public call in progress (valid under mu_)
  double fraction_ = 0.0;  // 0 = no limit set
  size_t allowed_max_ = static_cast<size_t>(-1);
  double gc_threshold_ = 0.0;  // 0 = policy off
  size_t capacity_ = 0;        // device total bytes, read once when first needed
};

}  // namespace memalloc
