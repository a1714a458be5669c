// trace_export.cpp — recorded events to torch's snapshot trace entries.
//
// A million events must become torch's list of dicts in well under a
// second (issue #5); building them in Python costs ~7 µs per event. Here
// each entry is one dict built with the C API from shared objects: the key
// strings, the action names, the tag names and the frames list of each
// stack are created once per call and referenced by every entry (so pickle
// also writes each of them once).
//
// Entry: {action, addr, size, stream, time_us, frames, requested_size, tag,
// step, thread}; an "oom" entry has addr 0 and device_free (the record
// keeps the device's free bytes in addr), as torch writes it.
//
// The cyclic garbage collector is paused while the entries are built: a
// million new dicts would otherwise trigger a collection every 700 of them
// over a growing young generation (1.6 s instead of 0.5 s per million). Each
// dict is copied from a prototype that already holds every key, so setting
// the values never resizes it.
//
// Invariants:
//   * GIL held throughout; every new reference is owned by a py::object
//     until it is stored, so an exception leaks nothing.
//   * Records are copied out of the bytes with memcpy (no alignment
//     assumption on the buffer).
#include "boundary/python/trace_export.h"

#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/errors.h"
#include "pool/events.h"
#include "recorder/recorder.h"

namespace py = pybind11;

namespace memalloc {
namespace {
enum Key { kAction, kAddr, kSize, kStream, kTimeUs, kFrames, kRequested, kTag, kStep, kThread, kDeviceFree, kKeys };
const char* const kKeyNames[kKeys] = {"action", "addr", "size", "stream", "time_us", "frames",
                                      "requested_size", "tag", "step", "thread", "device_free"};

// d[key] = value, taking ownership of a new reference.
void set_new(PyObject* d, PyObject* key, PyObject* value) {
  py::object owned = py::reinterpret_steal<py::object>(value);
  if (value == nullptr || PyDict_SetItem(d, key, value) < 0) throw py::error_already_set();
}
void set_shared(PyObject* d, PyObject* key, const py::object& value) {
  if (PyDict_SetItem(d, key, value.ptr()) < 0) throw py::error_already_set();
}

// Pauses the cyclic GC for its lifetime (restores the previous state).
class GcPause {
 public:
  GcPause() : was_enabled_(PyGC_Disable()) {}
  ~GcPause() {
    if (was_enabled_) PyGC_Enable();
  }
  GcPause(const GcPause&) = delete;
  GcPause& operator=(const GcPause&) = delete;

 private:
  int was_enabled_;
};
}  // namespace

py::list trace_entries(const py::bytes& raw, const py::sequence& keep, const py::sequence& tags,
                       const py::function& frames_of) {
  char* data = nullptr;
  Py_ssize_t len = 0;
  if (PyBytes_AsStringAndSize(raw.ptr(), &data, &len) < 0) throw py::error_already_set();
  MEMALLOC_EXPECTS(len % static_cast<Py_ssize_t>(sizeof(TraceRecord)) == 0,
                   "trace bytes must hold whole 64-byte records, got " + std::to_string(len) + " bytes");
  size_t n_actions = 0;
  const char* const* action_names_ = action_names(&n_actions);
  std::vector<py::object> actions;
  std::vector<bool> kept;
  for (size_t i = 0; i < n_actions; ++i) {
    actions.push_back(py::str(action_names_[i]));
    kept.push_back(i < keep.size() && py::cast<bool>(keep[i]));
  }
  size_t oom_action = n_actions;
  for (size_t i = 0; i < n_actions; ++i)
    if (std::strcmp(action_names_[i], "oom") == 0) oom_action = i;
  std::vector<py::object> keys;
  for (const char* k : kKeyNames) keys.push_back(py::reinterpret_steal<py::object>(PyUnicode_InternFromString(k)));
  std::vector<py::object> tag_names;
  for (const auto& t : tags) tag_names.push_back(py::str(t));
  std::unordered_map<uint32_t, py::object> frames;
  std::unordered_map<uint32_t, py::object> unknown_tags;

  py::dict prototype;  // every key but device_free (oom entries only)
  for (int k = 0; k < kDeviceFree; ++k) prototype[keys[k]] = py::none();

  GcPause no_gc;
  const size_t n = static_cast<size_t>(len) / sizeof(TraceRecord);
  py::list out;
  for (size_t i = 0; i < n; ++i) {
    TraceRecord r;
    std::memcpy(&r, data + i * sizeof(TraceRecord), sizeof r);
    if (r.action >= n_actions || !kept[r.action]) continue;
    py::object& stack = frames[r.stack_id];
    if (!stack) stack = frames_of(r.stack_id);
    py::object* tag;
    if (r.tag_id < tag_names.size()) {
      tag = &tag_names[r.tag_id];
    } else {
      tag = &unknown_tags[r.tag_id];
      if (!*tag) *tag = py::str("<tag " + std::to_string(r.tag_id) + ">");
    }
    py::object entry = py::reinterpret_steal<py::object>(PyDict_Copy(prototype.ptr()));
    if (!entry) throw py::error_already_set();
    PyObject* d = entry.ptr();
    const bool oom = r.action == oom_action;
    set_shared(d, keys[kAction].ptr(), actions[r.action]);
    set_new(d, keys[kAddr].ptr(), PyLong_FromUnsignedLongLong(oom ? 0 : r.addr));
    set_new(d, keys[kSize].ptr(), PyLong_FromUnsignedLongLong(r.size));
    set_new(d, keys[kStream].ptr(), PyLong_FromUnsignedLongLong(r.stream));
    set_new(d, keys[kTimeUs].ptr(), PyLong_FromLongLong(r.time_ns / 1000));
    set_shared(d, keys[kFrames].ptr(), stack);
    set_new(d, keys[kRequested].ptr(), PyLong_FromUnsignedLongLong(r.requested));
    set_shared(d, keys[kTag].ptr(), *tag);
    set_new(d, keys[kStep].ptr(), PyLong_FromUnsignedLong(r.step));
    set_new(d, keys[kThread].ptr(), PyLong_FromUnsignedLong(r.thread));
    if (oom) set_new(d, keys[kDeviceFree].ptr(), PyLong_FromUnsignedLongLong(r.addr));
    out.append(std::move(entry));
  }
  return out;
}

}  // namespace memalloc
