// provenance.h — who allocated a block, when, and what it holds: the
// profiler's data about one allocation, kept in one place. The Profiler's
// table holds one per live or pending allocation (provenance_table.h; a
// Block holds only its slot there); an Event points to one (pool/events.h);
// the snapshot and checkpoint copies of a block (BlockInfo, BlockState)
// reuse it. Nothing here depends on anything else in csrc/, so every layer
// may include it.
//
// Invariants:
//   an allocation's provenance is the one it was given when it became live
//   (Profiler::add), except that its category only moves from kUnresolved
//   to a final one, or from one final category to another (mark); the
//   breakdown's rules: profiler/breakdown.h
//   Provenance{} (all zero, kIdle, kOther) is the provenance of nothing
//   (kNoProvenance; a free block has no record)
//   seq: 1, 2, ... per device in allocation order; 0 = none
//   stack_id / tag_id: ids interned by profiler/stacks.h; 0 = none
#pragma once

#include <cstdint>

namespace memalloc {

// The training phase a block was allocated in (memalloc/features/phases.py tells the
// allocator; profiler/breakdown.h gives the meaning of each).
enum class Phase : uint8_t { kIdle = 0, kForward = 1, kBackward = 2, kOptimizer = 3 };
constexpr int kNumPhases = 4;

// What a block holds (profiler/breakdown.h decides it).
enum class Category : uint8_t {
  kParameters = 0,
  kGradients = 1,
  kOptimizerState = 2,
  kActivations = 3,
  kTemporaries = 4,
  kOther = 5,
  kUnresolved = 6,  // a block's state, never a reported category
};
constexpr int kNumCategories = 6;

struct Provenance {
  uint32_t stack_id = 0;                 // who: the caller's interned call stack
  uint32_t tag_id = 0;                   // who: the caller's interned tag path
  uint32_t step = 0;                     // when: memalloc.step() count at the allocation
  Phase phase = Phase::kIdle;            // when: the training phase at the allocation
  Category category = Category::kOther;  // what it holds, or kUnresolved
  uint64_t seq = 0;                      // when: the allocation's sequence number on its device
};

// The provenance of nothing: what an Event about no allocation points to.
inline constexpr Provenance kNoProvenance{};

}  // namespace memalloc
