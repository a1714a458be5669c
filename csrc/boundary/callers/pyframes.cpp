// pyframes.cpp — the calling thread's Python frames, read without the GIL.
//
// torch releases the GIL before dispatching an op, so an allocation arrives
// without it (docs/architecture.md, "torch's pluggable interface"). Taking
// the GIL back and walking frames with the public API (PyFrame_GetBack materialises a frame object per level) costs
// ~0.75 µs per allocation; reading the interpreter's own frame chain costs a
// few ns per frame.
//
// Why this is safe without the GIL:
//   * Only the calling thread's own chain is read (its PyThreadState comes
//     from PyGILState_GetThisThreadState, a thread-specific-storage lookup).
//     A thread's frames are pushed, popped and advanced only by that thread
//     while it runs bytecode; while it is inside this call it runs none, so
//     the chain and every frame's code object and instruction pointer are
//     stable. Other threads may attach a frame object (frame_obj), which is
//     not read here.
//   * No reference count is touched and no object is dereferenced beyond
//     the frame struct and its code object (kept alive by the frame). The
//     caller keeps a code object alive past the frame's life by INCREF'ing
//     it under the GIL when it interns a new stack (pystacks.cpp).
//
// Invariants:
//   * Compiled against CPython's internal headers for 3.11-3.13, so the
//     _PyInterpreterFrame layout is the compiler's, not a copy; any other
//     version compiles the stub (fast_frames_supported() == false).
//   * Frames the public API hides are skipped the same way
//     (_PyFrame_IsIncomplete, and the C-stack shim frames of 3.12+), so a
//     stack read here equals traceback.extract_stack() of the same thread
//     (tests/unit/test_pyframes.py checks it on every local CPython).
//   * lasti is in bytes, as PyFrame_GetLasti reports it, so symbolising
//     with PyCode_Addr2Line is the same for both capture paths.
#include <Python.h>

#include "boundary/callers/pyframes.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && defined(__has_include)
#if __has_include(<internal/pycore_frame.h>)
#define MEMALLOC_FAST_FRAMES 1
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#endif
#endif

namespace memalloc {

#ifdef MEMALLOC_FAST_FRAMES
namespace {
_PyInterpreterFrame* top_frame(PyThreadState* ts) {
#if PY_VERSION_HEX >= 0x030D0000
  return ts->current_frame;
#else
  return ts->cframe == nullptr ? nullptr : ts->cframe->current_frame;
#endif
}

PyCodeObject* frame_code(_PyInterpreterFrame* f) {
#if PY_VERSION_HEX >= 0x030D0000
  return PyCode_Check(f->f_executable) ? reinterpret_cast<PyCodeObject*>(f->f_executable) : nullptr;
#else
  return f->f_code;
#endif
}

bool hidden(_PyInterpreterFrame* f) {
#if PY_VERSION_HEX >= 0x030C0000
  if (f->owner == FRAME_OWNED_BY_CSTACK) return true;
#endif
  return frame_code(f) == nullptr || _PyFrame_IsIncomplete(f);
}
}  // namespace

bool fast_frames_supported() { return true; }

size_t own_frames(RawFrame* out, size_t max_depth) {
  if (!Py_IsInitialized()) return 0;
  PyThreadState* ts = PyGILState_GetThisThreadState();
  if (ts == nullptr) return 0;
  size_t n = 0;
  for (_PyInterpreterFrame* f = top_frame(ts); f != nullptr && n < max_depth; f = f->previous) {
    if (hidden(f)) continue;
    const int lasti = _PyInterpreterFrame_LASTI(f);
    out[n++] = RawFrame{frame_code(f), lasti < 0 ? -1 : lasti * static_cast<int>(sizeof(_Py_CODEUNIT))};
  }
  return n;
}
#else
bool fast_frames_supported() { return false; }
size_t own_frames(RawFrame*, size_t) { return 0; }
#endif

}  // namespace memalloc
