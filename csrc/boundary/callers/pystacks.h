// pystacks.h — the calling thread's CallContext (see pystacks.cpp).
#pragma once

#include <cstdint>

#include "profiler/recorder.h"

namespace memalloc {
// Tag, Python stack (per the registry's stack mode), thread and step of the
// calling thread. Call without holding a device lock.
CallContext current_context();
// The current thread's Python stack id (0 when it has none), regardless of
// the stack mode.
uint32_t capture_stack_now();
}  // namespace memalloc
