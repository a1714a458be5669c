// accounting_test.cpp — C++ unit tests of the peak windows (csrc/accounting/
// peak.h) and of two consumers of the Event stream on their own: the
// counters (accounting.h) and the breakdown by category (breakdown.h), fed
// Events made by hand. Every figure is checked against a truth this file
// computes itself from the events it made: the highest value since each
// window's own restart, the bytes of the live blocks by category. Proves
// each window's rule (Stat::peak, the step window, the breakdown's peak),
// that restarting one never moves the other two, and that the breakdown
// reads only kAlloc / kFreeRequested and their provenance. Built by
// tests/cpp/test_cpp_core.py; prints failures=N and exits 0 only when N is 0.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "accounting/accounting.h"
#include "profiler/breakdown.h"
#include "accounting/peak.h"
#include "pool/events.h"
#include "part_test.h"

using namespace memalloc;

namespace {
using part_test::expect;
// Evaluates each side twice: plain values only.
#define EXPECT_EQ(a, b) \
  expect((a) == (b), std::string(#a " == " #b ": ") + std::to_string(a) + " vs " + std::to_string(b), __LINE__)

using part_test::Rng;

// An Event with the provenance of its block, as the profiler hands them to
// the breakdown (Breakdown::apply(e, prov)).
struct ProvEvent : Event {
  const Provenance* prov = &kNoProvenance;
};

ProvEvent block_ev(Action action, PoolKind pool, size_t size, const Provenance& prov) {
  ProvEvent e;
  e.action = action;
  e.pool = pool;
  e.size = size;
  e.requested = size;
  e.prov = &prov;  // the callers' provenance outlives the Event's use
  return e;
}

ProvEvent segment_ev(Action action, PoolKind pool, size_t size) {
  ProvEvent e;
  e.action = action;
  e.pool = pool;
  e.size = size;
  return e;
}

void feed(Breakdown& bd, const ProvEvent& e) { bd.apply(e, *e.prov); }

// ---- the mechanism ----------------------------------------------------------

void peak_follows_the_maximum_and_restarts_at_the_current_value() {
  Rng rng;
  Peak<int64_t> p;
  EXPECT_EQ(p.value(), 0);
  int64_t truth = 0;
  for (int i = 0; i < 1000; ++i) {
    const auto v = static_cast<int64_t>(rng.below(1000));
    const bool rose = p.raise(v);
    EXPECT(rose == (v > truth));
    truth = std::max(truth, v);
    EXPECT_EQ(p.value(), truth);
    if (i % 97 == 96) {
      const int64_t now = static_cast<int64_t>(rng.below(1000));
      const int64_t ended = p.restart(now);
      EXPECT_EQ(ended, truth);  // the ended window's peak
      truth = now;              // the next begins at the current value
      EXPECT_EQ(p.value(), now);
    }
  }
  // A value equal to the peak is no new peak; a lower one leaves it.
  Peak<int64_t> q(5);
  EXPECT(!q.raise(5) && !q.raise(3) && q.value() == 5);
}

struct ByFirst {
  int operator()(const std::array<int, 2>& v) const { return v[0]; }
};

void peak_of_a_described_value_keeps_the_description_of_its_maximum() {
  Peak<std::array<int, 2>, ByFirst> p;
  EXPECT(p.raise({3, 30}));
  EXPECT(!p.raise({2, 99}));  // lower: the peak's description stays
  EXPECT(p.value()[0] == 3 && p.value()[1] == 30);
  p.relabel([](std::array<int, 2>& v) { v[1] = 31; });  // description only
  EXPECT(p.value()[0] == 3 && p.value()[1] == 31);
  EXPECT(p.raise({4, 40}) && p.value()[1] == 40);
}

// ---- the three windows ------------------------------------------------------

// The truths: each window's peak is the highest value of its quantity since
// that window's own restart.
struct Truth {
  int64_t allocated = 0, reserved = 0;
  std::array<int64_t, kNumStatTypes> alloc_pool{}, resv_pool{};
  std::array<int64_t, kNumStatTypes> stat_alloc_peak{}, stat_resv_peak{};  // since reset_peak
  int64_t step_alloc_peak = 0, step_resv_peak = 0, step_ooms = 0;          // since take_window
  int64_t breakdown_peak = 0;                                              // since end_window
  int64_t ooms = 0;                                                        // since reset_accumulated
  void rise() {
    for (int i = 0; i < kNumStatTypes; ++i) {
      stat_alloc_peak[i] = std::max(stat_alloc_peak[i], alloc_pool[i]);
      stat_resv_peak[i] = std::max(stat_resv_peak[i], resv_pool[i]);
    }
    step_alloc_peak = std::max(step_alloc_peak, allocated);
    step_resv_peak = std::max(step_resv_peak, reserved);
    breakdown_peak = std::max(breakdown_peak, allocated);
  }
};

void check_windows(const Accounting& acc, const Breakdown& bd, const Truth& t, int line) {
  const DeviceStats& s = acc.stats();
  for (int i = 0; i < kNumStatTypes; ++i) {
    expect(s.allocated_bytes[i].current == t.alloc_pool[i], "allocated_bytes current", line);
    expect(s.allocated_bytes[i].peak.value() == t.stat_alloc_peak[i],
           "allocated_bytes[" + std::to_string(i) + "].peak " + std::to_string(s.allocated_bytes[i].peak.value()) +
               " vs " + std::to_string(t.stat_alloc_peak[i]),
           line);
    expect(s.reserved_bytes[i].peak.value() == t.stat_resv_peak[i], "reserved_bytes peak", line);
  }
  const StepWindow w = acc.window();
  expect(w.peak_allocated_bytes == t.step_alloc_peak,
         "step window allocated " + std::to_string(w.peak_allocated_bytes) + " vs " + std::to_string(t.step_alloc_peak),
         line);
  expect(w.peak_reserved_bytes == t.step_resv_peak, "step window reserved", line);
  expect(w.num_ooms == t.step_ooms, "step window OOMs", line);
  expect(s.num_ooms == t.ooms, "num_ooms", line);
  expect(bd.now().total == t.allocated, "breakdown total == allocated", line);
  expect(bd.peak().total == t.breakdown_peak,
         "breakdown peak " + std::to_string(bd.peak().total) + " vs " + std::to_string(t.breakdown_peak), line);
}

struct Live {
  size_t size;
  PoolKind pool;
  Provenance prov;
  size_t requested = 0;  // 0: the whole block was asked for
};

// Random allocations, frees, segments and OOMs go to both consumers, as
// the EventSink hands them out; the three windows are restarted at random,
// each on its own schedule. After every step each window's peak is its own
// truth: restarting one moved neither of the others.
void each_window_keeps_its_own_rule_and_restarting_one_never_moves_the_others() {
  Rng rng;
  Accounting acc(SIZE_MAX);
  Breakdown bd;
  Truth t;
  std::vector<Live> live;
  uint64_t seq = 0;
  uint32_t step = 0;
  auto send = [&](const ProvEvent& e) {
    acc.apply(e);
    feed(bd, e);
  };
  int restarts[3] = {0, 0, 0};
  for (int i = 0; i < 20000; ++i) {
    const uint64_t op = rng.below(100);
    if (op < 40) {  // alloc
      Provenance p;
      p.seq = ++seq;
      const PoolKind pool = rng.below(2) ? PoolKind::kSmall : PoolKind::kLarge;
      const size_t size = 512 * (1 + rng.below(64));
      send(block_ev(Action::kAlloc, pool, size, p));
      live.push_back(Live{size, pool, p});
      t.allocated += static_cast<int64_t>(size);
      t.alloc_pool[kStatAll] += static_cast<int64_t>(size);
      t.alloc_pool[pool == PoolKind::kSmall ? kStatSmall : kStatLarge] += static_cast<int64_t>(size);
    } else if (op < 75 && !live.empty()) {  // free: requested, then completed
      const size_t k = rng.below(live.size());
      const Live b = live[k];
      live[k] = live.back();
      live.pop_back();
      send(block_ev(Action::kFreeRequested, b.pool, b.size, b.prov));
      send(block_ev(Action::kFreeCompleted, b.pool, b.size, b.prov));
      t.allocated -= static_cast<int64_t>(b.size);
      t.alloc_pool[kStatAll] -= static_cast<int64_t>(b.size);
      t.alloc_pool[b.pool == PoolKind::kSmall ? kStatSmall : kStatLarge] -= static_cast<int64_t>(b.size);
    } else if (op < 85) {  // a segment in or out
      const bool in = rng.below(2) != 0 || t.resv_pool[kStatLarge] < (2 << 20);
      const int64_t bytes = 2 << 20;
      send(segment_ev(in ? Action::kSegmentAlloc : Action::kSegmentFree, PoolKind::kLarge, static_cast<size_t>(bytes)));
      t.reserved += in ? bytes : -bytes;
      t.resv_pool[kStatAll] += in ? bytes : -bytes;
      t.resv_pool[kStatLarge] += in ? bytes : -bytes;
    } else if (op < 88) {
      send(segment_ev(Action::kOom, PoolKind::kLarge, 1 << 20));
      t.ooms += 1;
      t.step_ooms += 1;
    } else if (op < 92) {  // torch.cuda.reset_peak_memory_stats
      acc.reset_peak();
      t.stat_alloc_peak = t.alloc_pool;
      t.stat_resv_peak = t.resv_pool;
      ++restarts[0];
    } else if (op < 96) {  // the step tracker
      const StepWindow w = acc.take_window();
      expect(w.peak_allocated_bytes == t.step_alloc_peak && w.peak_reserved_bytes == t.step_resv_peak &&
                 w.num_ooms == t.step_ooms,
             "take_window returns the window that ended", __LINE__);
      t.step_alloc_peak = t.allocated;
      t.step_resv_peak = t.reserved;
      t.step_ooms = 0;
      ++restarts[1];
    } else if (op < 99) {  // memalloc.step(): the breakdown's window
      const int64_t ended = bd.peak().total;
      bd.end_window(seq, ++step);
      EXPECT(bd.has_last() && bd.last().total == ended && bd.last_step() == step);
      t.breakdown_peak = t.allocated;
      ++restarts[2];
    } else {  // torch.cuda.reset_accumulated_memory_stats: no window moves
      acc.reset_accumulated();
      t.ooms = 0;
    }
    t.rise();
    check_windows(acc, bd, t, __LINE__);
    if (part_test::g_failures > 20) return;
  }
  EXPECT(restarts[0] > 100 && restarts[1] > 100 && restarts[2] > 100);
}

// Each restart on its own, from one state: exactly its window moves.
void a_restart_moves_its_window_only() {
  Accounting acc(SIZE_MAX);
  Breakdown bd;
  auto send = [&](const ProvEvent& e) {
    acc.apply(e);
    feed(bd, e);
  };
  Provenance p;
  p.seq = 1;
  send(segment_ev(Action::kSegmentAlloc, PoolKind::kLarge, 20 << 20));
  send(block_ev(Action::kAlloc, PoolKind::kLarge, 8 << 20, p));
  send(segment_ev(Action::kOom, PoolKind::kLarge, 1 << 20));
  send(block_ev(Action::kFreeRequested, PoolKind::kLarge, 8 << 20, p));
  send(block_ev(Action::kFreeCompleted, PoolKind::kLarge, 8 << 20, p));
  send(segment_ev(Action::kSegmentFree, PoolKind::kLarge, 20 << 20));
  const int64_t mb8 = 8 << 20, mb20 = 20 << 20;
  auto all_high = [&] {
    return acc.stats().allocated_bytes[kStatAll].peak.value() == mb8 &&
           acc.stats().reserved_bytes[kStatAll].peak.value() == mb20;
  };
  auto step_high = [&] {
    const StepWindow w = acc.window();
    return w.peak_allocated_bytes == mb8 && w.peak_reserved_bytes == mb20 && w.num_ooms == 1;
  };
  auto breakdown_high = [&] { return bd.peak().total == mb8; };
  EXPECT(all_high() && step_high() && breakdown_high());

  acc.reset_peak();
  EXPECT(acc.stats().allocated_bytes[kStatAll].peak.value() == 0 &&
         acc.stats().reserved_bytes[kStatAll].peak.value() == 0);
  EXPECT(step_high() && breakdown_high());

  Accounting acc2(SIZE_MAX);  // the same history, then the step tracker's restart
  Breakdown bd2;
  acc2.apply(segment_ev(Action::kSegmentAlloc, PoolKind::kLarge, 20 << 20));
  acc2.apply(block_ev(Action::kAlloc, PoolKind::kLarge, 8 << 20, p));
  acc2.apply(segment_ev(Action::kOom, PoolKind::kLarge, 1 << 20));
  acc2.apply(block_ev(Action::kFreeRequested, PoolKind::kLarge, 8 << 20, p));
  acc2.apply(segment_ev(Action::kSegmentFree, PoolKind::kLarge, 20 << 20));
  feed(bd2, block_ev(Action::kAlloc, PoolKind::kLarge, 8 << 20, p));
  feed(bd2, block_ev(Action::kFreeRequested, PoolKind::kLarge, 8 << 20, p));
  const StepWindow taken = acc2.take_window();
  EXPECT(taken.peak_allocated_bytes == mb8 && taken.peak_reserved_bytes == mb20 && taken.num_ooms == 1);
  EXPECT(acc2.window().peak_allocated_bytes == 0 && acc2.window().peak_reserved_bytes == 0 &&
         acc2.window().num_ooms == 0);
  EXPECT(acc2.stats().allocated_bytes[kStatAll].peak.value() == mb8 &&
         acc2.stats().reserved_bytes[kStatAll].peak.value() == mb20 && acc2.stats().num_ooms == 1);
  EXPECT(bd2.peak().total == mb8);

  bd2.end_window(1, 1);  // the breakdown's restart: the counters' windows stay
  EXPECT(bd2.peak().total == 0 && bd2.last().total == mb8);
  EXPECT(acc2.stats().allocated_bytes[kStatAll].peak.value() == mb8);
  acc2.reset_accumulated();  // the counts restart; no peak moves
  EXPECT(acc2.stats().num_ooms == 0 && acc2.stats().allocated_bytes[kStatAll].peak.value() == mb8);
}

// ---- the breakdown as a consumer of Events -----------------------------------

// The bytes of the live blocks by category (final) and by phase
// (unresolved): a block's bytes asked for; the rest of it is other.
CategoryBytes split_of(const std::vector<Live>& live) {
  CategoryBytes s;
  for (const Live& b : live) {
    const auto bytes = static_cast<int64_t>(b.requested != 0 ? b.requested : b.size);
    s.live[static_cast<int>(Category::kOther)] += static_cast<int64_t>(b.size) - bytes;
    s.total += static_cast<int64_t>(b.size) - bytes;
    if (b.prov.category == Category::kUnresolved) {
      s.unresolved[static_cast<int>(b.prov.phase)] += bytes;
    } else {
      s.live[static_cast<int>(b.prov.category)] += bytes;
    }
    s.total += bytes;
  }
  return s;
}

bool same(const CategoryBytes& a, const CategoryBytes& b) {
  return a.live == b.live && a.unresolved == b.unresolved && a.total == b.total;
}

void the_breakdown_reads_block_events_and_their_provenance_only() {
  Rng rng;
  Breakdown bd;
  std::vector<Live> live;
  uint64_t seq = 0;
  CategoryBytes peak_truth;
  const Action others[] = {Action::kFreeCompleted,  Action::kSegmentAlloc, Action::kSegmentFree,
                           Action::kAllocRetry,     Action::kOom,          Action::kEmptyCache,
                           Action::kSyncAllStreams, Action::kGcRelease,    Action::kSegmentFreeFailed,
                           Action::kSegmentMap,     Action::kSegmentUnmap};
  for (int i = 0; i < 5000; ++i) {
    const uint64_t op = rng.below(10);
    if (op < 4) {
      Provenance p;
      p.phase = static_cast<Phase>(rng.below(kNumPhases));
      p.category = rng.below(3) == 0 ? static_cast<Category>(rng.below(kNumCategories)) : initial_category(p.phase);
      p.seq = ++seq;
      p.stack_id = static_cast<uint32_t>(rng.below(7));  // who: not the breakdown's business
      const size_t size = 512 * (1 + rng.below(100));
      // Asked for: the whole block, up to 511 bytes less (rounded up), or
      // far less (a cached block handed out whole).
      const uint64_t kind = rng.below(3);
      const size_t requested = kind == 0 ? size : kind == 1 ? size - rng.below(512) : 1 + rng.below(size);
      ProvEvent e = block_ev(Action::kAlloc, PoolKind::kSmall, size, p);
      e.requested = requested;
      feed(bd, e);
      live.push_back(Live{size, PoolKind::kSmall, p, requested});
      const CategoryBytes now = split_of(live);
      if (now.total > peak_truth.total) peak_truth = now;
    } else if (op < 7 && !live.empty()) {
      const size_t k = rng.below(live.size());
      const Live b = live[k];
      live[k] = live.back();
      live.pop_back();
      ProvEvent e = block_ev(Action::kFreeRequested, b.pool, b.size, b.prov);
      e.requested = b.requested;
      feed(bd, e);
    } else {  // any other action, with a block's figures: nothing moves
      const CategoryBytes before = bd.now(), peak_before = bd.peak();
      Provenance p;
      p.phase = Phase::kForward;
      p.category = Category::kUnresolved;
      p.seq = seq + 1;
      feed(bd, block_ev(others[rng.below(sizeof(others) / sizeof(others[0]))], PoolKind::kLarge, 1 << 30, p));
      EXPECT(same(bd.now(), before) && same(bd.peak(), peak_before));
    }
    EXPECT(same(bd.now(), split_of(live)));
    // Before any landmark, the peak is the split at the highest total.
    EXPECT(same(bd.peak(), peak_truth));
    if (part_test::g_failures > 20) return;
  }
  EXPECT(seq > 1000 && peak_truth.total > 0);
}

// A landmark resolves the peak the way breakdown.h says: unresolved bytes
// live at the peak become the category, those freed since it temporaries;
// the level (total) of the window never moves.
void resolving_relabels_the_peak_without_moving_it() {
  Breakdown bd;
  Provenance fwd;
  fwd.phase = Phase::kForward;
  fwd.category = Category::kUnresolved;
  Provenance a = fwd, b = fwd, c = fwd;
  a.seq = 1, b.seq = 2, c.seq = 3;
  feed(bd, block_ev(Action::kAlloc, PoolKind::kSmall, 1000, a));
  feed(bd, block_ev(Action::kAlloc, PoolKind::kSmall, 2000, b));
  feed(bd, block_ev(Action::kFreeRequested, PoolKind::kSmall, 2000, b));  // freed after the peak
  feed(bd, block_ev(Action::kAlloc, PoolKind::kSmall, 500, c));           // after the peak: not in it
  EXPECT_EQ(bd.peak().total, 3000);
  bd.resolve(Phase::kForward, Category::kActivations);
  const int act = static_cast<int>(Category::kActivations), tmp = static_cast<int>(Category::kTemporaries);
  EXPECT_EQ(bd.peak().total, 3000);
  EXPECT_EQ(bd.peak().live[act], 1000);
  EXPECT_EQ(bd.peak().live[tmp], 2000);
  EXPECT_EQ(bd.now().live[act], 1500);
  bd.recategorize(1000, Phase::kForward, Category::kActivations, Category::kParameters, 1);
  EXPECT_EQ(bd.peak().total, 3000);
  EXPECT_EQ(bd.peak().live[static_cast<int>(Category::kParameters)], 1000);
  EXPECT_EQ(bd.peak().live[act], 0);
}

}  // namespace

int main() {
  peak_follows_the_maximum_and_restarts_at_the_current_value();
  peak_of_a_described_value_keeps_the_description_of_its_maximum();
  each_window_keeps_its_own_rule_and_restarting_one_never_moves_the_others();
  a_restart_moves_its_window_only();
  the_breakdown_reads_block_events_and_their_provenance_only();
  resolving_relabels_the_peak_without_moving_it();
  return part_test::finish();
}
