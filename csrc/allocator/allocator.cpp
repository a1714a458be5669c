// allocator.cpp — the fast path of DeviceAllocator: take the device lock,
// take a cached block (splitting it), account, return; and the reverse.
// Misses go to growth.cpp (malloc_slow_locked). Invariants: device_allocator.h.
#include "allocator/device_allocator.h"
#include "allocator/messages.h"
#include "common/errors.h"

namespace memalloc {

DeviceAllocator::DeviceAllocator(int device, Backend& backend, const Config& config)
    : device_(device),
      backend_(backend),
      config_(config),
      live_(blocks_.resource()),
      segments_(blocks_.resource()),
      events_(backend, device, blocks_.resource()),
      vm_(backend, device, blocks_.resource()),
      pools_(device, blocks_.resource()),
      sink_(config.max_split_size),
      limits_(config.garbage_collection_threshold) {
  live_.reserve(4096);
}

void* DeviceAllocator::malloc(size_t size, Stream stream, Caller caller) {
  if (size == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  const EventSink::CallerScope scope(sink_, caller);
  PrivatePool* owner = nullptr;
  if (pools_.any_route()) {
    owner = pools_.route(stream);
    if (config_.graph_capture_record_stream_reuse && events_.has_deferred())
      events_.reuse_in_capture(stream, to_free_list());
  } else if (!events_.idle()) {
    events_.process(to_free_list());
  }
  bool from_cache = false;
  if (size > kMaxRequest) {
    Block* b = malloc_slow_locked(size, size, stream, owner, &from_cache);
    return alloc_found_locked(b, from_cache, size, size);
  }
  size_t rounded = round_size(size, config_.divisions_for(size));
  Block* b = blocks_.lists(owner).of(pool_kind_for(rounded)).best_fit(stream, rounded, config_.max_split_size);
  if (b != nullptr) return alloc_found_locked(b, true, rounded, size);
  b = malloc_slow_locked(rounded, size, stream, owner, &from_cache);
  return alloc_found_locked(b, from_cache, rounded, size);
}

void* DeviceAllocator::alloc_found_locked(Block* b, bool from_cache, size_t size, size_t requested) {
  int64_t split_bytes_delta = 0, split_count_delta = 0;
  if (from_cache) {
    blocks_.list_of(b).erase(b);
    split_bytes_delta -= split_bytes(b);
    split_count_delta -= split_count(b);
  }
  const bool no_split = b->owner != nullptr && b->owner->no_split;
  if (!no_split && should_split(*b, size, config_.max_split_size, config_.expandable_segments)) {
    Block* rest = blocks_.split(b, size);
    blocks_.list_of(rest).insert(rest);
    split_bytes_delta += split_bytes(rest);
    split_count_delta += split_count(rest);
  }
  b->allocated = true;
  b->requested = requested;
  ++allocations_;
  live_.emplace(b->addr, b);
  if (b->owner != nullptr) b->owner->live_blocks += 1;
  Event e = block_event(Action::kAlloc, *b);
  e.inactive_split_bytes_delta = split_bytes_delta;
  e.inactive_split_count_delta = split_count_delta;
  b->id = sink_.record_alloc(e);
  return reinterpret_cast<void*>(b->addr);
}

void DeviceAllocator::free(void* ptr, Caller caller) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = live_.find(addr);
  if (it == live_.end())
    throw InvalidPointer(unknown_pointer_message("free", addr, device_, segments_.containing(addr) != segments_.end()));
  const EventSink::CallerScope scope(sink_, caller);
  free_live_locked(it);
}

bool DeviceAllocator::free_if_owned(void* ptr, Caller caller) {
  if (ptr == nullptr) return true;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == live_.end()) return false;
  const EventSink::CallerScope scope(sink_, caller);
  free_live_locked(it);
  return true;
}

void DeviceAllocator::free_live_locked(LiveTable::iterator it) {
  Block* b = it->second;
  live_.erase(it);
  b->allocated = false;
  if (b->owner != nullptr) b->owner->live_blocks -= 1;
  sink_.record(block_event(Action::kFreeRequested, *b));
  if (b->stream_uses.empty()) {
    free_block_locked(b, /*at_once=*/true);  // both records, one time stamp
    return;
  }
  if (pools_.any_route()) {
    events_.defer(b, config_.graph_capture_record_stream_reuse);  // no event may be recorded during a capture
  } else {
    events_.insert(b);
  }
}

// Returns a no-longer-active block to its free list, merging free neighbours.
void DeviceAllocator::free_block_locked(Block* b, bool at_once) {
  FreeList& list = blocks_.list_of(b);
  Event e = block_event(Action::kFreeCompleted, *b);  // the block as freed, before merging
  e.at_once = at_once;
  b->id = 0;  // a block freed by its caller keeps its id until here (e has it)
  blocks_.merge_free_neighbours(b, list, e);
  b->requested = 0;
  e.inactive_split_bytes_delta += split_bytes(b);
  e.inactive_split_count_delta += split_count(b);
  list.insert(b);
  sink_.record(e);
}

}  // namespace memalloc
