// stacks.h — interned call stacks and tag names, referenced from records by
// a 32-bit id (0 = none).
//
// A stack is a sequence of raw frames, innermost first: (code object,
// last instruction offset). Symbolising (file, line, function) is deferred
// to export time (boundary/bindings.cpp, under the GIL): recording only hashes and
// compares pointers.
//
// Invariants:
//   * ids are dense, start at 1 and are never reused or removed;
//     frames(id) is immutable once interned.
//   * intern() allocates only for a stack not seen before; looking up a
//     known stack allocates nothing.
//   * Each table has its own mutex, never held while calling out (the GIL,
//     when held, is always taken before it).
#pragma once

#include <cstdint>
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
  // The id of frames[0..n) (innermost first); *is_new tells whether this
  // call added it (the caller then keeps the code objects alive).
  uint32_t intern(const RawFrame* frames, size_t n, bool* is_new);
  std::vector<RawFrame> frames(uint32_t id);
  size_t size();

 private:
  std::mutex mu_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> by_hash_;
  std::vector<std::vector<RawFrame>> stacks_;  // id - 1 -> frames
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
