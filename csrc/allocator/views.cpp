// views.cpp — DeviceAllocator's read-only views of its blocks for torch's
// interface: the largest free cached block (cacheInfo) and the segment
// holding a live block (getBaseAllocation, IPC). Invariants:
// device_allocator.h.
#include <algorithm>

#include "allocator/device_allocator.h"
#include "common/errors.h"

namespace memalloc {

size_t DeviceAllocator::largest_free_block() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t largest = 0;
  for (FreeLists* l : all_free_lists_locked())
    for (FreeList* list : {&l->small, &l->large})
      for (const Block* b : list->blocks()) largest = std::max(largest, b->size);
  return largest;
}

bool DeviceAllocator::segment_of(void* ptr, std::uintptr_t* base, size_t* bytes, bool* expandable, size_t* block_bytes,
                                 size_t* page) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
  auto live = live_.find(addr);
  if (live == live_.end()) return false;
  const Block* b = live->second;
  if (base == nullptr) return true;  // segment_of(ptr): only whether ptr is ours
  if (expandable != nullptr) *expandable = b->vm != nullptr;
  if (block_bytes != nullptr) *block_bytes = b->size;
  if (b->vm != nullptr) {  // its mapped run
    if (page != nullptr) *page = b->vm->page;
    const Block* first = b;
    while (first->prev != nullptr && first->prev->mapped) first = first->prev;
    *base = first->addr;
    *bytes = 0;
    for (const Block* m = first; m != nullptr && m->mapped; m = m->next) *bytes += m->size;
    return true;
  }
  auto it = segments_.containing(addr);  // a live block lies in a segment
  *base = it->first;
  *bytes = it->second.bytes;
  return true;
}

}  // namespace memalloc
