// subscriber.h — what the allocator tells the layer above it (the profiler,
// csrc/profiler/) about its allocations, and all it knows of that layer.
//
// The core knows no training steps, phases, categories, stacks or tags. A
// public call may carry one opaque word from its caller (`Caller`: the
// profiler passes its CallContext); the allocator hands it back to the
// subscriber unread. A block the caller holds carries one opaque id the
// subscriber gave it (on_live), which every Event about the block carries
// (Event::id) until its memory is free again (its kFreeCompleted Event).
//
// Invariants (the allocator's side; DeviceAllocator::validate checks them):
//   * At most one subscriber per DeviceAllocator; every call below is made
//     under the device lock, in the order the changes happen:
//       a block becomes live      on_live or on_restored, with its kAlloc
//                                 Event (after the counters): its id
//       its caller frees it       on_event(kFreeRequested); while streams
//                                 still use it, it is pending
//       its memory is free again  on_event(kFreeCompleted): the id is no
//                                 longer the block's
//     and on_event for every other Event (id 0), after the counters took it.
//     Three virtual calls per malloc/free pair: the lifecycle rides on the
//     Events the subscriber takes anyway.
//   * Every Event reaches the subscriber once: a kAlloc through on_live or
//     on_restored, every other through on_event.
//   * A live or pending block's id is the one on_live returned, never 0; a
//     free block's is 0, and every block's is 0 while no subscriber is set.
//   * The subscriber must not call back into the allocator, throw from
//     on_event or note, or keep the Event past the call.
//   * `note(id)`: a word the subscriber keeps of a live allocation for a
//     later on_restored of the same bytes (a private pool's checkpoint:
//     CUDA graph trees) and for the snapshot's blocks; the core copies it
//     unread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "accounting/accounting.h"
#include "pool/events.h"

namespace memalloc {

// The opaque word a public call carries from its caller (nullptr: none).
using Caller = const void*;

// A block as validate() shows it to the subscriber.
struct SubscribedBlock {
  std::uintptr_t addr;
  size_t size;
  size_t requested;
  uint32_t id;
  bool pending;  // freed by its caller, streams still using it
};

class Subscriber {
 public:
  using Id = uint32_t;
  virtual ~Subscriber() = default;

  // A block became live for `caller`: `e` is its kAlloc Event (addr, size,
  // requested bytes; e.id 0), `after` the device's stats with it. Returns
  // the id its later Events carry (not 0). May allocate (host memory of the
  // subscriber's tables); may throw only std::bad_alloc.
  virtual Id on_live(const Event& e, Caller caller, const DeviceStats& after) = 0;
  // The same for a block a private pool's restore makes live again, which
  // was live when the checkpoint took `note` (note() of it then).
  virtual Id on_restored(const Event& e, Caller caller, const DeviceStats& after, uint64_t note) = 0;
  // Every Event, after the counters (`after`: the device's stats with it);
  // a block's kFreeRequested and kFreeCompleted end its life (above).
  virtual void on_event(const Event& e, Caller caller, const DeviceStats& after) noexcept = 0;
  virtual uint64_t note(Id id) const noexcept = 0;
  // Throws memalloc::Error ("memalloc invariant broken: ...") naming the
  // first way the subscriber's view differs from `blocks` (every live and
  // pending block, by address) and `allocated_bytes` (the allocator's), or
  // breaks one of its own invariants. For tests and debugging.
  virtual void validate(const std::vector<SubscribedBlock>& blocks, int64_t allocated_bytes) const = 0;
};

}  // namespace memalloc
