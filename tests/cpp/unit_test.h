// unit_test.h — the harness every tests/cpp/<part>_test.cpp shares: EXPECT
// records a failed check with its line and goes on; unit_test::finish()
// prints failures=N and is main's exit status (0 only when N is 0), which
// tests/cpp/test_cpp_core.py reads.
#pragma once

#include <cstdio>
#include <string>

namespace unit_test {

inline int failures = 0;

inline void expect(bool ok, const std::string& what, int line) {
  if (!ok) {
    std::printf("FAIL line %d: %s\n", line, what.c_str());
    ++failures;
  }
}

inline int finish() {
  std::printf("failures=%d\n", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace unit_test

#define EXPECT(cond) ::unit_test::expect((cond), #cond, __LINE__)
