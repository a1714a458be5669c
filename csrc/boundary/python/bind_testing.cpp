// bind_testing.cpp — test hooks, in memalloc._C._testing (not API): free
// functions, the allocator first, that only tests need to reach states a user
// cannot: an allocation from a thread that never ran Python, as autograd's
// engine workers (malloc_on_native_thread); and, on the host backend (the
// simulated device), injected allocate/release faults (inject_allocate_faults,
// inject_release_faults, set_fault_rates, faults_injected) and the count of
// segments the device holds (live_segments), the event ring's clock
// (clock_ns, common/clock.h), and a simulated graph capture
// (capture_begin/work/wait/end, capture_reuse.h); and the backend's virtual
// memory (vm_*: reserve, map, unmap, free), the bottom layer of expandable
// segments before the pool uses it; and torch's CUDA IPC handle bytes
// (ipc_*: boundary/torch/ipc_wire.h). Invariants as bindings.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "boundary/python/bind.h"
#include "common/errors.h"
#include "boundary/python/pyargs.h"
#include "process/registry.h"
#include "backend/backend.h"
#include "boundary/torch/ipc_wire.h"
#include "boundary/callers/pystacks.h"
#include "common/clock.h"

#include <exception>
#include <thread>

namespace py = pybind11;

namespace memalloc {

void bind_testing(py::module_& m) {
  py::module_ t = m.def_submodule("_testing", "test hooks (not API)");
  using namespace pyargs;
  t.def("clock_ns", [](const py::args& args) {
    if (!args.empty())
      throw py::type_error("clock_ns() takes no arguments, not " + std::to_string(args.size()) +
                           ": it reads the event ring's clock");
    // The event ring's clock (common/clock.h), calibrated: (steady_clock ns,
    // whether it came from the time-stamp counter, steady_clock ns at the
    // calibration: the drift bound counts from there).
    clock::calibrate();
    return py::make_tuple(clock::now_ns(), clock::uses_counter(), clock::scale().ns0);
  });
  t.def(
      "malloc_on_native_thread",
      [](AllocatorArg a, SizeArg size, Device device) {
        // Test hook: allocate from a thread that never ran Python, as
        // autograd's engine workers do; returns the pointer.
        void* p = nullptr;
        std::exception_ptr error;
        py::gil_scoped_release nogil;
        std::thread t([&] {
          try {
            const CallContext who = current_context();
            p = a->device(device).malloc(size, 0, &who);
          } catch (...) {
            error = std::current_exception();
          }
        });
        t.join();
        if (error) std::rethrow_exception(error);
        return reinterpret_cast<std::uintptr_t>(p);
      },
      py::arg("allocator"), py::arg("size"), py::arg("device") = 0);

  // ---- the backend's virtual memory (the bottom layer of expandable
  // segments; backend.h): addresses are ints ----------------------------------
  auto at = [](PtrArg addr) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(addr)); };
  t.def(
      "vm_page_size", [](AllocatorArg a, Device device) { return a->backend().vm_page_size(device); },
      py::arg("allocator"), py::arg("device") = 0,
      "The granularity of virtual memory, bytes: every reservation's page is a multiple of it.");
  t.def(
      "vm_reserve",
      [](AllocatorArg a, NBytesArg bytes, Device device, std::optional<size_t> page) {
        void* p = a->backend().vm_reserve(device, bytes, page ? *page : a->backend().vm_page_size(device));
        return reinterpret_cast<std::uintptr_t>(p);
      },
      py::arg("allocator"), py::arg("nbytes"), py::arg("device") = 0, py::arg("page") = py::none(),
      "Reserves nbytes of address space (no memory), mapped later in pages of `page` bytes (default: the "
      "granularity); its address, 0 when exhausted.");
  t.def(
      "vm_calls",
      [](AllocatorArg a, Device device) {
        const HostBackend::VmCalls c = host_backend(a).vm_calls(device);
        py::dict out;
        out["create"] = c.create;
        out["map"] = c.map;
        out["set_access"] = c.set_access;
        out["unmap"] = c.unmap;
        out["release"] = c.release;
        out["stream_syncs"] = c.stream_syncs;
        out["waits"] = c.waits;
        return out;
      },
      py::arg("allocator"), py::arg("device") = 0,
      "The CUDA driver calls of virtual memory the host backend's device would have made so far: "
      "{create, map, set_access, unmap, release}, its stream synchronisations (stream_syncs), and its waits for "
      "a stream before mapping or freeing a range a page move left (waits).");
  t.def(
      "vm_map",
      [at](AllocatorArg a, PtrArg addr, NBytesArg bytes, Device device) {
        return a->backend().vm_map(device, at(addr), bytes);
      },
      py::arg("allocator"), py::arg("addr"), py::arg("nbytes"), py::arg("device") = 0,
      "Backs pages of a reservation with device memory; False when the device is full.");
  t.def(
      "vm_unmap",
      [at](AllocatorArg a, PtrArg addr, NBytesArg bytes, Device device) {
        a->backend().vm_unmap(device, at(addr), bytes);
      },
      py::arg("allocator"), py::arg("addr"), py::arg("nbytes"), py::arg("device") = 0);
  t.def(
      "vm_detach",
      [at](AllocatorArg a, PtrArg addr, NBytesArg bytes, StreamArg stream, Device device) {
        a->backend().vm_detach(device, at(addr), bytes, stream);
      },
      py::arg("allocator"), py::arg("addr"), py::arg("nbytes"), py::arg("stream") = 0, py::arg("device") = 0,
      "Unmaps pages of a reservation without waiting for `stream`, keeping their memory as spare pages that the "
      "next vm_map of the same page size maps (a page move).");
  t.def(
      "vm_drop_spares",
      [](AllocatorArg a, Device device) {
        const int n = a->backend().device_count();
        MEMALLOC_EXPECTS(device < n, "device " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                                         " visible to this allocator's backend)");
        a->backend().vm_drop_spares(device);
      },
      py::arg("allocator"), py::arg("device") = 0, "Gives back the memory of the spare pages no vm_map took.");
  t.def(
      "vm_free", [at](AllocatorArg a, PtrArg base, Device device) { a->backend().vm_free(device, at(base)); },
      py::arg("allocator"), py::arg("base"), py::arg("device") = 0, "Ends a reservation whose pages are all unmapped.");

  // ---- the host backend's fault injection ----------------------------------
  using NoGil = py::call_guard<py::gil_scoped_release>;
  t.def(
      "inject_allocate_faults",
      [](AllocatorArg a, SkipArg skip, CountArg count, DriverErrorArg driver_error, Device device) {
        host_backend(a).inject_allocate_faults(device, skip, count, driver_error);
      },
      py::arg("allocator"), py::arg("skip"), py::arg("count"), py::arg("driver_error") = false, py::arg("device") = 0,
      NoGil(), "After `skip` more successful device allocations, fail the next `count` (as OOM, or DriverError).");
  t.def(
      "inject_release_faults",
      [](AllocatorArg a, SkipArg skip, CountArg count, Device device) {
        host_backend(a).inject_release_faults(device, skip, count);
      },
      py::arg("allocator"), py::arg("skip"), py::arg("count"), py::arg("device") = 0, NoGil());
  t.def(
      "set_fault_rates",
      [](AllocatorArg a, AllocateRateArg alloc_rate, ReleaseRateArg release_rate, SeedArg seed, Device device) {
        host_backend(a).set_fault_rates(device, alloc_rate, release_rate, seed);
      },
      py::arg("allocator"), py::arg("allocate_rate"), py::arg("release_rate"), py::arg("seed") = 0,
      py::arg("device") = 0, NoGil());
  t.def(
      "faults_injected", [](AllocatorArg a, Device device) { return host_backend(a).faults_injected(device); },
      py::arg("allocator"), py::arg("device") = 0, NoGil());
  // ---- the host backend's simulated graph capture (backend.h) ----------------
  t.def(
      "capture_begin",
      [](AllocatorArg a, StreamArg stream, Device device) { host_backend(a).capture_begin(device, stream); },
      py::arg("allocator"), py::arg("stream"), py::arg("device") = 0, NoGil(),
      "Starts capturing `stream` into a new simulated graph.");
  t.def(
      "capture_work",
      [](AllocatorArg a, StreamArg stream, Device device) { host_backend(a).capture_work(device, stream); },
      py::arg("allocator"), py::arg("stream"), py::arg("device") = 0, NoGil(),
      "Adds a node (a kernel) after the captured stream's work so far.");
  t.def(
      "capture_wait",
      [](AllocatorArg a, StreamArg waiter, StreamArg stream, Device device) {
        host_backend(a).capture_wait(device, waiter, stream);
      },
      py::arg("allocator"), py::arg("waiter"), py::arg("stream"), py::arg("device") = 0, NoGil(),
      "waiter.wait_stream(stream) in the capture: the waiter joins it, after the stream's work so far.");
  t.def(
      "capture_end",
      [](AllocatorArg a, StreamArg stream, Device device) { host_backend(a).capture_end(device, stream); },
      py::arg("allocator"), py::arg("stream"), py::arg("device") = 0, NoGil(),
      "Ends the capture `stream` is in, for every stream in it.");
  t.def(
      "live_segments", [](AllocatorArg a, Device device) { return host_backend(a).live_segments(device); },
      py::arg("allocator"), py::arg("device") = 0, NoGil());
  // torch's ShareableHandle bytes (ipc_wire.h), as getIpcDevPtr reads them.
  t.def(
      "ipc_decode",
      [](const py::bytes& handle) {
        const ipc_wire::Decoded d = ipc_wire::decode(std::string(handle));
        py::dict out;
        out["version"] = d.version;
        out["type"] = std::string(1, d.type);
        if (d.type == ipc_wire::kCudaMalloc) {
          out["cuda_ipc"] = py::bytes(d.cuda_ipc);
          return out;
        }
        out["pid"] = d.pid;
        out["page_bytes"] = d.page_bytes;
        out["handle"] = d.handle == ipc_wire::PageHandle::kPosixFd ? "posix_fd" : "fabric";
        out["fds"] = d.fds;
        py::list fabric;
        for (const std::string& f : d.fabric) fabric.append(py::bytes(f));
        out["fabric"] = fabric;
        return out;
      },
      py::arg("handle"), "The fields of a CUDA IPC handle's bytes (InvalidArgumentError when unreadable).");
  t.def(
      "ipc_encode_cuda_malloc",
      [](int version, const py::bytes& raw) {
        return py::bytes(ipc_wire::encode_cuda_malloc(version, std::string(raw)));
      },
      py::arg("version"), py::arg("cuda_ipc"));
  t.def(
      "ipc_encode_expandable",
      [](int version, int pid, size_t page_bytes, const std::vector<int>& fds) {
        return py::bytes(ipc_wire::encode_expandable(version, pid, page_bytes, fds));
      },
      py::arg("version"), py::arg("pid"), py::arg("page_bytes"), py::arg("fds"));
  t.def(
      "ipc_version_for_torch",
      [](const py::object& major, const py::object& minor) {
        for (const py::object* v : {&major, &minor})
          if (!py::isinstance<py::int_>(*v) || py::isinstance<py::bool_>(*v) || v->cast<long long>() < 0)
            throw py::type_error(
                "ipc_version_for_torch(major, minor) takes torch's version as two "
                "non-negative ints, e.g. (2, 13), not " +
                std::string(py::repr(*v)));
        return ipc_wire::version_for_torch(major.cast<int>(), minor.cast<int>());
      },
      py::arg("major"), py::arg("minor"));
  t.attr("ipc_version_built") =
      ipc_wire::version_for_torch(MEMALLOC_TORCH_MAJOR, MEMALLOC_TORCH_MINOR);  // the version memalloc sends
  bind_pools(t);
}

}  // namespace memalloc
