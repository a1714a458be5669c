// malloc_entry.cpp — the allocation entry of the boundaries. Invariants:
// malloc_entry.h.
#include "boundary/torch/malloc_entry.h"

#include "common/errors.h"
#include "boundary/torch/oom_report.h"

namespace memalloc {

void* malloc_for_torch(CachingAllocator& a, int device, size_t size, Stream stream, const CallContext& ctx,
                       const char* func) {
  try {
    return a.device(device).malloc(size, stream, &ctx);
  } catch (const OutOfMemory& e) {
    throw_oom_for_torch(e, &a, device, size, func);
  }
}

}  // namespace memalloc
