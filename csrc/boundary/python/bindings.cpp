// bindings.cpp — the Python module memalloc._C (pybind11).
//
// Invariants:
//   * Every function that can take a device lock releases the GIL first
//     (py::call_guard<py::gil_scoped_release>): an allocation arriving
//     without the GIL on another thread can then never deadlock against it.
//   * Errors: OutOfMemory -> torch.OutOfMemoryError (through c10), memalloc
//     errors -> the exception classes registered below.
//   * Arguments: every argument of parse_config, Allocator(), the
//     Allocator methods and the _testing hooks is a typed argument of
//     pyargs.h (SizeArg, Device, StreamArg, FractionArg, AllocatorArg, ...),
//     never a bare int / size_t / double / std::string / shared_ptr: a
//     wrong type is a TypeError naming the argument, a value out of range
//     an InvalidArgumentError naming it, both raised before the call starts
//     (so before it can change anything).
//   * One file per concept: this one holds the module, the errors, the
//     config, the Allocator's core methods and installation; bind_host.cpp
//     the simulated device's methods and host tensors, bind_pools.cpp the
//     private pools' test hooks (in _testing), bind_breakdown.cpp the breakdown by category,
//     bind_flight.cpp the flight recorder's file mapping,
//     bind_attribution.cpp stacks/tags/steps and trace export,
//     bind_testing.cpp the test hooks (memalloc._C._testing).
#include <cstddef>
#include <type_traits>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdio>

#include "boundary/python/bind.h"
#include "boundary/python/settings.h"
#include "common/errors.h"
#include "profiler/breakdown.h"
#include "profiler/recorder.h"
#include "boundary/torch/malloc_entry.h"
#include "boundary/torch/pluggable.h"
#include "boundary/python/pyargs.h"
#include "boundary/callers/pystacks.h"
#include "process/registry.h"
#ifdef MEMALLOC_WITH_TORCH_CUDA
#include "boundary/torch/cuda/torch_allocator.h"
#endif

namespace py = pybind11;
using namespace memalloc;
using namespace memalloc::pyargs;

namespace {

using AllocatorPtr = std::shared_ptr<CachingAllocator>;
using NoGil = py::call_guard<py::gil_scoped_release>;

// `core` (the allocator's Config, or a device's current settings) as
// canonical settings text, with the Python layer's keys the allocator was
// made with (CachingAllocator::settings_text; none: their defaults).
std::string settings_of(const CachingAllocator& a, const Config& core) {
  Settings s = parse_settings(a.settings_text());
  s.config = core;
  return settings_text(s);
}

py::dict stat_dict(const Stat& s) {
  py::dict d;
  d["current"] = s.current;
  d["peak"] = s.peak.value();
  d["allocated"] = s.allocated;
  d["freed"] = s.freed;
  return d;
}

// {"allocated_bytes": {"all": {...}, "small_pool": {...}, "large_pool": {...}}, ..., "num_ooms": n}
py::dict stats_dict(const DeviceStats& s) {
  static const char* kPools[kNumStatTypes] = {"all", "small_pool", "large_pool"};
  py::dict out;
#define MEMALLOC_POOL_STAT_TO_PY(name)                                                  \
  {                                                                                     \
    py::dict per_pool;                                                                  \
    for (int i = 0; i < kNumStatTypes; ++i) per_pool[kPools[i]] = stat_dict(s.name[i]); \
    out[#name] = per_pool;                                                              \
  }
  MEMALLOC_POOL_STATS(MEMALLOC_POOL_STAT_TO_PY)
#undef MEMALLOC_POOL_STAT_TO_PY
#define MEMALLOC_FLAT_STAT_TO_PY(name) out[#name] = stat_dict(s.name);
  MEMALLOC_FLAT_STATS(MEMALLOC_FLAT_STAT_TO_PY)
#undef MEMALLOC_FLAT_STAT_TO_PY
#define MEMALLOC_SCALAR_STAT_TO_PY(name) out[#name] = s.name;
  MEMALLOC_SCALAR_STATS(MEMALLOC_SCALAR_STAT_TO_PY)
#undef MEMALLOC_SCALAR_STAT_TO_PY
  return out;
}

py::list segments_list(const std::vector<SegmentInfo>& segs, int device) {
  py::list out;
  for (const auto& s : segs) {
    py::list blocks;
    for (const auto& b : s.blocks) {
      py::dict bd;
      bd["address"] = b.addr;
      bd["size"] = b.size;
      bd["requested_size"] = b.requested;
      bd["state"] = b.state;
      bd["stack_id"] = Profiler::note_stack(b.note);
      bd["tag_id"] = Profiler::note_tag(b.note);
      blocks.append(bd);
    }
    py::dict sd;
    sd["device"] = device;
    sd["address"] = s.addr;
    sd["total_size"] = s.size;
    sd["stream"] = s.stream;
    sd["segment_type"] = s.pool == PoolKind::kSmall ? "small" : "large";
    sd["segment_pool_id"] = py::make_tuple(s.owner.first, s.owner.second);
    sd["is_expandable"] = s.expandable;
    sd["page_size"] = s.page;
    sd["blocks"] = blocks;
    out.append(sd);
  }
  return out;
}

uint64_t fn_addr(void* f) { return reinterpret_cast<uint64_t>(f); }

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "memalloc core: caching allocator, host/CUDA backends, pluggable entry points";

  // Translators are tried newest first: register the base class first.
  auto& error = py::register_exception<Error>(m, "MemallocError", PyExc_RuntimeError);
  py::register_exception<InvalidArgument>(m, "InvalidArgumentError", PyExc_ValueError);
  py::register_exception<InvalidPointer>(m, "InvalidPointerError", PyExc_ValueError);
  py::register_exception<DriverError>(m, "DriverError", error.ptr());
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const OutOfMemory& e) {
      // Reached only where malloc_for_torch was not used; keep torch's type.
      py::object oom = py::module_::import("torch").attr("OutOfMemoryError");
      PyErr_SetString(oom.ptr(), e.what());
    }
  });

  m.def(
      "parse_config", [](ConfigTextArg text) { return settings_text(parse_settings(text)); }, py::arg("text"),
      "Validates MEMALLOC_CONF-style text; returns its canonical form.");
  m.def("config_keys", &settings_keys);
  m.def(
      "config_entries", [](ConfigTextArg text) { return config_entries(text); }, py::arg("text"),
      "The (key, value) entries of settings text, in order: commas inside brackets stay in their "
      "value, whitespace around keys and values is dropped, an entry without ':' has value ''.");
  m.def("cuda_available", [] {
    std::string why;
    bool ok = cuda_available(&why);
    return py::make_tuple(ok, why);
  });

  py::class_<CachingAllocator, AllocatorPtr> allocator_class(m, "Allocator");
  allocator_class
      .def(py::init([](BackendArg backend, ConfigArg config) {
             const Settings s = parse_settings(config);
             return make_allocator(backend, s.config, settings_text(s));
           }),
           py::arg("backend"), py::arg("config") = "", NoGil())
      .def_property_readonly("backend_name", [](CachingAllocator& a) { return std::string(a.backend().name()); })
      .def_property_readonly("config", [](CachingAllocator& a) { return settings_of(a, a.config()); })
      .def_property_readonly("device_count", &CachingAllocator::device_count)
      .def(
          "malloc",
          [](CachingAllocator& a, SizeArg size, Device device, StreamArg stream) {
            const CallContext ctx = current_context();  // GIL held here
            py::gil_scoped_release nogil;
            return reinterpret_cast<std::uintptr_t>(malloc_for_torch(a, device, size, stream, ctx, "memalloc"));
          },
          py::arg("size"), py::arg("device") = 0, py::arg("stream") = 0)
      .def(
          "free",
          [](CachingAllocator& a, PtrArg ptr, Device device) {
            const memalloc::CallContext caller = AllocatorRegistry::instance().thread_context();
            a.device(device).free(reinterpret_cast<void*>(ptr.value), &caller);
          },
          py::arg("ptr"), py::arg("device") = 0, NoGil())
      .def(
          "record_stream",
          [](CachingAllocator& a, PtrArg ptr, StreamArg stream, Device device) {
            a.device(device).record_stream(reinterpret_cast<void*>(ptr.value), stream);
          },
          py::arg("ptr"), py::arg("stream"), py::arg("device") = 0, NoGil())
      .def(
          "empty_cache",
          [](CachingAllocator& a, Device device) {
            const memalloc::CallContext caller = AllocatorRegistry::instance().thread_context();
            return a.device(device).empty_cache(&caller);
          },
          py::arg("device") = 0, NoGil())
      .def(
          "set_memory_fraction",
          [](CachingAllocator& a, FractionArg f, Device device) { set_memory_fraction(a.device(device), f); },
          py::arg("fraction"), py::arg("device") = 0, NoGil())
      .def(
          "memory_fraction",
          [](CachingAllocator& a, Device device) {
            const double f = a.device(device).with_limits([](Limits& l) { return l.fraction(); });
            return f >= 0.0 ? f : 1.0;  // none set: the whole device, as torch answers
          },
          py::arg("device") = 0, NoGil())
      .def(
          "set_gc_threshold",
          [](CachingAllocator& a, ThresholdArg t, Device device) {
            a.device(device).with_limits([&](Limits& l) { l.set_gc_threshold(t); });
          },
          py::arg("threshold"), py::arg("device") = 0, NoGil())
      .def(
          "gc_threshold",
          [](CachingAllocator& a, Device device) {
            return a.device(device).with_limits([](Limits& l) { return l.gc_threshold(); });
          },
          py::arg("device") = 0, NoGil())
      .def_property_readonly("max_split_size",
                             [](CachingAllocator& a) {
                               // torch reports an unlimited max_split_size as -1
                               size_t m = a.device(0).settings().max_split_size;
                               return m == static_cast<size_t>(-1) ? int64_t{-1} : static_cast<int64_t>(m);
                             })
      .def(
          "apply_settings",
          [](CachingAllocator& a, ConfigTextArg text) {
            const Config c = parse_settings(text).config;
            for (int d = 0; d < a.device_count(); ++d) a.device(d).apply_settings(c);
          },
          py::arg("text"), NoGil(),
          "Run-time settings (torch.cuda.memory._set_allocator_settings): max_split_size_mb, "
          "roundup_power2_divisions, garbage_collection_threshold and expandable_segments from `text` "
          "(MEMALLOC_CONF syntax; keys it leaves out take their defaults) replace every device's.")
      .def(
          "settings", [](CachingAllocator& a, Device device) { return settings_of(a, a.device(device).settings()); },
          py::arg("device") = 0, NoGil(), "The device's current settings as canonical config text.")
      .def(
          "stats",
          [](CachingAllocator& a, Device device) {
            DeviceStats s;
            {
              py::gil_scoped_release nogil;
              s = a.device(device).stats();
            }
            return stats_dict(s);
          },
          py::arg("device") = 0)
      .def(
          "reset_peak_stats",
          [](CachingAllocator& a, Device device) {
            a.device(device).with_accounting([](Accounting& acc) { acc.reset_peak(); });
          },
          py::arg("device") = 0, NoGil())
      .def(
          "reset_accumulated_stats",
          [](CachingAllocator& a, Device device) {
            a.device(device).with_accounting([](Accounting& acc) { acc.reset_accumulated(); });
          },
          py::arg("device") = 0, NoGil())
      .def(
          "take_window",
          [](CachingAllocator& a, int device) {
            const StepWindow w = a.device(device).with_accounting([](Accounting& acc) { return acc.take_window(); });
            return std::make_tuple(w.peak_allocated_bytes, w.peak_reserved_bytes, w.num_ooms);
          },
          py::arg("device") = 0, NoGil(),
          "(peak allocated bytes, peak reserved bytes, OOMs) since the previous call; the next window "
          "starts at the current values. Independent of reset_peak_stats/reset_accumulated_stats. "
          "memalloc.StepTracker owns it (one window per device: use StepTracker rather than this).")
      .def(
          "mem_get_info",
          [](CachingAllocator& a, Device device) {
            MemInfo i = a.device(device).mem_get_info();
            return std::make_pair(i.free, i.total);
          },
          py::arg("device") = 0, NoGil())
      .def(
          "segments",
          [](CachingAllocator& a, Device device) {
            std::vector<SegmentInfo> segs;
            {
              py::gil_scoped_release nogil;
              segs = a.device(device).segments();
            }
            return segments_list(segs, device);
          },
          py::arg("device") = 0)
      .def(
          "live_blocks",
          [](CachingAllocator& a, Device device) {
            std::vector<LiveBlock> blocks;
            {
              py::gil_scoped_release nogil;
              blocks = a.with_profiler(device, [](Profiler& p) { return p.live_blocks(); });
            }
            // the wire format: memalloc._C.LIVE_FIELDS, LIVE_BYTES (memalloc/trace/sites.py reads them)
            return py::bytes(reinterpret_cast<const char*>(blocks.data()), blocks.size() * sizeof(LiveBlock));
          },
          py::arg("device") = 0,
          "Every live allocation of `device` as bytes, LIVE_BYTES per block, laid out as LIVE_FIELDS "
          "(addr, size, requested, stack_id, tag_id, step); in no particular order.")
      .def(
          "validate", [](CachingAllocator& a, Device device) { a.device(device).validate(); }, py::arg("device") = 0,
          NoGil())
      .def(
          "set_recording",
          [](CachingAllocator& a, CapacityArg capacity, Device device) { a.set_recording(device, capacity); },
          py::arg("capacity"), py::arg("device") = 0, NoGil(),
          "Records every event of `device` into a ring of `capacity` 64-byte records (0 = off).")
      .def(
          "trace",
          [](CachingAllocator& a, Device device) {
            uint64_t dropped = 0;
            std::vector<TraceRecord> records;
            {
              py::gil_scoped_release nogil;
              records = a.with_profiler(device, [&](Profiler& p) { return p.records(&dropped); });
            }
            py::bytes raw(reinterpret_cast<const char*>(records.data()), records.size() * sizeof(TraceRecord));
            return py::make_tuple(raw, dropped);
          },
          py::arg("device") = 0, "(records as bytes, 64 per record; dropped count), oldest first.");

  bind_host(allocator_class);
  bind_breakdown(allocator_class);
  bind_flight(m, allocator_class);
  {  // the one definition of the breakdown's names (breakdown.h), in value order
    py::list categories, phases;
    for (int c = 0; c < kNumCategories; ++c) categories.append(category_name(c));
    for (int p = 0; p < kNumPhases; ++p) phases.append(phase_name(p));
    m.attr("CATEGORIES") = py::tuple(categories);
    m.attr("PHASES") = py::tuple(phases);
  }
  // The wire formats, defined once here from the C++ structs: the 64-byte
  // record (recorder.h) and a live block as Allocator.live_blocks packs it
  // (device_allocator.h), each as (field, byte offset, bytes, signed) in
  // memory order; memalloc/trace/recording.py and sites.py build their formats
  // from them.
#define MEMALLOC_FIELD(T, f) py::make_tuple(#f, offsetof(T, f), sizeof(T::f), std::is_signed<decltype(T::f)>::value)
  m.attr("RECORD_FIELDS") = py::make_tuple(MEMALLOC_FIELD(TraceRecord, time_ns), MEMALLOC_FIELD(TraceRecord, addr),
                                           MEMALLOC_FIELD(TraceRecord, size), MEMALLOC_FIELD(TraceRecord, requested),
                                           MEMALLOC_FIELD(TraceRecord, stream), MEMALLOC_FIELD(TraceRecord, stack_id),
                                           MEMALLOC_FIELD(TraceRecord, tag_id), MEMALLOC_FIELD(TraceRecord, thread),
                                           MEMALLOC_FIELD(TraceRecord, step), MEMALLOC_FIELD(TraceRecord, action),
                                           MEMALLOC_FIELD(TraceRecord, device), MEMALLOC_FIELD(TraceRecord, pool));
  m.attr("RECORD_BYTES") = sizeof(TraceRecord);
  m.attr("LIVE_FIELDS") = py::make_tuple(MEMALLOC_FIELD(LiveBlock, addr), MEMALLOC_FIELD(LiveBlock, size),
                                         MEMALLOC_FIELD(LiveBlock, requested), MEMALLOC_FIELD(LiveBlock, stack_id),
                                         MEMALLOC_FIELD(LiveBlock, tag_id), MEMALLOC_FIELD(LiveBlock, step));
  m.attr("LIVE_BYTES") = sizeof(LiveBlock);
#undef MEMALLOC_FIELD
  bind_attribution(m);
  bind_testing(m);

  // ---- torch's CUDA allocator (builds against a CUDA torch only) -------------
#ifdef MEMALLOC_WITH_TORCH_CUDA
  m.attr("has_torch_cuda") = true;
  m.def(
      "install_torch_cuda", [](AllocatorPtr a) { install_torch_cuda_allocator(a); }, py::arg("allocator"),
      "Makes `allocator` (cuda backend) torch's CUDA allocator: a subclass of torch's "
      "CUDAPluggableAllocator. Before CUDA is initialised; once per process.");
#else
  m.attr("has_torch_cuda") = false;
#endif

  m.def("install", [](AllocatorPtr a) { AllocatorRegistry::instance().install(std::move(a)); });
  m.def("installed", [] { return AllocatorRegistry::instance().installed_shared(); });
  m.def("hook_addresses", [] {
    py::dict d;
    d["alloc"] = fn_addr(reinterpret_cast<void*>(&memalloc_alloc));
    d["free"] = fn_addr(reinterpret_cast<void*>(&memalloc_free));
    d["init"] = fn_addr(reinterpret_cast<void*>(&memalloc_init));
    d["reset"] = fn_addr(reinterpret_cast<void*>(&memalloc_reset));
    d["memory_fraction"] = fn_addr(reinterpret_cast<void*>(&memalloc_memory_fraction));
    d["record_stream"] = fn_addr(reinterpret_cast<void*>(&memalloc_record_stream));
    return d;
  });
}
