// stream_uses.cpp — record_stream on the allocator, and the StreamEvents
// part's non-template members (stream_events.h: what a pending block is,
// and the invariants).
#include <algorithm>

#include "allocator/device_allocator.h"
#include "allocator/messages.h"
#include "common/errors.h"

namespace memalloc {

void DeviceAllocator::record_stream(void* ptr, Stream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  auto it = live_.find(addr);
  if (it == live_.end())
    throw InvalidPointer(
        unknown_pointer_message("record_stream", addr, device_, segments_.containing(addr) != segments_.end()));
  Block* b = it->second;
  if (stream == b->stream) return;
  auto& uses = b->stream_uses;
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
}

StreamEvents::~StreamEvents() {
  for (const Pending& p : pending_) backend_.destroy_event(device_, p.event);
  for (EventHandle e : spare_) backend_.destroy_event(device_, e);
}

void StreamEvents::insert(Block* b) {
  for (Stream s : b->stream_uses) {
    EventHandle ev;
    if (spare_.empty()) {
      ev = backend_.create_event(device_);
    } else {
      ev = spare_.back();
      spare_.pop_back();
    }
    backend_.record_event(device_, ev, s);
    b->event_count += 1;
    pending_.push_back(Pending{ev, b});
  }
  b->stream_uses.clear();
}

void StreamEvents::defer(Block* b, bool reuse) {
  deferred_.push_back(b);
  b->event_count += 1;  // pending (active) until its events are recorded and done
  if (reuse) reuse_.mark(*b);
}

}  // namespace memalloc
