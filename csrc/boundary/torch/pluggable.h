// pluggable.h — the C ABI torch's CUDAPluggableAllocator loads (see
// pluggable.cpp for invariants). Stream arguments are cudaStream_t values.
#pragma once

#include <cstddef>

namespace memalloc {
// Rethrows the exception in flight as the c10 error torch expects
// (OutOfMemory -> c10::OutOfMemoryError, others -> c10::Error).
[[noreturn]] void rethrow_for_torch(const char* func);
}  // namespace memalloc

extern "C" {
void* memalloc_alloc(size_t size, int device, void* stream);
void memalloc_free(void* ptr, size_t size, int device, void* stream) noexcept;
void memalloc_init(int device_count) noexcept;
void memalloc_reset() noexcept;
void memalloc_memory_fraction(double fraction, int device);
void memalloc_record_stream(void* ptr, void* stream);
}
