// cpu_allocator.cpp — memalloc's host backend as torch's CPU allocator.
//
// Without a GPU, the host backend simulates a device; with this, every CPU
// tensor torch makes (activations, gradients, optimizer state of a model
// trained on the CPU) is allocated from that simulated device, so leak
// reports, the step tracker and the accounting see a real training loop on
// a machine with no GPU. (memalloc.host.empty makes single tensors without
// it.)
//
// Invariants:
//   * Installed through c10::SetCPUAllocator at the highest priority, once,
//     never removed: tensors made before keep their own deleter (a DataPtr
//     carries it), tensors made after are freed here, whenever that is.
//   * allocate(0) returns a null pointer and touches nothing, like torch.
//   * An allocation takes the calling thread's context (pystacks.cpp:
//     Python stack or tag, no GIL held under the device lock) like the CUDA
//     entry points; OutOfMemory becomes torch.OutOfMemoryError.
//   * g_installed only remembers that the (irreversible) installation was
//     done; c10 holds the allocator pointer. Only the registry's installed
//     allocator is used; it is immortal
//     (registry.h), so frees during interpreter shutdown are safe.
#include "cpu_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "errors.h"
#include "oom_report.h"
#include "pluggable.h"
#include "pystacks.h"
#include "registry.h"

namespace memalloc {
namespace {

void free_cpu(void* ptr) {
  if (ptr == nullptr) return;
  try {
    CachingAllocator* a = AllocatorRegistry::instance().installed();
    DeviceAllocator* owner = a == nullptr ? nullptr : a->find_owner(ptr);
    if (owner == nullptr) {
      std::fprintf(stderr, "memalloc: CPU free of %p ignored: not a live memalloc allocation\n", ptr);
      return;
    }
    owner->free(ptr, AllocatorRegistry::instance().thread_context());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memalloc: CPU free ignored: %s\n", e.what());
  }
}

class HostCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &free_cpu, cpu};
    void* p = nullptr;
    try {
      CachingAllocator* a = AllocatorRegistry::instance().installed();
      MEMALLOC_EXPECTS(a != nullptr, "memalloc is not installed");
      p = malloc_for_torch(*a, 0, n, 0, current_context(), "memalloc_cpu_allocate");
    } catch (...) {
      rethrow_for_torch("memalloc_cpu_allocate");
    }
    return {p, p, &free_cpu, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_cpu; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }
};

HostCpuAllocator g_cpu_allocator;  // stateless; referenced by c10 for the process's life
std::atomic<bool> g_installed{false};

}  // namespace

void use_for_torch_cpu() {
  CachingAllocator* a = AllocatorRegistry::instance().installed();
  MEMALLOC_EXPECTS(a != nullptr && std::strcmp(a->backend().name(), "host") == 0,
                   "torch's CPU tensors can come only from the host backend: call "
                   "memalloc.enable(backend='host') first");
  if (g_installed.exchange(true)) return;
  c10::SetCPUAllocator(&g_cpu_allocator, /*priority=*/255);
}

bool used_for_torch_cpu() { return g_installed.load(); }

}  // namespace memalloc
