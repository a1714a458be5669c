// steady_state.cpp — standalone C++17 test of the caching core (no torch,
// no Python): built by tests/cpp/test_cpp_core.py with g++ -std=c++17.
//
// Proves two claims of csrc/: (1) the core is plain C++17 that compiles and
// runs without torch; (2) once warmed up, a repeating allocate/free pattern
// makes no host allocation at all (global operator new is counted).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

#include "process/registry.h"

static std::atomic<long> g_news{0};

void* operator new(std::size_t n) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t a) {
  g_news.fetch_add(1, std::memory_order_relaxed);
  std::size_t al = static_cast<std::size_t>(a);
  if (void* p = std::aligned_alloc(al, (n + al - 1) / al * al)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

using namespace memalloc;

int main() {
  Config config = parse_config("host_capacity_mb:512");
  CachingAllocator alloc(std::unique_ptr<Backend>(new HostBackend(config)), config);
  DeviceAllocator& dev = alloc.device(0);

  // A training-step-like pattern: small and large, two streams, interleaved
  // lifetimes, one record_stream.
  const size_t sizes[] = {512, 4096, 100000, 1 << 20, (1 << 20) + 1, 3 << 20, 9 << 20, 12 << 20, 700, 65536};
  std::vector<void*> live;
  live.reserve(64);
  auto one_round = [&] {
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
      live.push_back(dev.malloc(sizes[i], i % 3 == 0 ? 7 : 0));
      if (i % 4 == 3) {
        dev.free(live.front());
        live.erase(live.begin());
      }
    }
    dev.record_stream(live.back(), 9);
    for (void* p : live) dev.free(p);
    live.clear();
    static_cast<HostBackend&>(alloc.backend()).synchronize_stream(0, 9);
    dev.with_accounting([](Accounting& acc) { return acc.take_window(); });  // the step tracker's read at each boundary
  };
  for (int i = 0; i < 3; ++i) one_round();
  dev.validate();

  const int rounds = 20000;
  long before = g_news.load();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < rounds; ++i) one_round();
  auto t1 = std::chrono::steady_clock::now();
  long news = g_news.load() - before;
  dev.validate();

  DeviceStats s = dev.stats();
  double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / (rounds * 10.0);
  std::printf("rounds=%d allocations=%lld device_allocs=%lld\n", rounds,
              static_cast<long long>(s.allocation[kStatAll].allocated), static_cast<long long>(s.num_device_alloc));
  std::printf("steady_state_operator_new_calls=%ld\n", news);
  std::printf("ns_per_alloc_free_pair=%.1f\n", ns);
  if (s.allocated_bytes[kStatAll].current != 0) {
    std::printf("FAIL: allocated bytes not back to 0\n");
    return 1;
  }
  return news == 0 ? 0 : 2;
}
