// bind_host.cpp — the simulated device's operations on memalloc._C.Allocator:
// host_synchronize_stream (complete a stream's pending work) and host_buffer
// (host tensors: a DLPack capsule over allocator memory whose deleter frees
// through the allocator; it holds a shared_ptr, so the allocator outlives the
// tensor); and host_backend(), shared with bind_testing.cpp, whose test hooks
// (fault injection, live segments) reach the host backend too. Invariants as
// bindings.cpp.
#include <ATen/dlpack.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "boundary/python/bind.h"
#include "common/errors.h"
#include "boundary/python/pyargs.h"
#include "process/registry.h"
#include "boundary/torch/malloc_entry.h"
#include "boundary/callers/pystacks.h"

#include <cstdio>

namespace py = pybind11;

namespace memalloc {
namespace {

using AllocatorPtr = std::shared_ptr<CachingAllocator>;
using NoGil = py::call_guard<py::gil_scoped_release>;
using namespace pyargs;

// ---- host tensors through DLPack -------------------------------------------
struct HostTensorCtx {
  AllocatorPtr allocator;
  int device = 0;
  int64_t shape[1] = {0};
  DLManagedTensor managed{};
};

void host_tensor_deleter(DLManagedTensor* m) {
  auto* ctx = static_cast<HostTensorCtx*>(m->manager_ctx);
  try {
    const memalloc::CallContext caller = AllocatorRegistry::instance().thread_context();
    ctx->allocator->device(ctx->device).free(m->dl_tensor.data, &caller);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memalloc: host tensor free failed: %s\n", e.what());
  }
  delete ctx;
}

void capsule_destructor(PyObject* capsule) {
  // Not consumed by a consumer (name unchanged): we still own it.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    m->deleter(m);
  }
}

// A 1-D uint8 DLPack capsule over `nbytes` (> 0) of allocator memory.
py::capsule host_buffer(const AllocatorPtr& a, NBytesArg nbytes, Device device, StreamArg stream) {
  MEMALLOC_EXPECTS(nbytes > 0, "host_buffer: nbytes must be positive (zero-element tensors need no memory)");
  const CallContext who = current_context();  // may walk Python frames: GIL held here
  void* p = nullptr;
  {
    py::gil_scoped_release nogil;
    p = malloc_for_torch(*a, device, nbytes, stream, who, "memalloc");
  }
  auto* ctx = new HostTensorCtx;
  ctx->allocator = a;
  ctx->device = device;
  ctx->shape[0] = static_cast<int64_t>(nbytes);
  DLTensor& t = ctx->managed.dl_tensor;
  t.data = p;
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = DLDataType{kDLUInt, 8, 1};
  t.shape = ctx->shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = host_tensor_deleter;
  return py::capsule(&ctx->managed, "dltensor", capsule_destructor);
}

}  // namespace

HostBackend& host_backend(CachingAllocator& a) {
  auto* host = dynamic_cast<HostBackend*>(&a.backend());
  MEMALLOC_EXPECTS(host != nullptr, "this method needs an allocator on the host backend (the simulated device)");
  return *host;
}

void bind_host(py::class_<CachingAllocator, std::shared_ptr<CachingAllocator>>& cls) {
  cls.def(
         "host_synchronize_stream",
         [](CachingAllocator& a, StreamArg stream, Device device) {
           host_backend(a).synchronize_stream(device, stream);
         },
         py::arg("stream"), py::arg("device") = 0, NoGil())
      .def("host_buffer", &host_buffer, py::arg("nbytes"), py::arg("device") = 0, py::arg("stream") = 0,
           "A DLPack capsule (1-D uint8, CPU) over nbytes of this allocator's memory; "
           "the memory returns to the allocator when the consuming tensor dies.");
}

}  // namespace memalloc
