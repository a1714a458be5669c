// vm_reservations.h — a backend's book of virtual-memory reservations
// (backend.h, "Virtual memory"): where each starts, its size, its page size,
// and one value per page (Page{} = unmapped). backend_host.cpp keeps a flag per page,
// backend_cuda.cpp the page's cuMemCreate handle; both check ranges, states
// and frees here, with the same rules and messages.
//
// Invariants:
//   * The reservations of a device never overlap (the address space hands
//     them out); keys are (device, base address).
//   * run() accepts a range only when it lies inside one reservation of that
//     device and is whole pages of it; nothing changes on refusal.
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
  // Pages [first, first + n) of one reservation, of `page` bytes each.
  struct Run {
    std::vector<Page>* pages;
    size_t first, n, page;
    Page& operator[](size_t k) const { return (*pages)[first + k]; }
    // InvalidArgument(message) unless every page's state is `mapped`.
    void expect(bool mapped, const char* message) const {
      for (size_t k = 0; k < n; ++k) MEMALLOC_EXPECTS(((*this)[k] != Page{}) == mapped, message);
    }
  };

  // InvalidArgument unless `page` is a positive multiple of `granularity`
  // and `bytes` a positive multiple of `page`.
  static void check_reserve(size_t bytes, size_t page, size_t granularity) {
    MEMALLOC_EXPECTS(page > 0 && page % granularity == 0,
                     "vm_reserve: the page size must be a positive multiple of the granularity (" +
                         std::to_string(granularity) + " bytes), not " + std::to_string(page));
    MEMALLOC_EXPECTS(
        bytes > 0 && bytes % page == 0,
        "vm_reserve: the size must be a positive multiple of the page size (" + std::to_string(page) + " bytes)");
  }

  void add(int device, std::uintptr_t base, size_t bytes, size_t page) {
    by_base_[{device, base}] = Reservation{bytes, page, std::vector<Page>(bytes / page, Page{})};
  }

  // The pages of [addr, addr + bytes) in the reservation holding it;
  // InvalidArgument naming the problem otherwise.
  Run run(int device, void* addr, size_t bytes) {
    const auto a = reinterpret_cast<std::uintptr_t>(addr);
    auto it = by_base_.upper_bound({device, a});
    MEMALLOC_EXPECTS(it != by_base_.begin(), "vm_map/vm_unmap: the range is in no reservation");
    --it;
    MEMALLOC_EXPECTS(it->first.first == device && a + bytes <= it->first.second + it->second.bytes,
                     "vm_map/vm_unmap: the range is in no reservation");
    const size_t page = it->second.page;
    MEMALLOC_EXPECTS(bytes > 0 && bytes % page == 0 && (a - it->first.second) % page == 0,
                     "vm_map/vm_unmap: address and size must be whole pages of the reservation (" +
                         std::to_string(page) + " bytes)");
    return Run{&it->second.pages, (a - it->first.second) / page, bytes / page, page};
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

  // f(address, page bytes) for every mapped page of `device`'s reservations.
  template <typename F>
  void for_each_mapped(int device, F&& f) const {
    for (const auto& [key, r] : by_base_) {
      if (key.first != device) continue;
      for (size_t k = 0; k < r.pages.size(); ++k)
        if (r.pages[k] != Page{}) f(key.second + k * r.page, r.page);
    }
  }

 private:
  struct Reservation {
    size_t bytes = 0;
    size_t page = 0;
    std::vector<Page> pages;
  };
  std::map<std::pair<int, std::uintptr_t>, Reservation> by_base_;
};

}  // namespace memalloc
