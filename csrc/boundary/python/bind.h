// bind.h — the parts of memalloc._C, one per concept (bindings.cpp builds
// the module and calls each), and host_backend(), which the host-backend
// bindings share (bind_host.cpp, bind_testing.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "backend/backend.h"
#include "process/registry.h"

namespace memalloc {
using AllocatorClass = pybind11::class_<CachingAllocator, std::shared_ptr<CachingAllocator>>;
void bind_host(AllocatorClass& cls);                          // bind_host.cpp
void bind_pools(pybind11::module_& testing);                  // bind_pools.cpp: private pools, in memalloc._C._testing
void bind_breakdown(AllocatorClass& cls);                     // bind_breakdown.cpp
void bind_flight(pybind11::module_& m, AllocatorClass& cls);  // bind_flight.cpp
void bind_attribution(pybind11::module_& m);                  // bind_attribution.cpp
void bind_testing(pybind11::module_& m);                      // bind_testing.cpp: memalloc._C._testing

// The allocator's backend as the host backend (the simulated device);
// InvalidArgumentError when it is on another backend. bind_host.cpp.
HostBackend& host_backend(CachingAllocator& a);
}  // namespace memalloc
