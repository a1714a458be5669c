// profiler_test.cpp — C++ unit tests of the Profiler part
// (csrc/profiler/profiler.h) on its own, fed as DeviceAllocator feeds it
// (add, then the kAlloc Event; the kFreeRequested Event, then
// set_pending or the kFreeCompleted Event and remove) with no allocator:
// a training step's landmarks resolve each allocation to the category the
// rules of breakdown.h give it, computed here from the test's own list of
// what it allocated and freed; marks by slot and by interior pointer; the
// first step's forward leftovers become other; pending allocations leave the
// walks; the leak view and the invariants. Built by tests/cpp/test_cpp_core.py.
#include <cstdint>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/errors.h"
#include "profiler/profiler.h"
#include "part_test.h"

using namespace memalloc;

namespace {

struct Alloc {
  std::uintptr_t addr;
  size_t size, requested;
  Profiler::Slot slot;
  Category want;  // the category the test expects once resolved
  bool live;
};

// The Event DeviceAllocator sends about allocation `a` (its id: the slot).
Event event(Action action, const Alloc& a) {
  Event e;
  e.action = action;
  e.addr = a.addr;
  e.size = a.size;
  e.requested = action == Action::kFreeCompleted ? 0 : a.requested;
  e.id = a.slot;
  return e;
}

struct Feed {
  Profiler p{0};
  CallContext call{7, 9, 1, 0};
  DeviceStats stats{};
  Subscriber& sub() { return p; }  // the allocator sees only the interface
  std::vector<Alloc> allocs;
  std::uintptr_t next = 0x100000;

  size_t alloc(size_t requested, Category want) {
    const size_t size = (requested + 511) / 512 * 512 + 512;  // some rounding: other
    Alloc a{next, size, requested, 0, want, true};
    next += size;
    // As DeviceAllocator calls its subscriber (allocator/subscriber.h).
    a.slot = sub().on_live(event(Action::kAlloc, a), &call, stats);
    allocs.push_back(a);
    return allocs.size() - 1;
  }
  // The caller frees allocation i; `pending`: its streams are still at work.
  void free(size_t i, bool pending = false) {
    Alloc& a = allocs[i];
    sub().on_event(event(Action::kFreeRequested, a), &call, stats);
    a.live = false;
    if (pending) return;  // its record stays, pending, until kFreeCompleted
    complete(i);
  }
  void complete(size_t i) {
    Alloc& a = allocs[i];
    sub().on_event(event(Action::kFreeCompleted, a), &call, stats);  // removes its record
    a.slot = 0;
  }
  int64_t allocated() const {
    int64_t n = 0;
    for (const Alloc& a : allocs) n += a.live ? static_cast<int64_t>(a.size) : 0;
    return n;
  }
  // The truth: each live allocation's requested bytes in its category, the
  // rest of its block other.
  CategoryBytes truth() const {
    CategoryBytes t;
    for (const Alloc& a : allocs) {
      if (!a.live) continue;
      t.live[static_cast<int>(a.want)] += static_cast<int64_t>(a.requested);
      t.live[static_cast<int>(Category::kOther)] += static_cast<int64_t>(a.size - a.requested);
      t.total += static_cast<int64_t>(a.size);
    }
    return t;
  }
};

bool split_is(const CategoryBytes& got, const CategoryBytes& want, std::string* why) {
  for (int c = 0; c < kNumCategories; ++c)
    if (got.live[c] != want.live[c]) {
      *why = std::string(category_name(c)) + " " + std::to_string(got.live[c]) + " != " + std::to_string(want.live[c]);
      return false;
    }
  for (int ph = 0; ph < kNumPhases; ++ph)
    if (got.unresolved[ph] != 0) {
      *why = std::string("unresolved ") + phase_name(ph);
      return false;
    }
  return got.total == want.total || (*why = "total", false);
}

std::vector<std::string> problems(const Feed& f, int64_t allocated) {
  std::vector<std::string> out;
  f.p.check_invariants(
      [&](bool ok, const std::string& what) {
        if (!ok) out.push_back(what);
      },
      allocated);
  // And the subscriber's own check against the blocks the allocator holds.
  std::vector<SubscribedBlock> blocks;
  for (const Alloc& a : f.allocs)
    if (a.slot != 0) blocks.push_back(SubscribedBlock{a.addr, a.size, a.requested, a.slot, !a.live});
  bool threw = false;
  try {
    f.p.validate(blocks, allocated);
  } catch (const Error& e) {
    threw = true;
    if (out.empty()) out.push_back(e.what());  // a difference from the blocks: its own problem
  }
  if (!threw && !out.empty()) out.push_back("validate() passed a broken invariant");
  return out;
}

void two_steps_resolve_by_the_rules() {
  Feed f;
  // Setup (idle): parameters, marked by slot as the Python layer does.
  const size_t w = f.alloc(4000, Category::kParameters);
  const size_t bias = f.alloc(100, Category::kParameters);
  for (size_t i : {w, bias}) EXPECT(f.p.mark(f.allocs[i].slot, 0, Category::kParameters) == f.allocs[i].size);
  const size_t setup_other = f.alloc(300, Category::kOther);  // idle and unmarked: other at once
  // Step 1, forward: kept to the backward (activations, then other at the
  // first step's end if still live), and freed before it (temporaries).
  f.p.enter_phase(Phase::kForward);
  const size_t act = f.alloc(2000, Category::kActivations);
  const size_t workspace = f.alloc(700, Category::kOther);  // outlives the first step
  const size_t tmp = f.alloc(900, Category::kTemporaries);
  f.free(tmp);
  f.p.enter_phase(Phase::kBackward);
  EXPECT(f.p.provenance_of(f.allocs[act].slot).category == Category::kActivations);
  const size_t grad = f.alloc(4000, Category::kGradients);
  f.free(act);  // autograd drops the saved tensor
  f.p.enter_phase(Phase::kOptimizer);
  EXPECT(f.p.provenance_of(f.allocs[grad].slot).category == Category::kGradients);
  const size_t state = f.alloc(8000, Category::kOptimizerState);
  f.p.end_step(1);
  // The first step's forward blocks still live were activations: now other.
  EXPECT(f.p.provenance_of(f.allocs[workspace].slot).category == Category::kOther);
  EXPECT(f.p.phase() == Phase::kForward);
  std::string why;
  EXPECT(split_is(f.p.state().now, f.truth(), &why) || (std::printf("  %s\n", why.c_str()), false));
  EXPECT(problems(f, f.allocated()).empty());
  // Step 2: a forward block live at the backward stays an activation.
  const size_t act2 = f.alloc(1500, Category::kActivations);
  f.p.enter_phase(Phase::kBackward);
  f.p.enter_phase(Phase::kOptimizer);
  f.p.end_step(2);
  EXPECT(f.p.provenance_of(f.allocs[act2].slot).category == Category::kActivations);
  EXPECT(split_is(f.p.state().now, f.truth(), &why) || (std::printf("  %s\n", why.c_str()), false));
  EXPECT(f.p.state().has_last && f.p.state().last_step == 2);
  EXPECT(problems(f, f.allocated()).empty());
  // The invariants catch a wrong allocated figure.
  EXPECT(problems(f, f.allocated() + 512).size() == 1);
  (void)setup_other;
  (void)state;
}

void an_interior_pointer_marks_the_allocation_that_spans_it() {
  Feed f;
  const size_t flat = f.alloc(64 << 10, Category::kParameters);
  const size_t other = f.alloc(1000, Category::kOther);
  const Alloc& a = f.allocs[flat];
  EXPECT(f.p.mark(0, a.addr + 4096, Category::kParameters) == a.size);
  EXPECT(f.p.provenance_of(a.slot).category == Category::kParameters);
  EXPECT(f.p.mark(0, f.next + (1 << 20), Category::kParameters) == 0);  // nothing there
  std::string why;
  EXPECT(split_is(f.p.state().now, f.truth(), &why) || (std::printf("  %s\n", why.c_str()), false));
  (void)other;
}

void pending_allocations_leave_the_walks_and_the_leak_view() {
  Feed f;
  f.p.enter_phase(Phase::kForward);
  const size_t kept = f.alloc(1000, Category::kActivations);
  const size_t waiting = f.alloc(3000, Category::kTemporaries);
  f.free(waiting, /*pending=*/true);  // streams still use it: its record stays, pending
  f.p.enter_phase(Phase::kBackward);  // resolves only what the caller holds
  EXPECT(f.p.provenance_of(f.allocs[waiting].slot).category == Category::kUnresolved);
  EXPECT(f.p.provenance_of(f.allocs[kept].slot).category == Category::kActivations);
  const std::vector<LiveBlock> live = f.p.live_blocks();
  EXPECT(live.size() == 1 && live[0].addr == f.allocs[kept].addr && live[0].stack_id == 7 && live[0].tag_id == 9);
  EXPECT(problems(f, f.allocated()).empty());
  f.complete(waiting);  // the streams finished
  EXPECT(f.p.table().live() == 1);
  EXPECT(problems(f, f.allocated()).empty());
}

void restored_allocations_keep_who_made_them() {
  Feed f;
  f.p.enter_phase(Phase::kForward);
  // What a checkpoint keeps of an allocation (note) comes back on restore.
  Alloc first{0x4000, 1024, 1000, 0, Category::kOther, true};
  const Profiler::Slot made = f.sub().on_live(event(Action::kAlloc, first), &f.call, f.stats);
  const uint64_t note = f.sub().note(made);
  EXPECT(Profiler::note_stack(note) == 7 && Profiler::note_tag(note) == 9);
  Alloc again{0x5000, 1024, 1000, 0, Category::kOther, true};
  const Profiler::Slot s = f.sub().on_restored(event(Action::kAlloc, again), nullptr, f.stats, uint64_t{41} << 32 | 42);
  const Provenance p = f.p.provenance_of(s);
  EXPECT(p.stack_id == 41 && p.tag_id == 42 && p.phase == Phase::kForward && p.seq == f.p.last_seq());
  EXPECT(p.step == 0);  // no caller: the call's step is unknown
  EXPECT(Profiler::call_provenance(f.call).stack_id == 7 && Profiler::call_provenance(f.call).seq == 0);
}

}  // namespace

int main() {
  two_steps_resolve_by_the_rules();
  an_interior_pointer_marks_the_allocation_that_spans_it();
  pending_allocations_leave_the_walks_and_the_leak_view();
  restored_allocations_keep_who_made_them();
  return part_test::finish();
}
