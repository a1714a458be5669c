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
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

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
  void add_locked(Device& d, int device, TraceEntry::Action action, std::uintptr_t addr, size_t size, const Event& e,
                  Context context);

  mutable std::mutex mu_;
  std::atomic<bool> enabled_{false};
  c10::CachingDeviceAllocator::CreateContextFn recorder_;
  RecordContext when_ = RecordContext::NEVER;
  size_t max_entries_ = 0;
  std::vector<std::string> skip_;  // action names not recorded
  std::vector<Device> devices_;
  std::vector<std::string> compile_contexts_;  // a stack; "N/A" when empty
  std::string user_metadata_;
};

}  // namespace memalloc
