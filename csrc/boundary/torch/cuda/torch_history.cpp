// torch_history.cpp — torch's memory history kept as native keeps it.
// Invariants: torch_history.h. Semantics read from torch's native caching
// allocator (c10/cuda/CUDACachingAllocator.cpp, record_trace and
// maybeGatherContext), not copied.
#include "boundary/torch/cuda/torch_history.h"

#include <algorithm>
#include <chrono>

#include "pool/events.h"
#include "pool/private_pool.h"

namespace memalloc {
namespace {

using TorchAction = c10::CachingDeviceAllocator::TraceEntry::Action;

thread_local TorchHistory::Context t_context;  // the frames of this thread's call in progress

const char* action_name(TorchAction a) {
  switch (a) {
    case TorchAction::ALLOC:
      return "alloc";
    case TorchAction::FREE_REQUESTED:
      return "free_requested";
    case TorchAction::FREE_COMPLETED:
      return "free_completed";
    case TorchAction::SEGMENT_ALLOC:
      return "segment_alloc";
    case TorchAction::SEGMENT_FREE:
      return "segment_free";
    case TorchAction::SEGMENT_MAP:
      return "segment_map";
    case TorchAction::SEGMENT_UNMAP:
      return "segment_unmap";
    case TorchAction::OOM:
      return "oom";
#if MEMALLOC_TORCH_AT_LEAST(2, 14)
    case TorchAction::ANNOTATE:
      return "annotate";
#endif
    default:
      return "snapshot";
  }
}

int64_t unix_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TorchHistory::Scope::Scope(Context context) : active_(context != nullptr) {
  if (!active_) return;
  previous_ = std::move(t_context);
  t_context = std::move(context);
}
TorchHistory::Scope::~Scope() {
  if (active_) t_context = std::move(previous_);
}

void TorchHistory::configure(bool enabled, c10::CachingDeviceAllocator::CreateContextFn recorder, size_t max_entries,
                             RecordContext when, bool clear_history, const std::vector<std::string>& skip_actions) {
  std::lock_guard<std::mutex> lock(mu_);
  recorder_ = enabled ? std::move(recorder) : nullptr;
  when_ = enabled ? when : RecordContext::NEVER;
  max_entries_ = std::max<size_t>(max_entries, 1);
  skip_ = skip_actions;
  if (!enabled || clear_history) {
    annotations_.clear();
    for (Device& d : devices_) {
      d.entries.clear();
      if (!enabled) {
        d.blocks.clear();
        d.segments.clear();
      }
    }
  }
  for (Device& d : devices_)
    while (d.entries.size() > max_entries_) d.entries.pop_front();
  enabled_.store(enabled, std::memory_order_relaxed);
}

TorchHistory::Context TorchHistory::gather(RecordContext level) const {
  if (!enabled()) return nullptr;
  c10::CachingDeviceAllocator::CreateContextFn recorder;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (recorder_ == nullptr || static_cast<int>(when_) < static_cast<int>(level)) return nullptr;
    recorder = recorder_;
  }
  return recorder();
}

void TorchHistory::add_locked(Device& d, int device, TorchAction action, std::uintptr_t addr, size_t size, void* stream,
                              c10::MempoolId_t pool, Context context, const std::string* metadata) {
  const char* name = action_name(action);
  if (std::find(skip_.begin(), skip_.end(), name) != skip_.end()) return;
  if (static_cast<int>(when_) < static_cast<int>(RecordContext::ALLOC)) context = nullptr;  // STATE: blocks only
  TraceEntry te(action, static_cast<c10::DeviceIndex>(device), addr, size, reinterpret_cast<cudaStream_t>(stream), pool,
                0, std::move(context), compile_contexts_.empty() ? std::string("N/A") : compile_contexts_.back(),
                metadata != nullptr ? *metadata : user_metadata_);
  te.time_.t_ = static_cast<time_t>(unix_us());
  for (const auto& tracker : trackers_) tracker(te);
  if (!enabled_.load(std::memory_order_relaxed)) return;
  d.entries.push_back(std::move(te));
  if (d.entries.size() > max_entries_) d.entries.pop_front();
}

void TorchHistory::on_event(int device, const Event& e) {
  if (!enabled() && !has_trackers_.load(std::memory_order_relaxed)) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (device < 0 || static_cast<size_t>(device) >= devices_.size()) return;
  Device& d = devices_[static_cast<size_t>(device)];
  c10::MempoolId_t pool{0, 0};
  if (e.block != nullptr && e.block->owner != nullptr) pool = e.block->owner->id;
  auto add = [&](TorchAction action, size_t size, Context context) {
    add_locked(d, device, action, e.addr, size, reinterpret_cast<void*>(e.stream), pool, std::move(context));
  };
  const bool keep_state = static_cast<int>(when_) >= static_cast<int>(RecordContext::STATE);
  // A free's own frames (level ALL), else the frames of the allocation.
  auto own_or = [&](const std::unordered_map<std::uintptr_t, Context>& from) -> Context {
    if (t_context) return t_context;
    auto it = from.find(e.addr);
    return it == from.end() ? nullptr : it->second;
  };
  switch (e.action) {
    case memalloc::Action::kAlloc:
      if (keep_state && t_context) d.blocks[e.addr] = t_context;
      add(TorchAction::ALLOC, e.requested, t_context);
      break;
    case memalloc::Action::kFreeRequested:
      add(TorchAction::FREE_REQUESTED, e.requested, own_or(d.blocks));
      break;
    case memalloc::Action::kFreeCompleted:
      add(TorchAction::FREE_COMPLETED, e.requested, own_or(d.blocks));
      d.blocks.erase(e.addr);
      break;
    case memalloc::Action::kSegmentAlloc:
      if (t_context) d.segments[e.addr] = t_context;
      add(TorchAction::SEGMENT_ALLOC, e.size, t_context);
      break;
    case memalloc::Action::kSegmentFree:
      add(TorchAction::SEGMENT_FREE, e.size, own_or(d.segments));
      d.segments.erase(e.addr);
      break;
    case memalloc::Action::kSegmentMap:
      add(TorchAction::SEGMENT_MAP, e.size, t_context);
      break;
    case memalloc::Action::kSegmentUnmap:
      add(TorchAction::SEGMENT_UNMAP, e.size, t_context);
      break;
    case memalloc::Action::kOom:  // addr: the device's free bytes then
      add(TorchAction::OOM, e.requested, t_context);
      break;
    default:
      break;  // memalloc's own actions (retries, policies) have no torch entry
  }
}

void TorchHistory::attach_tracker(c10::CachingDeviceAllocator::AllocatorTraceTracker tracker) {
  std::lock_guard<std::mutex> lock(mu_);
  trackers_.push_back(std::move(tracker));
  has_trackers_.store(true, std::memory_order_relaxed);
}

void TorchHistory::record_annotation(int device, const std::vector<std::pair<std::string, std::string>>& metadata) {
  if (!enabled()) return;
  c10::CachingDeviceAllocator::AnnotationEntry entry(static_cast<c10::DeviceIndex>(device), 0);
  entry.time_.t_ = static_cast<time_t>(unix_us());
  for (const auto& [name, value] : metadata) entry.recordUserMetadata(name, value);
  std::lock_guard<std::mutex> lock(mu_);
  annotations_.push_back(std::move(entry));
  if (annotations_.size() > max_entries_) annotations_.pop_front();
}

std::vector<c10::CachingDeviceAllocator::AnnotationEntry> TorchHistory::annotations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {annotations_.begin(), annotations_.end()};
}

#if MEMALLOC_TORCH_AT_LEAST(2, 14)
void TorchHistory::annotate(int device, std::uintptr_t addr, size_t size, const std::string& metadata,
                            Context context) {
  if (!enabled()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled_.load(std::memory_order_relaxed) || device < 0 || static_cast<size_t>(device) >= devices_.size()) return;
  add_locked(devices_[static_cast<size_t>(device)], device, TorchAction::ANNOTATE, addr, size, nullptr, {0, 0},
             std::move(context), &metadata);
}
#endif

std::vector<TorchHistory::TraceEntry> TorchHistory::entries(int device) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (device < 0 || static_cast<size_t>(device) >= devices_.size()) return {};
  const auto& q = devices_[static_cast<size_t>(device)].entries;
  return {q.begin(), q.end()};
}

TorchHistory::Context TorchHistory::block_context(int device, std::uintptr_t addr) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (device < 0 || static_cast<size_t>(device) >= devices_.size()) return nullptr;
  const auto& blocks = devices_[static_cast<size_t>(device)].blocks;
  auto it = blocks.find(addr);
  return it == blocks.end() ? nullptr : it->second;
}

void TorchHistory::push_compile_context(const std::string& context) {
  std::lock_guard<std::mutex> lock(mu_);
  compile_contexts_.push_back(context);
}

void TorchHistory::pop_compile_context() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!compile_contexts_.empty()) compile_contexts_.pop_back();
}

void TorchHistory::set_user_metadata(const std::string& metadata) {
  std::lock_guard<std::mutex> lock(mu_);
  user_metadata_ = metadata;
}

std::string TorchHistory::user_metadata() const {
  std::lock_guard<std::mutex> lock(mu_);
  return user_metadata_;
}

}  // namespace memalloc
