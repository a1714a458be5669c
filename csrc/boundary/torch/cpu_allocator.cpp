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
//     not installed) is the c10 allocator while open. Its DataPtrs follow
//     c10's raw contract (context == data, one deleter: raw_deleter()), which
//     torch's own CPU kernels rely on; the one global, RoutedAllocators, keeps
//     each routed allocator alive while its route is open or any block from
//     it lives (a lock and a search per allocation and free: this route is a
//     test and analysis seam, not the hot path), so a tensor may die after
//     the route is closed. Closing hands torch back the allocator it had.
#include "boundary/torch/cpu_allocator.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "common/errors.h"
#include "boundary/torch/malloc_entry.h"
#include "boundary/torch/pluggable.h"
#include "boundary/callers/pystacks.h"
#include "process/registry.h"

namespace memalloc {
namespace {

void free_cpu(void* ptr) {
  if (ptr == nullptr) return;
  try {
    CachingAllocator* a = AllocatorRegistry::instance().installed();
    const memalloc::CallContext caller = AllocatorRegistry::instance().thread_context();
    if (a == nullptr || !a->free_owned(ptr, &caller))
      std::fprintf(stderr, "memalloc: CPU free of %p ignored: not a live memalloc allocation\n", ptr);
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

// The allocators routed tensors may still be freed into: each with its
// routed blocks alive and whether its route is open. An entry goes when its
// route is closed and its last routed block is freed, so a tensor may die
// after its route closed. Immortal (frees may come during shutdown). Its
// mutex is never taken under a device lock (allocated() runs after the
// allocation returned); free() takes the device lock under it.
class RoutedAllocators {
 public:
  void opened(const std::shared_ptr<CachingAllocator>& a) {
    std::lock_guard<std::mutex> g(mu_);
    for (Entry& e : entries_) {
      if (e.allocator == a) {
        e.open = true;
        return;
      }
    }
    entries_.push_back(Entry{a, 0, true});
  }
  void closed(const CachingAllocator* a) {
    std::shared_ptr<CachingAllocator> last;  // released after the lock
    std::lock_guard<std::mutex> g(mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->allocator.get() != a) continue;
      it->open = false;
      drop_if_unused(it, last);
      return;
    }
  }
  void allocated(const CachingAllocator* a) {
    std::lock_guard<std::mutex> g(mu_);
    for (Entry& e : entries_)
      if (e.allocator.get() == a) ++e.live;
  }
  // Frees ptr into the routed allocator that owns it; false when none does.
  bool free(void* ptr) {
    std::shared_ptr<CachingAllocator> last;  // released after the lock
    std::lock_guard<std::mutex> g(mu_);
    const memalloc::CallContext caller = AllocatorRegistry::instance().thread_context();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (!it->allocator->free_owned(ptr, &caller)) continue;
      --it->live;
      drop_if_unused(it, last);
      return true;
    }
    return false;
  }

 private:
  struct Entry {
    std::shared_ptr<CachingAllocator> allocator;
    size_t live;
    bool open;
  };
  // Erases the entry once its route is closed and no block of it lives; its
  // allocator moves to `last`, which the caller releases after the lock.
  void drop_if_unused(std::vector<Entry>::iterator it, std::shared_ptr<CachingAllocator>& last) {
    if (it->open || it->live != 0) return;
    last = std::move(it->allocator);
    entries_.erase(it);
  }
  std::mutex mu_;
  std::vector<Entry> entries_;
};

RoutedAllocators& routed() {
  static RoutedAllocators* r = new RoutedAllocators();  // never destroyed
  return *r;
}

// The deleter of every routed block, and the route's raw_deleter(): the
// DataPtr's context is the data pointer itself, as c10's raw_allocate()
// and raw_deallocate() require (torch's CPU kernels use them: gelu).
void free_routed(void* ptr) {
  if (ptr == nullptr) return;
  try {
    if (!routed().free(ptr))
      std::fprintf(stderr, "memalloc: CPU free of %p ignored: not a live routed allocation\n", ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memalloc: CPU free ignored: %s\n", e.what());
  }
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
  routed().opened(allocator_);
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
  routed().closed(allocator_.get());
}

c10::DataPtr CpuRoute::allocate(size_t n) {
  const c10::Device cpu(c10::DeviceType::CPU);
  if (n == 0) return {nullptr, nullptr, &free_routed, cpu};
  void* p = nullptr;
  try {
    p = malloc_for_torch(*allocator_, 0, n, 0, current_context(), "memalloc_cpu_allocate");
  } catch (...) {
    rethrow_for_torch("memalloc_cpu_allocate");
  }
  routed().allocated(allocator_.get());
  return {p, p, &free_routed, cpu};
}

c10::DeleterFnPtr CpuRoute::raw_deleter() const { return &free_routed; }

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
