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
//   * A CpuRoute (the scoped form, for in-process use of an allocator that is
//     not installed) holds no global: the route object is the c10 allocator
//     while open, and each tensor's DataPtr context owns a reference to the
//     allocator it came from (one small heap object per tensor: this route is
//     a test and analysis seam, not the hot path), so a tensor may die after
//     the route is closed. Closing hands torch back the allocator it had.
#include "boundary/torch/cpu_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdio>
#include <cstring>

#include "common/errors.h"
#include "boundary/torch/malloc_entry.h"
#include "boundary/torch/pluggable.h"
#include "boundary/python/pystacks.h"
#include "allocator/registry.h"

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

// The DataPtr context of a routed tensor: its allocator and pointer.
struct RoutedBlock {
  std::shared_ptr<CachingAllocator> allocator;
  void* ptr;
};

void free_routed(void* ctx) {
  auto* block = static_cast<RoutedBlock*>(ctx);
  try {
    block->allocator->device(0).free(block->ptr, AllocatorRegistry::instance().thread_context());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memalloc: CPU free ignored: %s\n", e.what());
  }
  delete block;
}

constexpr uint8_t kPriority = 255;  // c10 keeps an allocator of higher priority over ours

}  // namespace

CpuRoute::CpuRoute(std::shared_ptr<CachingAllocator> allocator) : allocator_(std::move(allocator)) {
  MEMALLOC_EXPECTS(allocator_ != nullptr && std::strcmp(allocator_->backend().name(), "host") == 0,
                   "torch's CPU tensors can come only from a host-backend allocator: "
                   "pass memalloc.Allocator('host', ...)");
  c10::Allocator* current = c10::GetCPUAllocator();
  MEMALLOC_EXPECTS(dynamic_cast<CpuRoute*>(current) == nullptr,
                   "torch's CPU tensors are already routed to a memalloc allocator: "
                   "close that route (leave its `with` block) first");
  previous_ = current;
  c10::SetCPUAllocator(this, kPriority);
}

CpuRoute::~CpuRoute() {
  try {
    close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memalloc: CPU route left open: %s\n", e.what());
  }
}

void CpuRoute::close() {
  if (previous_ == nullptr) return;
  MEMALLOC_EXPECTS(c10::GetCPUAllocator() == this,
                   "this CPU route is not torch's CPU allocator any more: close the route opened "
                   "inside it first");
  c10::SetCPUAllocator(previous_, kPriority);
  previous_ = nullptr;
}

c10::DataPtr CpuRoute::allocate(size_t n) {
  const c10::Device cpu(c10::DeviceType::CPU);
  if (n == 0) return {nullptr, nullptr, &free_cpu, cpu};
  auto block = std::make_unique<RoutedBlock>(RoutedBlock{allocator_, nullptr});  // before the memory: no leak
  try {
    block->ptr = malloc_for_torch(*allocator_, 0, n, 0, current_context(), "memalloc_cpu_allocate");
  } catch (...) {
    rethrow_for_torch("memalloc_cpu_allocate");
  }
  void* p = block->ptr;
  return {p, block.release(), &free_routed, cpu};
}

void CpuRoute::copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }

void use_for_torch_cpu() {
  CachingAllocator* a = AllocatorRegistry::instance().installed();
  MEMALLOC_EXPECTS(a != nullptr && std::strcmp(a->backend().name(), "host") == 0,
                   "torch's CPU tensors can come only from the host backend: call "
                   "memalloc.enable(backend='host') first");
  MEMALLOC_EXPECTS(dynamic_cast<CpuRoute*>(c10::GetCPUAllocator()) == nullptr,
                   "torch's CPU tensors are routed to a memalloc allocator for a scope: close that "
                   "route (leave its `with` block) first");
  if (g_installed.exchange(true)) return;
  c10::SetCPUAllocator(&g_cpu_allocator, kPriority);
}

bool used_for_torch_cpu() { return g_installed.load(); }

}  // namespace memalloc
