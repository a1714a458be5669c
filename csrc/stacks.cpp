// stacks.cpp — StackTable and TagTable (see stacks.h for invariants).
#include "stacks.h"

#include <algorithm>

namespace memalloc {
namespace {
uint64_t hash_frames(const RawFrame* frames, size_t n) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the raw words
  for (size_t i = 0; i < n; ++i) {
    h = (h ^ reinterpret_cast<uintptr_t>(frames[i].code)) * 1099511628211ull;
    h = (h ^ static_cast<uint64_t>(static_cast<uint32_t>(frames[i].lasti))) * 1099511628211ull;
  }
  return h ^ n;
}
}  // namespace

uint32_t StackTable::intern(const RawFrame* frames, size_t n, bool* is_new) {
  if (n > kMaxDepth) n = kMaxDepth;
  const uint64_t h = hash_frames(frames, n);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_hash_.find(h);
  if (it != by_hash_.end()) {
    for (uint32_t id : it->second) {
      const auto& s = stacks_[id - 1];
      if (s.size() == n && std::equal(s.begin(), s.end(), frames)) {
        *is_new = false;
        return id;
      }
    }
  }
  stacks_.emplace_back(frames, frames + n);
  auto id = static_cast<uint32_t>(stacks_.size());
  by_hash_[h].push_back(id);
  *is_new = true;
  return id;
}

std::vector<RawFrame> StackTable::frames(uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id == 0 || id > stacks_.size()) return {};
  return stacks_[id - 1];
}

size_t StackTable::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return stacks_.size();
}

uint32_t TagTable::intern(const std::string& name) {
  if (name.empty()) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ids_.find(name);
  if (it != ids_.end()) return it->second;
  auto id = static_cast<uint32_t>(names_.size());
  names_.push_back(name);
  ids_.emplace(name, id);
  return id;
}

std::vector<std::string> TagTable::names() {
  std::lock_guard<std::mutex> lock(mu_);
  return names_;
}

}  // namespace memalloc
