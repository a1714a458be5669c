// profiler.cpp — the landmarks of the breakdown over the Profiler's own
// table (profiler.h): resolving, the step's end, marking, and reading the
// allocations back. The walks are O(table slots) and run a few times per
// training step, never on the malloc/free path. Invariants: profiler.h and
// breakdown.h.
#include "profiler/profiler.h"

#include "common/errors.h"

namespace memalloc {

void Profiler::resolve(Phase phase, Category cat) {
  if (breakdown_.now().unresolved[static_cast<int>(phase)] != 0) {
    table_.for_each_allocated([&](ProvenanceRecord& r) {
      if (r.prov.category == Category::kUnresolved && r.prov.phase == phase) r.prov.category = cat;
    });
  }
  breakdown_.resolve(phase, cat);
}

void Profiler::recategorize(Phase phase, Category from, Category to) {
  table_.for_each_allocated([&](ProvenanceRecord& r) {
    if (r.prov.phase != phase || r.prov.category != from) return;
    breakdown_.recategorize(static_cast<int64_t>(r.requested), phase, from, to, r.prov.seq);
    r.prov.category = to;
  });
}

void Profiler::enter_phase(Phase phase) {
  if (phase == Phase::kBackward) resolve(Phase::kForward, Category::kActivations);
  if (phase == Phase::kOptimizer) resolve(Phase::kBackward, Category::kGradients);
  phase_ = phase;
}

void Profiler::end_step(uint32_t step) {
  resolve(Phase::kOptimizer, Category::kOptimizerState);
  resolve(Phase::kBackward, Category::kGradients);
  resolve(Phase::kForward, Category::kOther);
  // The first step (its forward began at the first training forward, not at
  // a step's end): what its forward made and still holds is other.
  if (!breakdown_.has_last()) recategorize(Phase::kForward, Category::kActivations, Category::kOther);
  breakdown_.end_window(seq_, step);
  phase_ = Phase::kForward;
}

size_t Profiler::mark(Slot exact, std::uintptr_t ptr, Category cat) {
  ProvenanceRecord* r = nullptr;
  if (exact != 0) {
    r = &table_.at(exact);
  } else {
    // An interior pointer (a view into a larger allocation, e.g. a flat
    // parameter buffer): the allocation that spans it.
    table_.for_each_allocated([&](ProvenanceRecord& x) {
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

void Profiler::validate(const std::vector<SubscribedBlock>& blocks, int64_t allocated_bytes) const {
  auto check = [](bool ok, const std::string& what) {
    if (!ok) throw Error("memalloc invariant broken: " + what);
  };
  for (const SubscribedBlock& b : blocks) {
    check(table_.is_live(b.id), "a live or pending block has no provenance record");
    const ProvenanceRecord& r = table_.at(b.id);
    check(r.addr == b.addr && r.size == b.size && r.requested == b.requested,
          "a live or pending block's provenance record differs from the block");
    check(r.pending == b.pending, b.pending ? "a pending block's provenance record is not pending"
                                            : "a live block's provenance record is pending");
  }
  check(table_.live() == blocks.size(), "the provenance table holds records of no live or pending block");
  check_invariants(check, allocated_bytes);
}

std::vector<LiveBlock> Profiler::live_blocks() const {
  std::vector<LiveBlock> out;
  table_.for_each_allocated(
      [&](const ProvenanceRecord& r) { out.push_back(LiveBlock::of(r.addr, r.size, r.requested, r.prov)); });
  return out;
}

}  // namespace memalloc
