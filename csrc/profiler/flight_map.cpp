// flight_map.cpp — FlightMapping: a new file, sized, mapped MAP_SHARED
// (invariants in flight_map.h).
#include "profiler/flight_map.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace memalloc {

std::shared_ptr<FlightMapping> FlightMapping::create(const std::string& path, size_t bytes) {
  auto fail = [&](const char* what, int err, int fd) -> std::shared_ptr<FlightMapping> {
    if (fd >= 0) {
      ::close(fd);
      ::unlink(path.c_str());
    }
    throw std::runtime_error(std::string("flight recorder: cannot ") + what + " '" + path + "': " + std::strerror(err));
  };
  if (bytes == 0) throw std::runtime_error("flight recorder: a file of 0 bytes cannot hold a header");
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return fail("create", errno, -1);
  // Blocks reserved now (a full disk fails here, not as a SIGBUS on the
  // malloc path later), pages mapped now (no page fault when the ring writes).
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail("size", errno, fd);
  if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes))) return fail("reserve disk for", err, fd);
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) return fail("map", errno, fd);
  return std::shared_ptr<FlightMapping>(new FlightMapping(path, static_cast<uint8_t*>(p), bytes, fd));
}

FlightMapping::~FlightMapping() {
  ::munmap(data_, size_);
  ::close(fd_);
}

}  // namespace memalloc
