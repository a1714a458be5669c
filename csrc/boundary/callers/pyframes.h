// pyframes.h — the calling thread's Python frames, read without the GIL
// (see pyframes.cpp).
#pragma once

#include <cstddef>

#include "profiler/stacks.h"

namespace memalloc {
// True when this build can read frames without the GIL (CPython 3.11-3.13);
// otherwise callers take the GIL and use the public frame API.
bool fast_frames_supported();
// Writes the calling thread's Python frames, innermost first, into
// out[0..max_depth) and returns how many; 0 when the thread has no Python
// thread state or no frames. Takes no lock and needs no GIL. Only valid when
// fast_frames_supported().
size_t own_frames(RawFrame* out, size_t max_depth);
}  // namespace memalloc
