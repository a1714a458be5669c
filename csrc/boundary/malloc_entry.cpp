// malloc_entry.cpp — the allocation entry of the boundaries. Invariants:
// malloc_entry.h.
#include "malloc_entry.h"

#include "errors.h"
#include "oom_report.h"

namespace memalloc {

void* malloc_for_torch(CachingAllocator& a, int device, size_t size, Stream stream, const CallContext& ctx,
                       const char* func) {
  try {
    return a.device(device).malloc(size, stream, ctx);
  } catch (const OutOfMemory& e) {
    throw_oom_for_torch(e, &a, device, size, func);
  }
}

}  // namespace memalloc
