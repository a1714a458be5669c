// torch_snapshot.h — memalloc's segments and event records as torch's
// snapshot (torch.cuda.memory._snapshot(), memory_viz): the conversion
// alone, out of the allocator subclass (torch_allocator.cpp).
//
// Invariants:
//   * Reads only: the core's segments and trace (each copied under its
//     device lock by the core), torch's history, the interned stacks. It
//     changes nothing and calls no torch allocator function.
//   * A segment's blocks tile it, in address order (block.h): a block's
//     address is the segment's plus the sizes before it.
//   * Frames: torch's own while torch's history is on (torch_history.h);
//     else memalloc's interned stacks as torch contexts (torch_contexts.h).
//   * A trace record whose action torch has no entry for is left out.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include "process/registry.h"
#include "boundary/torch/cuda/torch_history.h"

namespace memalloc {

// The snapshot of every device of `core` (only the segments `pool` owns,
// unless it is kDefaultPool), with each device's trace when
// `include_traces`, and the settings of device 0 as torch's config metadata.
c10::cuda::CUDACachingAllocator::SnapshotInfo torch_snapshot(CachingAllocator& core, const TorchHistory& history,
                                                             c10::MempoolId_t pool, bool include_traces);

}  // namespace memalloc
