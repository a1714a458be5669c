// messages.cpp — the allocator's error messages (messages.h). Invariants:
// none beyond messages.h's; nothing here touches allocator state.
#include "allocator/messages.h"

#include <cstdio>

namespace memalloc {

std::string format_bytes(size_t bytes) {
  char buf[64];
  const double b = static_cast<double>(bytes);
  if (bytes < 1024)
    std::snprintf(buf, sizeof buf, "%zu bytes", bytes);
  else if (bytes < (size_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024);
  else if (bytes < (size_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1 << 20));
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
  return buf;
}

std::string hex_address(std::uintptr_t addr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(addr));
  return buf;
}

std::string oom_message(Backend& backend, int device, const DeviceStats& s, const Limits& limits, bool expandable,
                        size_t requested, size_t rounded) {
  const auto allocated = static_cast<size_t>(s.allocated_bytes[kStatAll].current);
  const auto reserved = static_cast<size_t>(s.reserved_bytes[kStatAll].current);
  const MemInfo info = backend.mem_get_info(device);
  const bool cuda = std::string(backend.name()) == "cuda";
  std::string dev = (cuda ? "GPU " : "Host-backend device ") + std::to_string(device);
  std::string msg = std::string(cuda ? "CUDA" : "Device") + " out of memory. Tried to allocate " +
                    format_bytes(rounded > kMaxRequest ? requested : rounded) + ". " + dev +
                    " has a total capacity of " + format_bytes(info.total) + " of which " + format_bytes(info.free) +
                    " is free. ";
  if (limits.has_fraction()) {
    msg += "This process has a memory fraction limit of " + format_bytes(limits.cap()) + " (fraction " +
           std::to_string(limits.fraction()) + "). ";
  }
  msg += "Of the allocated memory " + format_bytes(allocated) + " is allocated by PyTorch, and " +
         format_bytes(reserved - allocated) + " is reserved by PyTorch but unallocated. ";
  msg += expandable ? "(memalloc, expandable segments: free pages were given back before this error)"
                    : "If reserved but unallocated memory is large try setting "
                      "MEMALLOC_CONF=expandable_segments:True to avoid fragmentation. (memalloc)";
  return msg;
}

std::string unknown_pointer_message(const char* call, std::uintptr_t addr, int device, bool inside) {
  const bool is_free = std::string(call) == "free";
  const std::string head =
      std::string(call) + " of " + hex_address(addr) + " on device " + std::to_string(device) + ": ";
  if (inside) {
    return head + "no live allocation starts there. It lies inside a memalloc segment, so it was already freed" +
           (is_free ? " (double free)" : "") + " or is not a pointer that malloc returned; " +
           (is_free ? std::string("free each pointer exactly once")
                    : "call " + std::string(call) + " only on live allocations, before freeing them");
  }
  return head + "unknown pointer, not allocated by memalloc on this device; " +
         (is_free ? std::string("free only") : "call " + std::string(call) + " only on") +
         " pointers that memalloc's malloc returned, on the device they came from";
}

}  // namespace memalloc
