// recording.cpp — DeviceAllocator's side of the event ring (recorder.h):
// turning Events into TraceRecords, enabling, reading back.
// Invariants: trace_locked runs under the device lock, after accounting, for
// every Event while recording is on; it allocates nothing and cannot throw.
// observe_locked hands the same Event to the boundary's observer (if any),
// swallowing whatever it throws. Times come from common/clock.h (a free that
// completes at once stamps both of its records with one reading), calibrated
// before a ring is turned on (set_recording, set_recording_file), never on
// the malloc path.
#include "allocator/device_allocator.h"
#include "common/clock.h"
#include "common/errors.h"

namespace memalloc {

void DeviceAllocator::trace_locked(const Event& e) noexcept {
  const uint32_t thread = ctx_.thread, step = ctx_.step;
  const uint8_t device = static_cast<uint8_t>(device_);
  const int64_t t = completing_at_once_ && e.action == Action::kFreeCompleted ? last_record_ns_ : clock::now_ns();
  last_record_ns_ = t;
  ring_.push_with([&](TraceRecord& r) {
    r = TraceRecord{t, e.addr, e.size, e.requested, e.stream, e.prov.stack_id, e.prov.tag_id,
                    thread, step, static_cast<uint8_t>(e.action), device, static_cast<uint8_t>(e.pool), {}};
  });
}

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
  MEMALLOC_EXPECTS(capacity <= kMaxTraceRecords,
                   "recording capacity " + std::to_string(capacity) + " records is too large: at most " +
                       std::to_string(kMaxTraceRecords) + " (64 bytes each) per device");
  if (capacity > 0) clock::calibrate();
  std::lock_guard<std::mutex> lock(mu_);
  ring_.reset(capacity);
}

void DeviceAllocator::set_recording_file(TraceRecord* slots, uint64_t* seqs, size_t capacity,
                                         std::shared_ptr<void> keep) {
  MEMALLOC_EXPECTS(capacity > 0 && capacity <= kMaxTraceRecords,
                   "flight recorder capacity " + std::to_string(capacity) + " records: use 1 to " +
                       std::to_string(kMaxTraceRecords) + " per device");
  clock::calibrate();
  std::lock_guard<std::mutex> lock(mu_);
  ring_.attach(slots, seqs, capacity, std::move(keep));
}

bool DeviceAllocator::recording_enabled() {
  std::lock_guard<std::mutex> lock(mu_);
  return ring_.enabled();
}

std::vector<TraceRecord> DeviceAllocator::trace(uint64_t* dropped) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dropped) *dropped = ring_.dropped();
  return ring_.in_order();
}

std::vector<LiveBlock> DeviceAllocator::live_blocks() {
  std::vector<LiveBlock> out;
  std::lock_guard<std::mutex> lock(mu_);
  out.reserve(live_.size());
  for (const auto& kv : live_) {
    const Block* b = kv.second;
    out.push_back(LiveBlock::of(b->addr, b->size, b->requested, b->prov));
  }
  return out;
}

}  // namespace memalloc
