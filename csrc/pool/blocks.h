// blocks.h — one device's Block objects and the default pool's free lists:
// making and deleting blocks in the device's node memory, the tiling's two
// edits with that memory (split, absorb), merging a free block with its free
// neighbours, and the free list each free block belongs in.
//
// Invariants:
//   * Not thread-safe: used only under the owning device's lock.
//   * Every Block and every container node of the device comes from this
//     part's NodeCache (resource()), which outlives them all: the part is
//     declared before every container that uses it and destroyed last; its
//     destruction releases every Block at once (none is destroyed one by one
//     then). A steady state allocates no host memory (node_cache.h).
//   * A free block sits in exactly the list list_of(b) names: its owner's
//     (the default pool's lists here, or its PrivatePool's) of its kind.
//   * merge_free_neighbours leaves no two free mapped blocks adjacent around
//     `b` and reports the inactive-split change it made; the tiling rules are
//     block.h's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory_resource>
#include <new>
#include <unordered_map>

#include "pool/block.h"
#include "pool/events.h"
#include "pool/node_cache.h"
#include "pool/private_pool.h"

namespace memalloc {

// The live blocks by address: the allocator's table (its nodes from
// Blocks::resource()).
using LiveTable = std::pmr::unordered_map<std::uintptr_t, Block*>;

class Blocks {
 public:
  Blocks() : default_lists_(&mr_) {}
  Blocks(const Blocks&) = delete;
  Blocks& operator=(const Blocks&) = delete;

  // The device's node memory, for its other containers.
  std::pmr::memory_resource* resource() { return &mr_; }

  // A fresh Block (no addr, in no list).
  Block* make() {
    std::pmr::polymorphic_allocator<Block> alloc(&mr_);
    Block* b = alloc.allocate(1);
    return new (b) Block(&mr_);
  }
  void destroy(Block* b) {
    std::pmr::polymorphic_allocator<Block> alloc(&mr_);
    b->~Block();
    alloc.deallocate(b, 1);
  }
  // Splits `b` at `offset` bytes; returns the upper part (same stream, pool,
  // owner, segment, mapping; in no list).
  Block* split(Block* b, size_t offset) { return split_block(b, offset, make()); }
  // Merges the neighbour `n` (b's prev or next, in no list) into `b` and
  // deletes it.
  void absorb(Block* b, Block* n) {
    absorb_block(b, n);
    destroy(n);
  }
  // Merges the free block `b` (in no free list) with its free neighbours,
  // which leave `list` (b grows to cover them); `e` gets their
  // inactive-split change.
  void merge_free_neighbours(Block* b, FreeList& list, Event& e) {
    for (Block* n : {b->prev, b->next}) {
      if (n == nullptr || !n->is_free()) continue;
      list.erase(n);
      e.inactive_split_bytes_delta -= split_bytes(n);
      e.inactive_split_count_delta -= split_count(n);
      absorb(b, n);
    }
  }

  // The free lists of `owner` (nullptr: the default pool).
  FreeLists& lists(PrivatePool* owner) { return owner == nullptr ? default_lists_ : owner->lists; }
  // The free list block `b` belongs in while free.
  FreeList& list_of(const Block* b) { return lists(b->owner).of(b->pool); }

 private:
  NodeCache mr_;  // first: destroyed after the lists below
  FreeLists default_lists_;
};

}  // namespace memalloc
