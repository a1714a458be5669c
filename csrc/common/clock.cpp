// clock.cpp — calibration of clock.h's counter scale (see clock.h for the
// invariants): once per process, outside every malloc path.
#include "common/clock.h"

#include <cstdio>
#include <cstring>
#include <mutex>

namespace memalloc {
namespace clock {
namespace {

std::once_flag g_once;

#if defined(__x86_64__)
// Linux keeps CLOCK_MONOTONIC on the counter only when it trusts it.
bool kernel_clock_is_tsc() {
  std::FILE* f = std::fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (!f) return false;
  char buf[32] = {0};
  const bool ok = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  return ok && std::strncmp(buf, "tsc", 3) == 0 && (buf[3] == '\n' || buf[3] == '\0');
}

// One (ticks, ns) pair: the counter read on both sides of steady_clock,
// the tightest bracket of a few tries, its midpoint.
void pair(uint64_t* ticks, int64_t* ns) {
  uint64_t best = ~uint64_t{0};
  for (int i = 0; i < 16; ++i) {
    const uint64_t a = __rdtsc();
    const int64_t t = steady_ns();
    const uint64_t b = __rdtsc();
    if (b - a < best) {
      best = b - a;
      *ticks = a + (b - a) / 2;
      *ns = t;
    }
  }
}
#endif

void measure() {
#if defined(__x86_64__)
  if (!kernel_clock_is_tsc()) return;
  uint64_t t0 = 0, t1 = 0;
  int64_t n0 = 0, n1 = 0;
  pair(&t0, &n0);
  while (steady_ns() - n0 < kCalibrationNs) {}
  pair(&t1, &n1);
  if (t1 <= t0 || n1 <= n0) return;  // a counter that did not advance: keep steady_clock
  Scale s;
  s.ticks0 = t1;
  s.ns0 = n1;
  s.mult = static_cast<uint64_t>((static_cast<uint128>(n1 - n0) << 32) / (t1 - t0));
  s.on = s.mult != 0;
  g_scale = s;
#endif
}

}  // namespace

void calibrate() noexcept {
  try {
    std::call_once(g_once, measure);
  } catch (...) {  // (call_once cannot fail here; steady_clock stays in use if it did)
  }
}

}  // namespace clock
}  // namespace memalloc
