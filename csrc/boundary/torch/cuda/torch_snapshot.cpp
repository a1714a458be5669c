// torch_snapshot.cpp — see torch_snapshot.h. The shapes follow torch's
// native snapshot (c10/cuda/CUDACachingAllocator.cpp), read, not copied.
#include "boundary/torch/cuda/torch_snapshot.h"

#include <chrono>
#include <string>
#include <vector>

#include "boundary/torch/cuda/torch_contexts.h"

namespace memalloc {
namespace {

namespace cca = c10::cuda::CUDACachingAllocator;
namespace cda = c10::CachingDeviceAllocator;

cda::TraceEntry::Action torch_action(Action a, bool* known) {
  *known = true;
  switch (a) {
    case Action::kAlloc:
      return cda::TraceEntry::ALLOC;
    case Action::kFreeRequested:
      return cda::TraceEntry::FREE_REQUESTED;
    case Action::kFreeCompleted:
      return cda::TraceEntry::FREE_COMPLETED;
    case Action::kSegmentAlloc:
      return cda::TraceEntry::SEGMENT_ALLOC;
    case Action::kSegmentFree:
      return cda::TraceEntry::SEGMENT_FREE;
    case Action::kSegmentMap:
      return cda::TraceEntry::SEGMENT_MAP;
    case Action::kSegmentUnmap:
      return cda::TraceEntry::SEGMENT_UNMAP;
    case Action::kOom:
      return cda::TraceEntry::OOM;
    default:
      *known = false;
      return cda::TraceEntry::ALLOC;
  }
}

cda::SegmentInfo torch_segment(int device, const SegmentInfo& s, const TorchHistory& history, StackContexts* contexts) {
  cda::SegmentInfo seg;
  seg.device = static_cast<c10::DeviceIndex>(device);
  seg.address = s.addr;
  seg.total_size = s.size;
  seg.stream = reinterpret_cast<void*>(s.stream);
  seg.is_large = s.pool == PoolKind::kLarge;
  seg.is_expandable = s.expandable;
  seg.owner_private_pool_id = s.owner;
  std::uintptr_t addr = s.addr;  // the blocks tile the segment
  for (const BlockInfo& b : s.blocks) {
    cda::BlockInfo bi;
    bi.size = b.size;
    bi.requested_size = b.requested;
    bi.allocated = std::string(b.state) == "active_allocated";
    bi.active = std::string(b.state) != "inactive";
    if (bi.active) {
      bi.context_when_allocated =
          history.enabled() ? history.block_context(device, addr) : contexts->of(Profiler::note_stack(b.note));
    }
    addr += b.size;
    if (bi.allocated) {
      seg.allocated_size += b.size;
      seg.requested_size += b.requested;
    }
    if (bi.active) seg.active_size += b.size;
    seg.blocks.push_back(std::move(bi));
  }
  return seg;
}

// memalloc's event ring as torch's trace entries, times on the wall clock.
void add_traces(CachingAllocator& core, int device, std::vector<cda::TraceEntry>* out, StackContexts* contexts) {
  uint64_t dropped = 0;
  const std::vector<TraceRecord> records = core.with_profiler(device, [&](Profiler& p) { return p.records(&dropped); });
  const auto steady_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const auto unix_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  for (const TraceRecord& r : records) {
    bool known = false;
    const auto action = torch_action(static_cast<Action>(r.action), &known);
    if (!known) continue;
    cda::TraceEntry te(action, static_cast<c10::DeviceIndex>(device), r.addr, r.size, reinterpret_cast<void*>(r.stream),
                       kDefaultPool, 0, contexts->of(r.stack_id));
    te.time_.t_ = static_cast<time_t>(unix_us - (steady_ns - r.time_ns) / 1000);
    out->push_back(std::move(te));
  }
}

}  // namespace

cca::SnapshotInfo torch_snapshot(CachingAllocator& core, const TorchHistory& history, c10::MempoolId_t pool,
                                 bool include_traces) {
  cca::SnapshotInfo out;
  StackContexts contexts;
  for (int d = 0; d < core.device_count(); ++d) {
    DeviceAllocator& dev = core.device(d);
    for (const SegmentInfo& s : dev.segments()) {
      if (pool != kDefaultPool && s.owner != pool) continue;
      out.segments.push_back(torch_segment(d, s, history, &contexts));
    }
    out.device_traces.emplace_back();
    if (include_traces && history.enabled()) {
      out.device_traces.back() = history.entries(d);
    } else if (include_traces) {
      add_traces(core, d, &out.device_traces.back(), &contexts);
    }
  }
  if (include_traces) out.external_annotations = history.annotations();  // record_function's marks (recordAnnotation)
  const Config settings = core.device(0).settings();
  out.config_metadata.garbage_collection_threshold = settings.garbage_collection_threshold;
  out.config_metadata.max_split_size = settings.max_split_size;
  out.config_metadata.expandable_segments = settings.expandable_segments;
  out.config_metadata.last_allocator_settings = settings.to_string();
  return out;
}

}  // namespace memalloc
