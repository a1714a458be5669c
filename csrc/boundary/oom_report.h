// oom_report.h — the out-of-memory report: extra text for torch's
// OutOfMemoryError from a Python hook (see oom_report.cpp).
#pragma once

#include <cstddef>
#include <string>

#include "errors.h"
#include "registry.h"

namespace memalloc {
// Installs `hook` (a Python callable (device, requested_bytes) -> str, or
// None to remove it). GIL held.
void set_oom_hook(void* py_callable_or_none);
// a.device(device).malloc(size, stream, ctx) for torch: an OutOfMemory
// leaves as c10::OutOfMemoryError with its message plus the hook's text
// (when `a` is the installed allocator and a hook is set); other errors pass
// through. Call with no lock held and without the GIL. The
// one allocation path of the CUDA entry point, the CPU allocator and the
// bindings.
// Raises `e` for torch as c10::OutOfMemoryError: its message plus the
// hook's text when `a` is the installed allocator and a hook is set. No lock
// held, no GIL held.
[[noreturn]] void throw_oom_for_torch(const OutOfMemory& e, const CachingAllocator* a, int device, size_t size,
                                      const char* func);
void* malloc_for_torch(CachingAllocator& a, int device, size_t size, Stream stream, const CallContext& ctx,
                       const char* func);
}  // namespace memalloc
