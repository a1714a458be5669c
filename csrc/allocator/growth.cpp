// growth.cpp — the slow path of DeviceAllocator: growth from the backend,
// release of cached segments, the OOM retry and message, empty_cache, the
// memory fraction, and the read-only views (stats, segments). Segments enter
// and leave the SegmentTable (segment_table.h) here and in expandable.cpp.
// Invariants: device_allocator.h and block.h. A message about a pointer that
// is not live names the call that failed ("free of 0x...", "record_stream of
// 0x...") and what to do instead.
#include <algorithm>
#include <cstdio>
#include <set>

#include "allocator/device_allocator.h"
#include "allocator/messages.h"
#include "common/errors.h"

namespace memalloc {

DeviceAllocator::~DeviceAllocator() {
  for (auto& seg : segments_)
    if (seg.second.vm == nullptr) backend_.release(device_, reinterpret_cast<void*>(seg.first), seg.second.bytes);
  // Expandable segments: vm_'s destructor unmaps and ends them.
  // Block objects live in blocks_'s node memory, released at once when it is destroyed.
}

// Obtains a new segment big enough for `rounded` bytes for `owner` (nullptr:
// the default pool); nullptr when the backend or the memory fraction refuses.
Block* DeviceAllocator::grow_locked(size_t rounded, Stream stream, PrivatePool* owner) {
  const size_t bytes = segment_size_for(rounded);
  maybe_collect_locked(bytes);
  if (!limits_.admits(sink_.reserved_bytes(), bytes)) return nullptr;
  void* p =
      owner != nullptr && owner->source ? owner->source->allocate(bytes, stream) : backend_.allocate(device_, bytes);
  if (p == nullptr) return nullptr;
  if (!segments_.insert(reinterpret_cast<std::uintptr_t>(p), Segment{bytes, owner, nullptr}))
    throw Error("memalloc internal error: the backend returned a segment that overlaps another one");
  Block* b = blocks_.make();
  b->addr = reinterpret_cast<std::uintptr_t>(p);
  b->size = bytes;
  b->stream = stream;
  b->pool = pool_kind_for(rounded);
  b->owner = owner;
  Event e = block_event(Action::kSegmentAlloc, *b);
  sink_.record(e);
  return b;
}

void DeviceAllocator::maybe_collect_locked(size_t bytes) {
  if (!limits_.collecting() || pools_.any_route()) return;
  const auto reserved = sink_.reserved_bytes();
  if (!limits_.wants_collection(reserved, bytes, [this] { return capacity_locked(); })) return;
  Event e;
  e.action = Action::kGcRelease;
  e.size = release_cached_locked();
  sink_.record(e);
}

// Cache miss: grow; on refusal release the whole cache and retry once (not
// during a capture); then try the free blocks of use_on_oom pools; then
// raise OutOfMemory (after recording it).
Block* DeviceAllocator::malloc_slow_locked(size_t rounded, size_t requested, Stream stream, PrivatePool* owner,
                                           bool* from_cache) {
  *from_cache = false;
  const bool fits = rounded <= kMaxRequest;
  // A new segment, or pages mapped into an expandable one (then the block
  // is a cached free block).
  auto grow = [&]() -> Block* {
    if (VmArena::serves(config_.expandable_segments, owner)) {
      bool no_vm = false;
      // The Expandable part over this device's parts (references only: made
      // per call, on the slow path).
      Block* v =
          Expandable(vm_, segments_, blocks_, sink_, limits_, pools_)
              .grow(
                  rounded, stream, Expandable::Policy{config_.reuse_free_pages, allocations_},
                  [this] { return capacity_locked(); }, [this](size_t bytes) { maybe_collect_locked(bytes); }, &no_vm);
      *from_cache = v != nullptr;
      if (!no_vm) return v;
    }
    return grow_locked(rounded, stream, owner);
  };
  Block* b = fits ? grow() : nullptr;
  if (b == nullptr && fits && !pools_.any_route()) {
    Event retry;
    retry.action = Action::kAllocRetry;
    retry.pool = pool_kind_for(rounded);
    retry.size = rounded;
    sink_.record(retry);
    release_cached_locked();
    b = grow();
  }
  if (b == nullptr && fits && owner == nullptr) {
    b = pools_.oom_fallback(rounded, stream, config_.max_split_size);
    *from_cache = b != nullptr;
  }
  if (b != nullptr) return b;
  Event oom;
  oom.action = Action::kOom;
  oom.pool = pool_kind_for(rounded);
  oom.stream = stream;
  oom.size = rounded;
  oom.requested = requested;
  oom.addr = backend_.mem_get_info(device_).free;  // kOom: addr = device free bytes then
  sink_.record(oom);
  throw OutOfMemory(
      oom_message(backend_, device_, sink_.stats(), limits_, config_.expandable_segments, requested, rounded));
}

// Returns a whole free segment to the backend. When the backend refuses, the
// segment stays cached (still counted as reserved) and a later release
// retries it: nothing is lost from the books.
bool DeviceAllocator::release_segment_locked(Block* b) {
  void* ptr = reinterpret_cast<void*>(b->addr);
  const bool released = b->owner != nullptr && b->owner->source ? b->owner->source->release(ptr, b->size)
                                                                : backend_.release(device_, ptr, b->size);
  if (!released) {
    std::fprintf(stderr,
                 "memalloc: the %s backend refused to release segment %s of %zu bytes on device %d; "
                 "it stays cached\n",
                 backend_.name(), hex_address(b->addr).c_str(), b->size, device_);
    sink_.record(block_event(Action::kSegmentFreeFailed, *b));
    return false;
  }
  blocks_.list_of(b).erase(b);
  segments_.erase(b->addr);
  Event e = block_event(Action::kSegmentFree, *b);
  sink_.record(e);
  blocks_.destroy(b);
  return true;
}

// Completes pending frees, then returns every fully free segment of `only`,
// or of the default pool and the freeable private pools. Never while a
// route is open (the callers check capturing()).
size_t DeviceAllocator::release_cached_locked(PrivatePool* only) {
  Event sync;
  sync.action = Action::kSyncAllStreams;
  sink_.record(sync);
  events_.synchronize(to_free_list());
  std::vector<FreeLists*> sources;
  if (only != nullptr) {
    sources.push_back(&only->lists);
  } else {
    sources.push_back(&blocks_.lists(nullptr));
    for (auto& kv : pools_)
      if (PrivatePools::freeable(*kv.second)) sources.push_back(&kv.second->lists);
  }
  std::vector<Block*> whole;
  for (FreeLists* l : sources)
    for (FreeList* list : {&l->small, &l->large})
      for (Block* b : list->blocks())
        if (!b->is_split() && b->vm == nullptr) whole.push_back(b);
  size_t released = 0;
  for (Block* b : whole) {
    const size_t bytes = b->size;
    if (release_segment_locked(b)) released += bytes;
  }
  if (only == nullptr) released += Expandable(vm_, segments_, blocks_, sink_, limits_, pools_).release();
  pools_.delete_unused();
  return released;
}

size_t DeviceAllocator::empty_cache(Caller caller, PoolId id) {
  std::lock_guard<std::mutex> lock(mu_);
  const EventSink::CallerScope scope(sink_, caller);
  if (pools_.any_route()) return 0;  // a capture may be under way: no free, no sync
  size_t released = 0;
  if (id == kDefaultPool) {
    released = release_cached_locked();
  } else if (PrivatePool* pool = pools_.find(id); pool != nullptr && PrivatePools::freeable(*pool)) {
    released = release_cached_locked(pool);
  }
  Event e;
  e.action = Action::kEmptyCache;
  e.size = released;
  sink_.record(e);
  return released;
}

void DeviceAllocator::apply_settings(const Config& from) {
  std::lock_guard<std::mutex> lock(mu_);
  config_.max_split_size = from.max_split_size;
  config_.roundup_power2_divisions = from.roundup_power2_divisions;
  config_.garbage_collection_threshold = from.garbage_collection_threshold;
  config_.expandable_segments = from.expandable_segments;
  config_.graph_capture_record_stream_reuse = from.graph_capture_record_stream_reuse;
  limits_.set_gc_threshold(from.garbage_collection_threshold);
  int64_t blocks = 0, segments = 0;
  for (const auto& kv : live_) blocks += Accounting::oversize(kv.second->size, from.max_split_size) ? 1 : 0;
  for (const auto& kv : segments_)  // plain segments: expandable ones count no oversize segment
    segments += kv.second.vm == nullptr && Accounting::oversize(kv.second.bytes, from.max_split_size) ? 1 : 0;
  sink_.accounting().set_max_split_size(from.max_split_size, blocks, segments);
}

Config DeviceAllocator::settings() {
  std::lock_guard<std::mutex> lock(mu_);
  return config_;
}

DeviceStats DeviceAllocator::stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return sink_.stats();
}

MemInfo DeviceAllocator::mem_get_info() {
  std::lock_guard<std::mutex> lock(mu_);
  return backend_.mem_get_info(device_);
}

std::vector<SegmentInfo> DeviceAllocator::segments() {
  std::lock_guard<std::mutex> lock(mu_);
  const std::map<std::uintptr_t, Block*> blocks = mapped_blocks(live_, events_, all_free_lists_locked());
  std::vector<SegmentInfo> out;
  for (auto& seg : segments_) {
    const PoolId owner = seg.second.owner != nullptr ? seg.second.owner->id : kDefaultPool;
    const bool expandable = seg.second.vm != nullptr;
    // A plain segment is one SegmentInfo; an expandable one gives one per
    // maximal mapped run (blocks holds mapped blocks only).
    SegmentInfo* info = nullptr;
    std::uintptr_t end = 0;
    for (auto it = blocks.lower_bound(seg.first); it != blocks.end() && it->first < seg.first + seg.second.bytes;
         ++it) {
      const Block* b = it->second;
      if (info == nullptr || (expandable && b->addr != end)) {
        out.push_back(
            SegmentInfo{b->addr, 0, b->stream, b->pool, owner, expandable, {}, expandable ? seg.second.vm->page : 0});
        info = &out.back();
      }
      const char* state = b->allocated ? "active_allocated" : b->event_count > 0 ? "active_pending_free" : "inactive";
      info->blocks.push_back(BlockInfo{b->addr, b->size, b->requested, state, sink_.note(b->id)});
      info->size += b->size;
      end = b->addr + b->size;
    }
  }
  return out;
}

}  // namespace memalloc
