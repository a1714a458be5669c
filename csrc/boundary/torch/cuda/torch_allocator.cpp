// torch_allocator.cpp — the subclass of torch's CUDAPluggableAllocator that
// forwards torch's CUDAAllocator calls to memalloc's core. Invariants:
// torch_allocator.h. Semantics follow torch's native caching allocator
// (c10/cuda/CUDACachingAllocator.cpp), read, not copied.
#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <unordered_map>

#include "boundary/torch/ipc_wire.h"
#include "boundary/torch/oom_report.h"
#include "boundary/torch/pluggable.h"
#include "boundary/callers/pystacks.h"
#include "common/errors.h"
#include "process/registry.h"
#include "boundary/torch/cuda/torch_allocator.h"
#include "boundary/torch/cuda/torch_history.h"
#include "boundary/torch/cuda/torch_snapshot.h"
#include "boundary/torch/cuda/torch_version.h"

namespace memalloc {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;
using Pluggable = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

thread_local int t_last_device = 0;  // a hint for frees: where this thread allocated last

// torch's history (set once, when memalloc becomes torch's allocator; the
// allocator lives for the whole process).
TorchHistory* g_history = nullptr;

// Allocations made while torch's caching is off
// (torch.cuda.caching_allocator_enable(False)): straight from the backend,
// counted nowhere, as native's uncached path. Device of each.
std::mutex g_uncached_mu;
std::unordered_map<void*, std::pair<int, size_t>>* g_uncached = new std::unordered_map<void*, std::pair<int, size_t>>;

bool free_uncached(CachingAllocator* core, void* ptr) {
  std::pair<int, size_t> where;
  {
    std::lock_guard<std::mutex> lock(g_uncached_mu);
    auto it = g_uncached->find(ptr);
    if (it == g_uncached->end()) return false;
    where = it->second;
    g_uncached->erase(it);
  }
  core->backend().release(where.first, ptr, where.second);
  return true;
}

// Frees `ptr` on whichever device holds it (the hint first). Never throws.
void free_anywhere(void* ptr) noexcept {
  if (ptr == nullptr) return;
  try {
    CachingAllocator* core = AllocatorRegistry::instance().installed();
    if (core == nullptr) return;
    const CallContext ctx = AllocatorRegistry::instance().thread_context();
    // torch's history at level ALL: the free's own frames
    TorchHistory::Scope frames(g_history != nullptr ? g_history->gather(cda::RecordContext::ALL) : nullptr);
    const int hint = t_last_device < core->device_count() ? t_last_device : 0;
    if (core->device(hint).free_if_owned(ptr, &ctx)) return;
    for (int d = 0; d < core->device_count(); ++d)
      if (d != hint && core->device(d).free_if_owned(ptr, &ctx)) return;
    if (free_uncached(core, ptr)) return;
    std::fprintf(stderr, "memalloc: free of %p ignored: no device holds a live allocation there (double free?)\n", ptr);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memalloc: free of %p failed: %s\n", ptr, e.what());
  }
}

// A checkpoint of one private pool, as torch's AllocatorState.
struct PoolCheckpoint final : cca::AllocatorState {
  PoolCheckpoint(int dev, PoolState s) : device(dev), state(std::move(s)) {}
  int device;
  PoolState state;
};

void copy_stat(const Stat& from, c10::CachingAllocator::Stat& to) {
  to.current = from.current;
  to.peak = from.peak.value();
  to.allocated = from.allocated;
  to.freed = from.freed;
}

void copy_stats(const Stat (&from)[kNumStatTypes], c10::CachingAllocator::StatArray& to) {
  for (int i = 0; i < kNumStatTypes; ++i) copy_stat(from[i], to[i]);
}

class TorchCudaAllocator final : public Pluggable {
 public:
  explicit TorchCudaAllocator(std::shared_ptr<CachingAllocator> core)
      : Pluggable(nullptr, nullptr), core_(std::move(core)), history_(core_->device_count()) {
    g_history = &history_;
    for (int d = 0; d < core_->device_count(); ++d)
      core_->with_profiler(d, [&](Profiler& p) { p.set_observer({&observe, this}); });
  }

  // ---- allocation ----------------------------------------------------------
  c10::DataPtr allocate(size_t size) override {
    // Native's first check (before any observer or retry), word for word.
    constexpr size_t kOneExaByte = size_t{1} << 60;
    TORCH_CHECK_WITH(OutOfMemoryError, size < kOneExaByte,
                     "CUDA out of memory. Tried to allocate more than 1EB memory.");
    const c10::DeviceIndex device = c10::cuda::current_device();
    void* p = malloc(size, device, c10::cuda::getCurrentCUDAStream(device).stream());
    return {p, p, &free_anywhere, c10::Device(c10::DeviceType::CUDA, device)};
  }
  // torch.cuda.caching_allocator_enable(False): allocations bypass the cache
  // (and its counters) until it is turned back on, as natively.
  void enable(bool value) override { caching_.store(value, std::memory_order_relaxed); }
  bool isEnabled() const override { return caching_.load(std::memory_order_relaxed); }
  c10::DeleterFnPtr raw_deleter() const override { return &free_anywhere; }
  void* raw_alloc(size_t nbytes) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    return malloc(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
  }
  void* raw_alloc_with_stream(size_t nbytes, cudaStream_t stream) override {
    const c10::DeviceIndex device = c10::cuda::current_device();
    return malloc(nbytes, device, stream);
  }
  void raw_delete(void* ptr) override { free_anywhere(ptr); }

  void init(int device_count) override {
    TORCH_CHECK(device_count <= core_->device_count(), "memalloc sees ", core_->device_count(),
                " CUDA devices but torch sees ", device_count);
    initialized_ = true;
  }
  bool initialized() override { return initialized_; }
  std::string name() override { return "memalloc"; }

  // ---- limits and the cache --------------------------------------------------
  double getMemoryFraction(c10::DeviceIndex device) override {
    const double f = core_->device(device).with_limits([](Limits& l) { return l.fraction(); });
    return f >= 0.0 ? f : 1.0;
  }
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    guard([&] { set_memory_fraction(core_->device(device), fraction); });
  }
  void emptyCache(c10::MempoolId_t pool) override {
    TorchHistory::Scope frames(history_.gather(cda::RecordContext::ALL));  // segment frees carry empty_cache's frames
    guard([&] {
      const CallContext ctx = AllocatorRegistry::instance().thread_context();
      for (int d = 0; d < core_->device_count(); ++d) core_->device(d).empty_cache(&ctx, pool);
    });
  }
  // cuDNN's workspace guess: *largest == 0 asks for the device's free bytes
  // first; then at least the largest free cached block.
  void cacheInfo(c10::DeviceIndex device, size_t* largest) override {
    guard([&] {
      memalloc::DeviceAllocator& d = core_->device(device);
      if (*largest == 0) *largest = d.mem_get_info().free;
      *largest = std::max(*largest, d.largest_free_block());
    });
  }
  void* getBaseAllocation(void* ptr, size_t* size) override {
    std::uintptr_t base = 0;
    for (int d = 0; d < core_->device_count(); ++d) {
      if (core_->device(d).segment_of(ptr, &base, size)) return reinterpret_cast<void*>(base);
    }
    TORCH_CHECK(false, "memalloc: getBaseAllocation of a pointer that is not a live allocation");
  }
  std::vector<cca::StreamSegmentSize> getExpandableSegmentSizes(c10::DeviceIndex) override { return {}; }
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override {
    if (ptr.get() == nullptr || ptr.get_deleter() != &free_anywhere) return;  // not ours (native ignores too)
    guard([&] {
      core_->device(ptr.device().index()).record_stream(ptr.get(), reinterpret_cast<Stream>(stream.stream()));
    });
  }

  // ---- statistics --------------------------------------------------------------
  cda::DeviceStats getDeviceStats(c10::DeviceIndex device) override {
    DeviceStats s;
    guard([&] { s = core_->device(device).stats(); });
    cda::DeviceStats out;
    copy_stats(s.allocation, out.allocation);
    copy_stats(s.segment, out.segment);
    copy_stats(s.active, out.active);
    copy_stats(s.inactive_split, out.inactive_split);
    copy_stats(s.allocated_bytes, out.allocated_bytes);
    copy_stats(s.reserved_bytes, out.reserved_bytes);
    copy_stats(s.active_bytes, out.active_bytes);
    copy_stats(s.inactive_split_bytes, out.inactive_split_bytes);
    copy_stats(s.requested_bytes, out.requested_bytes);
    copy_stat(s.oversize_allocations, out.oversize_allocations);
    copy_stat(s.oversize_segments, out.oversize_segments);
    out.num_alloc_retries = s.num_alloc_retries;
    out.num_ooms = s.num_ooms;
    out.num_sync_all_streams = s.num_sync_all_streams;
    out.num_device_alloc = s.num_device_alloc;
    out.num_device_free = s.num_device_free;
    out.max_split_size = static_cast<int64_t>(core_->device(device).settings().max_split_size);  // unlimited: -1
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex device) override {
    guard([&] { core_->device(device).with_accounting([](Accounting& acc) { acc.reset_accumulated(); }); });
  }
  void resetPeakStats(c10::DeviceIndex device) override {
    guard([&] { core_->device(device).with_accounting([](Accounting& acc) { acc.reset_peak(); }); });
  }

  // ---- private pools (graphs, MemPool) ----------------------------------------
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool,
                           std::function<bool(cudaStream_t)> filter) override {
    guard([&] {
      core_->device(device).with_pools([&](PrivatePools& p) {
        p.begin_route(pool, [f = std::move(filter)](Stream s) { return f(reinterpret_cast<cudaStream_t>(s)); });
      });
    });
  }
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t pool) override {
    guard([&] { core_->device(device).with_pools([&](PrivatePools& p) { p.end_route(pool); }); });
  }
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t pool) override {
    guard([&] { core_->device(device).with_pools([&](PrivatePools& p) { p.release(pool); }); });
  }
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t pool) override {
    int n = 0;
    guard([&] { n = core_->device(device).with_pools([&](PrivatePools& p) { return p.use_count(pool); }); });
    return n;
  }
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t pool,
                          std::shared_ptr<cca::CUDAAllocator> allocator) override {
    // A pool backed by another allocator (ncclMemAlloc, symmetric memory):
    // its segments come from that allocator; memalloc caches, accounts and
    // records them as any pool's.
    std::shared_ptr<SegmentSource> source;
    if (allocator != nullptr && allocator.get() != this) source = source_for(device, std::move(allocator));
    guard([&] { core_->device(device).with_pools([&](PrivatePools& p) { p.create_or_incref(pool, source); }); });
  }
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t pool, bool use_on_oom) override {
    guard([&] {
      core_->device(device).with_pools([&](PrivatePools& p) { p.get(pool, "set_use_on_oom").use_on_oom = use_on_oom; });
    });
  }
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t pool) override {
    guard([&] {
      core_->device(device).with_pools([&](PrivatePools& p) { p.get(pool, "set_no_split").no_split = true; });
    });
  }
  bool checkPoolLiveAllocations(c10::DeviceIndex device, c10::MempoolId_t pool,
                                const std::unordered_set<void*>& expected) override {
    bool same = false;
    guard([&] {
      const std::vector<void*> ptrs(expected.begin(), expected.end());
      same = core_->device(device).with_checkpoints([&](PoolCheckpoints& c) { return c.live_blocks_are(pool, ptrs); });
    });
    return same;
  }
  std::shared_ptr<cca::AllocatorState> getCheckpointState(c10::DeviceIndex device, c10::MempoolId_t pool) override {
    std::shared_ptr<cca::AllocatorState> out;
    guard([&] {
      PoolState state = core_->device(device).with_checkpoints([&](PoolCheckpoints& c) { return c.checkpoint(pool); });
      out = std::make_shared<PoolCheckpoint>(device, std::move(state));
    });
    return out;
  }
  cca::CheckpointDelta setCheckpointPoolState(c10::DeviceIndex device,
                                              std::shared_ptr<cca::AllocatorState> state) override {
    auto* cp = dynamic_cast<PoolCheckpoint*>(state.get());
    TORCH_CHECK(cp != nullptr && cp->device == device,
                "memalloc: setCheckpointPoolState needs a state from memalloc's getCheckpointState for device ",
                static_cast<int>(device));
    PoolRestore r;
    guard([&] {
      const CallContext ctx = AllocatorRegistry::instance().thread_context();
      r = core_->device(device).with_checkpoints([&](PoolCheckpoints& c) { return c.restore(cp->state); }, &ctx);
    });
    cca::CheckpointDelta delta;
    delta.ptrs_freed = std::move(r.freed);
    for (void* p : r.allocated)
      delta.dataptrs_allocd.emplace_back(p, p, &free_anywhere, c10::Device(c10::DeviceType::CUDA, device));
    return delta;
  }

  // ---- IPC ---------------------------------------------------------------------
  // A plain segment goes as its cudaIpcMemHandle (the legacy bare form, which
  // every native receiver reads); a block of an expandable segment as the
  // pages it spans, one POSIX descriptor each, in the installed torch's
  // version of native's 'e' form (ipc_wire.h), so native receivers map it
  // as they map their own.
  cca::ShareableHandle shareIpcHandle(void* ptr) override {
    for (int d = 0; d < core_->device_count(); ++d) {
      std::uintptr_t base = 0;
      size_t bytes = 0, block = 0, page = 0;
      bool expandable = false;
      if (!core_->device(d).segment_of(ptr, &base, &bytes, &expandable, &block, &page)) continue;
      cca::ShareableHandle h;
      const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
      if (!expandable) {
        h.offset = static_cast<ptrdiff_t>(addr - base);
        guard([&] { h.handle = core_->backend().ipc_handle(d, reinterpret_cast<void*>(base)); });
        return h;
      }
      guard([&] {
        // the block's whole pages, which count from its mapped run's start (the segment's pages)
        const std::uintptr_t lo = base + (addr - base) / page * page;
        const std::uintptr_t hi = base + (addr + block - base + page - 1) / page * page;
        const std::vector<int> fds = core_->backend().vm_share(d, reinterpret_cast<void*>(lo), hi - lo);
        h.offset = static_cast<ptrdiff_t>(addr - lo);
        h.handle = ipc_wire::encode_expandable(ipc_wire::version_for_torch(MEMALLOC_TORCH_MAJOR, MEMALLOC_TORCH_MINOR),
                                               static_cast<int>(getpid()), page, fds);
      });
      return h;
    }
    TORCH_CHECK(false, "memalloc: shareIpcHandle of a pointer that is not a live memalloc allocation");
  }
  // Opens a handle once per process (keyed by its bytes, as native; a
  // cudaMalloc segment by its cudaIpcMemHandle, whichever form it came in,
  // since CUDA maps one handle once per process): later calls share the
  // mapping until the last user drops it. Reads every form native torch
  // 2.11 to 2.14 sends (ipc_wire.h) and memalloc's own.
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override {
    ipc_wire::Decoded h;
    guard([&] { h = ipc_wire::decode(handle); });
    const std::string key = h.type == ipc_wire::kCudaMalloc ? h.cuda_ipc : handle;
    const c10::DeviceIndex device = c10::cuda::current_device();
    std::lock_guard<std::mutex> lock(ipc_mu_);
    auto it = ipc_open_.find(key);
    if (it != ipc_open_.end()) {
      if (auto alive = it->second.lock()) return alive;
    }
    std::shared_ptr<CachingAllocator> core = core_;
    std::shared_ptr<void> mapped;
    guard([&] {
      if (h.type == ipc_wire::kCudaMalloc) {
        void* p = core_->backend().ipc_open(device, h.cuda_ipc);
        mapped = std::shared_ptr<void>(p, [core, device](void* q) { core->backend().ipc_close(device, q); });
        return;
      }
      SharedPages pages;
      pages.pid = h.pid;
      pages.page_bytes = h.page_bytes;
      pages.fds = std::move(h.fds);
      pages.fabric = std::move(h.fabric);
      void* p = core_->backend().vm_open_shared(device, pages);
      mapped = std::shared_ptr<void>(p, [core, device](void* q) { core->backend().vm_close_shared(device, q); });
    });
    ipc_open_[key] = mapped;
    return mapped;
  }

  // ---- history and snapshots --------------------------------------------------
  // torch's _record_memory_history: torch's context recorder and levels, as
  // natively (torch_history.h). memalloc's own ring (memalloc.
  // record_history) is separate.
  void recordHistory(bool enabled, cda::CreateContextFn context_recorder, size_t max_entries, cda::RecordContext when,
                     bool clear_history, const std::vector<std::string>& skip_actions) override {
    history_.configure(enabled, std::move(context_recorder), std::min(max_entries, kTorchDefaultEntries), when,
                       clear_history, skip_actions);
  }
  bool isHistoryEnabled() override {
    if (history_.enabled()) return true;
    for (int d = 0; d < core_->device_count(); ++d)
      if (core_->with_profiler(d, [](Profiler& p) { return p.trace().enabled(); })) return true;
    return false;
  }
  // torch.compile's regions and _set_memory_metadata, on each trace entry.
  void pushCompileContext(std::string& md) override { history_.push_compile_context(md); }
  void popCompileContext() override { history_.pop_compile_context(); }
#if MEMALLOC_TORCH_AT_LEAST(2, 14)
  bool supportsUserMetadata() override { return true; }
#endif
  void setUserMetadata(const std::string& metadata) override { history_.set_user_metadata(metadata); }
  std::string getUserMetadata() override { return history_.user_metadata(); }

  // The allocation context of the live block starting at `ptr` (nullptr:
  // none, or history below STATE), as native looks it up.
#if MEMALLOC_TORCH_AT_LEAST(2, 12)
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) override {
    const auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    for (int d = 0; d < core_->device_count(); ++d)
      if (auto context = history_.block_context(d, addr)) return context;
    return nullptr;
  }
#endif
  // record_function's marks while _record_memory_history runs with
  // global_record_annotations: the snapshot's external_annotations.
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override {
    history_.record_annotation(c10::cuda::current_device(), md);
  }
#if MEMALLOC_TORCH_AT_LEAST(2, 14)
  // torch.cuda.memory._annotate_tensor: an "annotate" trace entry for the
  // live block at `ptr` (its storage's base), with the annotation site's
  // frames; nothing when history is off or no live block starts there.
  void annotateMemory(const void* ptr, const std::string& metadata) override {
    TorchHistory::Context frames = history_.gather(cda::RecordContext::ALLOC);
    auto* p = const_cast<void*>(ptr);
    for (int d = 0; d < core_->device_count(); ++d) {
      std::uintptr_t base = 0;
      size_t segment = 0, block = 0, page = 0;
      bool expandable = false;
      if (!core_->device(d).segment_of(p, &base, &segment, &expandable, &block, &page)) continue;
      history_.annotate(d, reinterpret_cast<std::uintptr_t>(ptr), block, metadata, std::move(frames));
      return;
    }
  }
#endif
  // NCCL's buffer registration (TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK)
  // and other trackers: every trace entry, under the device lock.
  void attachAllocatorTraceTracker(cda::AllocatorTraceTracker tracker) override {
    history_.attach_tracker(std::move(tracker));
  }

  // torch.cuda.memory._snapshot() (torch_snapshot.h)
  cca::SnapshotInfo snapshot(c10::MempoolId_t pool, bool include_traces) override {
    return torch_snapshot(*core_, history_, pool, include_traces);
  }

  // ---- OOM observers ------------------------------------------------------------
  void attachOutOfMemoryObserver(cca::OutOfMemoryObserver observer) override {
    std::lock_guard<std::mutex> lock(observers_mu_);
    observers_.push_back(std::move(observer));
  }

#if MEMALLOC_TORCH_AT_LEAST(2, 12)
  // Observers of allocations refused before reaching the device (native's
  // throw_on_cudamalloc_oom policy). memalloc has no such policy (enable()
  // names the key as unsupported): it never refuses that way, so these are
  // kept and never called, and num_oom_rejections stays 0, as natively with
  // the policy off (its default).
  void attachOomRejectionObserver(cca::OomRejectionObserver observer) override {
    std::lock_guard<std::mutex> lock(observers_mu_);
    rejection_observers_.push_back(std::move(observer));
  }
#endif

  // ---- peers ---------------------------------------------------------------------
  // `dev` may use `dev_to_access`'s memory: the driver's peer access (enough
  // for cuMemAlloc segments), and the pages of expandable segments, now and
  // later, made accessible to `dev` (cuMemSetAccess), as native does.
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override {
    {
      c10::cuda::CUDAGuard device_guard(dev);
      const cudaError_t err = cudaDeviceEnablePeerAccess(dev_to_access, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        (void)cudaGetLastError();  // already on: clear the sticky error, as native
      } else {
        C10_CUDA_CHECK(err);
      }
    }
    guard([&] { core_->backend().vm_add_peer(dev_to_access, dev); });
  }
  // A copy between devices: memalloc's expandable segments are not
  // cudaMalloc memory, so without peer access it must go through the peer
  // copy (cudaMemcpyAsync would fail there); native decides the same way.
  cudaError_t memcpyAsync(void* dst, int dstDevice, const void* src, int srcDevice, size_t count, cudaStream_t stream,
                          bool p2p_enabled) override {
    if (p2p_enabled || dstDevice == srcDevice)
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    return cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream);
  }

  // ---- the one allocation path ---------------------------------------------------
  void* malloc(size_t size, c10::DeviceIndex device, cudaStream_t stream) {
    if (size == 0) return nullptr;
    if (!caching_.load(std::memory_order_relaxed)) return uncached_malloc(size, device);
    t_last_device = device;
    const CallContext ctx = current_context();
    TorchHistory::Scope frames(history_.gather(cda::RecordContext::STATE));  // torch's history: the allocation's frames
    try {
      return core_->device(device).malloc(size, reinterpret_cast<Stream>(stream), &ctx);
    } catch (const OutOfMemory& e) {
      notify_observers(device,
                       segment_size_for(round_size(size, core_->device(device).settings().divisions_for(size))));
      throw_oom_for_torch(e, core_.get(), device, size, __func__);
    } catch (...) {
      rethrow_for_torch(__func__);
    }
  }

 private:
  static constexpr size_t kTorchDefaultEntries = 1000000;  // torch's "unbounded" default, bounded

  // Runs f, turning memalloc errors into c10 errors (torch's Python
  // bindings then raise their Python equivalents).
  template <typename F>
  static void guard(F&& f) {
    try {
      f();
    } catch (...) {
      rethrow_for_torch("memalloc");
    }
  }

  void* uncached_malloc(size_t size, c10::DeviceIndex device) {
    void* p = nullptr;
    guard([&] { p = core_->backend().allocate(device, size); });
    TORCH_CHECK_WITH(OutOfMemoryError, p != nullptr,
                     "CUDA out of memory (memalloc, caching off: torch.cuda.caching_allocator_enable(False)); the "
                     "device refused the allocation");
    std::lock_guard<std::mutex> lock(g_uncached_mu);
    (*g_uncached)[p] = {static_cast<int>(device), size};
    return p;
  }

  // The core's Event observer: torch's history, and the profiler's memory
  // timeline (profile_memory=True) as native reports it.
  static void observe(void* user, int device, const Event& e, int64_t allocated, int64_t reserved) {
    auto* self = static_cast<TorchCudaAllocator*>(user);
    self->history_.on_event(device, e);
    if ((e.action == Action::kAlloc || e.action == Action::kFreeRequested) && c10::memoryProfilingEnabled()) {
      const auto bytes = static_cast<int64_t>(e.size);
      c10::reportMemoryUsageToProfiler(reinterpret_cast<void*>(e.addr), e.action == Action::kAlloc ? bytes : -bytes,
                                       static_cast<size_t>(allocated), static_cast<size_t>(reserved),
                                       c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device)));
    }
  }

  // A MemPool's own allocator as the source of its segments.
  class PoolAllocatorSource final : public SegmentSource {
   public:
    PoolAllocatorSource(int device, std::shared_ptr<cca::CUDAAllocator> allocator)
        : device_(device), allocator_(std::move(allocator)) {}
    void* allocate(size_t bytes, Stream stream) override {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
      try {
        return allocator_->raw_alloc_with_stream(bytes, reinterpret_cast<cudaStream_t>(stream));
      } catch (const c10::Error&) {
        return nullptr;  // refused: memalloc's OOM path (release, retry, then the error)
      }
    }
    bool release(void* ptr, size_t) noexcept override {
      try {
        c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
        allocator_->raw_delete(ptr);
        return true;
      } catch (...) {
        return false;
      }
    }

   private:
    int device_;
    std::shared_ptr<cca::CUDAAllocator> allocator_;  // kept while the pool's segments live
  };
  // One source per (pool allocator, device) while a pool uses it: the pools
  // own their source (and through it the allocator, as native's PrivatePool
  // keeps it until the pool's last segment is gone); this table only finds
  // a live one again, so a deleted pool's allocator is not kept.
  std::shared_ptr<SegmentSource> source_for(c10::DeviceIndex device, std::shared_ptr<cca::CUDAAllocator> allocator) {
    std::lock_guard<std::mutex> lock(sources_mu_);
    sources_.erase(
        std::remove_if(sources_.begin(), sources_.end(), [](const SourceEntry& e) { return e.source.expired(); }),
        sources_.end());
    for (const SourceEntry& e : sources_)
      if (e.allocator == allocator.get() && e.device == device)
        if (auto live = e.source.lock()) return live;
    auto source = std::make_shared<PoolAllocatorSource>(device, allocator);
    sources_.push_back(SourceEntry{allocator.get(), device, source});
    return source;
  }

  void notify_observers(c10::DeviceIndex device, size_t size) noexcept {
    std::vector<cca::OutOfMemoryObserver> observers;
    {
      std::lock_guard<std::mutex> lock(observers_mu_);
      observers = observers_;
    }
    if (observers.empty()) return;
    try {
      memalloc::DeviceAllocator& d = core_->device(device);
      const MemInfo info = d.mem_get_info();
      const double fraction = d.with_limits([](Limits& l) { return l.fraction(); });
      const size_t limit =
          fraction >= 0.0 ? static_cast<size_t>(fraction * static_cast<double>(info.total)) : info.total;
      for (auto& obs : observers) obs(device, size, limit, info.free);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "memalloc: an out-of-memory observer failed: %s\n", e.what());
    }
  }

  std::shared_ptr<CachingAllocator> core_;
  TorchHistory history_;
  std::atomic<bool> caching_{true};
  struct SourceEntry {
    const cca::CUDAAllocator* allocator;  // identity only: the source holds the allocator
    int device;
    std::weak_ptr<SegmentSource> source;
  };
  std::mutex sources_mu_;
  std::vector<SourceEntry> sources_;  // source_for's table
  std::mutex observers_mu_;
  std::vector<cca::OutOfMemoryObserver> observers_;
#if MEMALLOC_TORCH_AT_LEAST(2, 12)
  std::vector<cca::OomRejectionObserver> rejection_observers_;  // never called (attachOomRejectionObserver)
#endif
  std::mutex ipc_mu_;
  std::unordered_map<std::string, std::weak_ptr<void>> ipc_open_;
};

}  // namespace

void install_torch_cuda_allocator(const std::shared_ptr<CachingAllocator>& core) {
  MEMALLOC_EXPECTS(core != nullptr && std::string(core->backend().name()) == "cuda",
                   "torch's CUDA allocator must be a memalloc allocator on the cuda backend");
  // torch keeps the installed custom allocator: whether it is ours is read there, not kept here.
  MEMALLOC_EXPECTS(
      dynamic_cast<TorchCudaAllocator*>(torch::cuda::CUDAPluggableAllocator::getCurrentAllocator().get()) == nullptr,
      "memalloc is already torch's CUDA allocator in this process");
  auto allocator = std::make_shared<TorchCudaAllocator>(core);
  try {
    torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  } catch (const c10::Error& e) {
    throw InvalidArgument(std::string("torch refused the allocator: ") + e.what_without_backtrace());
  }
  // torch.accelerator.* asks c10's allocator table, which changeCurrentAllocator leaves alone.
  c10::SetAllocator(c10::DeviceType::CUDA, allocator.get(), /*priority=*/1);
  // changeCurrentAllocator keeps a shared_ptr for the life of the process.
}

}  // namespace memalloc
