// phases.cpp — DeviceAllocator::mark: the breakdown's one call that needs
// the allocator's live table (the slot of the block starting at a pointer)
// before the Profiler part (profiler.h) walks its own; every other call of
// the breakdown goes to the Profiler through with_profiler.
#include "allocator/device_allocator.h"

namespace memalloc {

size_t DeviceAllocator::mark(std::uintptr_t ptr, Category cat) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  return profile_.mark(it != live_.end() ? it->second->slot : 0, ptr, cat);
}

}  // namespace memalloc
