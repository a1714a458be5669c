// cpu_allocator.h — memalloc's host backend as torch's CPU allocator (see
// cpu_allocator.cpp).
#pragma once

#include <c10/core/Allocator.h>

#include <memory>

#include "process/registry.h"

namespace memalloc {
// Makes torch's CPU tensors come from device 0 of the installed host-backend
// allocator. Throws InvalidArgument when none is installed. Irreversible.
void use_for_torch_cpu();
// Whether use_for_torch_cpu() has run in this process.
bool used_for_torch_cpu();

// A scoped route: from construction to close(), torch's CPU tensors come
// from device 0 of `allocator` (a host-backend allocator that need not be
// installed); close() gives torch back the CPU allocator it had. Tensors
// made inside are freed into `allocator` whenever they die (each keeps it
// alive). One route at a time, opened and closed on one thread while no other
// thread makes CPU tensors. Its DataPtrs keep c10's raw contract (context ==
// data, deleter == raw_deleter()), so torch's kernels may raw_allocate.
class CpuRoute final : public c10::Allocator {
 public:
  explicit CpuRoute(std::shared_ptr<CachingAllocator> allocator);
  ~CpuRoute() override;  // closes the route if still open
  CpuRoute(const CpuRoute&) = delete;
  CpuRoute& operator=(const CpuRoute&) = delete;

  // Restores torch's previous CPU allocator; a second call does nothing.
  // Throws InvalidArgument when torch's CPU allocator is no longer this route
  // (another route was opened inside this one and not closed).
  void close();
  bool open() const { return previous_ != nullptr; }

  c10::DataPtr allocate(size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

 private:
  std::shared_ptr<CachingAllocator> allocator_;
  c10::Allocator* previous_ = nullptr;  // torch's CPU allocator before; nullptr once closed
};
}  // namespace memalloc
