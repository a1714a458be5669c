// flight_map.h — a file mapped MAP_SHARED, the storage of the flight
// recorder (memalloc/features/flight.py writes the file, memalloc/trace/flight_files.py
// lays it out and reads it back):
// what is written into the mapping is in the kernel's page cache, so it
// survives the writer's SIGKILL, segfault or abort (not a host crash).
//
// Invariants:
//   * data() points at size() mapped, writable bytes for the object's whole
//     life; the mapping is undone only in the destructor, so whoever may
//     still write into it (a TraceRing attached to it) holds a shared_ptr.
//   * create() makes a new file (never reuses one: O_EXCL) and sizes it
//     before mapping it; on any failure it throws, naming the path and the
//     system's reason, and leaves no file behind.
//   * Writing into the mapping makes no system call; nothing here runs on
//     the malloc/free path but the ring's stores into data().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace memalloc {

class FlightMapping {
 public:
  static std::shared_ptr<FlightMapping> create(const std::string& path, size_t bytes);
  ~FlightMapping();
  FlightMapping(const FlightMapping&) = delete;
  FlightMapping& operator=(const FlightMapping&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  FlightMapping(std::string path, uint8_t* data, size_t size, int fd)
      : path_(std::move(path)), data_(data), size_(size), fd_(fd) {}
  std::string path_;
  uint8_t* data_;
  size_t size_;
  int fd_;
};

}  // namespace memalloc
