// event_sink_test.cpp — C++ unit tests of the EventSink part
// (csrc/allocator/event_sink.h) on its own, with a subscriber that writes
// down every call: each Event reaches the counters first (the subscriber
// sees the stats with it), a kAlloc goes through on_live / on_restored and
// its id comes back, every other Event through on_event; the caller word is
// the scope's for the scope's life and nullptr outside it; with no
// subscriber nothing is called and ids and notes are 0. Built by
// tests/cpp/test_cpp_core.py; prints failures=N, exits 0 only when N is 0.
#include <cstdint>
#include <string>
#include <vector>

#include "allocator/event_sink.h"
#include "part_test.h"

using namespace memalloc;

namespace {

struct Call {
  std::string what;
  Action action;
  Caller caller;
  int64_t allocated_then;  // the stats the subscriber was given
  uint64_t note;
};

struct Recorder final : Subscriber {
  std::vector<Call> calls;
  Id next = 7;
  Id on_live(const Event& e, Caller caller, const DeviceStats& after) override {
    calls.push_back({"live", e.action, caller, after.allocated_bytes[kStatAll].current, 0});
    return next++;
  }
  Id on_restored(const Event& e, Caller caller, const DeviceStats& after, uint64_t note) override {
    calls.push_back({"restored", e.action, caller, after.allocated_bytes[kStatAll].current, note});
    return next++;
  }
  void on_event(const Event& e, Caller caller, const DeviceStats& after) noexcept override {
    calls.push_back({"event", e.action, caller, after.allocated_bytes[kStatAll].current, 0});
  }
  uint64_t note(Id id) const noexcept override { return uint64_t{id} * 1000; }
  void validate(const std::vector<SubscribedBlock>&, int64_t) const override {}
};

Event event(Action a, size_t size) {
  Event e;
  e.action = a;
  e.pool = PoolKind::kLarge;
  e.size = size;
  e.requested = size;
  return e;
}

void counters_first_then_the_subscriber_with_the_callers_word() {
  EventSink sink(static_cast<size_t>(-1));
  Recorder r;
  sink.set_subscriber(&r);
  const int who = 42;  // any object: the sink never reads it
  Subscriber::Id id = 0;
  {
    const EventSink::CallerScope scope(sink, &who);
    sink.record(event(Action::kSegmentAlloc, 2 << 20));
    id = sink.record_alloc(event(Action::kAlloc, 1 << 20));
  }
  EXPECT(id == 7);
  sink.record(event(Action::kFreeRequested, 1 << 20));  // no scope: no caller
  EXPECT(r.calls.size() == 3);
  EXPECT(r.calls[0].what == "event" && r.calls[0].action == Action::kSegmentAlloc && r.calls[0].caller == &who);
  EXPECT(r.calls[1].what == "live" && r.calls[1].caller == &who);
  EXPECT(r.calls[1].allocated_then == (1 << 20));  // the counters took the kAlloc first
  EXPECT(r.calls[2].what == "event" && r.calls[2].caller == nullptr && r.calls[2].allocated_then == 0);
  EXPECT(sink.stats().allocated_bytes[kStatAll].current == 0);
  EXPECT(sink.reserved_bytes() == (2u << 20));
  EXPECT(sink.note(id) == 7000 && sink.note(0) == 0);
  const Subscriber::Id again = sink.record_restored(event(Action::kAlloc, 4096), 99);
  EXPECT(again == 8 && r.calls.back().what == "restored" && r.calls.back().note == 99);
  EXPECT(sink.allocated_bytes() == 4096);
}

void no_subscriber_no_calls_and_zero_ids() {
  EventSink sink(static_cast<size_t>(-1));
  EXPECT(sink.subscriber() == nullptr);
  EXPECT(sink.record_alloc(event(Action::kAlloc, 512)) == 0);
  EXPECT(sink.record_restored(event(Action::kAlloc, 512), 5) == 0);
  EXPECT(sink.note(3) == 0);
  sink.record(event(Action::kOom, 512));
  EXPECT(sink.stats().num_ooms == 1 && sink.allocated_bytes() == 1024);
}

}  // namespace

int main() {
  counters_first_then_the_subscriber_with_the_callers_word();
  no_subscriber_no_calls_and_zero_ids();
  return part_test::finish();
}
