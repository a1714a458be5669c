// pluggable.cpp — the extern "C" entry points for users who load memalloc
// by hand with torch's CUDAPluggableAllocator (alloc/free) and its optional
// hooks (init, reset = empty_cache, memory fraction, record_stream).
// memalloc.enable() does not use them: it installs the subclass of
// csrc/boundary/torch/cuda/torch_allocator.cpp.
//
// Invariants:
//   * Every entry point works on AllocatorRegistry::installed(); before an
//     allocator is installed, alloc raises and the others do nothing.
//   * alloc turns memalloc::OutOfMemory into c10::OutOfMemoryError (torch
//     turns that into torch.OutOfMemoryError; returning NULL would raise
//     nothing). The message is built as a std::string first: formatting
//     inside TORCH_CHECK_WITH segfaulted on the H200 (docs/architecture.md,
//     "torch's pluggable interface").
//   * free never throws into torch: errors are printed to stderr.
//   * Only current_context() (pystacks.cpp) may take the GIL, in Python
//     stacks mode, and it does so before any device lock.
#include <c10/util/Exception.h>

#include <cstdio>

#include "common/errors.h"
#include "boundary/torch/malloc_entry.h"
#include "boundary/torch/pluggable.h"
#include "boundary/callers/pystacks.h"
#include "process/registry.h"

namespace memalloc {

[[noreturn]] void rethrow_for_torch(const char* func) {
  try {
    throw;
  } catch (const OutOfMemory& e) {
    throw c10::OutOfMemoryError(c10::SourceLocation{func, __FILE__, __LINE__}, std::string(e.what()));
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw c10::Error(c10::SourceLocation{func, __FILE__, __LINE__}, std::string("memalloc: ") + e.what());
  }
}

namespace {
CachingAllocator& installed_or_throw() {
  CachingAllocator* a = AllocatorRegistry::instance().installed();
  if (a == nullptr) throw Error("memalloc is not installed: call memalloc.enable() before the first CUDA allocation");
  return *a;
}
}  // namespace

}  // namespace memalloc

using memalloc::AllocatorRegistry;
using memalloc::Stream;

extern "C" {

void* memalloc_alloc(size_t size, int device, void* stream) {
  try {
    return memalloc::malloc_for_torch(memalloc::installed_or_throw(), device, size, reinterpret_cast<Stream>(stream),
                                      memalloc::current_context(), __func__);
  } catch (...) {
    memalloc::rethrow_for_torch(__func__);
  }
}

void memalloc_free(void* ptr, size_t /*size*/, int device, void* /*stream*/) noexcept {
  try {
    auto* a = AllocatorRegistry::instance().installed();
    const memalloc::CallContext caller = AllocatorRegistry::instance().thread_context();
    if (a != nullptr) a->device(device).free(ptr, &caller);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memalloc: free ignored: %s\n", e.what());
  }
}

void memalloc_init(int /*device_count*/) noexcept {}

void memalloc_reset() noexcept {
  try {
    auto* a = AllocatorRegistry::instance().installed();
    if (a == nullptr) return;
    const memalloc::CallContext ctx = AllocatorRegistry::instance().thread_context();
    for (int d = 0; d < a->device_count(); ++d) a->device(d).empty_cache(&ctx);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memalloc: empty_cache failed: %s\n", e.what());
  }
}

void memalloc_memory_fraction(double fraction, int device) {
  try {
    memalloc::set_memory_fraction(memalloc::installed_or_throw().device(device), fraction);
  } catch (...) {
    memalloc::rethrow_for_torch(__func__);
  }
}

void memalloc_record_stream(void* ptr, void* stream) {
  try {
    auto& a = memalloc::installed_or_throw();
    memalloc::DeviceAllocator* d = a.find_owner(ptr);
    if (d == nullptr) throw memalloc::InvalidPointer("record_stream of a pointer memalloc does not own");
    d->record_stream(ptr, reinterpret_cast<Stream>(stream));
  } catch (...) {
    memalloc::rethrow_for_torch(__func__);
  }
}

}  // extern "C"
