// stacks.h — interned call stacks and tag names, referenced from records by
// a 32-bit id (0 = none).
//
// A stack is a sequence of raw frames, innermost first: (code object,
// last instruction offset). Symbolising (file, line, function) is deferred
// to export time (boundary/python/, under the GIL): recording only hashes and
// compares pointers.
//
// Invariants:
//   * ids are dense, start at 1 and are never reused or removed;
//     an interned stack's frames are immutable and never move (they live in
//     fixed chunks that are never reallocated), so a thread that obtained an
//     id from intern() may read its frames later without the lock.
//   * intern() allocates only for a stack not seen before; looking up a
//     known stack allocates nothing.
//   * A known stack is usually found without the mutex: each thread keeps a
//     small direct-mapped cache (thread_local, keyed by the table's serial
//     number so that two tables never share entries) of the stacks it
//     interned recently; a hit is confirmed by comparing the frames, so the
//     cache never changes the answer, only whether the mutex is taken.
//   * Each table has its own mutex, never held while calling out (the GIL,
//     when held, is always taken before it).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace memalloc {

struct RawFrame {
  const void* code;  // a PyCodeObject*, kept alive by whoever interned it
  int lasti;         // byte offset of the last instruction
  bool operator==(const RawFrame& o) const { return code == o.code && lasti == o.lasti; }
};

class StackTable {
 public:
  static constexpr size_t kMaxDepth = 64;
  static constexpr size_t kChunk = 4096;      // stacks per storage chunk
  static constexpr size_t kMaxChunks = 4096;  // at most 16,777,216 stacks
  StackTable();
  StackTable(const StackTable&) = delete;
  StackTable& operator=(const StackTable&) = delete;

  // The id of frames[0..n) (innermost first; n is capped at kMaxDepth);
  // *is_new tells whether this call added it (the caller then keeps the code
  // objects alive). Returns 0 (no stack) when the table is full.
  uint32_t intern(const RawFrame* frames, size_t n, bool* is_new);
  std::vector<RawFrame> frames(uint32_t id);
  size_t size();

 private:
  const std::vector<RawFrame>& stored(uint32_t id) const { return chunks_[(id - 1) / kChunk][(id - 1) % kChunk]; }
  const uint64_t serial_;  // process-unique, keys the per-thread cache
  std::mutex mu_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> by_hash_;
  // kMaxChunks slots, each null until its chunk is made (under mu_);
  // neither the slots nor the chunks ever move.
  std::unique_ptr<std::unique_ptr<std::vector<RawFrame>[]>[]> chunks_;
  uint32_t count_ = 0;
};

class TagTable {
 public:
  // The id of `name` ("" -> 0), interning it.
  uint32_t intern(const std::string& name);
  // Names by id (index 0 is "").
  std::vector<std::string> names();

 private:
  std::mutex mu_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<std::string> names_{""};
};

}  // namespace memalloc
