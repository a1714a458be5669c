// part_test.h — what every C++ part test (tests/cpp/<part>_test.cpp) shares:
// EXPECT(cond) counts a failure (and prints its line) without stopping, and
// finish() prints "failures=N" and gives the exit status, 0 only when N is 0
// (test_cpp_core.py reads both).
#pragma once

#include <cstdio>
#include <string>

namespace part_test {

inline int g_failures = 0;

inline void expect(bool ok, const std::string& what, int line) {
  if (!ok) {
    std::printf("FAIL line %d: %s\n", line, what.c_str());
    ++g_failures;
  }
}

inline int finish() {
  std::printf("failures=%d\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}

}  // namespace part_test

#define EXPECT(cond) ::part_test::expect((cond), #cond, __LINE__)
