// provenance_table.h — the profiler's record of every live allocation, in a
// table of its own: who allocated it, when, what it holds (Provenance), and
// its address and bytes. A block refers to its record by a slot number
// (its subscriber id, allocator/subscriber.h, opaque to the allocator), so
// that blocks carry no profiler data
// and the walks of the breakdown (relabelling, marking) go over this table,
// not over the allocator's blocks.
//
// Invariants:
//   * Slots are 1-based; 0 means "no record". A slot is live from add()
//     until remove(); a live record has size > 0, a free one size 0 (its
//     addr links the free list: the next free slot, 0 at its end).
//     A live record is pending once its caller freed the block
//     (set_pending) while the block waits for its streams' work: the walks
//     over allocations (for_each_allocated) skip it.
//   * Every slot in [1, slots()] is either live or on the free list,
//     exactly once.
//   * add() reuses the most recently freed slot first; it allocates host
//     memory only when the table grows past its high-water mark: none in a
//     steady state. remove() and lookups allocate nothing.
//   * No lock of its own: its owner calls it under the device lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "profiler/provenance.h"

namespace memalloc {

struct ProvenanceRecord {
  std::uintptr_t addr = 0;
  size_t size = 0;       // the block's bytes
  size_t requested = 0;  // the bytes the caller asked for
  Provenance prov;
  bool pending = false;  // freed by its caller, waiting for its streams' work (its record lives on until then)
};

class ProvenanceTable {
 public:
  using Slot = uint32_t;

  explicit ProvenanceTable(size_t reserve = 4096) { records_.reserve(reserve); }
  ProvenanceTable(const ProvenanceTable&) = delete;
  ProvenanceTable& operator=(const ProvenanceTable&) = delete;

  // A live record for the block at `addr` (size > 0); returns its slot.
  Slot add(std::uintptr_t addr, size_t size, size_t requested, const Provenance& prov) {
    Slot s = free_head_;
    if (s != 0) {
      free_head_ = static_cast<Slot>(records_[s - 1].addr);  // a free record's addr links the free list
    } else {
      records_.emplace_back();  // amortised: grows past the high-water mark only
      s = static_cast<Slot>(records_.size());
    }
    ProvenanceRecord& r = records_[s - 1];
    r.addr = addr;
    r.size = size;
    r.requested = requested;
    r.prov = prov;
    r.pending = false;
    return s;
  }
  // Ends the live record at `s`.
  void remove(Slot s) {
    ProvenanceRecord& r = records_[s - 1];
    r.size = 0;
    r.addr = free_head_;
    free_head_ = s;
  }
  ProvenanceRecord& at(Slot s) { return records_[s - 1]; }
  const ProvenanceRecord& at(Slot s) const { return records_[s - 1]; }
  // The provenance of slot `s`, or an empty one for slot 0.
  Provenance of(Slot s) const { return s == 0 ? Provenance{} : records_[s - 1].prov; }

  // The number of live records (a walk: for checks, not the hot path).
  size_t live() const {
    size_t n = 0;
    for (const ProvenanceRecord& r : records_) n += r.size > 0 ? 1 : 0;
    return n;
  }
  size_t slots() const { return records_.size(); }
  bool is_live(Slot s) const { return s >= 1 && s <= records_.size() && records_[s - 1].size > 0; }

  // The caller freed the block of slot `s`; its record stays until remove().
  void set_pending(Slot s) { records_[s - 1].pending = true; }

  // f(ProvenanceRecord&) for every live record that is not pending (the
  // allocations the caller holds), in slot order.
  template <class F>
  void for_each_allocated(F&& f) {
    for (ProvenanceRecord& r : records_)
      if (r.size > 0 && !r.pending) f(r);
  }
  template <class F>
  void for_each_allocated(F&& f) const {
    for (const ProvenanceRecord& r : records_)
      if (r.size > 0 && !r.pending) f(r);
  }

  // check(ok, what) for each invariant above.
  template <class Check>
  void validate(Check&& check) const {
    size_t live = 0, freed_count = 0;
    std::vector<char> freed(records_.size(), 0);
    for (Slot s = free_head_; s != 0; s = static_cast<Slot>(records_[s - 1].addr)) {
      const bool in_range = s >= 1 && s <= records_.size();
      check(in_range, "provenance table: a free slot is out of range");
      if (!in_range) break;
      check(!freed[s - 1], "provenance table: a slot is on the free list twice");
      if (freed[s - 1]) break;  // a cycle
      freed[s - 1] = 1;
      ++freed_count;
      check(records_[s - 1].size == 0, "provenance table: a free slot holds a record");
    }
    for (size_t i = 0; i < records_.size(); ++i) {
      if (records_[i].size > 0) ++live;
      check(records_[i].size > 0 || freed[i], "provenance table: an empty slot is not on the free list");
    }
    check(live + freed_count == records_.size(), "provenance table: a slot is neither live nor free");
  }

 private:
  std::vector<ProvenanceRecord> records_;  // slot s at [s - 1]
  Slot free_head_ = 0;                     // the last slot freed; each free record's addr holds the next (0: none)
};

}  // namespace memalloc
