// registry.h — the multi-device CachingAllocator (each device's allocator
// with its profiler subscribed to it) and the one global: the
// AllocatorRegistry that holds the allocator torch (or memalloc.host) uses,
// and the attribution state the boundary reads for every call.
//
// Invariants:
//   * AllocatorRegistry is the only mutable global state of memalloc (the
//     dlopen'ed driver table of backend_cuda.cpp is write-once).
//   * Once installed, an allocator is never uninstalled or destroyed: torch
//     may free tensors during interpreter shutdown, after static destructors
//     would have run. The registry therefore lives in leaked heap memory.
//   * installed() is one atomic load: the pluggable hot path pays nothing else.
//   * A CachingAllocator owns its backend and one DeviceAllocator per device
//     with its Profiler (profiler/profiler.h) as its subscriber, created up
//     front; the set of devices never changes. A profiler outlives its
//     device's allocator and is reached only under that device's lock
//     (with_profiler, mark).
//   * Attribution state lives here too: the stack mode, the stack and tag
//     tables, the step counter, the backward context (tag and stack of the
//     thread that called backward, used by threads with no Python frames),
//     and two per-thread slots (thread_local): the current tag and a small
//     thread index. Atomics are read with relaxed ordering: attribution is
//     advisory, never used for memory safety.
//   * The out-of-memory hook pointer is opaque here (the core knows no
//     Python); csrc/boundary/torch/oom_report.cpp owns what it points to.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/backend.h"
#include "common/config.h"
#include "allocator/device_allocator.h"
#include "profiler/profiler.h"
#include "profiler/recorder.h"
#include "profiler/stacks.h"

namespace memalloc {

class CachingAllocator {
 public:
  // `settings_text`: the text it was made from, as its maker wrote it (the
  // Python module's canonical text, with keys the core does not read); kept
  // for the maker, never read here.
  CachingAllocator(std::unique_ptr<Backend> backend, const Config& config, std::string settings_text = "");
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  Backend& backend() { return *backend_; }
  const Config& config() const { return config_; }
  const std::string& settings_text() const { return settings_text_; }
  int device_count() const { return static_cast<int>(devices_.size()); }
  // Throws InvalidArgument for a device index out of range.
  DeviceAllocator& device(int index);
  // The device whose live block starts at ptr; nullptr when none.
  DeviceAllocator* find_owner(void* ptr);
  // Frees ptr on the device whose live block starts there: one lookup under
  // each device's lock tried (find_owner then free would take two); false,
  // and nothing changed, when no device owns it.
  bool free_owned(void* ptr, Caller caller = nullptr);

  // f(profiler) of device `index` under that device's lock; returns what f
  // returns. f must not call into the allocator.
  template <class F>
  decltype(auto) with_profiler(int index, F&& f) {
    DeviceAllocator& d = device(index);
    Profiler& p = *profilers_[index];
    return d.locked([&]() -> decltype(auto) { return f(p); });
  }
  // Gives the live allocation holding `ptr` on device `index` (its start or
  // an interior address) the final category `cat`. Returns its bytes (0:
  // none holds ptr). An interior pointer costs a walk over the profiler's
  // allocations.
  size_t mark(int index, std::uintptr_t ptr, Category cat) {
    DeviceAllocator& d = device(index);
    Profiler& p = *profilers_[index];
    return d.with_live_id(ptr, [&](Subscriber::Id id) { return p.mark(id, ptr, cat); });
  }
  // Event recording into device `index`'s ring (event_trace.h), the clock
  // calibrated first, outside the lock: capacity 0 turns it off. Enabling
  // allocates the ring once; recording itself never allocates.
  void set_recording(int index, size_t capacity);
  // Recording into a flight file (recorder.h's attach): `capacity` records
  // at `slots`, their sequence numbers at `seqs`, memory `keep` keeps alive.
  void set_recording_file(int index, TraceRecord* slots, uint64_t* seqs, size_t capacity, std::shared_ptr<void> keep);

 private:
  std::unique_ptr<Backend> backend_;
  const Config config_;
  const std::string settings_text_;
  std::vector<std::unique_ptr<Profiler>> profilers_;  // before devices_: destroyed after them
  std::vector<std::unique_ptr<DeviceAllocator>> devices_;
};

// Builds the backend named by `backend` ("cuda" or "host") and its allocator.
// `settings_text`: kept as the allocator's settings_text().
std::shared_ptr<CachingAllocator> make_allocator(const std::string& backend, const Config& config,
                                                 const std::string& settings_text = "");

enum class StackMode : int { kNone = 0, kTags = 1, kPython = 2 };
constexpr int kNumStackModes = 3;
// Names by StackMode value (exported to Python as memalloc._C.STACK_MODES).
inline const char* stack_mode_name(int m) {
  static const char* const names[kNumStackModes] = {"none", "tags", "python"};
  return names[m];
}

class AllocatorRegistry {
 public:
  static AllocatorRegistry& instance();

  // ---- attribution (read on every allocation; see pystacks.cpp) ----------
  StackMode stack_mode() const { return static_cast<StackMode>(stack_mode_.load(std::memory_order_relaxed)); }
  void set_stack_mode(StackMode m) { stack_mode_.store(static_cast<int>(m), std::memory_order_relaxed); }
  StackTable& stacks() { return stacks_; }
  TagTable& tags() { return tags_; }
  uint32_t step() const { return step_.load(std::memory_order_relaxed); }
  uint32_t next_step() { return step_.fetch_add(1, std::memory_order_relaxed) + 1; }
  void set_backward_context(uint32_t tag, uint32_t stack) {
    backward_tag_.store(tag, std::memory_order_relaxed);
    backward_stack_.store(stack, std::memory_order_relaxed);
  }
  uint32_t backward_tag() const { return backward_tag_.load(std::memory_order_relaxed); }
  uint32_t backward_stack() const { return backward_stack_.load(std::memory_order_relaxed); }
  // The out-of-memory report hook: an opaque pointer owned by the boundary
  // (a Python callable, csrc/boundary/torch/oom_report.cpp); nullptr = none.
  void* oom_hook() const { return oom_hook_.load(std::memory_order_acquire); }
  void* exchange_oom_hook(void* hook) { return oom_hook_.exchange(hook, std::memory_order_acq_rel); }
  static uint32_t thread_tag();
  static void set_thread_tag(uint32_t tag);
  static uint32_t thread_index();
  // Thread index and step of the calling thread: the context of calls that
  // need no stack (frees, empty_cache). No GIL, no allocation.
  CallContext thread_context() const {
    CallContext ctx;
    ctx.thread = thread_index();
    ctx.step = step();
    return ctx;
  }
  // Installs `a` as the process's allocator. Throws InvalidArgument when one
  // is already installed.
  void install(std::shared_ptr<CachingAllocator> a);
  CachingAllocator* installed() const noexcept { return installed_.load(std::memory_order_acquire); }
  std::shared_ptr<CachingAllocator> installed_shared();

 private:
  AllocatorRegistry() = default;
  std::mutex mu_;
  std::shared_ptr<CachingAllocator> owner_;
  std::atomic<CachingAllocator*> installed_{nullptr};
  std::atomic<int> stack_mode_{0};
  StackTable stacks_;
  TagTable tags_;
  std::atomic<uint32_t> step_{0};
  std::atomic<uint32_t> backward_tag_{0};
  std::atomic<uint32_t> backward_stack_{0};
  std::atomic<void*> oom_hook_{nullptr};
};

}  // namespace memalloc
