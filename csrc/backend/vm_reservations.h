// vm_reservations.h — a backend's book of virtual-memory reservations
// (backend.h, "Virtual memory"): where each starts, its size, and one value
// per page (Page{} = unmapped). backend_host.cpp keeps a flag per page,
// backend_cuda.cpp the page's cuMemCreate handle; both check ranges, states
// and frees here, with the same rules and messages.
//
// Invariants:
//   * The reservations of a device never overlap (the address space hands
//     them out); keys are (device, base address).
//   * run() accepts a range only when it is page-aligned (checked first) and
//     lies inside one reservation of that device; nothing changes on refusal.
//   * erase() follows removable(), which refuses while a page is mapped.
//   * Not thread-safe: the backend's own lock guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"

namespace memalloc {

template <typename Page>
class VmReservations {
 public:
  // Pages [first, first + n) of one reservation.
  struct Run {
    std::vector<Page>* pages;
    size_t first, n;
    Page& operator[](size_t k) const { return (*pages)[first + k]; }
    // InvalidArgument(message) unless every page's state is `mapped`.
    void expect(bool mapped, const char* message) const {
      for (size_t k = 0; k < n; ++k) MEMALLOC_EXPECTS(((*this)[k] != Page{}) == mapped, message);
    }
  };

  void add(int device, std::uintptr_t base, size_t bytes, size_t page) {
    by_base_[{device, base}] = Reservation{bytes, std::vector<Page>(bytes / page, Page{})};
  }

  // The pages of [addr, addr + bytes) (pages of `page` bytes); InvalidArgument
  // naming the problem otherwise.
  Run run(int device, void* addr, size_t bytes, size_t page) {
    const auto a = reinterpret_cast<std::uintptr_t>(addr);
    MEMALLOC_EXPECTS(bytes > 0 && bytes % page == 0 && a % page == 0,
                     "vm_map/vm_unmap: address and size must be multiples of the page size (" +
                         std::to_string(page) + " bytes)");
    auto it = by_base_.upper_bound({device, a});
    MEMALLOC_EXPECTS(it != by_base_.begin(), "vm_map/vm_unmap: the range is in no reservation");
    --it;
    MEMALLOC_EXPECTS(it->first.first == device && a + bytes <= it->first.second + it->second.bytes,
                     "vm_map/vm_unmap: the range is in no reservation");
    return Run{&it->second.pages, (a - it->first.second) / page, bytes / page};
  }

  // The size of the reservation starting at `base`, which may be erased;
  // InvalidArgument when none starts there or a page of it is mapped.
  size_t removable(int device, void* base) const {
    auto it = by_base_.find({device, reinterpret_cast<std::uintptr_t>(base)});
    MEMALLOC_EXPECTS(it != by_base_.end(), "vm_free: no reservation starts at this address");
    for (const Page& p : it->second.pages)
      MEMALLOC_EXPECTS(p == Page{}, "vm_free: unmap every page of the reservation first");
    return it->second.bytes;
  }
  void erase(int device, void* base) { by_base_.erase({device, reinterpret_cast<std::uintptr_t>(base)}); }

 private:
  struct Reservation {
    size_t bytes = 0;
    std::vector<Page> pages;
  };
  std::map<std::pair<int, std::uintptr_t>, Reservation> by_base_;
};

}  // namespace memalloc
