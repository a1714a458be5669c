// event_trace_test.cpp — C++ unit tests of the EventTrace subscriber
// (csrc/profiler/event_trace.h) on its own: Events made by hand, the
// records read back and compared field by field with the Events the test
// pushed, in memory and in slots the test owns (as a flight file's), the
// capacity checks, and the one-time-stamp rule of a free that completes at
// once. Built by tests/cpp/test_cpp_core.py.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "profiler/event_trace.h"
#include "profiler/provenance.h"
#include "common/config.h"
#include "common/errors.h"
#include "part_test.h"

using namespace memalloc;

namespace {

// Provenance the Events point to (stable: reserved up front).
std::vector<Provenance>& provenances() {
  static std::vector<Provenance> v = [] {
    std::vector<Provenance> p(64);
    for (size_t i = 0; i < p.size(); ++i) {
      p[i].stack_id = static_cast<uint32_t>(10 + i);
      p[i].tag_id = static_cast<uint32_t>(20 + i);
    }
    return p;
  }();
  return v;
}

// An Event and the provenance of its allocation (what Profiler::on_event
// looks up and passes to take()).
struct ProvEvent : Event {
  const Provenance* prov = &kNoProvenance;
};

void take(EventTrace& t, const ProvEvent& e, uint32_t thread, uint32_t step) {
  t.take(e, e.prov->stack_id, e.prov->tag_id, thread, step);
}

ProvEvent event(Action a, uint64_t i) {
  ProvEvent e;
  e.action = a;
  e.pool = i % 2 ? PoolKind::kLarge : PoolKind::kSmall;
  e.stream = 0x100 + i;
  e.addr = 0x7000'0000 + i * 512;
  e.size = 512 * (i + 1);
  e.requested = 500 * (i + 1);
  e.prov = &provenances().at(i);
  return e;
}

bool same(const TraceRecord& r, const ProvEvent& e, uint32_t thread, uint32_t step, uint8_t device) {
  return r.addr == e.addr && r.size == e.size && r.requested == e.requested && r.stream == e.stream &&
         r.stack_id == e.prov->stack_id && r.tag_id == e.prov->tag_id && r.thread == thread && r.step == step &&
         r.action == static_cast<uint8_t>(e.action) && r.device == device && r.pool == static_cast<uint8_t>(e.pool);
}

void off_until_reset_and_records_every_field() {
  EventTrace t(3);
  EXPECT(!t.enabled());
  EXPECT(t.records().empty() && t.dropped() == 0);
  t.reset(8);
  EXPECT(t.enabled());
  std::vector<ProvEvent> pushed;
  for (uint64_t i = 0; i < 5; ++i) {
    pushed.push_back(event(i % 2 ? Action::kFreeRequested : Action::kAlloc, i));
    take(t, pushed.back(), static_cast<uint32_t>(i), static_cast<uint32_t>(100 + i));
  }
  const std::vector<TraceRecord> got = t.records();
  EXPECT(got.size() == pushed.size() && t.dropped() == 0);
  for (size_t i = 0; i < got.size() && i < pushed.size(); ++i) {
    EXPECT(same(got[i], pushed[i], static_cast<uint32_t>(i), static_cast<uint32_t>(100 + i), 3));
    if (i > 0) EXPECT(got[i].time_ns >= got[i - 1].time_ns);  // never back
  }
  t.reset(0);
  EXPECT(!t.enabled() && t.records().empty());
}

void a_full_ring_keeps_the_newest() {
  EventTrace t(0);
  t.reset(4);
  std::vector<ProvEvent> pushed;
  for (uint64_t i = 0; i < 11; ++i) {
    pushed.push_back(event(Action::kAlloc, i));
    take(t, pushed.back(), 1, 2);
  }
  const std::vector<TraceRecord> got = t.records();
  EXPECT(got.size() == 4 && t.dropped() == 7);
  for (size_t i = 0; i < got.size(); ++i) EXPECT(same(got[i], pushed[7 + i], 1, 2, 0));
}

void a_free_completing_at_once_has_one_time_stamp() {
  EventTrace t(0);
  t.reset(16);
  take(t, event(Action::kFreeRequested, 1), 0, 0);
  ProvEvent done = event(Action::kFreeCompleted, 1);
  done.at_once = true;
  take(t, done, 0, 0);
  // A completion not at once is stamped with its own reading: one that
  // comes after a pause reads later than the request before it.
  take(t, event(Action::kFreeRequested, 2), 0, 0);
  const int64_t requested = t.records().back().time_ns;
  int64_t completed = requested;
  for (int tries = 0; tries < 1000 && completed == requested; ++tries) {
    EventTrace probe(0);
    probe.reset(1);
    take(probe, event(Action::kFreeCompleted, 2), 0, 0);
    completed = probe.records().back().time_ns;
  }
  const std::vector<TraceRecord> got = t.records();
  EXPECT(got.size() == 3);
  EXPECT(got[0].time_ns == got[1].time_ns);
  EXPECT(completed > requested);  // the clock moves: the equality above is at_once's doing
}

void attached_slots_get_sequence_numbers() {
  constexpr size_t kCap = 3;
  std::vector<TraceRecord> slots(kCap);
  std::vector<uint64_t> seqs(kCap, 99);
  auto keep = std::make_shared<int>(7);
  EventTrace t(1);
  t.attach(slots.data(), seqs.data(), kCap, keep);
  EXPECT(t.enabled());
  EXPECT(seqs[0] == 0 && seqs[1] == 0 && seqs[2] == 0);  // cleared on attach
  EXPECT(keep.use_count() == 2);                         // the ring keeps the memory alive
  for (uint64_t i = 0; i < 4; ++i) take(t, event(Action::kAlloc, i), 0, 0);
  // 4 pushes into 3 slots: slot 0 holds the 4th record, 1 and 2 the 2nd and 3rd.
  EXPECT(seqs[0] == 4 && seqs[1] == 2 && seqs[2] == 3);
  EXPECT(slots[0].addr == event(Action::kAlloc, 3).addr);
  EXPECT(t.dropped() == 1);
  t.reset(0);
  EXPECT(keep.use_count() == 1);  // released when the ring leaves the file
}

void bad_capacities_are_refused_and_change_nothing() {
  EventTrace t(0);
  t.reset(2);
  take(t, event(Action::kAlloc, 0), 0, 0);
  bool refused = false;
  try {
    t.reset(kMaxTraceRecords + 1);
  } catch (const InvalidArgument& e) {
    refused = std::string(e.what()).find("too large") != std::string::npos;
  }
  EXPECT(refused);
  TraceRecord slot{};
  uint64_t seq = 0;
  refused = false;
  try {
    t.attach(&slot, &seq, 0, nullptr);
  } catch (const InvalidArgument& e) {
    refused = std::string(e.what()).find("flight recorder capacity") != std::string::npos;
  }
  EXPECT(refused);
  EXPECT(t.enabled() && t.records().size() == 1);  // the ring as it was
}

}  // namespace

int main() {
  off_until_reset_and_records_every_field();
  a_full_ring_keeps_the_newest();
  a_free_completing_at_once_has_one_time_stamp();
  attached_slots_get_sequence_numbers();
  bad_capacities_are_refused_and_change_nothing();
  return part_test::finish();
}
