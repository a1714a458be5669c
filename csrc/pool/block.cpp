// block.cpp — size rules and best-fit lookup (see block.h for invariants).
#include "pool/block.h"

namespace memalloc {

Block* FreeList::best_fit(Stream stream, size_t size, size_t max_split) const {
  Block key(std::pmr::null_memory_resource());  // a lookup key: never allocates
  key.stream = stream;
  key.size = size;
  key.addr = 0;
  auto it = blocks_.lower_bound(&key);
  if (it == blocks_.end() || (*it)->stream != stream) return nullptr;
  Block* b = *it;
  if (size < max_split && b->size >= max_split) return nullptr;
  if (size >= max_split && b->size >= size + kLargeBuffer) return nullptr;
  return b;
}

size_t round_size(size_t size, size_t divisions) {
  if (size < kMinBlockSize) return kMinBlockSize;
  if (divisions > 1 && size > kMinBlockSize) {
    // Round up to the next of `divisions` equal steps between the powers of
    // two around `size` (native roundup_power2_divisions).
    size_t floor_pow2 = size_t{1} << (63 - __builtin_clzll(size));
    if (floor_pow2 != size) {
      size_t step = floor_pow2 / divisions;
      if (step >= kMinBlockSize) return (size + step - 1) / step * step;
    }
  }
  return (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t segment_size_for(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

bool should_split(const Block& block, size_t size, size_t max_split, bool expandable_segments) {
  size_t remaining = block.size - size;
  // Native's rule: with expandable segments on, every block (a private
  // pool's plain segment too) splits off any remainder of kMinBlockSize or
  // more, whatever max_split_size says; an expandable segment's remainder
  // coalesces with the pages mapped next to it, or is unmapped. Otherwise a
  // large block splits only below max_split_size and past a 1 MiB sliver.
  if (block.pool == PoolKind::kSmall || expandable_segments) return remaining >= kMinBlockSize;
  return size < max_split && remaining > kSmallSize;
}

}  // namespace memalloc
