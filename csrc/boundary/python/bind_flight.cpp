// bind_flight.cpp — Python bindings of the flight recorder's storage:
// memalloc._C.FlightMap (a new file mapped MAP_SHARED, profiler/flight_map.h)
// and Allocator.record_to_file (a device's event ring attached to a region
// of it). memalloc/features/flight.py writes the file, as
// memalloc/trace/flight_files.py lays it out; the ring writes its records and
// sequence numbers there (recorder.h).
//
// Invariants: the ring holds the mapping (a shared_ptr) while attached, so
// the file stays mapped however the Python object ends; a region is
// checked (inside the file, 64-byte aligned) before anything changes.
#include <pybind11/pybind11.h>

#include "process/registry.h"
#include "boundary/python/bind.h"
#include "boundary/python/pyargs.h"
#include "common/errors.h"
#include "profiler/flight_map.h"
#include "profiler/recorder.h"

namespace py = pybind11;

namespace memalloc {

using namespace pyargs;

void bind_flight(py::module_& m, AllocatorClass& cls) {
  py::class_<FlightMapping, std::shared_ptr<FlightMapping>>(m, "FlightMap",
                                                            "A new file of `nbytes` bytes, mapped MAP_SHARED.")
      .def(py::init([](PathArg path, FileBytesArg nbytes) {
             MEMALLOC_EXPECTS(nbytes >= 4096, "nbytes " + std::to_string(static_cast<uint64_t>(nbytes)) +
                                                  " is too small: a flight file holds at least its 4096-byte header");
             return FlightMapping::create(path, nbytes);
           }),
           py::arg("path"), py::arg("nbytes"))
      .def_property_readonly("path", &FlightMapping::path)
      .def_property_readonly("nbytes", &FlightMapping::size)
      .def(
          "buffer",
          [](const std::shared_ptr<FlightMapping>& f) {
            return py::memoryview::from_memory(f->data(), static_cast<py::ssize_t>(f->size()));
          },
          py::keep_alive<0, 1>(), "The mapped bytes, writable (valid while this object lives).");
  cls.def(
      "record_to_file",
      [](CachingAllocator& a, const py::object& file_arg, OffsetArg offset, CapacityArg capacity, Device device) {
        if (!py::isinstance<FlightMapping>(file_arg) || file_arg.is_none())
          throw py::type_error("file must be a memalloc._C.FlightMap, not " +
                               std::string(py::str(py::type::of(file_arg).attr("__name__"))));
        const auto file = file_arg.cast<std::shared_ptr<FlightMapping>>();
        const uint64_t bytes = static_cast<uint64_t>(capacity) * (sizeof(TraceRecord) + sizeof(uint64_t));
        MEMALLOC_EXPECTS(capacity > 0, "capacity must be > 0 records for a flight file");
        MEMALLOC_EXPECTS(offset % 64 == 0,  // (a multiple of alignof(TraceRecord) too)
                         "offset " + std::to_string(static_cast<uint64_t>(offset)) + " must be a multiple of 64");
        MEMALLOC_EXPECTS(offset <= file->size() && bytes <= file->size() - offset,
                         "the ring (" + std::to_string(bytes) + " bytes at offset " +
                             std::to_string(static_cast<uint64_t>(offset)) + ") does not fit in the " +
                             std::to_string(file->size()) + "-byte file " + file->path());
        auto* slots = reinterpret_cast<TraceRecord*>(file->data() + offset);
        auto* seqs = reinterpret_cast<uint64_t*>(file->data() + offset + capacity * sizeof(TraceRecord));
        py::gil_scoped_release nogil;
        a.set_recording_file(device, slots, seqs, capacity, file);
      },
      py::arg("file"), py::arg("offset"), py::arg("capacity"), py::arg("device") = 0,
      "Records every event of `device` into `file`: `capacity` 64-byte records at `offset`, then their "
      "8-byte sequence numbers (0 while a record is written, else its 1-based position).");
}

}  // namespace memalloc
