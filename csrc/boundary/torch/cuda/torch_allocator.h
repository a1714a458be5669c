// torch_allocator.h — memalloc as torch's CUDA allocator: a subclass of
// torch's CUDAPluggableAllocator that answers every call of torch's
// CUDAAllocator interface from memalloc's core (compiled only when the
// installed torch has CUDA; see setup.py).
//
// Why a subclass: memalloc stays a pluggable allocator (the class torch's
// Python CUDAPluggableAllocator wraps, installed with changeCurrentAllocator),
// and torch's own code paths answer from it: memory_stats through
// getDeviceStats, cuDNN's autotuner through cacheInfo, CUDA graphs through
// the pool calls, graph trees through the checkpoint calls, MemPool, IPC,
// OOM observers, _snapshot and _record_memory_history.
//
// Invariants:
//   * Every DataPtr handed to torch has data == context == the block
//     address and the deleter raw_deleter() (graph trees require exactly
//     that deleter); the deleter frees through the installed core.
//   * allocate/free take one lock: the owning device's (the pluggable base
//     class's map and mutex are never used). A free tries the device that
//     last allocated on this thread first, then the others.
//   * OOM observers run after the device lock is released and before the
//     c10::OutOfMemoryError is thrown, with (device, segment bytes asked, the limit
//     (memory fraction) or the device's capacity, free device bytes).
//   * Nothing here ever throws out of a deleter.
#pragma once

#include <memory>

namespace memalloc {
class CachingAllocator;

// Makes `core` torch's CUDA allocator (changeCurrentAllocator, and
// c10::SetAllocator so torch.accelerator answers from it too). Throws
// InvalidArgument when torch's CUDA allocator is already initialised or
// `core` is not on the cuda backend.
void install_torch_cuda_allocator(const std::shared_ptr<CachingAllocator>& core);
}  // namespace memalloc
