// cuda_driver_abi.h — the CUDA driver types and constants backend_cuda.cpp
// uses, declared with the driver's ABI (cuda.h) so that the build needs no
// CUDA toolkit (the driver is loaded with dlopen at run time).
//
// Invariants: every struct has cuda.h's size and field offsets, every
// constant cuda.h's value; tests/contract/test_cuda_abi.py compiles static_asserts of
// each against cuda.h where a toolkit is installed.
#pragma once

#include <cstddef>

namespace memalloc::cuda_abi {

using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUdeviceptr = unsigned long long;
using CUevent = void*;
using CUstream = void*;
using CUgraph = void*;
using CUgraphNode = void*;

constexpr CUresult kSuccess = 0;
constexpr CUresult kErrorOutOfMemory = 2;
constexpr CUresult kErrorNotReady = 600;
constexpr unsigned kEventDisableTiming = 0x2;
constexpr int kCaptureModeRelaxed = 2;              // CU_STREAM_CAPTURE_MODE_RELAXED
constexpr int kCaptureStatusActive = 1;             // CU_STREAM_CAPTURE_STATUS_ACTIVE
constexpr unsigned kIpcLazyEnablePeerAccess = 0x1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
constexpr size_t kIpcHandleBytes = 64;              // CU_IPC_HANDLE_SIZE
struct CUipcMemHandle {
  char reserved[kIpcHandleBytes];
};
// Virtual memory management (cuda.h, "Virtual Memory Management").
using CUmemGenericAllocationHandle = unsigned long long;
constexpr int kMemLocationTypeDevice = 1;           // CU_MEM_LOCATION_TYPE_DEVICE
constexpr int kMemAllocationTypePinned = 1;         // CU_MEM_ALLOCATION_TYPE_PINNED
constexpr int kMemAccessProtReadWrite = 3;          // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
constexpr int kMemAllocGranularityRecommended = 1;  // CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
constexpr int kMemHandleTypePosixFd = 0x1;          // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
constexpr int kMemHandleTypeFabric = 0x8;           // CU_MEM_HANDLE_TYPE_FABRIC
struct CUmemLocation {
  int type;
  int id;
};
struct CUmemAllocationProp {
  int type;
  int requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;
};

}  // namespace memalloc::cuda_abi
