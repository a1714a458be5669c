// bind_pools.h — the private-pool methods of memalloc._C.Allocator (see
// bind_pools.cpp).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "registry.h"

namespace memalloc {
void bind_pools(pybind11::class_<CachingAllocator, std::shared_ptr<CachingAllocator>>& cls);
}  // namespace memalloc
