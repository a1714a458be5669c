// limits_test.cpp — C++ unit tests of the Limits part (csrc/pool/limits.h)
// on its own: the memory fraction's cap, the threshold policy's decision and
// the capacity read once, each expected answer computed here from the
// numbers the test gives. Built by tests/cpp/test_cpp_core.py.
#include <cstddef>
#include <cstdio>
#include <limits>
#include <string>

#include "common/errors.h"
#include "pool/limits.h"
#include "part_test.h"

using namespace memalloc;

namespace {
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kTotal = 1000 * kMiB;

// True when f() throws InvalidArgument whose message names `word`.
template <class F>
bool refuses(F&& f, const std::string& word) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return std::string(e.what()).find(word) != std::string::npos;
  }
  return false;
}

void no_fraction_admits_all_but_overflow() {
  Limits l;
  EXPECT(!l.has_fraction() && l.fraction() < 0.0);
  EXPECT(l.cap() == std::numeric_limits<size_t>::max());
  EXPECT(l.admits(0, kTotal * 1000));
  EXPECT(l.admits(kTotal, kTotal));
  const size_t max = std::numeric_limits<size_t>::max();
  EXPECT(!l.admits(max - 10, 11));  // reserved + bytes would wrap
  EXPECT(l.admits(max - 10, 10));
}

void fraction_caps_reserved_bytes() {
  for (double f : {0.0, 0.25, 0.5, 0.999, 1.0}) {
    Limits l;
    l.set_fraction(f, kTotal);
    const auto cap = static_cast<size_t>(f * static_cast<double>(kTotal));
    EXPECT(l.has_fraction() && l.fraction() == f && l.cap() == cap);
    EXPECT(l.admits(0, cap));  // exactly the cap fits
    EXPECT(!l.admits(0, cap + 1));
    EXPECT(!l.admits(cap + 1, 0) || cap == std::numeric_limits<size_t>::max());
    if (cap >= kMiB) {
      EXPECT(l.admits(cap - kMiB, kMiB));
      EXPECT(!l.admits(cap - kMiB, kMiB + 1));
    }
  }
  Limits zero;
  zero.set_fraction(0.0, kTotal);
  EXPECT(!zero.admits(0, 1));  // torch's 0: nothing more may be reserved
  EXPECT(zero.admits(0, 0));
}

void bad_values_are_refused_and_change_nothing() {
  Limits l(0.5);
  l.set_fraction(0.5, kTotal);
  for (double bad : {-0.1, 1.5}) EXPECT(refuses([&] { l.set_fraction(bad, kTotal); }, "memory fraction"));
  EXPECT(l.fraction() == 0.5 && l.cap() == kTotal / 2);
  for (double bad : {-0.1, 1.0, 2.0}) EXPECT(refuses([&] { l.set_gc_threshold(bad); }, "garbage_collection_threshold"));
  EXPECT(l.gc_threshold() == 0.5);
  EXPECT(refuses([] { Limits bad(1.0); }, "garbage_collection_threshold"));
}

void threshold_policy_against_the_cap_or_the_capacity() {
  int reads = 0;
  auto capacity = [&] {
    ++reads;
    return kTotal;
  };
  Limits off;
  EXPECT(!off.collecting());
  EXPECT(!off.wants_collection(kTotal, kTotal, capacity));
  EXPECT(reads == 0);  // off: the capacity is not read

  Limits l(0.8);  // no fraction: the limit is the capacity
  EXPECT(l.collecting() && l.gc_threshold() == 0.8);
  const auto at = static_cast<size_t>(0.8 * static_cast<double>(kTotal));
  EXPECT(!l.wants_collection(at - kMiB, kMiB, capacity));  // reaching the threshold exactly is within it
  EXPECT(l.wants_collection(at - kMiB, kMiB + 1, capacity));
  EXPECT(reads == 2);

  l.set_fraction(0.5, kTotal);  // a fraction: the limit is its cap
  reads = 0;
  const auto cap_at = static_cast<size_t>(0.8 * static_cast<double>(kTotal / 2));
  EXPECT(!l.wants_collection(cap_at, 0, capacity));
  EXPECT(l.wants_collection(cap_at, 1, capacity));
  EXPECT(reads == 0);  // the cap, not the capacity

  l.set_gc_threshold(0.0);
  EXPECT(!l.collecting() && !l.wants_collection(kTotal, kTotal, capacity));
}

void capacity_is_read_once() {
  Limits l;
  int reads = 0;
  auto read = [&] {
    ++reads;
    return kTotal;
  };
  EXPECT(l.capacity(read) == kTotal);
  EXPECT(l.capacity(read) == kTotal);
  EXPECT(reads == 1);
  Limits failing;  // a read that throws is asked again next time
  bool threw = false;
  try {
    failing.capacity([]() -> size_t { throw DriverError("no device"); });
  } catch (const DriverError&) {
    threw = true;
  }
  EXPECT(threw);
  EXPECT(failing.capacity(read) == kTotal && reads == 2);
}
}  // namespace

int main() {
  no_fraction_admits_all_but_overflow();
  fraction_caps_reserved_bytes();
  bad_values_are_refused_and_change_nothing();
  threshold_policy_against_the_cap_or_the_capacity();
  capacity_is_read_once();
  return part_test::finish();
}
