// part_test.h — what every C++ unit test of a part (tests/cpp/*_test.cpp)
// shares: EXPECT, which counts failures and names the line; problems(part),
// the messages of what the part's validate(check) found broken, and VALID,
// a failure for each; and finish(), which prints "failures=N"
// (test_cpp_core.py reads it) and is main's exit status: 0 only when no
// EXPECT failed.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace part_test {

inline int g_failures = 0;

inline void expect(bool ok, const std::string& what, int line) {
  if (!ok) {
    std::printf("FAIL line %d: %s\n", line, what.c_str());
    ++g_failures;
  }
}

// What part.validate(check) reports, in the order it checks ({} when sound).
template <class Part>
std::vector<std::string> problems(const Part& part) {
  std::vector<std::string> out;
  part.validate([&](bool ok, const char* what) {
    if (!ok) out.push_back(what);
  });
  return out;
}

// One failure per problem the part's validate(check) reports, at `line`.
template <class Part>
void expect_valid(const Part& part, int line) {
  for (const std::string& p : problems(part)) expect(false, "invariant broken: " + p, line);
}

// A small deterministic generator (xorshift64): a test's figures are
// reproducible from its seed.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed = 0x9e3779b97f4a7c15ull) : s(seed) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  uint64_t below(uint64_t n) { return next() % n; }
};

inline int finish() {
  std::printf("failures=%d\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}

}  // namespace part_test

#define EXPECT(cond) ::part_test::expect((cond), #cond, __LINE__)
// The part's invariants hold: its validate(check) reports nothing.
#define VALID(part) ::part_test::expect_valid((part), __LINE__)
