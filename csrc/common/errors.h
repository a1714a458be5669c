// errors.h — typed errors of the memalloc core and the one check macro.
//
// Invariants:
//   * The core never depends on torch/c10: it throws only the types below.
//     The boundaries (boundary/torch/pluggable.cpp for torch, boundary/python/bindings.cpp
//     for Python)
//     translate them: OutOfMemory -> c10::OutOfMemoryError
//     (torch.OutOfMemoryError), InvalidArgument -> ValueError,
//     InvalidPointer -> memalloc.errors.InvalidPointerError, DriverError ->
//     memalloc.DriverError.
//   * Free paths never throw across the torch boundary (see boundary/torch/pluggable.cpp).
//   * Every message names the problem and, where there is one, the fix.
#pragma once

#include <stdexcept>
#include <string>

namespace memalloc {

// Base of every memalloc error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A request or configuration the caller can correct (bad size, bad key...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A free / record_stream of a pointer this allocator does not own as live.
class InvalidPointer : public Error {
 public:
  using Error::Error;
};

// The device (CUDA driver or host simulation) failed in a way that is not
// out-of-memory.
class DriverError : public Error {
 public:
  using Error::Error;
};

// The allocation cannot be satisfied even after releasing the cache.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

}  // namespace memalloc

// MEMALLOC_EXPECTS(cond, msg): throws memalloc::InvalidArgument(msg) when
// `cond` is false. `msg` (anything convertible to std::string) is evaluated
// only on failure. Messages are user-facing: problem first, then the fix.
#define MEMALLOC_EXPECTS(cond, msg)                      \
  do {                                                   \
    if (!(cond)) throw ::memalloc::InvalidArgument(msg); \
  } while (0)
