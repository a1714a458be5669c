// registry.h — the multi-device CachingAllocator and the one global: the
// AllocatorRegistry that holds the allocator torch (or memalloc.host) uses.
//
// Invariants:
//   * AllocatorRegistry is the only mutable global state of memalloc (the
//     dlopen'ed driver table of backend_cuda.cpp is write-once).
//   * Once installed, an allocator is never uninstalled or destroyed: torch
//     may free tensors during interpreter shutdown, after static destructors
//     would have run. The registry therefore lives in leaked heap memory.
//   * installed() is one atomic load: the pluggable hot path pays nothing else.
//   * A CachingAllocator owns its backend and one DeviceAllocator per device,
//     created up front; the set of devices never changes.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "backend.h"
#include "config.h"
#include "device_allocator.h"

namespace memalloc {

class CachingAllocator {
 public:
  CachingAllocator(std::unique_ptr<Backend> backend, const Config& config);
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  Backend& backend() { return *backend_; }
  const Config& config() const { return config_; }
  int device_count() const { return static_cast<int>(devices_.size()); }
  // Throws InvalidArgument for a device index out of range.
  DeviceAllocator& device(int index);
  // The device whose live block starts at ptr; nullptr when none.
  DeviceAllocator* find_owner(void* ptr);

 private:
  std::unique_ptr<Backend> backend_;
  const Config config_;
  std::vector<std::unique_ptr<DeviceAllocator>> devices_;
};

// Builds the backend named by `backend` ("cuda" or "host") and its allocator.
std::shared_ptr<CachingAllocator> make_allocator(const std::string& backend, const Config& config);

class AllocatorRegistry {
 public:
  static AllocatorRegistry& instance();
  // Installs `a` as the process's allocator. Throws InvalidArgument when one
  // is already installed.
  void install(std::shared_ptr<CachingAllocator> a);
  CachingAllocator* installed() const noexcept { return installed_.load(std::memory_order_acquire); }
  std::shared_ptr<CachingAllocator> installed_shared();

 private:
  AllocatorRegistry() = default;
  std::mutex mu_;
  std::shared_ptr<CachingAllocator> owner_;
  std::atomic<CachingAllocator*> installed_{nullptr};
};

}  // namespace memalloc
