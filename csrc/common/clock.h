// clock.h — the event ring's timestamps: std::chrono::steady_clock time in
// nanoseconds, read cheaply.
//
// Invariants:
//   * now_ns() is steady_clock's time since its epoch, in ns (on Linux,
//     CLOCK_MONOTONIC: Python's time.monotonic_ns()).
//   * Where Linux keeps CLOCK_MONOTONIC on the CPU's time-stamp counter
//     itself (x86-64 with clocksource "tsc": the kernel checked that it is
//     invariant and in step across cores), now_ns() reads the counter
//     (rdtsc: about half of what the vDSO's clock_gettime costs; torch's own
//     allocator history stamps its entries from the counter too) and scales
//     it by a multiplier measured once against steady_clock over
//     kCalibrationNs. Elsewhere it calls steady_clock.
//   * Scaled time follows steady_clock to within the calibration's error:
//     at most kMaxDrift of the time since calibration (tests/unit/
//     test_clock.py measures it), so times read on any thread are
//     non-decreasing in the order the ring stores them up to that error.
//   * now_ns() allocates nothing, takes no lock and makes no system call
//     once calibrated; calibrate() (called where a ring is turned on, never
//     on the malloc path) reads one sysfs file and spins for
//     kCalibrationNs, once per process.
#pragma once

#include <chrono>
#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace memalloc {
namespace clock {

__extension__ typedef __int128 int128;  // (GCC and Clang; the counter path is x86-64 only)
__extension__ typedef unsigned __int128 uint128;

constexpr int64_t kCalibrationNs = 5'000'000;  // 5 ms
constexpr double kMaxDrift = 1e-4;             // the bound the tests hold it to

// The counter's scale, set once by calibrate() (read-only afterwards).
struct Scale {
  uint64_t ticks0 = 0;  // the counter at calibration
  int64_t ns0 = 0;      // steady_clock's ns at the same moment
  uint64_t mult = 0;    // ns per tick, fixed point with 32 fraction bits
  bool on = false;      // false: now_ns() calls steady_clock
};
// The scale, written once by calibrate() before any ring is on (read-only
// afterwards; every reader's ring was turned on after calibrate() returned,
// under the device lock its pushes take).
inline Scale g_scale;
inline const Scale& scale() noexcept { return g_scale; }

// Measures the scale (once per process; later calls return at once).
void calibrate() noexcept;

inline int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline int64_t now_ns() noexcept {
#if defined(__x86_64__)
  const Scale& s = scale();
  if (s.on) {
    const int128 dt = static_cast<int64_t>(__rdtsc() - s.ticks0);  // a core a little behind: negative
    return s.ns0 + static_cast<int64_t>((dt * static_cast<int128>(s.mult)) >> 32);
  }
#endif
  return steady_ns();
}

// Whether now_ns() reads the time-stamp counter (calibrated and on).
inline bool uses_counter() noexcept { return scale().on; }

}  // namespace clock
}  // namespace memalloc
