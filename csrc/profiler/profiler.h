// profiler.h — what memalloc knows of one device's allocations beyond
// torch's counters, in the layer above the allocator: every allocation's
// provenance (provenance_table.h), the training phase new allocations are
// stamped with, their sequence numbers, the breakdown by category
// (breakdown.h), the event ring (event_trace.h) and the boundary's
// observer (torch's own history).
//
// It is its device's Subscriber (allocator/subscriber.h): told of each
// allocation's life (on_live / on_restored with a block's kAlloc Event; its
// kFreeRequested Event makes the record pending, its kFreeCompleted removes
// it) and of every Event (on_event, after the counters). The caller word of the allocator's calls is a CallContext
// (recorder.h) or nullptr. Its landmarks (enter_phase, resolve, end_step,
// mark) walk its own table, never the allocator's blocks.
//
// Invariants:
//   * Called only under the owning device's lock; no lock of its own (the
//     boundary reaches it through CachingAllocator::with_profiler).
//   * on_event and the record calls allocate no host memory in a steady
//     state and cannot throw.
//   * Sequence numbers are 1, 2, ... in the order allocations became live;
//     every live record's seq is in [1, last_seq()].
//   * The breakdown's bytes by category and phase equal the sums over the
//     table's allocations (not pending) of their requested bytes, the rest
//     of each block being other; its total equals the allocator's
//     allocated bytes (validate()).
//   * A record's category moves only from kUnresolved to a final one, or
//     between final ones (mark, the first step's recategorisation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "allocator/subscriber.h"
#include "pool/events.h"
#include "profiler/breakdown.h"
#include "profiler/event_trace.h"
#include "profiler/provenance.h"
#include "profiler/provenance_table.h"
#include "profiler/recorder.h"

namespace memalloc {

// One live allocation (a block the caller has not freed), for leak tracking.
// A wire format (memalloc._C.LIVE_FIELDS / LIVE_BYTES; memalloc/trace/sites.py
// unpacks it): the who and when of the block's Provenance that Python reads,
// flat, 40 bytes. Holding the whole Provenance would add its phase, category
// and sequence number (8 bytes) to every record that Python never reads.
struct LiveBlock {
  std::uintptr_t addr;
  size_t size;
  size_t requested;
  uint32_t stack_id;  // Provenance::stack_id
  uint32_t tag_id;    // Provenance::tag_id
  uint32_t step;      // Provenance::step: step count when it was allocated

  static LiveBlock of(std::uintptr_t addr, size_t size, size_t requested, const Provenance& p) {
    return LiveBlock{addr, size, requested, p.stack_id, p.tag_id, p.step};
  }
};
static_assert(sizeof(LiveBlock) == 40, "LiveBlock is a 40-byte wire format (LIVE_BYTES)");

// The caller word of an allocator call that carried none.
inline constexpr CallContext kNoCall{};

class Profiler final : public Subscriber {
 public:
  using Slot = ProvenanceTable::Slot;
  struct State {  // the breakdown's report
    CategoryBytes now, peak, last;
    bool has_last;
    uint32_t last_step;
    Phase phase;
  };

  explicit Profiler(int device) : device_(device), trace_(device) {}
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // ---- the allocator's calls (allocator/subscriber.h) ----------------------
  // A new record, then its kAlloc Event as on_event takes a block's.
  Id on_live(const Event& e, Caller caller, const DeviceStats& after) override {
    const Slot s = add(e.addr, e.size, e.requested, context(caller));
    take_block_event(e, s, caller, after);
    return s;
  }
  Id on_restored(const Event& e, Caller caller, const DeviceStats& after, uint64_t note) override {
    const Slot s = add_restored(e.addr, e.size, e.requested, context(caller), note_stack(note), note_tag(note));
    take_block_event(e, s, caller, after);
    return s;
  }
  // One Event, after the counters took it: the breakdown (its block's
  // provenance), the ring (stamped with the call's thread and step; a
  // segment or OOM event with the call's stack and tag) while recording is
  // on, then the observer; then a block's kFreeRequested makes its record
  // pending (the walks skip it), its kFreeCompleted removes it.
  // The malloc/free path: one test (watching_) while neither the ring nor
  // an observer is on.
  void on_event(const Event& e, Caller caller, const DeviceStats& after) noexcept override {
    if (e.id == 0) {
      if (watching_) watch(e, caller, after, nullptr);
      return;
    }
    take_block_event(e, e.id, caller, after);
  }
  // A live allocation's stack and tag (what a restore gives back and the
  // snapshot shows): stack_id << 32 | tag_id (note_stack, note_tag).
  uint64_t note(Id id) const noexcept override {
    const Provenance& p = table_.at(id).prov;
    return uint64_t{p.stack_id} << 32 | p.tag_id;
  }
  static uint32_t note_stack(uint64_t note) { return static_cast<uint32_t>(note >> 32); }
  static uint32_t note_tag(uint64_t note) { return static_cast<uint32_t>(note); }
  void validate(const std::vector<SubscribedBlock>& blocks, int64_t allocated_bytes) const override;

  // One more consumer of every Event, for a boundary (torch's own history
  // format): called after the breakdown and the ring with the device's
  // allocated and reserved bytes after the event. It must not throw (an
  // exception is swallowed) nor call into the allocator. fn nullptr: none.
  struct EventObserver {
    void (*fn)(void* user, int device, const Event& e, int64_t allocated, int64_t reserved) = nullptr;
    void* user = nullptr;
  };
  void set_observer(EventObserver o) {
    observer_ = o;
    rewatch();
  }
  // The event ring: `capacity` records in memory (0: off), or a flight
  // file's (event_trace.h's reset and attach).
  void reset_trace(size_t capacity) {
    trace_.reset(capacity);
    rewatch();
  }
  void attach_trace(TraceRecord* slots, uint64_t* seqs, size_t capacity, std::shared_ptr<void> keep) {
    trace_.attach(slots, seqs, capacity, std::move(keep));
    rewatch();
  }
  static const CallContext& context(Caller caller) {
    return caller != nullptr ? *static_cast<const CallContext*>(caller) : kNoCall;
  }

  // ---- an allocation's life ------------------------------------------------
  // A block became live: a record of the call's stack, tag and step, the
  // current phase, its initial category and the next sequence number.
  Slot add(std::uintptr_t addr, size_t size, size_t requested, const CallContext& call) {
    Provenance p = call_provenance(call);
    p.phase = phase_;
    p.category = initial_category(phase_);
    p.seq = ++seq_;
    return table_.add(addr, size, requested, p);
  }
  // The same for a block a checkpoint's restore makes live again: allocated
  // by whom it was (`stack_id`, `tag_id`), live again now.
  Slot add_restored(std::uintptr_t addr, size_t size, size_t requested, const CallContext& call, uint32_t stack_id,
                    uint32_t tag_id) {
    const Slot s = add(addr, size, requested, call);
    table_.at(s).prov.stack_id = stack_id;
    table_.at(s).prov.tag_id = tag_id;
    return s;
  }
  // A slot's provenance by value (empty for slot 0).
  Provenance provenance_of(Slot s) const { return table_.of(s); }
  // The call as a provenance (stack, tag, step; the rest empty): what
  // segment and OOM events carry.
  static Provenance call_provenance(const CallContext& call) {
    Provenance p;
    p.stack_id = call.stack_id;
    p.tag_id = call.tag_id;
    p.step = call.step;
    return p;
  }

  // ---- the landmarks of the breakdown (breakdown.h) -------------------------
  // New allocations are stamped with `phase`; entering kBackward resolves the
  // forward's (activations), entering kOptimizer the backward's (gradients).
  void enter_phase(Phase phase);
  Phase phase() const { return phase_; }
  // Every unresolved allocation of `phase` gets the final category `cat`
  // now (the Python layer: what is left of a first backward once the
  // gradients are marked is not gradients).
  void resolve(Phase phase, Category cat);
  // The step ended: resolves every unresolved allocation (optimizer state,
  // gradients, other), keeps the window's peak as last(), starts the next
  // window at the current split, and enters kForward. At the first step's
  // end (no window ended before), the forward's activations still live are
  // other, at the peak too: what the first forward made and outlives the
  // step (library workspaces, caches made on first use) is no activation.
  void end_step(uint32_t step);
  // Gives the allocation of slot `exact` (0: none known), or else the one
  // spanning `ptr` (an interior pointer: a walk), the category `cat`.
  // Returns its bytes (0: no allocation holds ptr).
  size_t mark(Slot exact, std::uintptr_t ptr, Category cat);
  State state() const {
    return State{breakdown_.now(),      breakdown_.peak(),      breakdown_.last(),
                 breakdown_.has_last(), breakdown_.last_step(), phase_};
  }

  // ---- reading --------------------------------------------------------------
  // Every allocation the callers hold, in no particular order.
  std::vector<LiveBlock> live_blocks() const;
  // The ring's records oldest first, and how many were overwritten.
  std::vector<TraceRecord> records(uint64_t* dropped) const {
    if (dropped != nullptr) *dropped = trace_.dropped();
    return trace_.records();
  }
  const EventTrace& trace() const { return trace_; }
  const ProvenanceTable& table() const { return table_; }
  uint64_t last_seq() const { return seq_; }

  // check(ok, what) for every invariant above; `allocated_bytes`: the
  // allocator's current allocated bytes.
  template <class Check>
  void check_invariants(Check&& check, int64_t allocated_bytes) const;

 private:
  // Every allocation of `phase` whose category is `from` (final) becomes
  // `to`, in the current split and, if live then, at the window's peak.
  void recategorize(Phase phase, Category from, Category to);

  // A block's Event, `s` its record.
  void take_block_event(const Event& e, Slot s, Caller caller, const DeviceStats& after) noexcept {
    ProvenanceRecord& r = table_.at(s);
    if (e.action == Action::kFreeRequested) table_.set_pending(s);  // the walks skip it from now on
    breakdown_.apply(e, r.prov);
    if (watching_) watch(e, caller, after, &r.prov);
    if (e.action == Action::kFreeCompleted) table_.remove(s);
  }
  // watching_ follows the ring and the observer (set only through the
  // three calls above).
  void rewatch() { watching_ = trace_.enabled() || observer_.fn != nullptr; }
  // The ring and the observer's part of on_event (`p`: the block's
  // provenance, nullptr for an Event about no block: the call's).
  void watch(const Event& e, Caller caller, const DeviceStats& after, const Provenance* p) noexcept {
    const CallContext& call = context(caller);
    if (trace_.enabled())
      trace_.take(e, p != nullptr ? p->stack_id : call.stack_id, p != nullptr ? p->tag_id : call.tag_id, call.thread,
                  call.step);
    if (observer_.fn != nullptr) observe(e, after);
  }
  void observe(const Event& e, const DeviceStats& after) noexcept {
    try {
      observer_.fn(observer_.user, device_, e, after.allocated_bytes[kStatAll].current,
                   after.reserved_bytes[kStatAll].current);
    } catch (...) {  // an observer never breaks the allocator
    }
  }

  const int device_;
  ProvenanceTable table_;
  Breakdown breakdown_;
  Phase phase_ = Phase::kIdle;  // stamped on new allocations
  uint64_t seq_ = 0;            // the last allocation's sequence number
  EventTrace trace_;
  EventObserver observer_;
  bool watching_ = false;  // trace_.enabled() || observer_.fn: on_event has more to do
};

template <class Check>
void Profiler::check_invariants(Check&& check, int64_t allocated_bytes) const {
  table_.validate(check);
  CategoryBytes want;
  table_.for_each_allocated([&](const ProvenanceRecord& r) {
    const auto bytes = static_cast<int64_t>(r.requested);  // what its category holds; the rest: other
    want.live[static_cast<int>(Category::kOther)] += static_cast<int64_t>(r.size) - bytes;
    if (r.prov.category == Category::kUnresolved) {
      check(r.prov.phase != Phase::kIdle, "breakdown: an idle-phase block is unresolved");
      want.unresolved[static_cast<int>(r.prov.phase)] += bytes;
    } else {
      check(static_cast<int>(r.prov.category) < kNumCategories, "breakdown: a block has no valid category");
      want.live[static_cast<int>(r.prov.category)] += bytes;
    }
    check(r.prov.seq >= 1 && r.prov.seq <= seq_, "breakdown: a live block's sequence number is out of range");
    want.total += static_cast<int64_t>(r.size);
  });
  const Breakdown& bd = breakdown_;
  const CategoryBytes& now = bd.now();
  for (int c = 0; c < kNumCategories; ++c)
    check(now.live[c] == want.live[c], std::string("breakdown: ") + category_name(c) + " bytes " +
                                           std::to_string(now.live[c]) + ", expected " + std::to_string(want.live[c]));
  for (int p = 0; p < kNumPhases; ++p)
    check(now.unresolved[p] == want.unresolved[p], std::string("breakdown: unresolved ") + phase_name(p) + " bytes " +
                                                       std::to_string(now.unresolved[p]) + ", expected " +
                                                       std::to_string(want.unresolved[p]));
  check(now.total == allocated_bytes, "breakdown: total differs from allocated_bytes");
  const CategoryBytes& peak = bd.peak();
  int64_t sum = 0;
  for (int64_t v : peak.live) sum += v;
  for (int p = 0; p < kNumPhases; ++p) {
    sum += peak.unresolved[p];
    check(bd.freed_since_peak()[p] >= 0 && bd.freed_since_peak()[p] <= peak.unresolved[p],
          std::string("breakdown: freed-since-peak bytes of ") + phase_name(p) + " out of range");
  }
  check(sum == peak.total, "breakdown: the peak's categories do not add up to its total");
  check(peak.total >= now.total, "breakdown: window peak < current total");
}

}  // namespace memalloc
