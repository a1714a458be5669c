// torch_contexts.h — memalloc's interned Python stacks as torch's stack
// contexts, so that torch.cuda.memory._snapshot() (and memory_viz) shows
// the frames memalloc recorded, with no Python-level patch.
//
// torch's snapshot accepts only torch::CapturedTraceback contexts, whose
// frames can be filled only through a registered Python unwinder. memalloc
// registers one (torch's documented extension point,
// CapturedTraceback::addPythonUnwinder) that answers only while this file
// builds a context on the calling thread and defers to torch's own
// unwinder otherwise.
//
// Invariants:
//   * The unwinder's gather() allocates no Python object and needs no GIL;
//     its frames are code objects that memalloc's stack table keeps alive
//     for the life of the process (pystacks.cpp), so release() does nothing.
//   * appendSymbolized() takes the GIL itself (torch may call it with or
//     without it).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>

namespace c10 {
struct GatheredContext;
}

namespace memalloc {
// Builds torch contexts for stack ids, one per id per cache.
class StackContexts {
 public:
  // The context of interned stack `stack_id` (nullptr for 0 or an empty stack).
  std::shared_ptr<c10::GatheredContext> of(uint32_t stack_id);

 private:
  std::unordered_map<uint32_t, std::shared_ptr<c10::GatheredContext>> cache_;
};
}  // namespace memalloc
