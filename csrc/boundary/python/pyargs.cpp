// pyargs.cpp — the conversions behind the typed arguments of memalloc._C
// (see pyargs.h for the invariants). Every function runs with the GIL held,
// returns the C++ value or throws: py::type_error for a wrong type,
// memalloc::InvalidArgument for a value out of range. Nothing here is on an
// allocation path that torch drives.
#include "boundary/python/pyargs.h"

#include <climits>

#include "common/errors.h"
#include "process/registry.h"

namespace memalloc::pyargs {
namespace {

std::string type_name(py::handle src) { return Py_TYPE(src.ptr())->tp_name; }

[[noreturn]] void wrong_type(py::handle src, const char* name, const char* what) {
  throw py::type_error(std::string(name) + " must be " + what + ", not " + type_name(src));
}

// src as a Python int: anything with __index__ except bool.
py::int_ as_int(py::handle src, const char* name, const char* what) {
  if (PyBool_Check(src.ptr()) || !PyIndex_Check(src.ptr())) wrong_type(src, name, what);
  PyObject* i = PyNumber_Index(src.ptr());
  if (i == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::int_>(i);
}

}  // namespace

uint64_t load_uint(py::handle src, const UIntSpec& spec) {
  const py::int_ i = as_int(src, spec.name, spec.what);
  MEMALLOC_EXPECTS(i >= py::int_(0), std::string("negative ") + spec.quantity + " " + std::string(py::repr(i)) +
                                         spec.unit + ": " + spec.name + " must be " + spec.what);
  MEMALLOC_EXPECTS(i <= py::int_(spec.max), std::string(spec.quantity) + " " + std::string(py::repr(i)) + spec.unit +
                                                " is too large: " + spec.name + " must be at most " +
                                                std::to_string(spec.max) + spec.unit);
  return i.cast<uint64_t>();
}

int load_device(py::handle src) {
  const py::int_ i = as_int(src, "device", "an int (a device index)");
  // Indices that fit an int go on to the allocator, which names its devices.
  MEMALLOC_EXPECTS(i >= py::int_(INT_MIN) && i <= py::int_(INT_MAX),
                   "device " + std::string(py::repr(i)) +
                       " does not exist: device indices run from 0 to the allocator's device_count - 1");
  return i.cast<int>();
}

double load_real(py::handle src, const RealSpec& spec) {
  PyNumberMethods* number = Py_TYPE(src.ptr())->tp_as_number;
  const bool real =
      PyFloat_Check(src.ptr()) || PyIndex_Check(src.ptr()) || (number != nullptr && number->nb_float != nullptr);
  if (PyBool_Check(src.ptr()) || !real) wrong_type(src, spec.name, spec.what);
  const double v = PyFloat_AsDouble(src.ptr());
  if (v == -1.0 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

std::string load_text(py::handle src, const TextSpec& spec) {
  if (!PyUnicode_Check(src.ptr())) wrong_type(src, spec.name, spec.what);
  return src.cast<std::string>();
}

bool load_flag(py::handle src, const FlagSpec& spec) {
  if (!PyBool_Check(src.ptr())) wrong_type(src, spec.name, spec.what);
  return src.ptr() == Py_True;
}

std::shared_ptr<CachingAllocator> load_allocator(py::handle src) {
  py::detail::copyable_holder_caster<CachingAllocator, std::shared_ptr<CachingAllocator>> holder;
  if (src.is_none() || !holder.load(src, /*convert=*/false)) {
    wrong_type(src, "allocator", "a memalloc._C.Allocator");
  }
  return static_cast<std::shared_ptr<CachingAllocator>>(holder);
}

}  // namespace memalloc::pyargs
