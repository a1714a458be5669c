// pystacks.cpp — who is allocating: the CallContext of the calling thread
// (tag, Python call stack, thread index, step), built by the entry points
// before they take a device lock.
//
// Invariants:
//   * Called without any device lock held. In Python stacks mode the frames
//     are read without the GIL where pyframes.cpp supports it (CPython
//     3.11-3.13), and a known stack is found in the stack table's per-thread
//     cache without a lock; the GIL is taken only to keep the code objects of
//     a stack seen for the first time alive (and, on other CPython versions,
//     to walk the frames with the public API). It is released before
//     returning, so the allocator lock is never held while waiting for it.
//   * A thread that never ran Python (no thread state), or whose Python
//     stack is empty (autograd engine workers), is attributed to the
//     backward context: the tag and stack of the thread that called
//     backward (set by memalloc's wrapper of torch.autograd.backward).
//     In tags mode no frames are walked (no GIL), so any untagged thread
//     gets the backward context while a backward() runs.
//   * A new stack's code objects are INCREF'd once and kept for the life of
//     the process, so the table's raw pointers stay valid for symbolising.
#include <Python.h>

#include "boundary/callers/pyframes.h"
#include "boundary/callers/pystacks.h"
#include "process/registry.h"

namespace memalloc {
namespace {

// Walks the current thread's Python frames (GIL held), innermost first.
size_t walk_frames(RawFrame* out, size_t max_depth) {
  size_t n = 0;
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed
  Py_XINCREF(frame);
  while (frame != nullptr && n < max_depth) {
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    out[n++] = RawFrame{code, PyFrame_GetLasti(frame)};
    Py_DECREF(code);                               // the frame keeps it alive while we walk
    PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  return n;
}

// Keeps the code objects of a newly interned stack alive (GIL held).
void incref_codes(const RawFrame* frames, size_t n) {
  for (size_t i = 0; i < n; ++i) Py_INCREF(static_cast<PyObject*>(const_cast<void*>(frames[i].code)));
}

uint32_t python_stack(AllocatorRegistry& reg) {
  RawFrame frames[StackTable::kMaxDepth];
  bool is_new = false;
  if (fast_frames_supported()) {
    // No GIL: the frames stay alive while this thread is in here.
    const size_t n = own_frames(frames, StackTable::kMaxDepth);
    if (n == 0) return 0;
    const uint32_t id = reg.stacks().intern(frames, n, &is_new);
    if (is_new) {
      PyGILState_STATE gil = PyGILState_Ensure();
      incref_codes(frames, n);
      PyGILState_Release(gil);
    }
    return id;
  }
  if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return 0;
  PyGILState_STATE gil = PyGILState_Ensure();
  const size_t n = walk_frames(frames, StackTable::kMaxDepth);
  uint32_t id = 0;
  if (n > 0) {
    id = reg.stacks().intern(frames, n, &is_new);
    if (is_new) incref_codes(frames, n);
  }
  PyGILState_Release(gil);
  return id;
}

}  // namespace

CallContext current_context() {
  AllocatorRegistry& reg = AllocatorRegistry::instance();
  CallContext ctx = reg.thread_context();
  const StackMode mode = reg.stack_mode();
  if (mode == StackMode::kNone) return ctx;
  ctx.tag_id = AllocatorRegistry::thread_tag();
  if (mode == StackMode::kPython) ctx.stack_id = python_stack(reg);
  if (ctx.stack_id == 0 && ctx.tag_id == 0) {
    ctx.tag_id = reg.backward_tag();
    ctx.stack_id = reg.backward_stack();
  }
  return ctx;
}

uint32_t capture_stack_now() { return python_stack(AllocatorRegistry::instance()); }

}  // namespace memalloc
