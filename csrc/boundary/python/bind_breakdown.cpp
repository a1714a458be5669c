// bind_breakdown.cpp — Python bindings of the breakdown by category
// (profiler/breakdown.h, profiler/profiler.h): the training phase, the end of a step,
// marking parameters, and the report. memalloc/features/phases.py calls them at the
// training loop's landmarks; memalloc/features/breakdown.py reads the report.
//
// Invariants: as bindings.cpp (the GIL is released before a device lock is
// taken; a phase or category name is checked before anything changes).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <limits>
#include <string>

#include "boundary/python/bind.h"
#include "profiler/breakdown.h"
#include "common/errors.h"
#include "boundary/python/pyargs.h"
#include "process/registry.h"

namespace py = pybind11;

namespace memalloc {
namespace {

using NoGil = py::call_guard<py::gil_scoped_release>;
using pyargs::Device;
using pyargs::PtrArg;

inline constexpr pyargs::TextSpec kPhaseName{"phase", "a str: 'idle', 'forward', 'backward' or 'optimizer'"};
inline constexpr pyargs::TextSpec kCategoryName{
    "category", "a str: 'parameters', 'gradients', 'optimizer_state', 'activations', 'temporaries' or 'other'"};
inline constexpr pyargs::UIntSpec kStepNumber{"step", "step", "",
                                              "an int >= 0 (the step that ended) or None (memalloc.iteration.steps())",
                                              std::numeric_limits<uint32_t>::max()};
using PhaseArg = pyargs::Text<kPhaseName>;
using CategoryArg = pyargs::Text<kCategoryName>;

Phase phase_of(const std::string& name) {
  for (int p = 0; p < kNumPhases; ++p)
    if (name == phase_name(p)) return static_cast<Phase>(p);
  throw InvalidArgument("unknown phase '" + name + "': phase must be " + kPhaseName.what);
}

Category category_of(const std::string& name) {
  for (int c = 0; c < kNumCategories; ++c)
    if (name == category_name(c)) return static_cast<Category>(c);
  throw InvalidArgument("unknown category '" + name + "': category must be " + kCategoryName.what);
}

py::dict split_dict(const std::array<int64_t, kNumCategories>& live) {
  py::dict d;
  for (int c = 0; c < kNumCategories; ++c) d[category_name(c)] = live[c];
  return d;
}

py::dict unresolved_dict(const CategoryBytes& s) {
  py::dict d;
  for (int p = 0; p < kNumPhases; ++p)
    if (p != static_cast<int>(Phase::kIdle)) d[phase_name(p)] = s.unresolved[p];
  return d;
}

// {"split": bytes by category (unresolved blocks under their provisional
// category), "unresolved": bytes by phase, "total": bytes}
py::dict bytes_dict(const CategoryBytes& s) {
  py::dict d;
  d["split"] = split_dict(s.provisional_split());
  d["unresolved"] = unresolved_dict(s);
  d["total"] = s.total;
  return d;
}

}  // namespace

void bind_breakdown(AllocatorClass& cls) {
  cls.def(
         "enter_phase",
         [](CachingAllocator& a, const PhaseArg& name) {
           const Phase p = phase_of(name);
           py::gil_scoped_release nogil;
           for (int d = 0; d < a.device_count(); ++d) a.with_profiler(d, [&](Profiler& pr) { pr.enter_phase(p); });
         },
         py::arg("phase"),
         "Stamps new blocks of every device with `phase`; entering 'backward' resolves the live forward blocks "
         "(activations), entering 'optimizer' the live backward blocks (gradients). memalloc/features/phases.py calls "
         "it.")
      .def(
          "resolve",
          [](CachingAllocator& a, const PhaseArg& phase, const CategoryArg& category) {
            const Phase p = phase_of(phase);
            const Category c = category_of(category);
            MEMALLOC_EXPECTS(p != Phase::kIdle, "phase 'idle' has nothing to resolve: its blocks are 'other' at once");
            py::gil_scoped_release nogil;
            for (int d = 0; d < a.device_count(); ++d) a.with_profiler(d, [&](Profiler& pr) { pr.resolve(p, c); });
          },
          py::arg("phase"), py::arg("category"),
          "Gives every live unresolved block of `phase` (every device) the category now.")
      .def(
          "phase",
          [](CachingAllocator& a, Device device) {
            return std::string(
                phase_name(static_cast<int>(a.with_profiler(device, [](Profiler& pr) { return pr.phase(); }))));
          },
          py::arg("device") = 0, "The phase new blocks of `device` are stamped with.")
      .def(
          "end_step",
          [](CachingAllocator& a, const py::object& step_number) {
            const auto step =
                static_cast<uint32_t>(step_number.is_none() ? AllocatorRegistry::instance().step()
                                                            : pyargs::load_uint(step_number, kStepNumber));
            py::gil_scoped_release nogil;
            for (int d = 0; d < a.device_count(); ++d) a.with_profiler(d, [&](Profiler& pr) { pr.end_step(step); });
          },
          py::arg("step") = py::none(),
          "Step `step` (default: memalloc.iteration.steps()) ended on every device: resolves every live block, keeps "
          "the "
          "step's peak split (breakdown()['last'], 'last_step') and enters 'forward'.")
      .def(
          "mark",
          [](CachingAllocator& a, const PtrArg& ptr, const CategoryArg& name) {
            const Category c = category_of(name);
            py::gil_scoped_release nogil;
            for (int d = 0; d < a.device_count(); ++d) {
              const size_t bytes = a.mark(d, static_cast<std::uintptr_t>(ptr.value), c);
              if (bytes != 0) return bytes;
            }
            return size_t{0};
          },
          py::arg("ptr"), py::arg("category"),
          "Gives the live block holding `ptr` (its start or an interior address) the category; returns the "
          "block's bytes, 0 when no live block holds ptr.")
      .def(
          "breakdown",
          [](CachingAllocator& a, Device device) {
            Profiler::State s;
            {
              py::gil_scoped_release nogil;
              s = a.with_profiler(device, [](Profiler& pr) { return pr.state(); });
            }
            py::dict d;
            d["now"] = bytes_dict(s.now);
            d["peak"] = bytes_dict(s.peak);
            d["last"] = s.has_last ? py::object(bytes_dict(s.last)) : py::object(py::none());
            d["last_step"] = s.last_step;
            d["phase"] = phase_name(static_cast<int>(s.phase));
            return d;
          },
          py::arg("device") = 0,
          "Live bytes by category: {'now', 'peak' (this step so far), 'last' (the last finished step's peak, "
          "or None)}, each {'split': {category: bytes}, 'unresolved': {phase: bytes}, 'total': bytes}; "
          "plus 'last_step' and 'phase'.");
}

}  // namespace memalloc
