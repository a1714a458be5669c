// breakdown.h — live bytes by what they hold (parameters, gradients,
// optimizer state, activations, temporaries, other), now and at the peak of
// the step. The Profiler's consumer of the Event stream (profiler.h), beside
// the ring: it reads the kAlloc and kFreeRequested Events (their size, their
// requested bytes) with their block's provenance (phase, category, sequence
// number) and nothing else of the allocator.
//
// What a block's category holds is the bytes that were asked for (the
// Event's `requested`: a tensor's storage bytes), so that a category holds
// what its tensors hold. The rest of the block, the allocator's rounding (a
// size rounded up to 512 B or to a power-of-two division, a cached block
// handed out whole because too little of it would be left to split), is
// `other` from the block's allocation to its free, whatever its category;
// the categories still add up to allocated_bytes. Below, "a block's bytes"
// in a category are its requested bytes.
//
// Phases: the Python layer tells the allocator where a training step is
// (memalloc/features/phases.py); every new block is stamped with the phase it was
// allocated in:
//   kIdle       before the first training step (model, data, setup)
//   kForward    after a step ended or backward() returned
//   kBackward   inside torch.autograd.backward()
//   kOptimizer  inside optimizer.step()
// A block's category follows from its phase and from what became of it. It
// is decided ("resolved") at the landmark where its fate is known; until
// then the block is unresolved and counted under its phase:
//   kIdle       other, at once
//   kForward    activations if still live when backward() starts (what
//               autograd saved, the loss, the batch); temporaries if freed
//               before; other if live at the step's end without a backward
//               having started (metrics, a tensor the loop keeps)
//   kBackward   gradients if live when optimizer.step() starts or the step
//               ends; temporaries if freed before
//   kOptimizer  optimizer state if live at the step's end; temporaries if
//               freed before
//   mark()      parameters (or any category), at any time: the Python layer
//               marks the storages of nn.Parameters.
//   The first step's end: its kForward blocks still live (resolved as
//               activations) become other (recategorize(), at the peak too):
//               made by the first forward and kept past it, they are
//               workspaces and caches made on first use, not activations.
// A report of "now" shows an unresolved block as the category its phase
// resolves to if the block survives (provisional()); the peak of a finished
// step is fully resolved: a block live at the peak and freed before its
// landmark counts as a temporary there.
//
// The peak window (a Peak, peak.h, of the split by its total) begins at a
// step's end (end_window) and records the split when allocated bytes reach
// a new maximum; it is independent of Stat::peak and the step window.
// Blocks are ordered by a per-device allocation sequence number, so "live at
// the peak" is "allocated at or before the peak's sequence number and not
// freed before it".
//
// Invariants (per device; checked by DeviceAllocator::validate):
//   total == sum(live) + sum(unresolved) == allocated_bytes (all pools)
//   peak.total == max of total since the window began, >= total
//   peak.total == sum(peak.live) + sum(peak.unresolved)
//   0 <= freed[p] <= peak.unresolved[p]   (unresolved bytes live at the
//                                          peak that have been freed since)
//   every live block with category kUnresolved has phase != kIdle
//   after end_step: nothing is unresolved, in the window or in `last`
// O(1) per event, no allocation; resolve() is O(1) (the caller walks the
// blocks).
#pragma once

#include <array>
#include <cstdint>

#include "accounting/peak.h"
#include "pool/events.h"
#include "profiler/provenance.h"  // Phase, Category

namespace memalloc {

// Names by Category value (exported to Python; torch.profiler's names where
// its memory timeline has the category).
inline const char* category_name(int c) {
  static const char* const names[kNumCategories] = {"parameters",  "gradients",   "optimizer_state",
                                                    "activations", "temporaries", "other"};
  return names[c];
}
inline const char* phase_name(int p) {
  static const char* const names[kNumPhases] = {"idle", "forward", "backward", "optimizer"};
  return names[p];
}

// The category an unresolved block of phase p gets if it survives its landmark.
inline Category provisional(Phase p) {
  switch (p) {
    case Phase::kForward:
      return Category::kActivations;
    case Phase::kBackward:
      return Category::kGradients;
    case Phase::kOptimizer:
      return Category::kOptimizerState;
    case Phase::kIdle:
      break;
  }
  return Category::kOther;
}

// The category a block allocated in phase p starts with.
inline Category initial_category(Phase p) { return p == Phase::kIdle ? Category::kOther : Category::kUnresolved; }

// Bytes by category, with the unresolved ones by phase.
struct CategoryBytes {
  std::array<int64_t, kNumCategories> live{};
  std::array<int64_t, kNumPhases> unresolved{};
  int64_t total = 0;
  // live with each unresolved phase added to its provisional category.
  std::array<int64_t, kNumCategories> provisional_split() const {
    std::array<int64_t, kNumCategories> out = live;
    for (int p = 0; p < kNumPhases; ++p) out[static_cast<int>(provisional(static_cast<Phase>(p)))] += unresolved[p];
    return out;
  }
};

// How high a split is, for its Peak window: its total.
struct TotalLevel {
  int64_t operator()(const CategoryBytes& s) const { return s.total; }
};

class Breakdown {
 public:
  // The consumer of one block Event, `p` its block's provenance: kAlloc and
  // kFreeRequested move its bytes; every other action leaves the breakdown
  // alone.
  void apply(const Event& e, const Provenance& p) {
    if (e.action == Action::kAlloc) {
      on_alloc(static_cast<int64_t>(e.size), static_cast<int64_t>(e.requested), p.phase, p.category, p.seq);
    } else if (e.action == Action::kFreeRequested) {
      on_free(static_cast<int64_t>(e.size), static_cast<int64_t>(e.requested), p.phase, p.category, p.seq);
    }
  }
  // A block of `size` bytes, `held` of them its category's (its requested
  // bytes, never more than its size: DeviceAllocator::validate; the rest:
  // other), became live (kAlloc) or was freed (kFreeRequested): its phase,
  // its category (kUnresolved or a final one) and its sequence number.
  void on_alloc(int64_t size, int64_t held, Phase phase, Category cat, uint64_t seq) {
    add(now_, size, held, phase, cat);
    if (peak_.raise(now_)) {
      peak_seq_ = seq;
      freed_ = {};
    }
  }
  void on_free(int64_t size, int64_t held, Phase phase, Category cat, uint64_t seq) {
    add(now_, -size, -held, phase, cat);
    if (cat == Category::kUnresolved && seq <= peak_seq_) freed_[static_cast<int>(phase)] += held;
  }
  // Every unresolved block of `phase` became `cat` (the caller set their
  // category): in the window's peak, those freed since it are temporaries.
  void resolve(Phase phase, Category cat) {
    const int p = static_cast<int>(phase), c = static_cast<int>(cat);
    now_.live[c] += now_.unresolved[p];
    now_.unresolved[p] = 0;
    const int64_t freed = freed_[p];
    peak_.relabel([&](CategoryBytes& peak) {
      peak.live[c] += peak.unresolved[p] - freed;
      peak.live[static_cast<int>(Category::kTemporaries)] += freed;
      peak.unresolved[p] = 0;
    });
    freed_[p] = 0;
  }
  // A live block moved from category `from` (kUnresolved: of `phase`) to
  // `to`, which is final; `bytes`: those its category holds (requested).
  void recategorize(int64_t bytes, Phase phase, Category from, Category to, uint64_t seq) {
    add(now_, -bytes, -bytes, phase, from);
    add(now_, bytes, bytes, phase, to);
    if (seq > peak_seq_) return;  // allocated after the peak: not in it
    peak_.relabel([&](CategoryBytes& peak) {
      if (from == Category::kUnresolved) {
        // Of the phase's unresolved bytes at the peak, this block's are now final.
        peak.unresolved[static_cast<int>(phase)] -= bytes;
      } else {
        peak.live[static_cast<int>(from)] -= bytes;
      }
      peak.live[static_cast<int>(to)] += bytes;
    });
  }
  // Ends the window (call after resolving every phase): `last()` becomes
  // its peak; the next window starts at the current split. `last_seq` is
  // the sequence number of the last block allocated so far.
  void end_window(uint64_t last_seq, uint32_t step) {
    last_ = peak_.restart(now_);
    has_last_ = true;
    last_step_ = step;
    peak_seq_ = last_seq;
    freed_ = {};
  }

  const CategoryBytes& now() const { return now_; }
  const CategoryBytes& peak() const { return peak_.value(); }
  const std::array<int64_t, kNumPhases>& freed_since_peak() const { return freed_; }
  bool has_last() const { return has_last_; }
  const CategoryBytes& last() const { return last_; }
  uint32_t last_step() const { return last_step_; }

 private:
  // `size` bytes of a block join the split (leave it: negative), `held` of
  // them under its category (its phase while unresolved), the rest other.
  static void add(CategoryBytes& s, int64_t size, int64_t held, Phase phase, Category cat) {
    int64_t& slot =
        cat == Category::kUnresolved ? s.unresolved[static_cast<int>(phase)] : s.live[static_cast<int>(cat)];
    slot += held;
    s.live[static_cast<int>(Category::kOther)] += size - held;
    s.total += size;
  }
  CategoryBytes now_;
  Peak<CategoryBytes, TotalLevel> peak_;  // the current window's peak
  uint64_t peak_seq_ = 0;                 // blocks with seq <= this were allocated by the peak
  std::array<int64_t, kNumPhases> freed_{};
  CategoryBytes last_;  // the last finished window's peak
  bool has_last_ = false;
  uint32_t last_step_ = 0;
};

}  // namespace memalloc
