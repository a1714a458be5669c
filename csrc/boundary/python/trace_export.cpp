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
// over a growing young generation (1.6 s instead of 0.5 s per million). And
// each entry is untracked by the collector: tracked, the first allocation
// after the pause would collect a young generation of a million dicts
// (0.15 s), and every later full collection would walk them again. CPython
// untracks a dict that holds only atomic values; an entry refers to
// strings, integers and its stack's frames list (of dicts of strings and
// integers), so no cycle runs through the entries as built (a cycle a user
// makes by storing an entry inside itself is never collected).
//
// Each dict is copied from the entry before it (or, next to an oom entry,
// from a prototype that holds every key), so setting the values never
// resizes it and only the values that differ are set. A trace repeats few distinct
// integers (the addresses and sizes of a training loop's blocks, one
// stream, one thread, one step for many entries), so the integer objects
// are shared through a small direct-mapped cache: a hit is one compare and
// an incref instead of a new object (and a free when the entries die).
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
#include "profiler/recorder.h"

namespace py = pybind11;

namespace memalloc {
namespace {
enum Key { kAction, kAddr, kSize, kStream, kTimeUs, kFrames, kRequested, kTag, kStep, kThread, kDeviceFree, kKeys };
const char* const kKeyNames[kKeys] = {"action",         "addr", "size", "stream", "time_us",    "frames",
                                      "requested_size", "tag",  "step", "thread", "device_free"};

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

// Integer objects by value, direct-mapped (a slot keeps the last value that
// hashed to it). Owns one reference to each cached object.
class IntCache {
 public:
  IntCache() = default;
  IntCache(const IntCache&) = delete;
  IntCache& operator=(const IntCache&) = delete;
  ~IntCache() {
    for (Slot& s : slots_) Py_XDECREF(s.object);
  }
  // A new reference to an int equal to `value`.
  PyObject* get(uint64_t value) {
    Slot& s = slots_[(value * 0x9E3779B97F4A7C15ull) >> (64 - kBits)];
    if (s.object == nullptr || s.value != value) {
      PyObject* fresh = PyLong_FromUnsignedLongLong(value);
      if (fresh == nullptr) throw py::error_already_set();
      Py_XDECREF(s.object);
      s.object = fresh;
      s.value = value;
    }
    Py_INCREF(s.object);
    return s.object;
  }

 private:
  static constexpr int kBits = 12;
  struct Slot {
    uint64_t value = 0;
    PyObject* object = nullptr;
  };
  Slot slots_[1 << kBits];
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
  IntCache ints;
  const size_t n = static_cast<size_t>(len) / sizeof(TraceRecord);
  py::list out;
  PyObject* prev = nullptr;  // the last entry made, and its record
  TraceRecord p{};
  bool prev_oom = false;
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
    const bool oom = r.action == oom_action;
    // An entry copied from the one before (same keys: neither is an oom entry) only needs the
    // values that changed; successive records mostly share stream, thread, step, tag and stack.
    const bool all = prev == nullptr || oom || prev_oom;
    py::object entry = py::reinterpret_steal<py::object>(PyDict_Copy(all ? prototype.ptr() : prev));
    if (!entry) throw py::error_already_set();
    PyObject* d = entry.ptr();
    if (all || r.action != p.action) set_shared(d, keys[kAction].ptr(), actions[r.action]);
    if (all || r.addr != p.addr) set_new(d, keys[kAddr].ptr(), ints.get(oom ? 0 : r.addr));
    if (all || r.size != p.size) set_new(d, keys[kSize].ptr(), ints.get(r.size));
    if (all || r.stream != p.stream) set_new(d, keys[kStream].ptr(), ints.get(r.stream));
    if (all || r.time_ns / 1000 != p.time_ns / 1000)
      set_new(d, keys[kTimeUs].ptr(), PyLong_FromLongLong(r.time_ns / 1000));
    if (all || r.stack_id != p.stack_id) set_shared(d, keys[kFrames].ptr(), stack);
    if (all || r.requested != p.requested) set_new(d, keys[kRequested].ptr(), ints.get(r.requested));
    if (all || r.tag_id != p.tag_id) set_shared(d, keys[kTag].ptr(), *tag);
    if (all || r.step != p.step) set_new(d, keys[kStep].ptr(), ints.get(r.step));
    if (all || r.thread != p.thread) set_new(d, keys[kThread].ptr(), ints.get(r.thread));
    if (oom) set_new(d, keys[kDeviceFree].ptr(), ints.get(r.addr));
    PyObject_GC_UnTrack(d);
    prev = d;  // borrowed: `out` owns it
    p = r;
    prev_oom = oom;
    out.append(std::move(entry));
  }
  return out;
}

}  // namespace memalloc
