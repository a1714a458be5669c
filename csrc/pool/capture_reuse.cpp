// capture_reuse.cpp — the graph_capture_record_stream_reuse check.
// Invariants: capture_reuse.h.
#include "pool/capture_reuse.h"

#include <algorithm>

namespace memalloc {

// A query the driver refuses reads as "not capturing": the block then waits
// for the capture's end, which is always safe.
bool CaptureReuse::mark(const Block& b) noexcept {
  try {
    return mark_or_throw(b);
  } catch (...) {
    marks_.erase(&b);
    return false;
  }
}

bool CaptureReuse::refresh(Stream stream) noexcept {
  try {
    return refresh_or_throw(stream);
  } catch (...) {
    current_ = nullptr;
    return false;
  }
}

bool CaptureReuse::mark_or_throw(const Block& b) {
  std::vector<GraphNode> markers;
  uint64_t capture = 0, other = 0;
  if (!backend_.capture_frontier(device_, b.stream, &capture, &frontier_)) return false;
  markers = frontier_;
  for (Stream s : b.stream_uses) {
    if (!backend_.capture_frontier(device_, s, &other, &frontier_) || other != capture) return false;
    markers.insert(markers.end(), frontier_.begin(), frontier_.end());
  }
  std::sort(markers.begin(), markers.end());
  markers.erase(std::unique(markers.begin(), markers.end()), markers.end());
  if (markers.empty()) return false;
  marks_[&b] = std::move(markers);
  return true;
}

bool CaptureReuse::refresh_or_throw(Stream stream) {
  current_ = nullptr;
  uint64_t capture = 0;
  if (marks_.empty() || !backend_.capture_frontier(device_, stream, &capture, &frontier_) || frontier_.empty())
    return false;
  auto& reached = reached_[{capture, stream}];
  stack_.assign(frontier_.begin(), frontier_.end());
  while (!stack_.empty()) {
    GraphNode n = stack_.back();
    stack_.pop_back();
    if (!reached.insert(n).second) continue;  // reached before, and so are its ancestors
    backend_.graph_dependencies(device_, n, &stack_);
  }
  current_ = &reached;
  current_stream_ = stream;
  return true;
}

bool CaptureReuse::reusable(const Block& b, Stream stream) const {
  if (current_ == nullptr || stream != current_stream_) return false;
  auto it = marks_.find(&b);
  if (it == marks_.end()) return false;
  return std::all_of(it->second.begin(), it->second.end(), [&](GraphNode m) { return current_->count(m) > 0; });
}

void CaptureReuse::clear() {
  marks_.clear();
  reached_.clear();
  current_ = nullptr;
}

}  // namespace memalloc
