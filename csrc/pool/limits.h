// limits.h — how much one device may reserve, and when its cache is
// collected: torch's memory fraction (set_per_process_memory_fraction) and
// the "threshold" empty-cache policy (garbage_collection_threshold), as one
// part that owns their state.
//
// The fraction caps reserved bytes at fraction * the device's total bytes
// (read when the fraction is set); obtaining a segment or mapping pages
// asks admits() first. Lowering the fraction later releases nothing (as
// native): only growth is refused. The threshold policy: before new memory
// would take reserved bytes above threshold * limit (the fraction's cap
// when one is set, else the device's capacity), the caller releases every
// fully free cached segment (wants_collection()).
//
// Invariants:
//   * No fraction set: fraction() < 0 and the cap is SIZE_MAX (admits()
//     refuses only what overflows); a fraction f in [0, 1] caps at
//     floor(f * total).
//   * 0 <= gc_threshold() < 1; 0 turns the policy off, and then
//     wants_collection() is false without reading the capacity.
//   * The capacity is read from the device at most once, when first needed
//     (a backend whose capacity cannot be read throws from that call and
//     is asked again next time).
//   * No lock of its own: DeviceAllocator calls it under the device lock;
//     its checks (set_*) throw InvalidArgument before changing anything.
#pragma once

#include <cstddef>
#include <limits>
#include <string>

#include "common/errors.h"

namespace memalloc {

class Limits {
 public:
  explicit Limits(double gc_threshold = 0.0) { set_gc_threshold(gc_threshold); }

  // Caps reserved bytes at fraction * total_bytes (0 <= fraction <= 1,
  // torch's range: 0 allows nothing).
  void set_fraction(double fraction, size_t total_bytes) {
    check_fraction(fraction);
    fraction_ = fraction;
    cap_ = static_cast<size_t>(fraction * static_cast<double>(total_bytes));
  }
  // InvalidArgument unless 0 <= fraction <= 1 (callers check before reading
  // the device's total bytes).
  static void check_fraction(double fraction) {
    MEMALLOC_EXPECTS(fraction >= 0.0 && fraction <= 1.0,
                     "invalid memory fraction " + std::to_string(fraction) + ": set a value in [0, 1]");
  }
  double fraction() const { return fraction_; }  // < 0: none set
  bool has_fraction() const { return fraction_ >= 0.0; }
  size_t cap() const { return cap_; }  // bytes; SIZE_MAX when no fraction is set

  // 0 <= threshold < 1; 0 turns the policy off.
  void set_gc_threshold(double threshold) {
    MEMALLOC_EXPECTS(threshold >= 0.0 && threshold < 1.0,
                     "invalid garbage_collection_threshold " + std::to_string(threshold) +
                         ": set a value in (0, 1), or 0 to turn the threshold policy off");
    gc_threshold_ = threshold;
  }
  double gc_threshold() const { return gc_threshold_; }
  bool collecting() const { return gc_threshold_ > 0.0; }

  // May `reserved` bytes grow by `bytes` within the cap?
  bool admits(size_t reserved, size_t bytes) const { return bytes <= cap_ && reserved <= cap_ - bytes; }

  // Should the cache be collected before `reserved` grows by `bytes`?
  // `capacity()` gives the device's total bytes; it is called only when
  // the policy is on and no fraction is set.
  template <class Capacity>
  bool wants_collection(size_t reserved, size_t bytes, Capacity&& capacity) const {
    if (!collecting()) return false;
    const size_t limit = has_fraction() ? cap_ : capacity();
    return static_cast<double>(reserved + bytes) > gc_threshold_ * static_cast<double>(limit);
  }

  // The device's total bytes, read once through `read_capacity()`.
  template <class ReadCapacity>
  size_t capacity(ReadCapacity&& read_capacity) {
    if (capacity_ == 0) capacity_ = read_capacity();
    return capacity_;
  }

 private:
  double fraction_ = -1.0;
  size_t cap_ = std::numeric_limits<size_t>::max();
  double gc_threshold_ = 0.0;
  size_t capacity_ = 0;  // 0: not read yet
};

}  // namespace memalloc
