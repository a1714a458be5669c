// torch_version.h — the torch version this file is compiled against, for
// guards where torch's allocator interface differs between releases.
//
// Invariants:
//   * MEMALLOC_TORCH_AT_LEAST(M, m) is true exactly when the installed
//     torch's headers (torch/headeronly/version.h, read through
//     torch/version.h) say version >= M.m.
//   * Guards use only this macro, which benchmarks/compat/interface.py
//     evaluates when it reads the subclass (tests/contract/
//     test_torch_interface.py): any other macro in a guard there is an error.
//
// What differs (read from each release's c10/cuda/CUDACachingAllocator.h):
//   2.12 adds getContextForPointer, attachOomRejectionObserver;
//   2.13 adds markCaptureBegin/End, allocateWithAddress;
//   2.14 adds supportsUserMetadata, annotateMemory (TraceEntry::ANNOTATE);
//   2.15 adds no virtual method.
#pragma once

#include <torch/version.h>

#define MEMALLOC_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
