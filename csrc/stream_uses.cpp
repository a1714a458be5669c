// stream_uses.cpp — cross-stream safety (torch's record_stream semantics).
//
// A block freed after record_stream(s) is not reusable until the work queued
// on every recorded stream s at free time has completed. On free one event is
// recorded per such stream; the block stays "pending" (active, not
// allocated, in no free list) while block->event_count > 0.
// A block freed while a capture is under way (device_allocator.h) cannot
// have its events recorded yet: it waits in deferred_, pending, with one
// extra count, until the first process_events_locked() outside a capture,
// or (graph_capture_record_stream_reuse) until the captured graph orders its
// uses before the next work of its stream (reuse_in_capture_locked).
// Invariants: event_count == number of entries of pending_ naming the block
// + 1 if deferred_ holds it; every EventHandle is in exactly one of pending_ and spare_events_ (or being
// used by the function that took it).
#include <algorithm>

#include "device_allocator.h"
#include "errors.h"

namespace memalloc {

void DeviceAllocator::record_stream(void* ptr, Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == live_.end())
    throw InvalidPointer(unknown_pointer_message_locked("record_stream", reinterpret_cast<std::uintptr_t>(ptr)));
  Block* b = it->second;
  if (stream == b->stream) return;
  auto& uses = b->stream_uses;
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
}

void DeviceAllocator::insert_events_locked(Block* b) {
  for (Stream s : b->stream_uses) {
    EventHandle ev;
    if (spare_events_.empty()) {
      ev = backend_.create_event(device_);
    } else {
      ev = spare_events_.back();
      spare_events_.pop_back();
    }
    backend_.record_event(device_, ev, s);
    b->event_count += 1;
    pending_.push_back(Pending{ev, b});
  }
  b->stream_uses.clear();
}

// Records the events of deferred frees, then frees the blocks whose events
// have all completed (non-blocking).
void DeviceAllocator::process_events_locked() {
  for (Block* b : deferred_) {
    b->event_count -= 1;
    insert_events_locked(b);
  }
  deferred_.clear();
  capture_reuse_.clear();
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending p = pending_[i];
    if (!backend_.query_event(device_, p.event)) {
      pending_[kept++] = p;
      continue;
    }
    spare_events_.push_back(p.event);
    if (--p.block->event_count == 0) free_block_locked(p.block);
  }
  pending_.resize(kept);
}

void DeviceAllocator::reuse_in_capture_locked(Stream stream) {
  if (!capture_reuse_.refresh(stream)) return;
  size_t kept = 0;
  for (Block* b : deferred_) {
    if (b->stream != stream || !capture_reuse_.reusable(*b, stream)) {
      deferred_[kept++] = b;
      continue;
    }
    capture_reuse_.forget(*b);
    b->stream_uses.clear();  // the graph orders them: no event is needed
    if (--b->event_count == 0) free_block_locked(b);
  }
  deferred_.resize(kept);
}

// Waits for every pending event, then frees their blocks.
void DeviceAllocator::synchronize_events_locked() {
  if (!deferred_.empty()) process_events_locked();
  for (Pending& p : pending_) backend_.synchronize_event(device_, p.event);
  process_events_locked();
}

}  // namespace memalloc
