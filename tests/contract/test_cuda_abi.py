"""csrc/backend/cuda_driver_abi.h declares the CUDA driver's types and constants by
hand (the build needs no toolkit: the driver is dlopen'ed). This compiles
static_asserts of every one against the toolkit's own cuda.h, where one is
installed (found through CUDA_HOME, nvcc, or /usr/local/cuda); skipped
without it."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from memtest_helpers import REPO

from benchmarks.speed import driver_costs as v

CHECK = r"""
#include <cstddef>
#include <cuda.h>
#include "backend/cuda_driver_abi.h"
namespace a = memalloc::cuda_abi;
#define SAME_LAYOUT(T, FIELD) static_assert(offsetof(a::T, FIELD) == offsetof(::T, FIELD), #T "." #FIELD)
static_assert(sizeof(a::CUresult) == sizeof(::CUresult), "CUresult");
static_assert(sizeof(a::CUdevice) == sizeof(::CUdevice), "CUdevice");
static_assert(sizeof(a::CUdeviceptr) == sizeof(::CUdeviceptr), "CUdeviceptr");
static_assert(sizeof(a::CUmemGenericAllocationHandle) == sizeof(::CUmemGenericAllocationHandle), "handle");
static_assert(a::kSuccess == CUDA_SUCCESS, "kSuccess");
static_assert(a::kErrorOutOfMemory == CUDA_ERROR_OUT_OF_MEMORY, "kErrorOutOfMemory");
static_assert(a::kErrorNotReady == CUDA_ERROR_NOT_READY, "kErrorNotReady");
static_assert(a::kEventDisableTiming == CU_EVENT_DISABLE_TIMING, "kEventDisableTiming");
static_assert(a::kCaptureModeRelaxed == CU_STREAM_CAPTURE_MODE_RELAXED, "kCaptureModeRelaxed");
static_assert(a::kCaptureStatusActive == CU_STREAM_CAPTURE_STATUS_ACTIVE, "kCaptureStatusActive");
static_assert(sizeof(a::CUgraph) == sizeof(::CUgraph), "CUgraph");
static_assert(sizeof(a::CUgraphNode) == sizeof(::CUgraphNode), "CUgraphNode");
static_assert(a::kIpcLazyEnablePeerAccess == CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS, "kIpcLazyEnablePeerAccess");
static_assert(a::kIpcHandleBytes == CU_IPC_HANDLE_SIZE, "kIpcHandleBytes");
static_assert(sizeof(a::CUipcMemHandle) == sizeof(::CUipcMemHandle), "CUipcMemHandle");
static_assert(a::kMemLocationTypeDevice == CU_MEM_LOCATION_TYPE_DEVICE, "kMemLocationTypeDevice");
static_assert(a::kMemAllocationTypePinned == CU_MEM_ALLOCATION_TYPE_PINNED, "kMemAllocationTypePinned");
static_assert(a::kMemAccessProtReadWrite == CU_MEM_ACCESS_FLAGS_PROT_READWRITE, "kMemAccessProtReadWrite");
static_assert(a::kMemAllocGranularityRecommended == CU_MEM_ALLOC_GRANULARITY_RECOMMENDED, "granularity");
static_assert(a::kMemHandleTypePosixFd == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, "kMemHandleTypePosixFd");
static_assert(a::kMemHandleTypeFabric == CU_MEM_HANDLE_TYPE_FABRIC, "kMemHandleTypeFabric");
static_assert(sizeof(a::CUmemLocation) == sizeof(::CUmemLocation), "CUmemLocation");
SAME_LAYOUT(CUmemLocation, type);
SAME_LAYOUT(CUmemLocation, id);
static_assert(sizeof(a::CUmemAllocationProp) == sizeof(::CUmemAllocationProp), "CUmemAllocationProp");
SAME_LAYOUT(CUmemAllocationProp, type);
SAME_LAYOUT(CUmemAllocationProp, requestedHandleTypes);
SAME_LAYOUT(CUmemAllocationProp, location);
SAME_LAYOUT(CUmemAllocationProp, win32HandleMetaData);
SAME_LAYOUT(CUmemAllocationProp, allocFlags);
static_assert(sizeof(a::CUmemAccessDesc) == sizeof(::CUmemAccessDesc), "CUmemAccessDesc");
SAME_LAYOUT(CUmemAccessDesc, location);
SAME_LAYOUT(CUmemAccessDesc, flags);
int main() { return 0; }
"""


def cuda_include() -> Path | None:
    """The toolkit's include folder holding cuda.h, or None."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(str(Path(nvcc).resolve().parent.parent))
    homes.append("/usr/local/cuda")
    for home in filter(None, homes):
        if (Path(home) / "include" / "cuda.h").is_file():
            return Path(home) / "include"
    return None


def test_driver_abi_matches_cuda_h(tmp_path):
    include = cuda_include()
    if include is None:
        pytest.skip("no CUDA toolkit (cuda.h) on this machine")
    src = tmp_path / "abi_check.cpp"
    src.write_text(CHECK)
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    assert cxx, "a C++ compiler is needed"
    p = subprocess.run(
        [cxx, "-std=c++17", "-fsyntax-only", f"-I{include}", f"-I{REPO / 'csrc'}", str(src)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr


LAYOUT = r"""
#include <cstddef>
#include <cstdio>
#include <cuda.h>
#define F(T, FIELD) std::printf(#T "." #FIELD " %zu\n", offsetof(T, FIELD))
int main() {
  std::printf("CUmemAllocationProp %zu\nCUmemAccessDesc %zu\n", sizeof(CUmemAllocationProp), sizeof(CUmemAccessDesc));
  F(CUmemAllocationProp, type); F(CUmemAllocationProp, requestedHandleTypes); F(CUmemAllocationProp, location);
  F(CUmemAllocationProp, win32HandleMetaData); F(CUmemAllocationProp, allocFlags);
  F(CUmemAccessDesc, location); F(CUmemAccessDesc, flags);
  std::printf("POSIX_FD %d\nLOCATION_DEVICE %d\nPINNED %d\nPROT_READWRITE %d\n",
              (int)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, (int)CU_MEM_LOCATION_TYPE_DEVICE,
              (int)CU_MEM_ALLOCATION_TYPE_PINNED, (int)CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
  return 0;
}
"""


def test_the_driver_cost_benchmark_passes_the_drivers_structs_as_cuda_h_lays_them_out(tmp_path):
    """benchmarks/speed/driver_costs.py calls the driver through ctypes with
    its own declarations of CUmemAllocationProp and CUmemAccessDesc: their
    sizes, offsets and the constants it passes are cuda.h's."""
    include = cuda_include()
    if include is None:
        pytest.skip("no CUDA toolkit (cuda.h) on this machine")
    src, exe = tmp_path / "layout.cpp", tmp_path / "layout"
    src.write_text(LAYOUT)
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    assert cxx, "a C++ compiler is needed"
    p = subprocess.run(
        [cxx, "-std=c++17", f"-I{include}", str(src), "-o", str(exe)], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    want = dict(
        line.rsplit(" ", 1)
        for line in subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.splitlines()
    )
    got = {
        "CUmemAllocationProp": ctypes.sizeof(v.Prop),
        "CUmemAccessDesc": ctypes.sizeof(v.Access),
        "POSIX_FD": v.POSIX_FD,
        "LOCATION_DEVICE": v.LOCATION_DEVICE,
        "PINNED": v.PINNED,
        "PROT_READWRITE": v.PROT_READWRITE,
    }
    for name in ("type", "requestedHandleTypes", "location", "win32HandleMetaData", "allocFlags"):
        got[f"CUmemAllocationProp.{name}"] = getattr(v.Prop, name).offset
    for name in ("location", "flags"):
        got[f"CUmemAccessDesc.{name}"] = getattr(v.Access, name).offset
    assert {k: int(x) for k, x in want.items()} == got
