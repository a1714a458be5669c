// torch_history.h — torch's own memory history (torch.cuda.memory.
// _record_memory_history and its C++ twin), kept the way torch's native
// allocator keeps it, for memalloc as torch's CUDA allocator.
//
// torch hands the allocator a context recorder (a function that captures
// the calling thread's Python, TorchScript and C++ frames as a
// torch::CapturedTraceback) and a level: STATE (live blocks keep the frames
// of their allocation), ALLOC (trace entries of allocations too), ALL
// (frees and segment frees too, with their own frames). memalloc calls that
// recorder exactly where native does, before taking any lock, and attaches
// what it returns to the trace entries made from the allocator's Events
// (the core's event observer), so snapshots, memory_viz, the FX
// augmentation and the compile-context and user-metadata columns read as
// they do natively. memalloc's own event ring and call sites are separate
// and unaffected.
//
// Invariants:
//   * recorder() is called only outside the device locks, on the thread of
//     the call it describes (the recorder takes the GIL itself); the
//     Event observer (under a device lock) only reads the context gathered
//     for its thread's call (Scope).
//   * Lock order: a device lock, then this object's mutex; nothing here
//     calls into the allocator.
//   * Per device, entries() holds the last max_entries trace entries, oldest
//     first; disabling or clear_history empties them (native).
//   * A live block's allocation context is kept while level >= STATE, and
//     dropped when the block is freed or history is disabled.
//   * Trace trackers (attachAllocatorTraceTracker) see every entry made,
//     history on or off, under the device lock and this object's mutex, as
//     natively (torch asks them to take no lock of the allocator's).
//   * External annotations (recordAnnotation, the profiler's record_function
//     marks) and post-facto annotations (annotateMemory, torch >= 2.14) are
//     kept only while history is on, the last max_entries of them.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include "boundary/torch/cuda/torch_version.h"

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace memalloc {
struct Event;

class TorchHistory {
 public:
  using Context = std::shared_ptr<c10::GatheredContext>;
  using RecordContext = c10::CachingDeviceAllocator::RecordContext;
  using TraceEntry = c10::CachingDeviceAllocator::TraceEntry;

  explicit TorchHistory(int device_count) : devices_(static_cast<size_t>(device_count)) {}

  // recordHistory's arguments, as torch passes them.
  void configure(bool enabled, c10::CachingDeviceAllocator::CreateContextFn recorder, size_t max_entries,
                 RecordContext when, bool clear_history, const std::vector<std::string>& skip_actions);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // The calling thread's frames when history records contexts at `level`
  // or above (native's maybeGatherContext); nullptr otherwise. Never
  // call with a device lock held.
  Context gather(RecordContext level) const;

  // While alive, the Events this thread causes carry `context`; a null
  // context (history off, or below the level asked for) changes nothing.
  class Scope {
   public:
    explicit Scope(Context context);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Context previous_;
    bool active_;
  };

  // The core's Event observer (under the device lock).
  void on_event(int device, const Event& e);

  std::vector<TraceEntry> entries(int device) const;
  // The allocation context of the live block at `addr` (nullptr: none).
  Context block_context(int device, std::uintptr_t addr) const;

  // torch's trace trackers: called with every trace entry made.
  void attach_tracker(c10::CachingDeviceAllocator::AllocatorTraceTracker tracker);
  // recordAnnotation: one external annotation on `device` (history on only).
  void record_annotation(int device, const std::vector<std::pair<std::string, std::string>>& metadata);
  std::vector<c10::CachingDeviceAllocator::AnnotationEntry> annotations() const;
#if MEMALLOC_TORCH_AT_LEAST(2, 14)
  // annotateMemory: an "annotate" entry for the live block at `addr` of
  // `size` bytes, carrying `metadata` and `context` (history on only).
  void annotate(int device, std::uintptr_t addr, size_t size, const std::string& metadata, Context context);
#endif

  void push_compile_context(const std::string& context);
  void pop_compile_context();
  void set_user_metadata(const std::string& metadata);
  std::string user_metadata() const;

 private:
  struct Device {
    std::deque<TraceEntry> entries;
    std::unordered_map<std::uintptr_t, Context> blocks;    // live block -> its allocation's frames
    std::unordered_map<std::uintptr_t, Context> segments;  // segment -> the frames that made it
  };
  // Makes the entry, shows it to the trackers, keeps it while history is on.
  void add_locked(Device& d, int device, TraceEntry::Action action, std::uintptr_t addr, size_t size, void* stream,
                  c10::MempoolId_t pool, Context context, const std::string* metadata = nullptr);

  mutable std::mutex mu_;
  std::atomic<bool> enabled_{false};
  c10::CachingDeviceAllocator::CreateContextFn recorder_;
  RecordContext when_ = RecordContext::NEVER;
  size_t max_entries_ = 0;
  std::vector<std::string> skip_;  // action names not recorded
  std::vector<Device> devices_;
  std::vector<c10::CachingDeviceAllocator::AllocatorTraceTracker> trackers_;
  std::atomic<bool> has_trackers_{false};
  std::deque<c10::CachingDeviceAllocator::AnnotationEntry> annotations_;
  std::vector<std::string> compile_contexts_;  // a stack; "N/A" when empty
  std::string user_metadata_;
};

}  // namespace memalloc
