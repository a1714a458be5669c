// bind_testing.cpp — test hooks, in memalloc._C._testing (not API): calls
// that only tests need to reach states a user cannot (an allocation from a
// thread that never ran Python, as autograd's engine workers). Invariants as
// bindings.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "bind.h"
#include "errors.h"
#include "pyargs.h"
#include "registry.h"
#include "pystacks.h"

#include <exception>
#include <thread>

namespace py = pybind11;

namespace memalloc {

void bind_testing(py::module_& m) {
  py::module_ t = m.def_submodule("_testing", "test hooks (not API)");
  using AllocatorPtr = std::shared_ptr<CachingAllocator>;
  using namespace pyargs;
  t.def("malloc_on_native_thread",
        [](AllocatorPtr a, SizeArg size, Device device) {
          // Test hook: allocate from a thread that never ran Python, as
          // autograd's engine workers do; returns the pointer.
          void* p = nullptr;
          std::exception_ptr error;
          py::gil_scoped_release nogil;
          std::thread t([&] {
            try {
              p = a->device(device).malloc(size, 0, current_context());
            } catch (...) {
              error = std::current_exception();
            }
          });
          t.join();
          if (error) std::rethrow_exception(error);
          return reinterpret_cast<std::uintptr_t>(p);
        },
        py::arg("allocator"), py::arg("size"), py::arg("device") = 0);
}

}  // namespace memalloc
