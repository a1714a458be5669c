// backend.h — the bottom layer: the only code that obtains device memory.
//
// Two implementations: backend_cuda.cpp (CUDA driver API through dlopen) and
// backend_host.cpp (a simulated device: host memory behind a capacity limit,
// streams whose work completes only when synchronized).
//
// Invariants:
//   * allocate() returns nullptr exactly when the device is out of memory;
//     any other failure throws DriverError.
//   * release() never throws; it returns false when the device refused.
//   * Calls for one device are serialised by that device's allocator lock;
//     a backend guards any state it shares across devices itself.
//   * Events: record_event(e, s) marks the work queued on stream s so far;
//     query_event(e) is true once that work has completed;
//     synchronize_event(e) waits for it.
//   * allocate() and vm_map() may run while a stream of the device is being
//     captured into a CUDA graph (a pool growing): the CUDA backend then
//     allocates in the relaxed capture mode, which a capture tolerates.
//   * Inter-process handles (CUDA IPC) name whole segments (ipc_handle)
//     or the pages of a reservation (vm_share: one POSIX descriptor per
//     page, exported once, closed when the page is unmapped); the host
//     backend has none and throws DriverError.
//   * Virtual memory (expandable segments, vm_arena.h):
//     vm_reserve() takes address space only, in pages of its own size (a
//     multiple of the granularity, vm_page_size()); vm_map() backs whole
//     pages of a reservation with device memory, one physical allocation
//     per page (the driver's calls per byte mapped fall as the page grows),
//     and returns false exactly when the device is out of memory; vm_unmap()
//     gives them back; vm_free() ends a reservation whose pages are all
//     unmapped. vm_detach() unmaps pages but keeps their device memory as
//     spare pages, which vm_map() maps before it creates any (moving pages
//     costs no device memory and no stream synchronisation) until
//     vm_drop_spares() gives the rest back. Mapped bytes and spare pages
//     count as device memory in use (mem_get_info), reserved address space
//     does not. A backend without
//     virtual memory (or a driver without its entry points) throws
//     DriverError from all of them.
//   * Graph capture topology (capture_reuse.h): capture_frontier() and
//     graph_dependencies() only read the graph a stream is being captured
//     into (no node is added, no event queried); they are legal during a
//     capture. A backend without graphs reports no stream as capturing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"

namespace memalloc {

// A stream handle as torch passes it (cudaStream_t == CUstream); 0 is the
// default stream.
using Stream = std::uintptr_t;
using EventHandle = void*;
// A node of a CUDA graph under capture (CUgraphNode), opaque.
using GraphNode = const void*;

// Pages of another process's reservation as it shares them (CUDA IPC of an
// expandable segment): its pid and the descriptor numbers in it (POSIX), or
// fabric handles (64 bytes each), one per page of page_bytes.
struct SharedPages {
  int pid = 0;
  size_t page_bytes = 0;
  std::vector<int> fds;
  std::vector<std::string> fabric;
};

struct MemInfo {
  size_t free = 0;   // bytes the device could still hand out
  size_t total = 0;  // bytes of device memory in all
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual int device_count() const = 0;

  virtual void* allocate(int device, size_t size) = 0;
  virtual bool release(int device, void* ptr, size_t size) noexcept = 0;
  virtual MemInfo mem_get_info(int device) = 0;

  virtual EventHandle create_event(int device) = 0;
  virtual void destroy_event(int device, EventHandle event) noexcept = 0;
  virtual void record_event(int device, EventHandle event, Stream stream) = 0;
  virtual bool query_event(int device, EventHandle event) = 0;
  virtual void synchronize_event(int device, EventHandle event) = 0;
  // Waits until all work queued on `stream` so far has completed (before
  // the pages of an expandable segment are unmapped).
  virtual void synchronize_stream(int device, Stream stream) = 0;

  // The bytes of an inter-process handle of the segment starting at `base`.
  virtual std::string ipc_handle(int device, void* base);
  // Maps another process's segment (from ipc_handle) into this one.
  virtual void* ipc_open(int device, const std::string& handle);
  // Unmaps what ipc_open returned.
  virtual void ipc_close(int device, void* ptr) noexcept;
  // POSIX descriptors, in this process, of the mapped pages of
  // [addr, addr + bytes) (whole pages of one reservation).
  virtual std::vector<int> vm_share(int device, void* addr, size_t bytes);
  // Maps another process's pages, in order, into a new address range of
  // this one; returns its start.
  virtual void* vm_open_shared(int device, const SharedPages& pages);
  // Unmaps and releases what vm_open_shared returned, once the device's
  // queued work is done.
  virtual void vm_close_shared(int device, void* base) noexcept;

  // ---- virtual memory (see the invariants above) ----------------------------
  // The granularity of virtual memory, bytes: every reservation's page is
  // a multiple of it.
  virtual size_t vm_page_size(int device);
  // `bytes` (a multiple of `page`) of address space, mapped later in pages
  // of `page` bytes (a positive multiple of vm_page_size()); nullptr when
  // the address space is exhausted.
  virtual void* vm_reserve(int device, size_t bytes, size_t page);
  // Backs [addr, addr + bytes) (whole pages of one reservation, not mapped)
  // with device memory, one physical allocation per page; false when the
  // device is out of memory.
  virtual bool vm_map(int device, void* addr, size_t bytes);
  // Unmaps [addr, addr + bytes) (mapped pages of one reservation) and gives
  // their device memory back; the caller has waited for the work on them.
  virtual void vm_unmap(int device, void* addr, size_t bytes);
  // Unmaps [addr, addr + bytes) (mapped pages of one reservation) without
  // waiting for the work queued on `stream` so far, which may still use
  // them: their device memory stays, as spare pages that the next vm_map()
  // of the same page size maps at its range (so that work and the pages'
  // next user are ordered as they are when a free block is reused on its
  // stream). The range reads as unmapped at once. This base version
  // synchronises the stream and calls vm_unmap() (no spares).
  virtual void vm_detach(int device, void* addr, size_t bytes, Stream stream);
  // Gives back the device memory of the spare pages no vm_map() took (on
  // CUDA once their stream's work is done: at a later virtual-memory call of
  // the device, which finishes the pending unmaps that are done).
  virtual void vm_drop_spares(int device) noexcept;
  // Ends the reservation at `base` (every page unmapped).
  virtual void vm_free(int device, void* base);
  // Lets device `peer` read and write `device`'s virtual memory: every page
  // mapped now and every page vm_map maps later (torch's enablePeerAccess;
  // memory from allocate() needs only the driver's peer access). A backend
  // without virtual memory has nothing to do.
  virtual void vm_add_peer(int device, int peer);

  // ---- graph capture topology (see the invariants above) ---------------------
  // True when `stream` is being captured into a graph: *capture_id is the
  // capture's id, and `frontier` is set to the nodes that the next work
  // queued on the stream will depend on. False (frontier emptied) otherwise.
  virtual bool capture_frontier(int device, Stream stream, uint64_t* capture_id, std::vector<GraphNode>* frontier);
  // Appends to `out` the nodes `node` depends on.
  virtual void graph_dependencies(int device, GraphNode node, std::vector<GraphNode>* out);
};

// The simulated device: `config.host_devices` devices of
// `config.host_capacity` bytes each.
class HostBackend : public Backend {
 public:
  explicit HostBackend(const Config& config);
  ~HostBackend() override;
  const char* name() const override { return "host"; }
  int device_count() const override;

  void* allocate(int device, size_t size) override;
  bool release(int device, void* ptr, size_t size) noexcept override;
  MemInfo mem_get_info(int device) override;

  EventHandle create_event(int device) override;
  void destroy_event(int device, EventHandle event) noexcept override;
  void record_event(int device, EventHandle event, Stream stream) override;
  bool query_event(int device, EventHandle event) override;
  void synchronize_event(int device, EventHandle event) override;
  // Completes all work queued on `stream` (the simulation's only clock).
  void synchronize_stream(int device, Stream stream) override;

  // A granularity of 2 MiB, reservations in the device's one address range.
  size_t vm_page_size(int device) override;
  void* vm_reserve(int device, size_t bytes, size_t page) override;
  bool vm_map(int device, void* addr, size_t bytes) override;
  void vm_unmap(int device, void* addr, size_t bytes) override;
  void vm_detach(int device, void* addr, size_t bytes, Stream stream) override;
  void vm_drop_spares(int device) noexcept override;
  void vm_free(int device, void* base) override;

  // A simulated graph capture (tests): a capture holds nodes, each with the
  // nodes it depends on. capture_begin starts one on `stream`; capture_work
  // adds a node after the stream's frontier (a kernel); capture_wait makes
  // `waiter` wait for `stream`'s work so far (wait_stream: the waiter joins
  // the capture, its frontier gains the stream's); capture_end ends the
  // capture of `stream` for every stream in it.
  bool capture_frontier(int device, Stream stream, uint64_t* capture_id, std::vector<GraphNode>* frontier) override;
  void graph_dependencies(int device, GraphNode node, std::vector<GraphNode>* out) override;
  void capture_begin(int device, Stream stream);
  void capture_work(int device, Stream stream);
  void capture_wait(int device, Stream waiter, Stream stream);
  void capture_end(int device, Stream stream);

  // Number of live segments obtained from the simulated device.
  size_t live_segments(int device);

  // Fault injection (tests). After `skip` more successful calls, the next
  // `count` allocate() calls on `device` fail: as out-of-memory (nullptr),
  // or with DriverError when `driver_error`.
  void inject_allocate_faults(int device, size_t skip, size_t count, bool driver_error);
  // After `skip` more successful calls, the next `count` release() calls on
  // `device` fail (return false; the memory stays with the caller).
  void inject_release_faults(int device, size_t skip, size_t count);
  // Random faults: each allocate()/release() fails (as OOM / refusal) with
  // the given probability, from a generator seeded with `seed`.
  void set_fault_rates(int device, double allocate_rate, double release_rate, uint64_t seed);
  // Faults injected so far on `device`: {allocate, release}.
  std::pair<size_t, size_t> faults_injected(int device);

  // The CUDA driver calls the virtual memory of `device` would have made
  // so far (backend_cuda.cpp's, call for call): cuMemCreate per page mapped
  // that no spare page served, cuMemMap per page mapped, cuMemSetAccess per
  // vm_map, cuMemUnmap per vm_unmap and vm_detach, cuMemRelease per page
  // unmapped or spare page dropped; the stream synchronisations
  // (synchronize_stream) made so far, and the waits for a stream's work
  // before a vm_map or vm_free of a range vm_detach took while that work
  // was queued (CUDA's cuEventSynchronize before the range's pending unmap).
  struct VmCalls {
    uint64_t create = 0, map = 0, set_access = 0, unmap = 0, release = 0, stream_syncs = 0, waits = 0;
  };
  VmCalls vm_calls(int device);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// The CUDA driver API, loaded with dlopen("libcuda.so.1"). Throws DriverError
// when no driver or no device is usable.
std::unique_ptr<Backend> make_cuda_backend();

// True when a CUDA driver with at least one device is usable; otherwise
// false and *why says what is missing.
bool cuda_available(std::string* why);

}  // namespace memalloc
