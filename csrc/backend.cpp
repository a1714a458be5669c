// backend.cpp — what a Backend does by default (backend.h): no
// inter-process handles. The CUDA backend overrides them.
#include "backend.h"
#include "errors.h"

namespace memalloc {

std::string Backend::ipc_handle(int, void*) {
  throw DriverError(std::string("the ") + name() + " backend has no inter-process memory handles (CUDA IPC needs "
                    "the cuda backend)");
}

void* Backend::ipc_open(int device, const std::string&) {
  ipc_handle(device, nullptr);  // throws the same error
  return nullptr;
}

void Backend::ipc_close(int, void*) noexcept {}

}  // namespace memalloc
