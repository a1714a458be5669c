// stream_events.h — cross-stream safety as one part (torch's record_stream
// semantics): a block freed after record_stream(s) is reusable only once
// the work queued on every such stream at free time has completed.
//
// On free (insert) one event is recorded per use stream; the block stays
// "pending" (active, not allocated, in no free list) while
// block->event_count > 0. A block freed while a capture is under way
// (defer) cannot have its events recorded yet (no event may be recorded or
// queried during a capture): it waits, unrecorded, with one extra count,
// until the first process() outside a capture, or (graph capture reuse)
// until the captured graph orders its uses before its stream's next work
// (reuse_in_capture, capture_reuse.h). When a block's last event completes,
// the part hands it back through the caller's `done(b)` (its free list).
//
// Invariants:
//   * b->event_count == the entries of pending_ naming b + 1 if deferred_
//     holds b, for every block either names; every EventHandle is in exactly
//     one of pending_ and spare_ (or in the function that took it).
//   * process() and synchronize() are never called during a capture (the
//     caller checks); insert() neither.
//   * No lock of its own: DeviceAllocator calls it under the device lock.
//     Its vectors use the allocator's node resource; the fast path's one
//     test is idle() (inline), which allocates nothing.
#pragma once

#include <algorithm>
#include <memory_resource>
#include <vector>

#include "backend/backend.h"
#include "pool/block.h"
#include "pool/capture_reuse.h"

namespace memalloc {

class StreamEvents {
 public:
  struct Pending {
    EventHandle event;
    Block* block;
  };

  StreamEvents(Backend& backend, int device, std::pmr::memory_resource* mr)
      : backend_(backend), device_(device), pending_(mr), deferred_(mr), spare_(mr), reuse_(backend, device) {}
  ~StreamEvents();  // destroys every event it holds
  StreamEvents(const StreamEvents&) = delete;
  StreamEvents& operator=(const StreamEvents&) = delete;

  // No block waits: the fast path's one test.
  bool idle() const { return pending_.empty() && deferred_.empty(); }
  bool has_deferred() const { return !deferred_.empty(); }

  // `b` (freed, with stream uses, outside a capture) waits for one event per
  // use stream; its stream uses are cleared.
  void insert(Block* b);
  // `b` freed with stream uses during a capture: waits unrecorded. With
  // `reuse` (graph_capture_record_stream_reuse) its free markers are taken.
  void defer(Block* b, bool reuse);

  // Records the deferred blocks' events, then calls done(b) for every block
  // whose events have all completed (non-blocking).
  template <class Done>
  void process(Done&& done);
  // Waits for every event, then as process().
  template <class Done>
  void synchronize(Done&& done);
  // During a capture: done(b) for the deferred blocks allocated on `stream`
  // whose uses the captured graph orders before the stream's next work.
  template <class Done>
  void reuse_in_capture(Stream stream, Done&& done);

  // Whether any waiting block satisfies `pred`.
  template <class Pred>
  bool any_waiting(Pred&& pred) const {
    return std::any_of(pending_.begin(), pending_.end(), [&](const Pending& p) { return pred(p.block); }) ||
           std::any_of(deferred_.begin(), deferred_.end(), pred);
  }
  // Calls f(b) for every waiting block (a block with several events more than once).
  template <class F>
  void for_each_waiting(F&& f) const {
    for (const Pending& p : pending_) f(p.block);
    for (Block* b : deferred_) f(b);
  }
  // Checks the invariants above: check(condition, what is wrong).
  template <class Check>
  void validate(Check&& check) const;

 private:
  Backend& backend_;
  const int device_;
  std::pmr::vector<Pending> pending_;
  std::pmr::vector<Block*> deferred_;
  std::pmr::vector<EventHandle> spare_;  // recorded and completed: reused before creating more
  CaptureReuse reuse_;
};

template <class Done>
void StreamEvents::process(Done&& done) {
  for (Block* b : deferred_) {
    b->event_count -= 1;
    insert(b);
  }
  deferred_.clear();
  reuse_.clear();
  size_t kept = 0;
  for (size_t i = 0; i < pending_.size(); ++i) {
    Pending p = pending_[i];
    if (!backend_.query_event(device_, p.event)) {
      pending_[kept++] = p;
      continue;
    }
    spare_.push_back(p.event);
    if (--p.block->event_count == 0) done(p.block);
  }
  pending_.resize(kept);
}

template <class Done>
void StreamEvents::synchronize(Done&& done) {
  if (!deferred_.empty()) process(done);
  for (Pending& p : pending_) backend_.synchronize_event(device_, p.event);
  process(done);
}

template <class Done>
void StreamEvents::reuse_in_capture(Stream stream, Done&& done) {
  if (!reuse_.refresh(stream)) return;
  size_t kept = 0;
  for (Block* b : deferred_) {
    if (b->stream != stream || !reuse_.reusable(*b, stream)) {
      deferred_[kept++] = b;
      continue;
    }
    reuse_.forget(*b);
    b->stream_uses.clear();  // the graph orders them: no event is needed
    if (--b->event_count == 0) done(b);
  }
  deferred_.resize(kept);
}

template <class Check>
void StreamEvents::validate(Check&& check) const {
  for (const Block* b : deferred_)
    check(!b->allocated && b->event_count > 0, "deferred entry names a non-pending block");
  for (const Pending& p : pending_)
    check(!p.block->allocated && p.block->event_count > 0, "pending entry names a non-pending block");
  check(reuse_.marks_only(deferred_), "a capture-reuse marker names a block that is not deferred");
  auto count = [&](const Block* b) {
    size_t n = static_cast<size_t>(std::count(deferred_.begin(), deferred_.end(), b));
    for (const Pending& p : pending_) n += p.block == b;
    return n;
  };
  for_each_waiting([&](const Block* b) {
    check(static_cast<int>(count(b)) == b->event_count, "event_count differs from pending entries");
  });
}

}  // namespace memalloc
