// bind_attribution.cpp — who allocates: stack modes, tags, the backward
// context, steps, interned stacks, the OOM hook, torch's CPU tensors from the
// host backend (for good, or for a scope: CpuRoute), and the export of
// recorded events to torch's trace entries (functions of memalloc._C). Invariants as
// bindings.cpp.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "boundary/python/bind.h"
#include "common/errors.h"
#include "boundary/python/pyargs.h"
#include "process/registry.h"
#include "boundary/torch/cpu_allocator.h"
#include "boundary/torch/oom_report.h"
#include "boundary/callers/pystacks.h"
#include "boundary/python/trace_export.h"

namespace py = pybind11;

namespace memalloc {
namespace {

// Symbolises an interned stack (GIL held): code objects were kept alive when
// the stack was interned (pystacks.cpp).
py::list stack_frames(uint32_t id) {
  py::list out;
  for (const RawFrame& f : AllocatorRegistry::instance().stacks().frames(id)) {
    auto* code = reinterpret_cast<PyCodeObject*>(const_cast<void*>(f.code));
    py::handle h(reinterpret_cast<PyObject*>(code));
    int line = PyCode_Addr2Line(code, f.lasti);
    py::object name = py::hasattr(h, "co_qualname") ? h.attr("co_qualname") : h.attr("co_name");
    out.append(py::make_tuple(h.attr("co_filename"), line, name));
  }
  return out;
}

}  // namespace

void bind_attribution(py::module_& m) {
  py::dict modes;  // the one definition of the stack modes' names and numbers (registry.h)
  std::string choices;
  for (int i = 0; i < kNumStackModes; ++i) {
    modes[stack_mode_name(i)] = i;
    choices +=
        (i ? (i + 1 == kNumStackModes ? " or " : ", ") : "") + std::to_string(i) + " (" + stack_mode_name(i) + ")";
  }
  m.attr("STACK_MODES") = modes;
  m.def("set_stack_mode", [choices](int mode) {
    MEMALLOC_EXPECTS(mode >= 0 && mode < kNumStackModes, "stack mode must be " + choices);
    AllocatorRegistry::instance().set_stack_mode(static_cast<StackMode>(mode));
  });
  m.def("stack_mode", [] { return static_cast<int>(AllocatorRegistry::instance().stack_mode()); });
  m.def("intern_tag", [](const std::string& name) { return AllocatorRegistry::instance().tags().intern(name); });
  m.def("tag_names", [] { return AllocatorRegistry::instance().tags().names(); });
  m.def("thread_tag", &AllocatorRegistry::thread_tag);
  m.def("set_thread_tag", &AllocatorRegistry::set_thread_tag);
  m.def("set_backward_context",
        [](uint32_t tag, uint32_t stack) { AllocatorRegistry::instance().set_backward_context(tag, stack); });
  m.def("backward_context", [] {
    auto& r = AllocatorRegistry::instance();
    return py::make_tuple(r.backward_tag(), r.backward_stack());
  });
  m.def("capture_stack", &capture_stack_now, "The calling thread's Python stack id (interned).");
  m.def("next_step", [] { return AllocatorRegistry::instance().next_step(); });
  m.def("step", [] { return AllocatorRegistry::instance().step(); });
  m.def("stack_count", [] { return AllocatorRegistry::instance().stacks().size(); });
  m.def("stack_frames", &stack_frames, py::arg("stack_id"),
        "[(filename, line, function)] of an interned stack, innermost first.");
  m.def(
      "set_oom_hook",
      [](py::object hook) {
        MEMALLOC_EXPECTS(hook.is_none() || PyCallable_Check(hook.ptr()),
                         "the OOM hook must be callable(device, requested_bytes) -> str, or None");
        set_oom_hook(hook.ptr());
      },
      py::arg("hook"), "Text appended to out-of-memory errors of the installed allocator (None: off).");
  m.def("use_for_torch_cpu", &use_for_torch_cpu,
        "Makes torch's CPU tensors come from device 0 of the installed host-backend allocator (irreversible).");
  m.def("used_for_torch_cpu", &used_for_torch_cpu);
  py::class_<CpuRoute>(m, "CpuRoute",
                       "Routes torch's CPU tensors to device 0 of a host-backend allocator until close() "
                       "(memalloc.host.cpu_tensors_from).")
      .def(py::init([](pyargs::AllocatorArg a) { return std::make_unique<CpuRoute>(a.allocator); }),
           py::arg("allocator"))
      .def("close", &CpuRoute::close, "Gives torch back its previous CPU allocator; a second call does nothing.")
      .def_property_readonly("open", &CpuRoute::open);
  m.def("trace_entries", &trace_entries, py::arg("raw"), py::arg("keep"), py::arg("tags"), py::arg("frames_of"),
        "torch snapshot trace entries of raw records (see csrc/boundary/python/trace_export.h).");
  m.def("record_size", [] { return sizeof(TraceRecord); });
  m.def("max_trace_records", [] { return kMaxTraceRecords; });
  m.def("action_names", [] {
    size_t n = 0;
    const char* const* names = action_names(&n);
    return std::vector<std::string>(names, names + n);
  });
}

}  // namespace memalloc
