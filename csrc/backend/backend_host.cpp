// backend_host.cpp — a simulated device for tests, replay and the CPU demo.
//
// Invariants (per device d):
//   used[d] == sum of sizes of live segments[d]  <=  capacity
//   For every stream s: completed[s] <= submitted[s]; an event recorded on
//   s holds ticket t = ++submitted[s] and is complete iff completed[s] >= t.
//   Work on a simulated stream never completes by itself: only
//   synchronize_event / synchronize_stream advance `completed`. That makes
//   cross-stream tests deterministic (no timing, no sleeps).
//   All state is guarded by one mutex: the host backend serves every device.
//   Injected faults (tests) fail a call before it touches any state, so a
//   failed allocate obtains nothing and a failed release keeps the segment.
//   Addresses are deterministic: each device reserves one range of address
//   space (4 x capacity rounded up to 2 MiB, so that freed runs between live
//   segments never make a request within capacity fail; PROT_NONE, no
//   memory committed) on
//   its first allocation, and a segment takes the lowest free run of pages
//   that fits (first fit, like cudaMalloc's increasing addresses), made
//   readable and writable while it lives and given back (MADV_DONTNEED,
//   PROT_NONE) when released. So the same calls give the same addresses in
//   every run, and so do the allocator's best-fit ties (lowest address):
//   a replay's figures repeat to the byte. free_ranges of a device tile the
//   reserved range minus the live segments (or, in the vm range, minus the
//   vm reservations), coalesced.
//   Virtual memory: a vm reservation is a run of a second range of the
//   device (kVmFactor x capacity, so reservations never take the segments'
//   address space); its pages are committed (mprotect) and counted in
//   used[d] only while mapped:
//   used[d] == live segment bytes + the bytes of the mapped vm pages + the
//   bytes of the spare pages (vm_detach kept them; spares[d]: their count
//   per page size; vm_map takes them before it commits any more).
//   vm_calls[d] counts the driver calls backend_cuda.cpp would have made,
//   the stream synchronisations, and the waits for a range vm_detach took
//   (pending[d], until its stream's work completes) before it is mapped or
//   freed again.
//   Simulated graph capture (tests): node k (k >= 1, its handle the integer
//   k) depends only on nodes < k; a stream is in at most one capture, and
//   its frontier names nodes of that capture only.
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <map>
#include <random>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "common/errors.h"
#include "backend/vm_reservations.h"

namespace memalloc {

namespace {
constexpr size_t kPage = size_t{4} << 10;  // mprotect granularity
constexpr size_t kReserveRound = size_t{2} << 20;
constexpr size_t kReserveFactor = 4;                // address space per byte of capacity
constexpr size_t kVmGranularity = size_t{2} << 20;  // as CUDA's usual one
constexpr size_t kVmFactor = 8;                     // vm address space per byte of capacity

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// One device's address space: a reserved range and its free runs
// (offset -> length, coalesced, in address order).
struct AddressSpace {
  char* base = nullptr;
  size_t size = 0;
  std::map<size_t, size_t> free_ranges;

  // Reserves the range on first use; throws DriverError when the host
  // cannot give that much address space.
  void reserve(int device, size_t capacity, size_t factor = kReserveFactor) {
    if (base != nullptr) return;
    size = round_up(capacity, kReserveRound) * factor;
    void* p = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      throw DriverError("host backend: cannot reserve " + std::to_string(size) +
                        " bytes of address space for "
                        "device " +
                        std::to_string(device) + ": lower host_capacity_mb");
    base = static_cast<char*>(p);
    free_ranges.emplace(0, size);
  }
  // The lowest free run of `n` bytes (a multiple of kPage), or nullptr.
  char* take(size_t n) {
    for (auto it = free_ranges.begin(); it != free_ranges.end(); ++it) {
      if (it->second < n) continue;
      const size_t off = it->first, len = it->second;
      free_ranges.erase(it);
      if (len > n) free_ranges.emplace(off + n, len - n);
      return base + off;
    }
    return nullptr;
  }
  // Gives back [p, p + n), merging with its free neighbours.
  void give_back(char* p, size_t n) {
    size_t off = static_cast<size_t>(p - base), len = n;
    auto next = free_ranges.lower_bound(off);
    if (next != free_ranges.end() && off + len == next->first) {
      len += next->second;
      next = free_ranges.erase(next);
    }
    if (next != free_ranges.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == off) {
        prev->second += len;
        return;
      }
    }
    free_ranges.emplace(off, len);
  }
  ~AddressSpace() {
    if (base != nullptr) ::munmap(base, size);
  }
};

struct HostEvent {
  int device = 0;
  Stream stream = 0;
  uint64_t ticket = 0;  // 0 = never recorded: complete
};

struct StreamClock {
  uint64_t submitted = 0;
  uint64_t completed = 0;
};

// One device's simulated graph captures (tests).
struct Captures {
  uint64_t next_id = 0;
  std::map<Stream, uint64_t> capture_of;              // captured stream -> its capture id
  std::map<Stream, std::vector<GraphNode>> frontier;  // captured stream -> its frontier
  std::vector<std::vector<GraphNode>> dependencies;   // [k - 1]: node k's dependencies

  static GraphNode handle(size_t k) { return reinterpret_cast<GraphNode>(static_cast<std::uintptr_t>(k)); }
  static size_t index(GraphNode n) { return static_cast<size_t>(reinterpret_cast<std::uintptr_t>(n)); }
};

// Injected faults of one device (tests only; all zero by default).
struct Faults {
  size_t alloc_skip = 0, alloc_count = 0;
  bool alloc_driver_error = false;
  size_t release_skip = 0, release_count = 0;
  double alloc_rate = 0.0, release_rate = 0.0;
  std::mt19937_64 rng;
  size_t alloc_injected = 0, release_injected = 0;

  // Consumes one scheduled or random fault; true when this call must fail.
  static bool take(size_t& skip, size_t& count, double rate, std::mt19937_64& rng) {
    if (count > 0) {
      if (skip > 0) {
        --skip;
        return false;
      }
      --count;
      return true;
    }
    return rate > 0.0 && std::uniform_real_distribution<double>(0.0, 1.0)(rng) < rate;
  }
};
}  // namespace

struct HostBackend::State {
  std::mutex mu;
  size_t capacity = 0;
  std::vector<size_t> used;
  std::vector<std::unordered_map<void*, size_t>> segments;
  std::vector<AddressSpace> spaces;            // segments
  std::vector<AddressSpace> vm_spaces;         // vm reservations
  VmReservations<unsigned char> reservations;  // a page is 1 while mapped
  std::vector<std::map<Stream, StreamClock>> streams;
  std::vector<Faults> faults;
  std::vector<HostBackend::VmCalls> vm_calls;
  std::vector<std::map<size_t, size_t>> spares;  // per device: page size -> spare pages
  // Per device, the ranges vm_detach took while work was queued on their
  // stream: CUDA unmaps them once that work is done (the ticket completed),
  // and waits for it before mapping or freeing them again.
  struct Pending {
    std::uintptr_t addr;
    size_t bytes;
    Stream stream;
    uint64_t ticket;
  };
  std::vector<std::vector<Pending>> pending;

  // Takes [addr, addr + bytes) (mapped pages of one of device d's
  // reservations, else InvalidArgument(not_mapped)) out of the books and
  // decommits it: one cuMemUnmap. The caller accounts for the memory.
  // Under mu.
  VmReservations<unsigned char>::Run unmap_pages(int d, void* addr, size_t bytes, const char* not_mapped) {
    const auto pages = reservations.run(d, addr, bytes);
    pages.expect(true, not_mapped);
    ::madvise(addr, bytes, MADV_DONTNEED);
    ::mprotect(addr, bytes, PROT_NONE);
    for (size_t k = 0; k < pages.n; ++k) pages[k] = 0;
    vm_calls[d].unmap += 1;
    return pages;
  }

  // Forgets device d's pending ranges whose work is done, after completing
  // (a wait, counted) the work of those overlapping [lo, hi). Under mu.
  void settle(int d, std::uintptr_t lo, std::uintptr_t hi) {
    auto& list = pending[d];
    for (size_t i = 0; i < list.size();) {
      StreamClock& clock = streams[d][list[i].stream];
      if (clock.completed < list[i].ticket && list[i].addr < hi && lo < list[i].addr + list[i].bytes) {
        clock.completed = list[i].ticket;
        vm_calls[d].waits += 1;
      }
      if (clock.completed >= list[i].ticket) {
        list[i] = list.back();
        list.pop_back();
      } else {
        ++i;
      }
    }
  }
  std::vector<Captures> captures;

  void check_device(int device) const {
    MEMALLOC_EXPECTS(device >= 0 && device < static_cast<int>(used.size()),
                     "device " + std::to_string(device) +
                         " does not exist: the host backend "
                         "simulates " +
                         std::to_string(used.size()) + " device(s); set host_devices in the config for more");
  }
};

HostBackend::HostBackend(const Config& config) : state_(new State) {
  state_->capacity = config.host_capacity;
  state_->used.assign(config.host_devices, 0);
  state_->segments.resize(config.host_devices);
  state_->spaces.resize(config.host_devices);
  state_->vm_spaces.resize(config.host_devices);
  state_->streams.resize(config.host_devices);
  state_->faults.resize(config.host_devices);
  state_->vm_calls.resize(config.host_devices);
  state_->spares.resize(config.host_devices);
  state_->pending.resize(config.host_devices);
  state_->captures.resize(config.host_devices);
}

HostBackend::~HostBackend() = default;  // each AddressSpace unmaps its whole range

int HostBackend::device_count() const { return static_cast<int>(state_->used.size()); }

void* HostBackend::allocate(int device, size_t size) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  Faults& f = state_->faults[device];
  if (Faults::take(f.alloc_skip, f.alloc_count, f.alloc_rate, f.rng)) {
    ++f.alloc_injected;
    if (f.alloc_driver_error) throw DriverError("host backend: injected device error on allocate");
    return nullptr;
  }
  if (size > state_->capacity - state_->used[device]) return nullptr;
  AddressSpace& space = state_->spaces[device];
  space.reserve(device, state_->capacity);
  const size_t rounded = round_up(size, kPage);
  char* p = space.take(rounded);
  if (p == nullptr) return nullptr;  // within capacity but no run that long (pages of freed segments)
  if (::mprotect(p, rounded, PROT_READ | PROT_WRITE) != 0) {
    space.give_back(p, rounded);
    throw DriverError("host backend: the host itself is out of memory");
  }
  state_->used[device] += size;
  state_->segments[device].emplace(p, size);
  return p;
}

bool HostBackend::release(int device, void* ptr, size_t size) noexcept {
  std::lock_guard<std::mutex> g(state_->mu);
  if (device < 0 || device >= static_cast<int>(state_->used.size())) return false;
  auto it = state_->segments[device].find(ptr);
  if (it == state_->segments[device].end() || it->second != size) return false;
  Faults& f = state_->faults[device];
  if (Faults::take(f.release_skip, f.release_count, f.release_rate, f.rng)) {
    ++f.release_injected;
    return false;
  }
  state_->used[device] -= size;
  state_->segments[device].erase(it);
  const size_t rounded = round_up(size, kPage);
  ::madvise(ptr, rounded, MADV_DONTNEED);  // the pages go back to the host
  ::mprotect(ptr, rounded, PROT_NONE);
  state_->spaces[device].give_back(static_cast<char*>(ptr), rounded);
  return true;
}

size_t HostBackend::vm_page_size(int device) {
  state_->check_device(device);
  return kVmGranularity;
}

void* HostBackend::vm_reserve(int device, size_t bytes, size_t page) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  VmReservations<unsigned char>::check_reserve(bytes, page, kVmGranularity);
  AddressSpace& space = state_->vm_spaces[device];
  space.reserve(device, state_->capacity, kVmFactor);
  char* p = space.take(bytes);
  if (p == nullptr) return nullptr;
  state_->reservations.add(device, reinterpret_cast<std::uintptr_t>(p), bytes, page);
  return p;
}

bool HostBackend::vm_map(int device, void* addr, size_t bytes) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  const auto pages = state_->reservations.run(device, addr, bytes);
  pages.expect(false, "vm_map: a page of the range is already mapped");
  Faults& f = state_->faults[device];
  if (Faults::take(f.alloc_skip, f.alloc_count, f.alloc_rate, f.rng)) {
    ++f.alloc_injected;
    if (f.alloc_driver_error) throw DriverError("host backend: injected device error on vm_map");
    return false;
  }
  const auto lo = reinterpret_cast<std::uintptr_t>(addr);
  state_->settle(device, lo, lo + bytes);
  VmCalls& calls = state_->vm_calls[device];
  size_t& spare = state_->spares[device][pages.page];
  const size_t reused = std::min(spare, pages.n), fresh = (pages.n - reused) * pages.page;
  if (fresh > state_->capacity - state_->used[device]) {
    // CUDA maps the spare pages, then creates and maps page after page until
    // one does not fit, then undoes them (the spare pages stay spare)
    const size_t fit = (state_->capacity - state_->used[device]) / pages.page;
    calls.create += fit + 1;
    calls.map += reused + fit;
    calls.unmap += reused + fit;
    calls.release += fit;
    return false;
  }
  if (::mprotect(addr, bytes, PROT_READ | PROT_WRITE) != 0)
    throw DriverError("host backend: the host itself is out of memory");
  for (size_t k = 0; k < pages.n; ++k) pages[k] = 1;
  spare -= reused;
  state_->used[device] += fresh;
  calls.create += pages.n - reused;
  calls.map += pages.n;
  calls.set_access += 1;
  return true;
}

void HostBackend::vm_unmap(int device, void* addr, size_t bytes) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  const auto pages = state_->unmap_pages(device, addr, bytes, "vm_unmap: a page of the range is not mapped");
  state_->used[device] -= bytes;
  state_->vm_calls[device].release += pages.n;
}

void HostBackend::vm_detach(int device, void* addr, size_t bytes, Stream stream) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  // CUDA's cuMemUnmap runs once the stream's work is done (its event: the ticket)
  const auto pages = state_->unmap_pages(device, addr, bytes, "vm_detach: a page of the range is not mapped");
  const uint64_t ticket = ++state_->streams[device][stream].submitted;
  state_->pending[device].push_back({reinterpret_cast<std::uintptr_t>(addr), bytes, stream, ticket});
  state_->spares[device][pages.page] += pages.n;  // their memory stays in use
}

void HostBackend::vm_drop_spares(int device) noexcept {
  std::lock_guard<std::mutex> g(state_->mu);
  if (device < 0 || static_cast<size_t>(device) >= state_->spares.size()) return;
  for (auto& [page, n] : state_->spares[device]) {
    state_->used[device] -= n * page;
    state_->vm_calls[device].release += n;
    n = 0;
  }
}

void HostBackend::vm_free(int device, void* base) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  const size_t bytes = state_->reservations.removable(device, base);
  const auto lo = reinterpret_cast<std::uintptr_t>(base);
  state_->settle(device, lo, lo + bytes);
  state_->vm_spaces[device].give_back(static_cast<char*>(base), bytes);
  state_->reservations.erase(device, base);
}

MemInfo HostBackend::mem_get_info(int device) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  return MemInfo{state_->capacity - state_->used[device], state_->capacity};
}

EventHandle HostBackend::create_event(int device) {
  state_->check_device(device);
  return new HostEvent{device, 0, 0};
}

void HostBackend::destroy_event(int, EventHandle event) noexcept { delete static_cast<HostEvent*>(event); }

void HostBackend::record_event(int device, EventHandle event, Stream stream) {
  std::lock_guard<std::mutex> g(state_->mu);
  auto* e = static_cast<HostEvent*>(event);
  e->device = device;
  e->stream = stream;
  e->ticket = ++state_->streams[device][stream].submitted;
}

bool HostBackend::query_event(int device, EventHandle event) {
  std::lock_guard<std::mutex> g(state_->mu);
  auto* e = static_cast<HostEvent*>(event);
  return e->ticket == 0 || state_->streams[device][e->stream].completed >= e->ticket;
}

void HostBackend::synchronize_event(int device, EventHandle event) {
  std::lock_guard<std::mutex> g(state_->mu);
  auto* e = static_cast<HostEvent*>(event);
  auto& clock = state_->streams[device][e->stream];
  if (clock.completed < e->ticket) clock.completed = e->ticket;
}

void HostBackend::synchronize_stream(int device, Stream stream) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  auto& clock = state_->streams[device][stream];
  clock.completed = clock.submitted;
  state_->vm_calls[device].stream_syncs += 1;
}

bool HostBackend::capture_frontier(int device, Stream stream, uint64_t* capture_id, std::vector<GraphNode>* frontier) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  Captures& c = state_->captures[device];
  frontier->clear();
  auto it = c.capture_of.find(stream);
  if (it == c.capture_of.end()) return false;
  *capture_id = it->second;
  *frontier = c.frontier[stream];
  return true;
}

void HostBackend::graph_dependencies(int device, GraphNode node, std::vector<GraphNode>* out) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  const Captures& c = state_->captures[device];
  const size_t k = Captures::index(node);
  MEMALLOC_EXPECTS(k >= 1 && k <= c.dependencies.size(), "host backend: no graph node " + std::to_string(k));
  const auto& deps = c.dependencies[k - 1];
  out->insert(out->end(), deps.begin(), deps.end());
}

void HostBackend::capture_begin(int device, Stream stream) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  Captures& c = state_->captures[device];
  MEMALLOC_EXPECTS(c.capture_of.count(stream) == 0, "host backend: the stream is already being captured");
  c.capture_of[stream] = ++c.next_id;
  c.frontier[stream].clear();
}

void HostBackend::capture_work(int device, Stream stream) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  Captures& c = state_->captures[device];
  MEMALLOC_EXPECTS(c.capture_of.count(stream) == 1, "host backend: capture_work on a stream not being captured");
  auto& front = c.frontier[stream];
  c.dependencies.push_back(front);
  front.assign(1, Captures::handle(c.dependencies.size()));
}

void HostBackend::capture_wait(int device, Stream waiter, Stream stream) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  Captures& c = state_->captures[device];
  auto from = c.capture_of.find(stream);
  if (from == c.capture_of.end()) return;  // waiting on work outside a capture: no edge
  auto joined = c.capture_of.find(waiter);
  MEMALLOC_EXPECTS(joined == c.capture_of.end() || joined->second == from->second,
                   "host backend: the streams are in different captures");
  c.capture_of[waiter] = from->second;
  auto& front = c.frontier[waiter];
  for (GraphNode n : c.frontier[stream])
    if (std::find(front.begin(), front.end(), n) == front.end()) front.push_back(n);
}

void HostBackend::capture_end(int device, Stream stream) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  Captures& c = state_->captures[device];
  auto it = c.capture_of.find(stream);
  MEMALLOC_EXPECTS(it != c.capture_of.end(), "host backend: capture_end on a stream not being captured");
  const uint64_t id = it->second;
  for (auto s = c.capture_of.begin(); s != c.capture_of.end();) {
    if (s->second == id) {
      c.frontier.erase(s->first);
      s = c.capture_of.erase(s);
    } else {
      ++s;
    }
  }
}

size_t HostBackend::live_segments(int device) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  return state_->segments[device].size();
}

void HostBackend::inject_allocate_faults(int device, size_t skip, size_t count, bool driver_error) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  Faults& f = state_->faults[device];
  f.alloc_skip = skip;
  f.alloc_count = count;
  f.alloc_driver_error = driver_error;
}

void HostBackend::inject_release_faults(int device, size_t skip, size_t count) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  Faults& f = state_->faults[device];
  f.release_skip = skip;
  f.release_count = count;
}

void HostBackend::set_fault_rates(int device, double allocate_rate, double release_rate, uint64_t seed) {
  MEMALLOC_EXPECTS(allocate_rate >= 0.0 && allocate_rate <= 1.0 && release_rate >= 0.0 && release_rate <= 1.0,
                   "fault rates are probabilities in [0, 1]");
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  Faults& f = state_->faults[device];
  f.alloc_rate = allocate_rate;
  f.release_rate = release_rate;
  f.rng.seed(seed);
}

std::pair<size_t, size_t> HostBackend::faults_injected(int device) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  return {state_->faults[device].alloc_injected, state_->faults[device].release_injected};
}

HostBackend::VmCalls HostBackend::vm_calls(int device) {
  std::lock_guard<std::mutex> g(state_->mu);
  state_->check_device(device);
  return state_->vm_calls[device];
}

}  // namespace memalloc
