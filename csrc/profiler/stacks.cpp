// stacks.cpp — StackTable and TagTable (see stacks.h for invariants).
#include "profiler/stacks.h"

#include <algorithm>
#include <atomic>

namespace memalloc {
namespace {
uint64_t hash_frames(const RawFrame* frames, size_t n) {
  // One multiply per frame on the dependency chain (the word of a frame is
  // formed off the chain): a deep stack hashes in about a cycle per byte
  // less than FNV-1a over both words. Equal stacks hash equal; a collision
  // only costs a compare (intern() confirms every hit).
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t w = reinterpret_cast<uintptr_t>(frames[i].code) ^
                       (static_cast<uint64_t>(static_cast<uint32_t>(frames[i].lasti)) << 40);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
  }
  return h ^ (h >> 33);
}

// The per-thread cache of recently interned stacks (see stacks.h). An entry
// is only ever written by its own thread, after that thread obtained the id
// under the table's mutex, so reading the stored frames of that id later is
// ordered after their construction.
struct CacheSlot {
  uint64_t table = 0;  // StackTable serial; 0 = empty
  uint64_t hash = 0;
  uint32_t id = 0;
};
constexpr size_t kCacheSlots = 256;
thread_local CacheSlot t_cache[kCacheSlots];

std::atomic<uint64_t> g_table_serial{0};

bool same(const std::vector<RawFrame>& s, const RawFrame* frames, size_t n) {
  return s.size() == n && std::equal(s.begin(), s.end(), frames);
}
}  // namespace

StackTable::StackTable()
    : serial_(g_table_serial.fetch_add(1, std::memory_order_relaxed) + 1),
      chunks_(new std::unique_ptr<std::vector<RawFrame>[]>[kMaxChunks]) {}

uint32_t StackTable::intern(const RawFrame* frames, size_t n, bool* is_new) {
  if (n > kMaxDepth) n = kMaxDepth;
  *is_new = false;
  const uint64_t h = hash_frames(frames, n);
  CacheSlot& slot = t_cache[h % kCacheSlots];
  if (slot.table == serial_ && slot.hash == h && same(stored(slot.id), frames, n)) return slot.id;

  std::lock_guard<std::mutex> lock(mu_);
  uint32_t id = 0;
  auto it = by_hash_.find(h);
  if (it != by_hash_.end()) {
    for (uint32_t candidate : it->second)
      if (same(stored(candidate), frames, n)) id = candidate;
  }
  if (id == 0) {
    if (count_ == kChunk * kMaxChunks) return 0;
    if (count_ % kChunk == 0) chunks_[count_ / kChunk].reset(new std::vector<RawFrame>[kChunk]);
    id = ++count_;
    chunks_[(id - 1) / kChunk][(id - 1) % kChunk].assign(frames, frames + n);
    by_hash_[h].push_back(id);
    *is_new = true;
  }
  slot = CacheSlot{serial_, h, id};
  return id;
}

std::vector<RawFrame> StackTable::frames(uint32_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (id == 0 || id > count_) return {};
  return stored(id);
}

size_t StackTable::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
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
