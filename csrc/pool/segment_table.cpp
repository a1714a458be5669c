// segment_table.cpp — SegmentTable's members that are not inline
// (segment_table.h): insert with its overlap refusal, erase, and the count
// per owner. Invariants: segment_table.h.
#include "pool/segment_table.h"

#include <cstdint>
#include <iterator>

namespace memalloc {

bool SegmentTable::insert(std::uintptr_t addr, const Segment& seg) {
  if (seg.bytes == 0 || seg.bytes - 1 > UINTPTR_MAX - addr) return false;
  auto next = map_.lower_bound(addr);
  if (next != map_.end() && next->first - addr < seg.bytes) return false;  // reaches into the next one
  if (next != map_.begin()) {
    auto prev = std::prev(next);
    if (addr - prev->first < prev->second.bytes) return false;  // starts inside the previous one
  }
  map_.emplace_hint(next, addr, seg);
  if (seg.owner != nullptr) seg.owner->segments += 1;
  return true;
}

bool SegmentTable::erase(std::uintptr_t addr) {
  auto it = map_.find(addr);
  if (it == map_.end()) return false;
  if (it->second.owner != nullptr) it->second.owner->segments -= 1;
  map_.erase(it);
  return true;
}

size_t SegmentTable::count(const PrivatePool* owner) const {
  size_t n = 0;
  for (const auto& kv : map_) n += kv.second.owner == owner ? 1 : 0;
  return n;
}

}  // namespace memalloc
