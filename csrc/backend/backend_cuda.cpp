// backend_cuda.cpp — device memory from the CUDA driver API, loaded at run
// time with dlopen("libcuda.so.1").
//
// Why the driver API through dlopen: the same build then works on machines
// without a CUDA toolkit (CI) and with any CUDA 12/13 torch was built for;
// where there is no driver the backend reports "unavailable".
//
// Invariants:
//   * Every driver call runs with the device's primary context current (the
//     one torch's runtime uses); ScopedContext pushes it only when another
//     context is current and pops it afterwards, so the caller's thread state
//     is unchanged.
//   * allocate() maps CUDA_ERROR_OUT_OF_MEMORY to nullptr; other errors throw
//     DriverError with the driver's own error string.
//   * The library handle and the function table are immutable once loaded.
//   * cuMemAlloc runs in the relaxed stream-capture mode (the thread's mode
//     is exchanged and restored around it): a private pool may grow while
//     a CUDA graph is being captured, as native's cudaMallocMaybeCapturing.
//   * IPC entry points are optional: a driver without them loads, and
//     ipc_handle/ipc_open then throw DriverError.
//   * Virtual memory entry points (cuMemAddressReserve, cuMemCreate,
//     cuMemMap, ...) are optional the same way. A mapped page is one
//     cuMemCreate handle of its reservation's page size (a multiple of
//     vm_page_size(), the device's recommended granularity), mapped
//     read-write for its device and the peers vm_add_peer named (torch's
//     enablePeerAccess; peers_, guarded by vm_mu_, only grow); vm_unmap
//     unmaps and releases the handles; vm_detach keeps them as spare
//     handles (spares_, per device and page size) that vm_map maps before it
//     creates any, and leaves the range's driver unmap pending (pending_)
//     until an event recorded on the range's stream has completed: a
//     range's pending unmap is done before vm_map maps it again or vm_free
//     ends its reservation, and any that are done at other calls; a
//     handle vm_drop_spares releases frees its memory at its pending unmap.
//     A failed cuMemCreate waits for every pending unmap, then tries once more;
//     the reservations (vm_reservations.h: their page size and their
//     pages' handles, 0 = unmapped) are guarded by vm_mu_. The driver structs used
//     (CUmemAllocationProp, CUmemAccessDesc) are declared in
//     cuda_driver_abi.h with the driver's layout; tests/contract/test_cuda_abi.py
//     compiles a check of each against cuda.h; tests/gpu/test_cuda_expandable.py
//     runs them on a GPU. vm_map, like allocate, runs in the relaxed
//     stream-capture mode.
//   * Pages are created exportable as POSIX descriptors (CUDA IPC of
//     expandable segments), as native torch creates its pages, unless
//     TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=0 (torch's switch) or the driver
//     refuses the handle type (then pages are plain from then on and
//     vm_share says why). vm_share exports a page once and keeps the
//     descriptor (exported_) until the page is released (vm_unmap,
//     vm_drop_spares).
//     vm_open_shared takes its own copy of the sender's descriptors
//     (pidfd_getfd), imports and maps them in a reservation of its own
//     (imported_), and closes its copies; vm_close_shared waits for the
//     context's work, unmaps, releases and frees the range.
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <unordered_map>

#include <algorithm>
#include <mutex>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda_driver_abi.h"
#include "common/errors.h"
#include "backend/vm_reservations.h"

namespace memalloc {
namespace {

using namespace cuda_abi;  // the driver's types and constants (cuda_driver_abi.h)

struct DriverApi {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemGetInfo)(size_t*, size_t*);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuThreadExchangeStreamCaptureMode)(int*);
  // Optional (nullptr when the driver lacks them).
  CUresult (*cuIpcGetMemHandle)(CUipcMemHandle*, CUdeviceptr);
  CUresult (*cuIpcOpenMemHandle)(CUdeviceptr*, CUipcMemHandle, unsigned);
  CUresult (*cuIpcCloseMemHandle)(CUdeviceptr);
  CUresult (*cuMemGetAllocationGranularity)(size_t*, const CUmemAllocationProp*, int);
  CUresult (*cuMemAddressReserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*cuMemAddressFree)(CUdeviceptr, size_t);
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle);
  CUresult (*cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*cuMemUnmap)(CUdeviceptr, size_t);
  CUresult (*cuMemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  // Sharing pages between processes (optional apart from the rest).
  CUresult (*cuMemExportToShareableHandle)(void*, CUmemGenericAllocationHandle, int, unsigned long long);
  CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle*, void*, int);
  CUresult (*cuCtxSynchronize)();
  // Graph topology (capture_reuse.h): the edge-data entry points of CUDA
  // 12.3+ where the driver has them (edge data not asked for), else the
  // older ones; nullptr when neither exists.
  CUresult (*cuStreamGetCaptureInfo_v3)(CUstream, int*, unsigned long long*, CUgraph*, const CUgraphNode**,
                                        const void**, size_t*);
  CUresult (*cuStreamGetCaptureInfo_v2)(CUstream, int*, unsigned long long*, CUgraph*, const CUgraphNode**, size_t*);
  CUresult (*cuGraphNodeGetDependencies_v2)(CUgraphNode, CUgraphNode*, void*, size_t*);
  CUresult (*cuGraphNodeGetDependencies)(CUgraphNode, CUgraphNode*, size_t*);
};

template <typename F>
bool load(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

// Loads the driver once per process; returns nullptr and sets *why on failure.
const DriverApi* driver(std::string* why) {
  static std::once_flag once;
  static DriverApi api;
  static std::string error;
  std::call_once(once, [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      error = std::string("no CUDA driver: dlopen(libcuda.so.1) failed (") + (why ? why : "no reason given") +
              "). This machine has no NVIDIA driver on the loader path (a CUDA build of torch then runs on the CPU "
              "only): install the NVIDIA driver, or put the folder holding libcuda.so.1 on LD_LIBRARY_PATH, to use "
              "a GPU; memalloc.enable() meanwhile uses the host backend (backend='host')";
      return;
    }
    bool ok = load(lib, "cuInit", api.cuInit) && load(lib, "cuDeviceGetCount", api.cuDeviceGetCount) &&
              load(lib, "cuDeviceGet", api.cuDeviceGet) &&
              load(lib, "cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain) &&
              load(lib, "cuCtxGetCurrent", api.cuCtxGetCurrent) &&
              load(lib, "cuCtxPushCurrent_v2", api.cuCtxPushCurrent) &&
              load(lib, "cuCtxPopCurrent_v2", api.cuCtxPopCurrent) && load(lib, "cuMemAlloc_v2", api.cuMemAlloc) &&
              load(lib, "cuMemFree_v2", api.cuMemFree) && load(lib, "cuMemGetInfo_v2", api.cuMemGetInfo) &&
              load(lib, "cuEventCreate", api.cuEventCreate) && load(lib, "cuEventDestroy_v2", api.cuEventDestroy) &&
              load(lib, "cuEventRecord", api.cuEventRecord) && load(lib, "cuEventQuery", api.cuEventQuery) &&
              load(lib, "cuEventSynchronize", api.cuEventSynchronize) &&
              load(lib, "cuStreamSynchronize", api.cuStreamSynchronize) &&
              load(lib, "cuGetErrorString", api.cuGetErrorString) &&
              load(lib, "cuThreadExchangeStreamCaptureMode", api.cuThreadExchangeStreamCaptureMode);
    if (ok && !(load(lib, "cuIpcGetMemHandle", api.cuIpcGetMemHandle) &&
                (load(lib, "cuIpcOpenMemHandle_v2", api.cuIpcOpenMemHandle) ||
                 load(lib, "cuIpcOpenMemHandle", api.cuIpcOpenMemHandle)) &&
                load(lib, "cuIpcCloseMemHandle", api.cuIpcCloseMemHandle))) {
      api.cuIpcGetMemHandle = nullptr;  // IPC unavailable; the rest works
    }
    if (ok && !(load(lib, "cuMemGetAllocationGranularity", api.cuMemGetAllocationGranularity) &&
                load(lib, "cuMemAddressReserve", api.cuMemAddressReserve) &&
                load(lib, "cuMemAddressFree", api.cuMemAddressFree) && load(lib, "cuMemCreate", api.cuMemCreate) &&
                load(lib, "cuMemRelease", api.cuMemRelease) && load(lib, "cuMemMap", api.cuMemMap) &&
                load(lib, "cuMemUnmap", api.cuMemUnmap) && load(lib, "cuMemSetAccess", api.cuMemSetAccess))) {
      api.cuMemCreate = nullptr;  // virtual memory unavailable; the rest works
    }
    if (ok && !(load(lib, "cuMemExportToShareableHandle", api.cuMemExportToShareableHandle) &&
                load(lib, "cuMemImportFromShareableHandle", api.cuMemImportFromShareableHandle) &&
                load(lib, "cuCtxSynchronize", api.cuCtxSynchronize))) {
      api.cuMemExportToShareableHandle = nullptr;  // pages cannot be shared; the rest works
    }
    if (!load(lib, "cuStreamGetCaptureInfo_v3", api.cuStreamGetCaptureInfo_v3))
      load(lib, "cuStreamGetCaptureInfo_v2", api.cuStreamGetCaptureInfo_v2);
    if (!load(lib, "cuGraphNodeGetDependencies_v2", api.cuGraphNodeGetDependencies_v2))
      load(lib, "cuGraphNodeGetDependencies", api.cuGraphNodeGetDependencies);
    if (!ok) {
      error = "the CUDA driver lacks a required entry point (driver too old?)";
      return;
    }
    CUresult r = api.cuInit(0);
    if (r != kSuccess) error = "cuInit failed with CUDA error " + std::to_string(r);
  });
  if (!error.empty()) {
    if (why) *why = error;
    return nullptr;
  }
  return &api;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const DriverApi* api) : api_(api) {
    int n = 0;
    check(api_->cuDeviceGetCount(&n), "cuDeviceGetCount");
    contexts_.assign(n, nullptr);
    const char* ipc = std::getenv("TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC");
    if (api_->cuMemExportToShareableHandle == nullptr) {
      not_shared_ = "this CUDA driver has no cuMemExportToShareableHandle";
    } else if (ipc != nullptr &&
               (std::strcmp(ipc, "0") == 0 || std::strcmp(ipc, "False") == 0 || std::strcmp(ipc, "false") == 0)) {
      not_shared_ = "TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=" + std::string(ipc) +
                    " turned exportable pages off; unset it (or set it to 1) before the process starts";
    }
  }
  const char* name() const override { return "cuda"; }
  int device_count() const override { return static_cast<int>(contexts_.size()); }

  void* allocate(int device, size_t size) override {
    ScopedContext ctx(this, device);
    CUdeviceptr p = 0;
    CUresult r;
    {
      CaptureModeRelaxed relaxed(this);
      r = api_->cuMemAlloc(&p, size);
    }
    if (r == kErrorOutOfMemory) return nullptr;
    check(r, "cuMemAlloc");
    return reinterpret_cast<void*>(p);
  }

  bool release(int device, void* ptr, size_t) noexcept override {
    try {
      ScopedContext ctx(this, device);
      return api_->cuMemFree(reinterpret_cast<CUdeviceptr>(ptr)) == kSuccess;
    } catch (...) {
      return false;
    }
  }

  MemInfo mem_get_info(int device) override {
    ScopedContext ctx(this, device);
    MemInfo info;
    check(api_->cuMemGetInfo(&info.free, &info.total), "cuMemGetInfo");
    return info;
  }

  EventHandle create_event(int device) override {
    ScopedContext ctx(this, device);
    CUevent e = nullptr;
    check(api_->cuEventCreate(&e, kEventDisableTiming), "cuEventCreate");
    return e;
  }
  void destroy_event(int, EventHandle event) noexcept override { api_->cuEventDestroy(static_cast<CUevent>(event)); }
  void record_event(int device, EventHandle event, Stream stream) override {
    ScopedContext ctx(this, device);
    check(api_->cuEventRecord(static_cast<CUevent>(event), reinterpret_cast<CUstream>(stream)), "cuEventRecord");
  }
  bool query_event(int, EventHandle event) override {
    CUresult r = api_->cuEventQuery(static_cast<CUevent>(event));
    if (r == kErrorNotReady) return false;
    check(r, "cuEventQuery");
    return true;
  }
  void synchronize_event(int, EventHandle event) override {
    check(api_->cuEventSynchronize(static_cast<CUevent>(event)), "cuEventSynchronize");
  }
  void synchronize_stream(int device, Stream stream) override {
    ScopedContext ctx(this, device);
    check(api_->cuStreamSynchronize(reinterpret_cast<CUstream>(stream)), "cuStreamSynchronize");
  }

  std::string ipc_handle(int device, void* base) override {
    require_ipc();
    ScopedContext ctx(this, device);
    CUipcMemHandle h{};
    check(api_->cuIpcGetMemHandle(&h, reinterpret_cast<CUdeviceptr>(base)), "cuIpcGetMemHandle");
    return std::string(h.reserved, kIpcHandleBytes);
  }

  void* ipc_open(int device, const std::string& handle) override {
    require_ipc();
    MEMALLOC_EXPECTS(handle.size() == kIpcHandleBytes, "a CUDA IPC handle has " + std::to_string(kIpcHandleBytes) +
                                                           " bytes, not " + std::to_string(handle.size()));
    ScopedContext ctx(this, device);
    CUipcMemHandle h{};
    std::copy(handle.begin(), handle.end(), h.reserved);
    CUdeviceptr p = 0;
    check(api_->cuIpcOpenMemHandle(&p, h, kIpcLazyEnablePeerAccess), "cuIpcOpenMemHandle");
    return reinterpret_cast<void*>(p);
  }

  // ---- graph capture topology -----------------------------------------------
  bool capture_frontier(int, Stream stream, uint64_t* capture_id, std::vector<GraphNode>* frontier) override {
    frontier->clear();
    int status = 0;
    unsigned long long id = 0;
    CUgraph graph = nullptr;
    const CUgraphNode* nodes = nullptr;
    size_t n = 0;
    const auto s = reinterpret_cast<CUstream>(stream);
    if (api_->cuStreamGetCaptureInfo_v3 != nullptr) {
      check(api_->cuStreamGetCaptureInfo_v3(s, &status, &id, &graph, &nodes, nullptr, &n), "cuStreamGetCaptureInfo");
    } else if (api_->cuStreamGetCaptureInfo_v2 != nullptr) {
      check(api_->cuStreamGetCaptureInfo_v2(s, &status, &id, &graph, &nodes, &n), "cuStreamGetCaptureInfo");
    } else {
      return false;  // a driver without the query: blocks wait for the capture's end
    }
    if (status != kCaptureStatusActive) return false;
    *capture_id = id;
    frontier->assign(nodes, nodes + n);
    return true;
  }

  void graph_dependencies(int, GraphNode node, std::vector<GraphNode>* out) override {
    auto n = static_cast<CUgraphNode>(const_cast<void*>(node));
    auto get = [&](CUgraphNode* deps, size_t* count) {
      if (api_->cuGraphNodeGetDependencies_v2 != nullptr)
        return api_->cuGraphNodeGetDependencies_v2(n, deps, nullptr, count);
      return api_->cuGraphNodeGetDependencies(n, deps, count);
    };
    if (api_->cuGraphNodeGetDependencies_v2 == nullptr && api_->cuGraphNodeGetDependencies == nullptr) return;
    size_t count = 0;
    check(get(nullptr, &count), "cuGraphNodeGetDependencies");
    if (count == 0) return;
    const size_t at = out->size();
    out->resize(at + count);
    check(get(static_cast<CUgraphNode*>(static_cast<void*>(out->data() + at)), &count), "cuGraphNodeGetDependencies");
    out->resize(at + count);
  }

  // ---- virtual memory -------------------------------------------------------
  size_t vm_page_size(int device) override {
    require_vm();
    ScopedContext ctx(this, device);
    std::lock_guard<std::mutex> g(vm_mu_);
    if (vm_pages_.size() <= static_cast<size_t>(device)) vm_pages_.resize(device + 1, 0);
    if (vm_pages_[device] == 0) {
      const CUmemAllocationProp prop = page_prop(device);
      check(api_->cuMemGetAllocationGranularity(&vm_pages_[device], &prop, kMemAllocGranularityRecommended),
            "cuMemGetAllocationGranularity");
    }
    return vm_pages_[device];
  }

  void* vm_reserve(int device, size_t bytes, size_t page) override {
    const size_t granularity = vm_page_size(device);
    VmReservations<CUmemGenericAllocationHandle>::check_reserve(bytes, page, granularity);
    ScopedContext ctx(this, device);
    CUdeviceptr p = 0;
    CUresult r = api_->cuMemAddressReserve(&p, bytes, granularity, 0, 0);
    if (r == kErrorOutOfMemory) return nullptr;
    check(r, "cuMemAddressReserve");
    std::lock_guard<std::mutex> g(vm_mu_);
    vm_.add(device, p, bytes, page);
    return reinterpret_cast<void*>(p);
  }

  bool vm_map(int device, void* addr, size_t bytes) override {
    require_vm();
    ScopedContext ctx(this, device);
    std::lock_guard<std::mutex> g(vm_mu_);
    const auto pages = vm_.run(device, addr, bytes);
    const size_t page = pages.page;
    pages.expect(false, "vm_map: a page of the range is already mapped");
    CUmemAllocationProp prop = page_prop(device);
    const auto base = reinterpret_cast<CUdeviceptr>(addr);
    CaptureModeRelaxed relaxed(this);           // a pool may grow during a capture
    settle_locked(device, base, base + bytes);  // a move's source range: unmapped in the driver first
    std::vector<CUmemGenericAllocationHandle>& spare = spares_locked(device, page);
    const size_t reused = std::min(spare.size(), pages.n);  // pages [0, reused) are spare handles
    size_t done = 0;                                        // pages mapped so far; undone on failure
    // Page k's handle h, not (or no longer) mapped: a spare stays spare, a created one is released.
    auto let_go = [&](size_t k, CUmemGenericAllocationHandle h) {
      if (k < reused)
        spare.push_back(h);
      else
        api_->cuMemRelease(h);
    };
    auto undo = [&] {
      for (size_t k = 0; k < done; ++k) {
        api_->cuMemUnmap(base + k * page, page);
        let_go(k, pages[k]);
        pages[k] = 0;
      }
    };
    for (; done < pages.n; ++done) {
      CUmemGenericAllocationHandle h = 0;
      CUresult res = kSuccess;
      if (done < reused) {
        h = spare.back();
        spare.pop_back();
      } else {
        res = create_page(&h, page, prop);
        if (res == kErrorOutOfMemory && !pending_.empty()) {
          settle_locked(device, 0, std::numeric_limits<CUdeviceptr>::max());  // dropped spares free their memory
          res = create_page(&h, page, prop);
        }
      }
      if (res == kErrorOutOfMemory) {
        undo();
        return false;
      }
      if (res == kSuccess) {
        res = api_->cuMemMap(base + done * page, page, 0, h, 0);
        if (res != kSuccess) let_go(done, h);
      }
      if (res != kSuccess) {
        undo();
        check(res, "cuMemCreate/cuMemMap");
      }
      pages[done] = h;
    }
    const std::vector<CUmemAccessDesc> access = access_locked(device);
    CUresult res = api_->cuMemSetAccess(base, bytes, access.data(), access.size());
    if (res != kSuccess) {
      undo();
      check(res, "cuMemSetAccess");
    }
    return true;
  }

  // torch's enablePeerAccess(peer, device): the pages mapped so far, and
  // (access_locked) every later vm_map, become read-write for `peer` too.
  void vm_add_peer(int device, int peer) override {
    if (peer == device || api_->cuMemSetAccess == nullptr) return;
    ScopedContext ctx(this, device);
    std::lock_guard<std::mutex> g(vm_mu_);
    if (static_cast<size_t>(device) >= peers_.size()) peers_.resize(static_cast<size_t>(device) + 1);
    std::vector<int>& peers = peers_[static_cast<size_t>(device)];
    if (std::find(peers.begin(), peers.end(), peer) != peers.end()) return;
    const CUmemAccessDesc access{{kMemLocationTypeDevice, peer}, kMemAccessProtReadWrite};
    vm_.for_each_mapped(device, [&](std::uintptr_t addr, size_t bytes) {
      check(api_->cuMemSetAccess(static_cast<CUdeviceptr>(addr), bytes, &access, 1), "cuMemSetAccess (peer)");
    });
    peers.push_back(peer);
  }

  void vm_unmap(int device, void* addr, size_t bytes) override {
    require_vm();
    ScopedContext ctx(this, device);
    std::lock_guard<std::mutex> g(vm_mu_);
    const auto pages = vm_.run(device, addr, bytes);
    pages.expect(true, "vm_unmap: a page of the range is not mapped");
    check(api_->cuMemUnmap(reinterpret_cast<CUdeviceptr>(addr), bytes), "cuMemUnmap");
    for (size_t k = 0; k < pages.n; ++k) {
      forget_export(pages[k]);
      api_->cuMemRelease(pages[k]);
      pages[k] = 0;
    }
    settle_locked(device, 0, 0);  // the pending unmaps that are done
  }

  void vm_detach(int device, void* addr, size_t bytes, Stream stream) override {
    require_vm();
    ScopedContext ctx(this, device);
    std::lock_guard<std::mutex> g(vm_mu_);
    const auto pages = vm_.run(device, addr, bytes);
    pages.expect(true, "vm_detach: a page of the range is not mapped");
    CUevent done = nullptr;
    check(api_->cuEventCreate(&done, kEventDisableTiming), "cuEventCreate");
    const CUresult r = api_->cuEventRecord(done, reinterpret_cast<CUstream>(stream));
    if (r != kSuccess) {
      api_->cuEventDestroy(done);
      check(r, "cuEventRecord");
    }
    pending_.push_back(PendingUnmap{device, reinterpret_cast<CUdeviceptr>(addr), bytes, done});
    std::vector<CUmemGenericAllocationHandle>& spare = spares_locked(device, pages.page);
    for (size_t k = pages.n; k-- > 0;) {  // the lowest page on top: mapped again in address order
      spare.push_back(pages[k]);
      pages[k] = 0;
    }
  }

  void vm_drop_spares(int device) noexcept override {
    try {
      ScopedContext ctx(this, device);
      std::lock_guard<std::mutex> g(vm_mu_);
      if (static_cast<size_t>(device) >= spares_.size()) return;  // none were kept
      for (auto& [page, handles] : spares_[static_cast<size_t>(device)]) {
        for (CUmemGenericAllocationHandle h : handles) {
          forget_export(h);
          api_->cuMemRelease(h);  // its memory is freed once its pending unmap is done
        }
        handles.clear();
      }
    } catch (...) {}  // no context: the handles stay spare (memory in use) until the next drop
  }

  // ---- sharing pages between processes (CUDA IPC of expandable segments) ----
  std::vector<int> vm_share(int device, void* addr, size_t bytes) override {
    require_vm();
    ScopedContext ctx(this, device);
    std::lock_guard<std::mutex> g(vm_mu_);
    if (!not_shared_.empty())
      throw DriverError(
          "cannot share this CUDA tensor with another process: it lives in an expandable segment "
          "whose pages were not created exportable (" +
          not_shared_ + "). Or share from a process with MEMALLOC_CONF=expandable_segments:False");
    const auto pages = vm_.run(device, addr, bytes);
    pages.expect(true, "vm_share: a page of the range is not mapped");
    std::vector<int> fds(pages.n, -1);
    for (size_t k = 0; k < pages.n; ++k) {
      auto it = exported_.find(pages[k]);
      if (it == exported_.end()) {
        int fd = -1;
        check(api_->cuMemExportToShareableHandle(&fd, pages[k], kMemHandleTypePosixFd, 0),
              "cuMemExportToShareableHandle");
        it = exported_.emplace(pages[k], fd).first;
      }
      fds[k] = it->second;
    }
    return fds;
  }

  void* vm_open_shared(int device, const SharedPages& shared) override {
    require_vm();
    if (api_->cuMemImportFromShareableHandle == nullptr)
      throw DriverError(
          "this CUDA driver has no cuMemImportFromShareableHandle: CUDA tensors of expandable "
          "segments cannot be received here");
    const size_t n = shared.fds.empty() ? shared.fabric.size() : shared.fds.size();
    const size_t page = shared.page_bytes;
    MEMALLOC_EXPECTS(n > 0 && page > 0, "vm_open_shared: no pages");
    ScopedContext ctx(this, device);
    std::vector<CUmemGenericAllocationHandle> handles;
    handles.reserve(n);
    auto release_all = [&] {
      for (CUmemGenericAllocationHandle h : handles) api_->cuMemRelease(h);
    };
    if (!shared.fds.empty()) {
      const int pidfd = static_cast<int>(syscall(kSysPidfdOpen, shared.pid, 0));
      if (pidfd < 0) throw DriverError(pidfd_error("pidfd_open", errno, shared.pid));
      for (int fd : shared.fds) {
        const int mine = static_cast<int>(syscall(kSysPidfdGetfd, pidfd, fd, 0));
        if (mine < 0) {
          const int e = errno;
          close(pidfd);
          release_all();
          throw DriverError(pidfd_error("pidfd_getfd", e, shared.pid));
        }
        CUmemGenericAllocationHandle h = 0;
        const CUresult r = api_->cuMemImportFromShareableHandle(
            &h, reinterpret_cast<void*>(static_cast<std::uintptr_t>(mine)), kMemHandleTypePosixFd);
        close(mine);  // the imported handle keeps the page
        if (r != kSuccess) {
          close(pidfd);
          release_all();
          check(r, "cuMemImportFromShareableHandle");
        }
        handles.push_back(h);
      }
      close(pidfd);
    } else {
      for (const std::string& fabric : shared.fabric) {
        CUmemGenericAllocationHandle h = 0;
        const CUresult r =
            api_->cuMemImportFromShareableHandle(&h, const_cast<char*>(fabric.data()), kMemHandleTypeFabric);
        if (r != kSuccess) {
          release_all();
          check(r, "cuMemImportFromShareableHandle (fabric handle)");
        }
        handles.push_back(h);
      }
    }
    const size_t bytes = n * page;
    CUdeviceptr base = 0;
    CUresult r = api_->cuMemAddressReserve(&base, bytes, 0, 0, 0);
    if (r != kSuccess) {
      release_all();
      check(r, "cuMemAddressReserve");
    }
    size_t mapped = 0;
    auto undo = [&] {
      for (size_t k = 0; k < mapped; ++k) api_->cuMemUnmap(base + k * page, page);
      api_->cuMemAddressFree(base, bytes);
      release_all();
    };
    for (; mapped < n; ++mapped) {
      r = api_->cuMemMap(base + mapped * page, page, 0, handles[mapped], 0);
      if (r != kSuccess) {
        undo();
        check(r, "cuMemMap");
      }
    }
    CUmemAccessDesc access{{kMemLocationTypeDevice, device}, kMemAccessProtReadWrite};
    r = api_->cuMemSetAccess(base, bytes, &access, 1);
    if (r != kSuccess) {
      undo();
      check(r, "cuMemSetAccess");
    }
    std::lock_guard<std::mutex> g(vm_mu_);
    imported_[{device, base}] = Imported{bytes, std::move(handles)};
    return reinterpret_cast<void*>(base);
  }

  void vm_close_shared(int device, void* ptr) noexcept override {
    try {
      Imported im;
      {
        std::lock_guard<std::mutex> g(vm_mu_);
        auto it = imported_.find({device, reinterpret_cast<CUdeviceptr>(ptr)});
        if (it == imported_.end()) return;
        im = std::move(it->second);
        imported_.erase(it);
      }
      ScopedContext ctx(this, device);
      api_->cuCtxSynchronize();  // work queued on the pages may still run
      const auto base = reinterpret_cast<CUdeviceptr>(ptr);
      api_->cuMemUnmap(base, im.bytes);
      for (CUmemGenericAllocationHandle h : im.handles) api_->cuMemRelease(h);
      api_->cuMemAddressFree(base, im.bytes);
    } catch (...) {}
  }

  void vm_free(int device, void* base) override {
    require_vm();
    ScopedContext ctx(this, device);
    std::lock_guard<std::mutex> g(vm_mu_);
    const size_t bytes = vm_.removable(device, base);
    const auto b = reinterpret_cast<CUdeviceptr>(base);
    settle_locked(device, b, b + bytes);
    check(api_->cuMemAddressFree(b, bytes), "cuMemAddressFree");
    vm_.erase(device, base);
  }

  void ipc_close(int device, void* ptr) noexcept override {
    if (api_->cuIpcCloseMemHandle == nullptr) return;
    try {
      ScopedContext ctx(this, device);
      api_->cuIpcCloseMemHandle(reinterpret_cast<CUdeviceptr>(ptr));
    } catch (...) {}
  }

 private:
  // Makes the device's primary context current for one scope.
  class ScopedContext {
   public:
    ScopedContext(CudaBackend* b, int device) : api_(b->api_) {
      CUcontext want = b->primary_context(device);
      CUcontext cur = nullptr;
      b->check(api_->cuCtxGetCurrent(&cur), "cuCtxGetCurrent");
      if (cur != want) {
        b->check(api_->cuCtxPushCurrent(want), "cuCtxPushCurrent");
        pushed_ = true;
      }
    }
    ~ScopedContext() {
      CUcontext ignored = nullptr;
      if (pushed_) api_->cuCtxPopCurrent(&ignored);
    }
    ScopedContext(const ScopedContext&) = delete;
    ScopedContext& operator=(const ScopedContext&) = delete;

   private:
    const DriverApi* api_;
    bool pushed_ = false;
  };

  // The calling thread's stream-capture mode is relaxed for one scope.
  class CaptureModeRelaxed {
   public:
    explicit CaptureModeRelaxed(CudaBackend* b) : api_(b->api_) {
      b->check(api_->cuThreadExchangeStreamCaptureMode(&mode_), "cuThreadExchangeStreamCaptureMode");
    }
    ~CaptureModeRelaxed() { api_->cuThreadExchangeStreamCaptureMode(&mode_); }  // the caller's mode again
    CaptureModeRelaxed(const CaptureModeRelaxed&) = delete;
    CaptureModeRelaxed& operator=(const CaptureModeRelaxed&) = delete;

   private:
    const DriverApi* api_;
    int mode_ = kCaptureModeRelaxed;
  };

  CUcontext primary_context(int device) {
    MEMALLOC_EXPECTS(
        device >= 0 && device < device_count(),
        "CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(device_count()) + " visible)");
    std::lock_guard<std::mutex> g(ctx_mu_);
    if (contexts_[device] == nullptr) {
      CUdevice dev = 0;
      check(api_->cuDeviceGet(&dev, device), "cuDeviceGet");
      check(api_->cuDevicePrimaryCtxRetain(&contexts_[device], dev), "cuDevicePrimaryCtxRetain");
    }
    return contexts_[device];
  }

  // cuMemCreate of one page, exportable while pages may be shared; a
  // refusal of the handle type (not of the memory) makes pages plain from
  // then on, as native falls back. Called under vm_mu_.
  CUresult create_page(CUmemGenericAllocationHandle* h, size_t page, CUmemAllocationProp prop) {
    if (not_shared_.empty()) {
      prop.requestedHandleTypes = kMemHandleTypePosixFd;
      const CUresult r = api_->cuMemCreate(h, page, &prop, 0);
      if (r == kSuccess || r == kErrorOutOfMemory) return r;
      const char* msg = nullptr;
      api_->cuGetErrorString(r, &msg);
      not_shared_ =
          "the driver refused exportable pages: CUDA error " + std::to_string(r) + " (" + (msg ? msg : "unknown") + ")";
      prop.requestedHandleTypes = 0;
    }
    return api_->cuMemCreate(h, page, &prop, 0);
  }

  // The spare handles of `device` for pages of `page` bytes. Under vm_mu_.
  std::vector<CUmemGenericAllocationHandle>& spares_locked(int device, size_t page) {
    if (static_cast<size_t>(device) >= spares_.size()) spares_.resize(static_cast<size_t>(device) + 1);
    return spares_[static_cast<size_t>(device)][page];
  }

  // Does the pending unmaps of `device` whose stream's work is done, after
  // waiting for those that overlap [lo, hi). Under vm_mu_, the device's
  // context current.
  void settle_locked(int device, CUdeviceptr lo, CUdeviceptr hi) {
    for (size_t i = 0; i < pending_.size();) {
      const PendingUnmap& u = pending_[i];
      if (u.device != device) {
        ++i;
        continue;
      }
      const bool overlaps = u.addr < hi && lo < u.addr + u.bytes;
      const CUresult r = overlaps ? api_->cuEventSynchronize(u.done) : api_->cuEventQuery(u.done);
      if (r == kErrorNotReady) {
        ++i;
        continue;
      }
      check(r, overlaps ? "cuEventSynchronize" : "cuEventQuery");
      check(api_->cuMemUnmap(u.addr, u.bytes), "cuMemUnmap");
      api_->cuEventDestroy(u.done);
      pending_[i] = pending_.back();
      pending_.pop_back();
    }
  }

  // Closes the descriptor vm_share exported for page h, if any. Under vm_mu_.
  void forget_export(CUmemGenericAllocationHandle h) {
    auto it = exported_.find(h);
    if (it == exported_.end()) return;
    close(it->second);
    exported_.erase(it);
  }

  // The message for a failed pidfd_open / pidfd_getfd of the sender `pid`.
  static std::string pidfd_error(const char* call, int err, int pid) {
    std::string m = std::string("cannot map the CUDA tensor another process (pid ") + std::to_string(pid) +
                    ") shared from an expandable segment: " + call + " failed: " + std::strerror(err) + ". ";
    if (err == ENOSYS)
      return m +
             "This kernel lacks pidfd_getfd (Linux 5.6 or newer is needed), as native torch needs it too. "
             "Send from a process with MEMALLOC_CONF=expandable_segments:False "
             "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False natively)";
    if (err == EPERM)
      return m +
             "Taking the sender's page descriptors needs ptrace access to it (as native torch's "
             "receiver): the same user with kernel.yama.ptrace_scope 0, or CAP_SYS_PTRACE. Allow it, or "
             "send from a process with MEMALLOC_CONF=expandable_segments:False";
    if (err == ESRCH)
      return m +
             "The sender is gone, or runs in another pid namespace (a container): keep it alive until the "
             "tensor is received, or share within one namespace";
    return m + "Send from a process with MEMALLOC_CONF=expandable_segments:False";
  }

  // Who may use `device`'s mapped pages: the device, then its peers
  // (vm_add_peer). Under vm_mu_.
  std::vector<CUmemAccessDesc> access_locked(int device) const {
    std::vector<CUmemAccessDesc> out{{{kMemLocationTypeDevice, device}, kMemAccessProtReadWrite}};
    if (static_cast<size_t>(device) < peers_.size())
      for (int p : peers_[static_cast<size_t>(device)])
        out.push_back({{kMemLocationTypeDevice, p}, kMemAccessProtReadWrite});
    return out;
  }

  static CUmemAllocationProp page_prop(int device) {
    CUmemAllocationProp prop{};
    prop.type = kMemAllocationTypePinned;
    prop.location = CUmemLocation{kMemLocationTypeDevice, device};
    return prop;
  }

  void require_vm() const {
    if (api_->cuMemCreate == nullptr)
      throw DriverError(
          "this CUDA driver has no virtual memory entry points (cuMemCreate...): expandable "
          "segments need a newer driver");
  }

  void require_ipc() const {
    if (api_->cuIpcGetMemHandle == nullptr)
      throw DriverError(
          "this CUDA driver has no IPC entry points (cuIpcGetMemHandle...): CUDA tensors cannot be "
          "shared between processes here");
  }

  void check(CUresult r, const char* what) const {
    if (r == kSuccess) return;
    const char* msg = nullptr;
    api_->cuGetErrorString(r, &msg);
    throw DriverError(std::string(what) + " failed: CUDA error " + std::to_string(r) + " (" + (msg ? msg : "unknown") +
                      ")");
  }

  const DriverApi* api_;
  std::mutex ctx_mu_;  // guards contexts_ (filled lazily, one entry per device)
  std::vector<CUcontext> contexts_;
  std::mutex vm_mu_;                                 // guards vm_ and vm_pages_
  VmReservations<CUmemGenericAllocationHandle> vm_;  // a page's handle while mapped
  std::vector<size_t> vm_pages_;                     // page size per device, 0 = not read yet
  std::vector<std::vector<int>> peers_;              // per device: the peers given access (vm_add_peer), vm_mu_
  // Per device and page size, the handles vm_detach kept (vm_mu_).
  std::vector<std::map<size_t, std::vector<CUmemGenericAllocationHandle>>> spares_;
  // Ranges vm_detach took out of their reservations, still mapped in the
  // driver until `done` (recorded on their stream) completes (vm_mu_).
  struct PendingUnmap {
    int device;
    CUdeviceptr addr;
    size_t bytes;
    CUevent done;
  };
  std::vector<PendingUnmap> pending_;
  // Sharing (guarded by vm_mu_): why pages are not exportable ("" = they
  // are), the descriptor exported for each shared page, and the ranges
  // mapped from other processes' pages.
  std::string not_shared_;
  std::unordered_map<CUmemGenericAllocationHandle, int> exported_;
  struct Imported {
    size_t bytes = 0;
    std::vector<CUmemGenericAllocationHandle> handles;
  };
  std::map<std::pair<int, CUdeviceptr>, Imported> imported_;
  static constexpr long kSysPidfdOpen = 434;   // SYS_pidfd_open, the same on x86-64 and aarch64
  static constexpr long kSysPidfdGetfd = 438;  // SYS_pidfd_getfd
};

}  // namespace

bool cuda_available(std::string* why) {
  const DriverApi* api = driver(why);
  if (api == nullptr) return false;
  int n = 0;
  if (api->cuDeviceGetCount(&n) != kSuccess || n == 0) {
    if (why) *why = "the CUDA driver reports no device";
    return false;
  }
  return true;
}

std::unique_ptr<Backend> make_cuda_backend() {
  std::string why;
  if (!cuda_available(&why)) throw DriverError("CUDA backend unavailable: " + why);
  return std::unique_ptr<Backend>(new CudaBackend(driver(nullptr)));
}

}  // namespace memalloc
