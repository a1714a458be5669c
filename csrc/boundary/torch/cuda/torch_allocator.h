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
//   * Every virtual method of torch's CUDAAllocator (its bases' included) is
//     overridden, under MEMALLOC_TORCH_AT_LEAST guards where torch 2.11 to
//     2.15 differ (torch_version.h), or inherited on purpose and listed
//     below with the reason. tests/contract/test_torch_interface.py reads
//     the installed torch's headers and this list (benchmarks/compat/
//     interface.py) and fails on any other.
//
// Inherited on purpose (what the base does is what native does, or what
// a caller of it should get):
//   inherited markCaptureBegin: CUDAAllocator's no-op (2.13 on). memalloc
//       treats every open pool route (beginAllocateToPool) as a possible
//       capture and is capture-safe for all of it, which covers the capture
//       these marks announce; torch 2.11 and 2.12 send no marks, so one rule
//       serves every version.
//   inherited markCaptureEnd: as markCaptureBegin, at the capture's end.
//   inherited allocateWithAddress: CUDAAllocator's error "memalloc does not
//       yet support allocateWithAddress" (2.13 on; it names the allocator
//       through name()). No torch code calls it: it is an entry point for
//       outside tools, which get an error naming memalloc and the method.
//   inherited copy_data: CUDAPluggableAllocator's cudaMemcpy device to
//       device, as native (declared final there).
//   inherited is_simple_data_ptr: c10::Allocator's data == context, true of
//       every DataPtr memalloc hands out (data == context == the block).
//   inherited getMemoryInfo: CUDAAllocator's cudaMemGetInfo of the device, as
//       native (torch.accelerator.get_memory_info).
//   inherited recordStream(const DataPtr&,Stream): CUDAAllocator's
//       forwarding of a c10::Stream to the CUDAStream overload, which
//       memalloc overrides.
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
