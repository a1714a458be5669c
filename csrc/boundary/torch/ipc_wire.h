// ipc_wire.h — the bytes of torch's ShareableHandle.handle: what a process
// sends when a CUDA tensor goes through torch.multiprocessing
// (storage._share_cuda_()) and what the receiving allocator's getIpcDevPtr
// gets. Native torch's own forms, read from its 2.11, 2.13 and 2.14 wheels
// (the research note, retired once this file held its result, is in git:
// git log -- 'docs/notes-expandable-ipc*'), so that memalloc and native
// processes can exchange tensors both ways:
//
//   legacy        64 bytes: a cudaIpcMemHandle_t of the segment's base
//   'c'           [version][ 'c' ][64-byte cudaIpcMemHandle_t]
//   'e', v2       [2]['e'][header 24 B: int32 pid, 4 pad, u64 page bytes,
//                 u64 pages][pages x (int32 fd | 64-byte fabric handle)]
//                 (torch 2.11; the payload's length says which)
//   'e', v3       [3]['e'][header 32 B: v2's, then int32 handle type
//                 (1 POSIX fd, 2 fabric), 4 pad][pages x payload]
//                 (torch 2.13, 2.14)
//
// An 'e' handle names the pages a block spans of an expandable segment:
// each page is one physical allocation, exported as a POSIX file descriptor
// of the sending process (the receiver takes its own copy with
// pidfd_getfd) or as a fabric handle. All integers are little-endian, as
// x86-64 and aarch64 torch write them.
//
// Invariants:
//   * decode() accepts exactly the forms above (version 1..3 for 'c', 2..3
//     for 'e') and throws InvalidArgument naming the length, version or type
//     it cannot read; decode(encode_*(...)) gives back what was encoded.
//   * Pure functions of their arguments: no CUDA, no torch, no state, so
//     the host build tests them (tests/unit/test_ipc_wire.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace memalloc::ipc_wire {

constexpr size_t kCudaIpcBytes = 64;  // CU_IPC_HANDLE_SIZE
constexpr size_t kFabricBytes = 64;   // sizeof(CUmemFabricHandle)
constexpr char kCudaMalloc = 'c';     // torch's SHAREABLE_CUDA_MALLOC
constexpr char kExpandable = 'e';     // torch's SHAREABLE_CUDA_EXPANDABLE_SEGMENT

// torch's Expandable_Segments_Handle_Type (c10/cuda/CUDAAllocatorConfig.h).
enum class PageHandle : int { kPosixFd = 1, kFabric = 2 };

struct Decoded {
  int version = 0;  // 0: the legacy bare handle
  char type = kCudaMalloc;
  std::string cuda_ipc;  // 'c': the 64-byte cudaIpcMemHandle_t
  // 'e':
  int pid = 0;            // the sender, in its pid namespace
  size_t page_bytes = 0;  // bytes of each page
  PageHandle handle = PageHandle::kPosixFd;
  std::vector<int> fds;             // kPosixFd: the sender's descriptor numbers
  std::vector<std::string> fabric;  // kFabric: 64 bytes each
};

// The handle version the installed torch writes and its receivers accept:
// 2 up to torch 2.12 (2.11's form; 2.12's was not read), 3 from 2.13 on.
int version_for_torch(int major, int minor);

Decoded decode(const std::string& handle);

// A cudaMalloc segment's handle: the legacy bare form when version == 0.
std::string encode_cuda_malloc(int version, const std::string& cuda_ipc);

// The pages of an expandable segment as POSIX descriptors of process `pid`.
std::string encode_expandable(int version, int pid, size_t page_bytes, const std::vector<int>& fds);

}  // namespace memalloc::ipc_wire
