// segment_table.h — the segments of one device as one part: every range of
// device memory the allocator holds (a plain segment from the backend or a
// SegmentSource, or the address space of an expandable segment), keyed by
// its start address, with its owner (the default pool or a PrivatePool).
//
// Answers "which segment holds address a" (containing: the segment whose
// [start, start + bytes) covers a, interior addresses included), iterates in
// address order, and keeps each owner's segment count (PrivatePool::segments,
// which private pools need to know when they may be deleted).
//
// Invariants:
//   * Every segment has bytes > 0, and no two segments overlap: insert()
//     refuses (and changes nothing) otherwise.
//   * For every PrivatePool p that owns a segment here, p.segments == the
//     number of segments with owner == &p: insert() and erase() are the only
//     writers of that count (a pool owning none has segments == 0, which
//     DeviceAllocator::validate checks per pool with count()).
//   * An expandable segment (vm != nullptr) belongs to the default pool.
//   * No lock of its own: DeviceAllocator calls it under the device lock.
//     The map's nodes come from the allocator's node resource (NodeCache):
//     no host allocation in a steady state. Lookups allocate nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory_resource>
#include <string>

#include "pool/vm_arena.h"
#include "pool/private_pool.h"

namespace memalloc {

struct Segment {
  size_t bytes;        // a plain segment's size; an expandable one's address space
  PrivatePool* owner;  // nullptr = default pool
  VmSegment* vm;       // nullptr = a plain segment
};

class SegmentTable {
 public:
  using Map = std::pmr::map<std::uintptr_t, Segment>;
  using const_iterator = Map::const_iterator;

  explicit SegmentTable(std::pmr::memory_resource* mr) : map_(mr) {}
  SegmentTable(const SegmentTable&) = delete;
  SegmentTable& operator=(const SegmentTable&) = delete;

  // Adds the segment [addr, addr + seg.bytes) and counts it for its owner.
  // False (nothing changed) when seg.bytes == 0 or it overlaps a segment.
  bool insert(std::uintptr_t addr, const Segment& seg);
  // Removes the segment that starts at `addr` and uncounts it for its
  // owner; false (nothing changed) when no segment starts there.
  bool erase(std::uintptr_t addr);

  // The segment that starts at `addr`, or end().
  const_iterator find(std::uintptr_t addr) const { return map_.find(addr); }
  // The segment whose range holds `addr` (its start or an interior
  // address), or end().
  const_iterator containing(std::uintptr_t addr) const {
    auto it = map_.upper_bound(addr);
    if (it == map_.begin()) return map_.end();
    --it;
    return addr - it->first < it->second.bytes ? it : map_.end();
  }

  // Address order.
  const_iterator begin() const { return map_.begin(); }
  const_iterator end() const { return map_.end(); }
  size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }
  // Segments owned by `owner` (nullptr: the default pool), counted: O(n).
  size_t count(const PrivatePool* owner) const;

  // Checks the invariants above: check(condition, what is wrong).
  template <class Check>
  void validate(Check&& check) const;

 private:
  Map map_;
};

template <class Check>
void SegmentTable::validate(Check&& check) const {
  std::map<const PrivatePool*, size_t> owned;
  const_iterator prev = map_.end();
  for (auto it = map_.begin(); it != map_.end(); ++it) {
    check(it->second.bytes > 0, "a segment of the segment table has no bytes");
    check(prev == map_.end() || it->first - prev->first >= prev->second.bytes,
          "two segments of the segment table overlap");
    check(it->second.vm == nullptr || it->second.owner == nullptr, "a private pool has an expandable segment");
    if (it->second.owner != nullptr) owned[it->second.owner] += 1;
    prev = it;
  }
  for (const auto& kv : owned)
    check(kv.first->segments == kv.second, "a private pool's segment count differs from its segments");
}

}  // namespace memalloc
