// oom_report.cpp — the out-of-memory report.
//
// When an allocation fails for good, memalloc's message (what was asked,
// what the device has, what memalloc holds) is extended by a Python hook
// (memalloc/features/oom.py): the live allocations holding the most memory, by call
// site, and where a report was written. torch then raises the result as
// torch.OutOfMemoryError.
//
// Invariants:
//   * Called after the device lock was released (the failing malloc has
//     returned by exception), so the hook may query the allocator; it takes
//     the GIL itself (the allocating thread does not hold it: torch
//     releases it before dispatching).
//   * Re-entry (the hook itself running out of memory) is cut off per thread:
//     the inner error gets the plain message.
//   * A failing hook never replaces the out-of-memory error: its exception
//     is printed and dropped.
//   * The hook's reference is owned here: INCREF'd when installed, DECREF'd
//     when replaced (both with the GIL held); the registry only stores it. A
//     call reads the pointer and takes its own reference under the GIL.
#include <Python.h>

#include "boundary/torch/oom_report.h"

#include <c10/util/Exception.h>

namespace memalloc {
namespace {
thread_local bool t_in_hook = false;

std::string hook_text(int device, size_t size) {
  AllocatorRegistry& reg = AllocatorRegistry::instance();
  if (reg.oom_hook() == nullptr || t_in_hook || !Py_IsInitialized()) return "";
  t_in_hook = true;
  std::string out;
  PyGILState_STATE gil = PyGILState_Ensure();
  // Read (and hold) the hook under the GIL: set_oom_hook may replace and
  // release it, also with the GIL held.
  PyObject* hook = static_cast<PyObject*>(reg.oom_hook());
  if (hook == nullptr) {
    PyGILState_Release(gil);
    t_in_hook = false;
    return "";
  }
  Py_INCREF(hook);
  PyObject* r = PyObject_CallFunction(hook, "in", device, static_cast<Py_ssize_t>(size));
  Py_DECREF(hook);
  if (r == nullptr) {
    PyErr_Print();  // never let the report replace the out-of-memory error
  } else if (PyUnicode_Check(r)) {
    const char* text = PyUnicode_AsUTF8(r);
    if (text != nullptr)
      out = text;
    else
      PyErr_Clear();
  }
  Py_XDECREF(r);
  PyGILState_Release(gil);
  t_in_hook = false;
  return out;
}
}  // namespace

[[noreturn]] void throw_oom_for_torch(const OutOfMemory& e, const CachingAllocator* a, int device, size_t size,
                                      const char* func) {
  std::string msg = e.what();
  if (a != nullptr && a == AllocatorRegistry::instance().installed()) msg += hook_text(device, size);
  throw c10::OutOfMemoryError(c10::SourceLocation{func, __FILE__, __LINE__}, msg);
}

void set_oom_hook(void* py_callable_or_none) {
  PyObject* hook = static_cast<PyObject*>(py_callable_or_none);
  if (hook == Py_None) hook = nullptr;
  Py_XINCREF(hook);
  PyObject* old = static_cast<PyObject*>(AllocatorRegistry::instance().exchange_oom_hook(hook));
  Py_XDECREF(old);
}

}  // namespace memalloc
