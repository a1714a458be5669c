// oom_report.h — the out-of-memory report: extra text for torch's
// OutOfMemoryError from a Python hook (see oom_report.cpp).
#pragma once

#include <cstddef>
#include <string>

#include "common/errors.h"
#include "process/registry.h"

namespace memalloc {
// Installs `hook` (a Python callable (device, requested_bytes) -> str, or
// None to remove it). GIL held.
void set_oom_hook(void* py_callable_or_none);
// Raises `e` for torch as c10::OutOfMemoryError: its message plus the
// hook's text when `a` is the installed allocator and a hook is set. No lock
// held, no GIL held.
[[noreturn]] void throw_oom_for_torch(const OutOfMemory& e, const CachingAllocator* a, int device, size_t size,
                                      const char* func);
}  // namespace memalloc
