// phases.cpp — the breakdown by category of DeviceAllocator (breakdown.h):
// the training phase stamped on new blocks, the landmarks that resolve
// unresolved blocks, marking parameters, and the report. Every call takes
// the device lock; the walks go over the provenance table's allocations
// (provenance_table.h), not the blocks, are O(its slots) and run a few
// times per training step, never on the malloc/free path. Invariants:
// breakdown.h.
#include "allocator/device_allocator.h"

namespace memalloc {

void DeviceAllocator::resolve_locked(Phase phase, Category cat) {
  if (breakdown_.now().unresolved[static_cast<int>(phase)] != 0) {
    prov_.for_each_allocated([&](ProvenanceRecord& r) {
      if (r.prov.category == Category::kUnresolved && r.prov.phase == phase) r.prov.category = cat;
    });
  }
  breakdown_.resolve(phase, cat);
}

void DeviceAllocator::recategorize_locked(Phase phase, Category from, Category to) {
  prov_.for_each_allocated([&](ProvenanceRecord& r) {
    if (r.prov.phase != phase || r.prov.category != from) return;
    breakdown_.recategorize(static_cast<int64_t>(r.requested), phase, from, to, r.prov.seq);
    r.prov.category = to;
  });
}

void DeviceAllocator::enter_phase(Phase phase) {
  std::lock_guard<std::mutex> lock(mu_);
  if (phase == Phase::kBackward) resolve_locked(Phase::kForward, Category::kActivations);
  if (phase == Phase::kOptimizer) resolve_locked(Phase::kBackward, Category::kGradients);
  phase_ = phase;
}

void DeviceAllocator::resolve(Phase phase, Category cat) {
  std::lock_guard<std::mutex> lock(mu_);
  resolve_locked(phase, cat);
}

Phase DeviceAllocator::phase() {
  std::lock_guard<std::mutex> lock(mu_);
  return phase_;
}

void DeviceAllocator::end_step(uint32_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  resolve_locked(Phase::kOptimizer, Category::kOptimizerState);
  resolve_locked(Phase::kBackward, Category::kGradients);
  resolve_locked(Phase::kForward, Category::kOther);
  // The first step (its forward began at the first training forward, not at
  // a step's end): what its forward made and still holds is other.
  if (!breakdown_.has_last()) recategorize_locked(Phase::kForward, Category::kActivations, Category::kOther);
  breakdown_.end_window(alloc_seq_, step);
  phase_ = Phase::kForward;
}

size_t DeviceAllocator::mark(std::uintptr_t ptr, Category cat) {
  std::lock_guard<std::mutex> lock(mu_);
  ProvenanceRecord* r = nullptr;
  auto it = live_.find(ptr);
  if (it != live_.end()) {
    r = &prov_.at(it->second->slot);
  } else {
    // An interior pointer (a view into a larger allocation, e.g. a flat
    // parameter buffer): the allocation that spans it.
    prov_.for_each_allocated([&](ProvenanceRecord& x) {
      if (r == nullptr && x.addr < ptr && ptr < x.addr + x.size) r = &x;
    });
  }
  if (r == nullptr) return 0;
  if (r->prov.category != cat) {
    breakdown_.recategorize(static_cast<int64_t>(r->requested), r->prov.phase, r->prov.category, cat, r->prov.seq);
    r->prov.category = cat;
  }
  return r->size;
}

DeviceAllocator::BreakdownState DeviceAllocator::breakdown() {
  std::lock_guard<std::mutex> lock(mu_);
  const Breakdown& b = breakdown_;
  return BreakdownState{b.now(), b.peak(), b.last(), b.has_last(), b.last_step(), phase_};
}

}  // namespace memalloc
