// pyargs.h — typed arguments of memalloc._C: pybind11 type casters that turn
// one Python argument into a C++ value, or raise an error that names the
// argument, what was wrong and what it must be.
//
// A binding declares its parameters with these types instead of int / size_t
// / double / std::string / bool (e.g. `[](CachingAllocator& a, SizeArg size, Device
// device, StreamArg stream)`); the values convert implicitly to the plain
// types the core takes.
//
// Invariants:
//   * A wrong type raises TypeError "<name> must be <what>, not <type>";
//     a value out of range raises memalloc.errors.InvalidArgumentError (a
//     ValueError) naming the value. pybind11's "incompatible function
//     arguments" list of C++ signatures is never what a caller sees.
//   * bool is never a number here: True is not size 1, device 1 or
//     fraction 1.0. Integers are anything with __index__ (int, numpy ints);
//     real numbers are int, float and anything with __float__ (not str);
//     a flag is True or False, nothing else.
//   * A valid argument costs a type check and a range comparison; messages
//     are built only on failure (MEMALLOC_EXPECTS).
//   * Conversion runs while pybind11 loads the arguments, with the GIL held
//     and before any call guard releases it; it never touches an allocator,
//     so a rejected call changes nothing.
//   * Only the Python-facing bindings (bindings.cpp) use these types. The
//     entry points torch calls for every allocation (pluggable.cpp) take
//     plain C values and never come here.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "common/config.h"
#include "profiler/recorder.h"

namespace memalloc {
class CachingAllocator;  // registry.h
}  // namespace memalloc

namespace memalloc::pyargs {

namespace py = pybind11;

// An unsigned integer argument. Messages read
//   TypeError:  "<name> must be <what>, not <type>"
//   negative:   "negative <quantity> <value><unit>: <name> must be <what>"
//   too large:  "<quantity> <value><unit> is too large: <name> must be at most <max><unit>"
// (quantity is what the number counts, e.g. "size" for the argument nbytes).
struct UIntSpec {
  const char* name;
  const char* quantity;
  const char* unit;  // "" or " bytes", " records"...
  const char* what;
  uint64_t max;
};

// A real-number argument; its range is checked by the core.
struct RealSpec {
  const char* name;
  const char* what;
};

// A str argument.
struct TextSpec {
  const char* name;
  const char* what;
};

// A bool argument: True or False only (not 0/1, not None).
struct FlagSpec {
  const char* name;
  const char* what;
};

// Sizes are int64 in torch; a larger request is a caller error, not an OOM.
constexpr uint64_t kMaxBytes = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

inline constexpr UIntSpec kSize{"size", "size", " bytes", "an int >= 0 (bytes)", kMaxBytes};
inline constexpr UIntSpec kNBytes{"nbytes", "size", " bytes", "an int > 0 (bytes)", kMaxBytes};
inline constexpr UIntSpec kPtr{"ptr", "ptr", "", "an address that malloc returned (an int >= 0)",
                               std::numeric_limits<std::uintptr_t>::max()};
inline constexpr UIntSpec kStream{"stream", "stream", "", "a stream handle, an int >= 0 (0 = the default stream)",
                                  std::numeric_limits<std::uintptr_t>::max()};
inline constexpr UIntSpec kCapacity{"capacity", "capacity", " records", "an int >= 0 (records per device; 0 = off)",
                                    kMaxTraceRecords};
inline constexpr UIntSpec kSkip{"skip", "skip", "", "an int >= 0 (successful calls to let through first)",
                                std::numeric_limits<size_t>::max()};
inline constexpr UIntSpec kCount{"count", "count", "", "an int >= 0 (calls to fail)",
                                 std::numeric_limits<size_t>::max()};
inline constexpr UIntSpec kSeed{"seed", "seed", "", "an int >= 0 (a random seed)",
                                std::numeric_limits<uint64_t>::max()};
inline constexpr UIntSpec kOffset{"offset", "offset", " bytes", "an int >= 0 (bytes into the file)", kMaxBytes};
inline constexpr UIntSpec kFileBytes{"nbytes", "size", " bytes", "an int > 0 (the file's bytes)", kMaxBytes};

inline constexpr RealSpec kFraction{"fraction", "a float in [0, 1] (a share of the device's memory)"};
inline constexpr RealSpec kThreshold{"threshold", "a float in [0, 1) (a share of the limit; 0 = off)"};
inline constexpr RealSpec kAllocateRate{"allocate_rate", "a float in [0, 1] (a probability)"};
inline constexpr RealSpec kReleaseRate{"release_rate", "a float in [0, 1] (a probability)"};

inline constexpr TextSpec kBackend{"backend", "a str, 'cuda' or 'host'"};
inline constexpr TextSpec kConfig{"config", "a 'key:value,...' str (MEMALLOC_CONF syntax)"};
inline constexpr TextSpec kConfigText{"text", "a 'key:value,...' str (MEMALLOC_CONF syntax)"};
inline constexpr TextSpec kPath{"path", "a str (a file path)"};

inline constexpr FlagSpec kUseOnOom{"use_on_oom", "a bool"};
inline constexpr FlagSpec kDriverError{"driver_error", "a bool (True: fail with DriverError, False: as out of memory)"};

// The conversions (pyargs.cpp). GIL held; they throw py::type_error or
// memalloc::InvalidArgument.
uint64_t load_uint(py::handle src, const UIntSpec& spec);
int load_device(py::handle src);
double load_real(py::handle src, const RealSpec& spec);
std::string load_text(py::handle src, const TextSpec& spec);
bool load_flag(py::handle src, const FlagSpec& spec);
std::shared_ptr<CachingAllocator> load_allocator(py::handle src);

// Each argument type: its value, the name signatures show (kPyName) and
// from_python(), the conversion. They only come from Python: never returned.
template <const UIntSpec& S>
struct UInt {
  static constexpr char kPyName[] = "int";
  static UInt from_python(py::handle src) { return {load_uint(src, S)}; }
  uint64_t value = 0;
  operator uint64_t() const { return value; }  // NOLINT: stands for the plain value
};

template <const RealSpec& S>
struct Real {
  static constexpr char kPyName[] = "float";
  static Real from_python(py::handle src) { return {load_real(src, S)}; }
  double value = 0.0;
  operator double() const { return value; }  // NOLINT
};

template <const TextSpec& S>
struct Text {
  static constexpr char kPyName[] = "str";
  static Text from_python(py::handle src) { return {load_text(src, S)}; }
  std::string value;
  operator const std::string&() const { return value; }  // NOLINT
};

template <const FlagSpec& S>
struct Flag {
  static constexpr char kPyName[] = "bool";
  static Flag from_python(py::handle src) { return {load_flag(src, S)}; }
  bool value = false;
  operator bool() const { return value; }  // NOLINT
};

// A device index: an int; one beyond the C int range does not exist.
struct Device {
  static constexpr char kPyName[] = "int";
  static Device from_python(py::handle src) { return {load_device(src)}; }
  int index = 0;
  operator int() const { return index; }  // NOLINT
};

// The allocator as an argument (the functions of memalloc._C._testing take it
// first): a memalloc._C.Allocator, not None.
struct AllocatorArg {
  static constexpr char kPyName[] = "memalloc._C.Allocator";
  static AllocatorArg from_python(py::handle src) { return {load_allocator(src)}; }
  std::shared_ptr<CachingAllocator> allocator;
  operator CachingAllocator&() const { return *allocator; }  // NOLINT
  CachingAllocator* operator->() const { return allocator.get(); }
};

using SizeArg = UInt<kSize>;
using NBytesArg = UInt<kNBytes>;
using PtrArg = UInt<kPtr>;
using StreamArg = UInt<kStream>;
using CapacityArg = UInt<kCapacity>;
using SkipArg = UInt<kSkip>;
using CountArg = UInt<kCount>;
using SeedArg = UInt<kSeed>;
using OffsetArg = UInt<kOffset>;
using FileBytesArg = UInt<kFileBytes>;
using PathArg = Text<kPath>;
using FractionArg = Real<kFraction>;
using ThresholdArg = Real<kThreshold>;
using AllocateRateArg = Real<kAllocateRate>;
using ReleaseRateArg = Real<kReleaseRate>;
using BackendArg = Text<kBackend>;
using ConfigArg = Text<kConfig>;
using ConfigTextArg = Text<kConfigText>;
using DriverErrorArg = Flag<kDriverError>;
using UseOnOomArg = Flag<kUseOnOom>;

}  // namespace memalloc::pyargs

namespace pybind11::detail {

// The one caster of every argument type above.
template <typename T>
struct memalloc_arg_caster {
  PYBIND11_TYPE_CASTER(T, const_name(T::kPyName));
  bool load(handle src, bool /*convert*/) {
    value = T::from_python(src);  // throws instead of returning false: the error names the argument
    return true;
  }
};

template <const memalloc::pyargs::UIntSpec& S>
struct type_caster<memalloc::pyargs::UInt<S>> : memalloc_arg_caster<memalloc::pyargs::UInt<S>> {};
template <const memalloc::pyargs::RealSpec& S>
struct type_caster<memalloc::pyargs::Real<S>> : memalloc_arg_caster<memalloc::pyargs::Real<S>> {};
template <const memalloc::pyargs::TextSpec& S>
struct type_caster<memalloc::pyargs::Text<S>> : memalloc_arg_caster<memalloc::pyargs::Text<S>> {};
template <const memalloc::pyargs::FlagSpec& S>
struct type_caster<memalloc::pyargs::Flag<S>> : memalloc_arg_caster<memalloc::pyargs::Flag<S>> {};
template <>
struct type_caster<memalloc::pyargs::Device> : memalloc_arg_caster<memalloc::pyargs::Device> {};
template <>
struct type_caster<memalloc::pyargs::AllocatorArg> : memalloc_arg_caster<memalloc::pyargs::AllocatorArg> {};

}  // namespace pybind11::detail
