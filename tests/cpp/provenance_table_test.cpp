// provenance_table_test.cpp — C++ unit tests of the ProvenanceTable part
// (csrc/profiler/provenance_table.h) on its own: records added, made
// pending and removed in a seeded random order against a model the test
// keeps (a map from slot to record), the slots reused, the walks, the
// invariants checked after every step, and a validate() that catches a
// broken table. Built by tests/cpp/test_cpp_core.py.
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "profiler/provenance_table.h"
#include "part_test.h"

using namespace memalloc;

namespace {
using Slot = ProvenanceTable::Slot;

Provenance prov_of(uint64_t i) {
  Provenance p;
  p.stack_id = static_cast<uint32_t>(i * 3 + 1);
  p.tag_id = static_cast<uint32_t>(i * 5 + 2);
  p.step = static_cast<uint32_t>(i / 7);
  p.phase = static_cast<Phase>(i % kNumPhases);
  p.category = i % 2 ? Category::kUnresolved : Category::kParameters;
  p.seq = i + 1;
  return p;
}

bool same(const ProvenanceRecord& a, const ProvenanceRecord& b) {
  return a.addr == b.addr && a.size == b.size && a.requested == b.requested && a.pending == b.pending &&
         a.prov.stack_id == b.prov.stack_id && a.prov.tag_id == b.prov.tag_id && a.prov.step == b.prov.step &&
         a.prov.phase == b.prov.phase && a.prov.category == b.prov.category && a.prov.seq == b.prov.seq;
}

void random_steps_match_a_model() {
  ProvenanceTable t(4);  // small: the table grows several times
  std::map<Slot, ProvenanceRecord> model;
  std::mt19937_64 rng(12345);
  uint64_t next = 0;
  size_t high_water = 0;
  for (int step = 0; step < 4000; ++step) {
    const int op = static_cast<int>(rng() % 10);
    if (op < 5 || model.empty()) {
      const uint64_t i = next++;
      ProvenanceRecord want{0x1000 + i * 0x200, 512 * (1 + i % 9), 500 * (1 + i % 9), prov_of(i), false};
      const Slot s = t.add(want.addr, want.size, want.requested, want.prov);
      EXPECT(s >= 1 && model.count(s) == 0);  // a slot in use is never given out again
      model[s] = want;
      high_water = std::max(high_water, model.size());
    } else {
      auto it = model.begin();
      std::advance(it, static_cast<long>(rng() % model.size()));
      if (op < 7 && !it->second.pending) {
        t.set_pending(it->first);
        it->second.pending = true;
      } else {
        t.remove(it->first);
        EXPECT(!t.is_live(it->first));
        model.erase(it);
      }
    }
    EXPECT(t.live() == model.size());
    if (step % 97 == 0) VALID(t);
  }
  VALID(t);
  EXPECT(t.slots() == high_water);  // freed slots are reused before the table grows
  for (const auto& [s, want] : model) {
    EXPECT(t.is_live(s));
    EXPECT(same(t.at(s), want));
    EXPECT(t.of(s).seq == want.prov.seq);
  }
  // The walk visits exactly the records not pending, each once.
  std::set<uintptr_t> want_addrs, got_addrs;
  for (const auto& [s, r] : model)
    if (!r.pending) want_addrs.insert(r.addr);
  size_t visits = 0;
  t.for_each_allocated([&](ProvenanceRecord& r) {
    ++visits;
    got_addrs.insert(r.addr);
  });
  EXPECT(got_addrs == want_addrs && visits == want_addrs.size());
  // A change through the walk is seen by at().
  t.for_each_allocated([&](ProvenanceRecord& r) { r.prov.category = Category::kGradients; });
  for (const auto& [s, r] : model) EXPECT((t.at(s).prov.category == Category::kGradients) == !r.pending);
}

void slot_zero_and_reuse_order() {
  ProvenanceTable t;
  EXPECT(t.of(0).seq == 0 && t.of(0).stack_id == 0);  // slot 0: an empty provenance
  EXPECT(!t.is_live(0) && !t.is_live(1));
  const Slot a = t.add(0x1000, 512, 10, prov_of(1));
  const Slot b = t.add(0x2000, 512, 10, prov_of(2));
  const Slot c = t.add(0x3000, 512, 10, prov_of(3));
  t.remove(a);
  t.remove(c);
  EXPECT(t.add(0x4000, 512, 10, prov_of(4)) == c);  // the last freed first
  EXPECT(t.add(0x5000, 512, 10, prov_of(5)) == a);
  EXPECT(t.live() == 3 && t.at(b).addr == 0x2000);
  VALID(t);
}

void validate_catches_a_broken_table() {
  ProvenanceTable t;
  const Slot a = t.add(0x1000, 512, 10, prov_of(1));
  t.add(0x2000, 512, 10, prov_of(2));
  t.at(a) = ProvenanceRecord{};  // emptied behind the table's back: not on the free list
  const auto found = part_test::problems(t);
  EXPECT(found.size() == 2);  // the empty slot, and the live count
}
}  // namespace

int main() {
  random_steps_match_a_model();
  slot_zero_and_reuse_order();
  validate_catches_a_broken_table();
  return part_test::finish();
}
