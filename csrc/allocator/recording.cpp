// recording.cpp — DeviceAllocator's calls to its Event subscribers beyond
// the counters: the event ring (event_trace.h, which owns it) turned on,
// off and read back under the device lock, and the boundary's observer.
// Invariants: observe_locked hands every Event to the observer (if any)
// after the counters took it, swallowing whatever it throws.
#include "allocator/device_allocator.h"
#include "common/clock.h"

namespace memalloc {

void DeviceAllocator::observe_locked(const Event& e) noexcept {
  const DeviceStats& s = accounting_.stats();
  try {
    observer_.fn(observer_.user, device_, e, s.allocated_bytes[kStatAll].current, s.reserved_bytes[kStatAll].current);
  } catch (...) {  // an observer never breaks the allocator
  }
}

void DeviceAllocator::set_event_observer(EventObserver observer) {
  std::lock_guard<std::mutex> lock(mu_);
  observer_ = observer;
}

void DeviceAllocator::set_recording(size_t capacity) {
  if (capacity > 0) clock::calibrate();  // its first call measures: not under the lock
  std::lock_guard<std::mutex> lock(mu_);
  profile_.trace().reset(capacity);
}

void DeviceAllocator::set_recording_file(TraceRecord* slots, uint64_t* seqs, size_t capacity,
                                         std::shared_ptr<void> keep) {
  clock::calibrate();  // its first call measures: not under the lock
  std::lock_guard<std::mutex> lock(mu_);
  profile_.trace().attach(slots, seqs, capacity, std::move(keep));
}

}  // namespace memalloc
