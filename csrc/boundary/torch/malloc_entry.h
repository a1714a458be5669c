// malloc_entry.h — the one allocation entry every boundary uses: the CUDA
// entry points (pluggable.cpp), torch's CPU allocator on the host backend
// (cpu_allocator.cpp), host tensors (bind_host.cpp) and the bindings.
//
// Invariants: called with no lock held and without the GIL; an OutOfMemory
// of the core leaves as c10::OutOfMemoryError (oom_report.h: its message
// plus the OOM hook's text when `a` is the installed allocator), every other
// error passes through unchanged.
#pragma once

#include <cstddef>

#include "process/registry.h"

namespace memalloc {
// a.device(device).malloc(size, stream, ctx) for torch; `func` names the
// caller in torch's error.
void* malloc_for_torch(CachingAllocator& a, int device, size_t size, Stream stream, const CallContext& ctx,
                       const char* func);
}  // namespace memalloc
