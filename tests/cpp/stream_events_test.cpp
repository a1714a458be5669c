// stream_events_test.cpp — C++ unit tests of the StreamEvents part
// (csrc/pool/stream_events.h) on its own: blocks made by hand, the host backend's
// streams (their work completes only when synchronised), and the part's
// invariants checked after every step. Built by tests/cpp/test_cpp_core.py.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common/config.h"
#include "pool/stream_events.h"
#include "part_test.h"

using namespace memalloc;

namespace {

struct Fixture {
  Config config = parse_config("host_capacity_mb:64");
  HostBackend backend{config};
  std::pmr::unsynchronized_pool_resource mr;
  StreamEvents events{backend, 0, &mr};
  std::vector<Block*> done;
  std::vector<std::unique_ptr<Block>> blocks;

  Block* freed_block(Stream stream, std::vector<Stream> uses) {
    blocks.push_back(std::make_unique<Block>(&mr));
    Block* b = blocks.back().get();
    b->addr = 0x1000 * blocks.size();
    b->stream = stream;
    for (Stream s : uses) b->stream_uses.push_back(s);
    return b;  // freed: not allocated
  }
  auto collect() {
    return [this](Block* b) { done.push_back(b); };
  }
};

void a_block_waits_for_every_use_stream() {
  Fixture f;
  Block* b = f.freed_block(1, {2, 3});
  f.events.insert(b);
  EXPECT(b->event_count == 2 && b->stream_uses.empty() && !f.events.idle());
  VALID(f.events);
  f.events.process(f.collect());
  EXPECT(f.done.empty());  // neither stream's work has completed
  f.backend.synchronize_stream(0, 2);
  f.events.process(f.collect());
  EXPECT(f.done.empty() && b->event_count == 1);
  VALID(f.events);
  f.backend.synchronize_stream(0, 3);
  f.events.process(f.collect());
  EXPECT(f.done.size() == 1 && f.done[0] == b && b->event_count == 0 && f.events.idle());
  VALID(f.events);
}

void events_are_reused_once_completed() {
  Fixture f;
  Block* a = f.freed_block(1, {2});
  f.events.insert(a);
  f.backend.synchronize_stream(0, 2);
  f.events.process(f.collect());
  Block* b = f.freed_block(1, {2});
  f.events.insert(b);  // takes the spare event: recorded again on stream 2, so not complete
  f.events.process(f.collect());
  EXPECT(f.done.size() == 1 && f.done[0] == a);
  f.events.synchronize(f.collect());
  EXPECT(f.done.size() == 2 && f.done[1] == b && f.events.idle());
  VALID(f.events);
}

void a_deferred_block_waits_for_the_capture_to_end() {
  Fixture f;
  Block* b = f.freed_block(1, {2});
  f.events.defer(b, false);
  EXPECT(b->event_count == 1 && f.events.has_deferred());
  VALID(f.events);
  f.events.process(f.collect());  // the capture ended: its events are recorded now
  EXPECT(f.done.empty() && !f.events.has_deferred() && b->event_count == 1);
  VALID(f.events);
  f.events.synchronize(f.collect());
  EXPECT(f.done.size() == 1 && f.events.idle());
}

void reuse_in_capture_follows_the_graph() {
  Fixture f;
  f.backend.capture_begin(0, 1);
  f.backend.capture_wait(0, 2, 1);
  f.backend.capture_work(0, 2);  // stream 2 reads the block
  Block* b = f.freed_block(1, {2});
  f.events.defer(b, true);
  f.backend.capture_work(0, 1);
  f.events.reuse_in_capture(1, f.collect());
  EXPECT(f.done.empty());  // stream 1's next work is not after stream 2's read
  f.backend.capture_wait(0, 1, 2);
  f.events.reuse_in_capture(2, f.collect());
  EXPECT(f.done.empty());  // only its own stream reuses it
  f.events.reuse_in_capture(1, f.collect());
  EXPECT(f.done.size() == 1 && f.done[0] == b && f.events.idle() && b->stream_uses.empty());
  VALID(f.events);
  f.backend.capture_end(0, 1);
}

void waiting_blocks_are_listed_and_found() {
  Fixture f;
  Block* a = f.freed_block(1, {2, 3});
  Block* b = f.freed_block(1, {2});
  f.events.insert(a);
  f.events.defer(b, false);
  int named = 0;
  f.events.for_each_waiting([&](const Block*) { ++named; });
  EXPECT(named == 3);  // a twice (two events), b once
  EXPECT(f.events.any_waiting([&](const Block* x) { return x == b; }));
  EXPECT(!f.events.any_waiting([&](const Block* x) { return x->addr == 0; }));
  f.events.synchronize(f.collect());
  EXPECT(f.done.size() == 2 && f.events.idle());
}
}  // namespace

int main() {
  a_block_waits_for_every_use_stream();
  events_are_reused_once_completed();
  a_deferred_block_waits_for_the_capture_to_end();
  reuse_in_capture_follows_the_graph();
  waiting_blocks_are_listed_and_found();
  return part_test::finish();
}
