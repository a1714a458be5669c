// phases.cpp — DeviceAllocator's calls of the breakdown by category: each
// takes the device lock and hands the call to the Profiler part
// (profiler.h), which owns the phase, the provenance and the breakdown.
#include "allocator/device_allocator.h"

namespace memalloc {

void DeviceAllocator::enter_phase(Phase phase) {
  std::lock_guard<std::mutex> lock(mu_);
  profile_.enter_phase(phase);
}

void DeviceAllocator::resolve(Phase phase, Category cat) {
  std::lock_guard<std::mutex> lock(mu_);
  profile_.resolve(phase, cat);
}

Phase DeviceAllocator::phase() {
  std::lock_guard<std::mutex> lock(mu_);
  return profile_.phase();
}

void DeviceAllocator::end_step(uint32_t step) {
  std::lock_guard<std::mutex> lock(mu_);
  profile_.end_step(step);
}

size_t DeviceAllocator::mark(std::uintptr_t ptr, Category cat) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  return profile_.mark(it != live_.end() ? it->second->slot : 0, ptr, cat);
}

DeviceAllocator::BreakdownState DeviceAllocator::breakdown() {
  std::lock_guard<std::mutex> lock(mu_);
  return profile_.state();
}

}  // namespace memalloc
