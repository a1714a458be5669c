// backend.cpp — what a Backend does by default (backend.h): no
// inter-process handles (of segments or of pages), no virtual memory and no graph capture. The backends that have them
// override these.
#include "backend/backend.h"
#include "common/errors.h"

namespace memalloc {

std::string Backend::ipc_handle(int, void*) {
  throw DriverError(std::string("the ") + name() +
                    " backend has no inter-process memory handles (CUDA IPC needs "
                    "the cuda backend)");
}

void* Backend::ipc_open(int device, const std::string&) {
  ipc_handle(device, nullptr);  // throws the same error
  return nullptr;
}

void Backend::ipc_close(int, void*) noexcept {}

std::vector<int> Backend::vm_share(int device, void*, size_t) {
  ipc_handle(device, nullptr);  // throws: no inter-process handles
  return {};
}
void* Backend::vm_open_shared(int device, const SharedPages&) {
  ipc_handle(device, nullptr);
  return nullptr;
}
void Backend::vm_close_shared(int, void*) noexcept {}

namespace {
[[noreturn]] void no_vm(const Backend& b) {
  throw DriverError(std::string("the ") + b.name() + " backend has no virtual memory (expandable segments)");
}
}  // namespace

size_t Backend::vm_page_size(int) { no_vm(*this); }
void* Backend::vm_reserve(int, size_t, size_t) { no_vm(*this); }
bool Backend::vm_map(int, void*, size_t) { no_vm(*this); }
void Backend::vm_unmap(int, void*, size_t) { no_vm(*this); }
void Backend::vm_detach(int device, void* addr, size_t bytes, Stream stream) {
  synchronize_stream(device, stream);
  vm_unmap(device, addr, bytes);
}
void Backend::vm_drop_spares(int) noexcept {}
void Backend::vm_free(int, void*) { no_vm(*this); }
void Backend::vm_add_peer(int, int) {}

bool Backend::capture_frontier(int, Stream, uint64_t*, std::vector<GraphNode>* frontier) {
  frontier->clear();
  return false;
}
void Backend::graph_dependencies(int, GraphNode, std::vector<GraphNode>*) {}

}  // namespace memalloc
