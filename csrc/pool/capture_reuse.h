// capture_reuse.h — graph_capture_record_stream_reuse: when a block freed
// during a CUDA graph capture, after record_stream(), may be handed out again
// within the same capture.
//
// No event may be recorded or queried while a capture is under way, so such
// a block normally waits for the capture's end (StreamEvents::defer).
// The captured graph itself orders the work instead: every node queued on a
// stream from now on depends on the stream's current frontier
// (Backend::capture_frontier). At free time the block gets "free markers":
// the frontiers of its allocation stream and of every stream it was used
// on, which hold its last uses. Once each marker is the allocating stream's
// frontier or an ancestor of it, all work that stream queues from then on
// runs after every use of the block, and the block may be reused on it
// with no event. Only the graph's topology is read (no node is added).
//
// Invariants:
//   * marks_ names only blocks that StreamEvents holds deferred
//     (it forgets a block when the block stops waiting); a block with no
//     entry waits for the capture's end (one of its streams was not being
//     captured when it was freed).
//   * reached_[(capture, stream)] holds only the stream's frontier and its
//     ancestors in that capture. A graph under capture only grows, so a node
//     once reached stays reached, and a search stops at reached nodes: each
//     node is visited once per stream and capture.
//   * No lock of its own: DeviceAllocator calls it under the device lock.
//   * It never throws: a graph query the backend refuses reads as "not
//     capturing" (the block waits for the capture's end).
//     It allocates host memory (capture-time frees only, never the fast path).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "pool/block.h"

namespace memalloc {

class CaptureReuse {
 public:
  CaptureReuse(Backend& backend, int device) : backend_(backend), device_(device) {}

  // Records the free markers of `b` (freed during a capture, with stream
  // uses); returns false, recording nothing, when one of its streams is not
  // being captured or none of them has captured work yet (as native: such a
  // block waits for the capture's end).
  bool mark(const Block& b) noexcept;
  // Brings up to date the nodes reached from `stream`'s frontier; false when
  // the stream is not being captured or nothing is marked.
  bool refresh(Stream stream) noexcept;
  // After refresh(stream): whether `b` is marked and every marker of it is
  // reached from `stream`'s frontier.
  bool reusable(const Block& b, Stream stream) const;
  void forget(const Block& b) { marks_.erase(&b); }
  // No capture under way: drops every marker and reached set.
  void clear();
  // Whether every marked block is in `blocks` (validate.cpp).
  template <class Blocks>
  bool marks_only(const Blocks& blocks) const {
    for (const auto& kv : marks_)
      if (std::find(blocks.begin(), blocks.end(), kv.first) == blocks.end()) return false;
    return true;
  }

 private:
  bool mark_or_throw(const Block& b);
  bool refresh_or_throw(Stream stream);

  Backend& backend_;
  const int device_;
  std::unordered_map<const Block*, std::vector<GraphNode>> marks_;
  std::map<std::pair<uint64_t, Stream>, std::unordered_set<GraphNode>> reached_;
  const std::unordered_set<GraphNode>* current_ = nullptr;  // refresh()'s set
  Stream current_stream_ = 0;
  std::vector<GraphNode> frontier_, stack_;  // scratch
};

}  // namespace memalloc
