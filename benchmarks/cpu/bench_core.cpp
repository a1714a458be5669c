// bench_core.cpp — CPU benchmark of the memalloc caching core on the host
// backend (no torch, no Python, no GPU). Built and driven by
// benchmarks/cpu/suite.py (`python -m benchmarks cpu`); compiled
// with g++ -std=c++17 -O2 -g together with csrc/*.cpp (minus bindings.cpp and
// pluggable.cpp).
//
// Modes (each prints exactly one JSON object on stdout):
//
//   bench_core timing [--repeats R] [--pair-iters N] [--random-ops N]
//                     [--thread-pair-iters N] [--thread-random-ops N]
//                     [--threads T] [--warmup-pairs N]
//       Wall-clock timings, raw values of every repeat (the suite takes the
//       medians):
//       * pair/<size>: one thread, malloc+free of the same size N times
//         (cache hits after the warm-up);
//       * random: the seeded random workload (below), ns per op where one op
//         is one malloc + one free; plus peak reserved / peak allocated;
//       * threads: the same two with T threads all on device 0 (contending on
//         its lock) and with T threads spread over 2 devices (t % 2).
//
//   bench_core callgrind random <ops>
//   bench_core callgrind pair <bytes> <ops>
//       Runs one workload once untimed (warm-up), then once more inside
//       memalloc_bench_measured(): the only function callgrind collects in
//       (valgrind --tool=callgrind --collect-atstart=no
//        --toggle-collect=memalloc_bench_measured). Ir / ops = instructions
//       per op. Why a toggle function and not the client-request macros of
//       <valgrind/callgrind.h>: it needs no valgrind headers at build time
//       (some distributions ship them in a separate -dev package), the binary
//       is byte-identical whether or not valgrind is installed, and the
//       region is exact (no N-vs-2N subtraction whose difference amplifies
//       noise from the unmeasured part). The function is extern "C" (the
//       name is not mangled) and noipa (never inlined or cloned under
//       another name); the suite fails when the region collected nothing.
//
// The random workload: sizes exp(N(11, 3)) bytes (std::lognormal_distribution),
// capped at 512 MiB, at least 1; a window of 64 live blocks; after each
// allocation one of the 65 live blocks (the new one included) is freed,
// chosen uniformly. std::mt19937_64 seeded with 7 (thread t of the threaded
// variants: 7 + t). Sizes and victims are generated before timing.
//
//   bench_core leak-demo
//       Leaks one block on purpose: the self-check must fail (exit 3).
//
// Self-checks: after every benchmark each device must be back to zero
// (allocation / allocated / active / requested bytes), pass validate(), and
// hold no segment after empty_cache() (also according to the backend). On
// any failure the JSON has "ok": false, the failures are listed, and the
// exit status is 3. Bad usage exits 2.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "common/errors.h"
#include "process/registry.h"
#include "profiler/flight_map.h"

using namespace memalloc;

namespace {

constexpr const char* kConfig = "host_capacity_mb:4096,host_devices:2";
constexpr size_t kMaxRandomSize = size_t{512} << 20;
constexpr size_t kWindow = 64;
constexpr uint64_t kSeed = 7;
const size_t kPairSizes[] = {512, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20, size_t{256} << 20};

std::vector<std::string> g_failures;

using Clock = std::chrono::steady_clock;
double ns_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::nano>(b - a).count();
}

struct Bench {
  Config config = parse_config(kConfig);
  CachingAllocator alloc{std::unique_ptr<Backend>(new HostBackend(config)), config};
};

// Every device back to zero, consistent, and empty after empty_cache().
void check_clean(Bench& b, const std::string& what) {
  for (int d = 0; d < b.alloc.device_count(); ++d) {
    DeviceAllocator& dev = b.alloc.device(d);
    const std::string where = what + " (device " + std::to_string(d) + ")";
    try {
      dev.validate();
    } catch (const std::exception& e) {
      g_failures.push_back(where + ": validate() failed: " + e.what());
    }
    DeviceStats s = dev.stats();
    struct {
      const char* name;
      int64_t value;
    } must_be_zero[] = {
        {"allocation.current", s.allocation[kStatAll].current},
        {"allocated_bytes.current", s.allocated_bytes[kStatAll].current},
        {"active.current", s.active[kStatAll].current},
        {"active_bytes.current", s.active_bytes[kStatAll].current},
        {"requested_bytes.current", s.requested_bytes[kStatAll].current},
    };
    for (auto& c : must_be_zero)
      if (c.value != 0) g_failures.push_back(where + ": " + c.name + " = " + std::to_string(c.value) + ", expected 0");
    if (s.allocation[kStatAll].allocated != s.allocation[kStatAll].freed)
      g_failures.push_back(where + ": allocation.allocated != allocation.freed");
    dev.empty_cache();
    s = dev.stats();
    if (s.reserved_bytes[kStatAll].current != 0 || s.segment[kStatAll].current != 0)
      g_failures.push_back(where + ": reserved_bytes.current = " + std::to_string(s.reserved_bytes[kStatAll].current) +
                           " after empty_cache(), expected 0");
    size_t live = static_cast<HostBackend&>(b.alloc.backend()).live_segments(d);
    if (live != 0)
      g_failures.push_back(where + ": the host backend still holds " + std::to_string(live) + " segment(s)");
  }
}

// ------------------------------------------------------------ workloads ----
struct RandomPlan {
  std::vector<size_t> fill;      // kWindow sizes that fill the window (untimed)
  std::vector<size_t> sizes;     // one per op
  std::vector<uint32_t> victim;  // one per op, in [0, kWindow]; kWindow = the new block
};

RandomPlan make_plan(uint64_t seed, size_t ops) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> size_dist(11.0, 3.0);
  std::uniform_int_distribution<uint32_t> victim_dist(0, kWindow);
  auto draw = [&] {
    double x = size_dist(rng);
    if (!(x < static_cast<double>(kMaxRandomSize))) return kMaxRandomSize;
    return std::max<size_t>(1, static_cast<size_t>(x));
  };
  RandomPlan p;
  p.fill.reserve(kWindow);
  for (size_t i = 0; i < kWindow; ++i) p.fill.push_back(draw());
  p.sizes.reserve(ops);
  p.victim.reserve(ops);
  for (size_t i = 0; i < ops; ++i) {
    p.sizes.push_back(draw());
    p.victim.push_back(victim_dist(rng));
  }
  return p;
}

// One pass of the random workload, split so that only run_ops is timed.
struct RandomRun {
  DeviceAllocator* dev;
  const RandomPlan* plan;
  void* live[kWindow];
  long ooms = 0;

  void* try_malloc(size_t size) {
    try {
      return dev->malloc(size, 0);
    } catch (const OutOfMemory&) {
      ++ooms;  // possible only when many threads share a device; counted and reported
      return nullptr;
    }
  }
  void fill() {
    for (size_t i = 0; i < kWindow; ++i) live[i] = try_malloc(plan->fill[i]);
  }
  void run_ops() {
    const size_t n = plan->sizes.size();
    const size_t* sizes = plan->sizes.data();
    const uint32_t* victim = plan->victim.data();
    for (size_t i = 0; i < n; ++i) {
      void* p = try_malloc(sizes[i]);
      const uint32_t v = victim[i];
      if (v == kWindow) {
        dev->free(p);
      } else {
        dev->free(live[v]);
        live[v] = p;
      }
    }
  }
  void drain() {
    for (void*& p : live) {
      dev->free(p);
      p = nullptr;
    }
  }
};

struct PairRun {
  DeviceAllocator* dev;
  size_t size;
  size_t iters;
  void run_ops() {
    for (size_t i = 0; i < iters; ++i) dev->free(dev->malloc(size, 0));
  }
};

// ------------------------------------------------------------- callgrind ----
}  // namespace

#if defined(__clang__)
#define MEMALLOC_BENCH_NOIPA __attribute__((noinline))
#else
#define MEMALLOC_BENCH_NOIPA __attribute__((noipa))
#endif

// The measured region for callgrind (--toggle-collect=memalloc_bench_measured).
extern "C" MEMALLOC_BENCH_NOIPA void memalloc_bench_measured(void (*fn)(void*), void* ctx) { fn(ctx); }

namespace {

template <class Run>
void call_run_ops(void* ctx) {
  static_cast<Run*>(ctx)->run_ops();
}

// ------------------------------------------------------------ JSON output ----
std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}
std::string list(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + num(v[i]);
  return s + "]";
}
std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// Fragmentation figures of one allocator, summed over its devices.
struct Peaks {
  int64_t peak_reserved = 0;
  int64_t peak_allocated = 0;
  int64_t num_device_alloc = 0;
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
};
Peaks peaks(Bench& b, int devices) {
  Peaks p;
  for (int d = 0; d < devices; ++d) {
    DeviceStats s = b.alloc.device(d).stats();
    p.peak_reserved += s.reserved_bytes[kStatAll].peak.value();
    p.peak_allocated += s.allocated_bytes[kStatAll].peak.value();
    p.num_device_alloc += s.num_device_alloc;
    p.num_alloc_retries += s.num_alloc_retries;
    p.num_ooms += s.num_ooms;
  }
  return p;
}
std::string peaks_json(const Peaks& p) {
  std::ostringstream o;
  o << "\"peak_reserved\": " << p.peak_reserved << ", \"peak_allocated\": " << p.peak_allocated
    << ", \"num_device_alloc\": " << p.num_device_alloc << ", \"num_alloc_retries\": " << p.num_alloc_retries
    << ", \"num_ooms\": " << p.num_ooms;
  return o.str();
}

// --------------------------------------------------------- single thread ----
std::string bench_pair(size_t size, size_t iters, size_t warmup, int repeats, size_t record_capacity = 0) {
  Bench b;
  DeviceAllocator& dev = b.alloc.device(0);
  if (record_capacity) b.alloc.set_recording(0, record_capacity);
  PairRun warm{&dev, size, warmup};
  warm.run_ops();
  std::vector<double> ns;
  for (int r = 0; r < repeats; ++r) {
    PairRun run{&dev, size, iters};
    auto t0 = Clock::now();
    run.run_ops();
    auto t1 = Clock::now();
    ns.push_back(ns_between(t0, t1) / static_cast<double>(iters));
  }
  Peaks p = peaks(b, 1);
  check_clean(b, "pair " + std::to_string(size));
  std::ostringstream o;
  o << "{\"size\": " << size << ", \"iters\": " << iters << ", \"ns_per_pair\": " << list(ns) << ", " << peaks_json(p)
    << "}";
  return o.str();
}

std::string bench_random(size_t ops, int repeats) {
  Bench b;
  DeviceAllocator& dev = b.alloc.device(0);
  RandomPlan plan = make_plan(kSeed, ops);
  std::vector<double> ns;
  long ooms = 0;
  for (int r = -1; r < repeats; ++r) {  // r == -1: warm-up pass
    RandomRun run{&dev, &plan, {}, 0};
    run.fill();
    auto t0 = Clock::now();
    run.run_ops();
    auto t1 = Clock::now();
    run.drain();
    ooms += run.ooms;
    if (r >= 0) ns.push_back(ns_between(t0, t1) / static_cast<double>(ops));
  }
  Peaks p = peaks(b, 1);
  check_clean(b, "random");
  std::ostringstream o;
  o << "{\"ops\": " << ops << ", \"window\": " << kWindow << ", \"seed\": " << kSeed << ", \"ns_per_op\": " << list(ns)
    << ", " << peaks_json(p) << ", \"skipped_ooms\": " << ooms << "}";
  return o.str();
}

// ------------------------------------------------------------ threads ----
// Runs `repeats + 1` rounds (the first is a warm-up) of `threads` threads.
// Each round: every thread prepares (untimed), all start together, each
// runs its ops, all wait for the slowest, then each cleans up (untimed).
// wall = from the start signal to the last thread done.
template <class Prepare, class Ops, class Cleanup>
std::vector<double> run_rounds(int threads, int repeats, Prepare prepare, Ops ops, Cleanup cleanup) {
  std::vector<double> walls;
  for (int r = -1; r < repeats; ++r) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::atomic<int> done{0};
    std::vector<Clock::time_point> finished(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        prepare(t);
        ready.fetch_add(1);
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
        ops(t);
        finished[t] = Clock::now();
        done.fetch_add(1);
        while (done.load() < threads) std::this_thread::yield();
        cleanup(t);
      });
    }
    while (ready.load() < threads) std::this_thread::yield();
    auto t0 = Clock::now();
    go.store(true, std::memory_order_release);
    for (auto& th : pool) th.join();
    if (r >= 0) walls.push_back(ns_between(t0, *std::max_element(finished.begin(), finished.end())));
  }
  return walls;
}

std::string thread_figures(const std::vector<double>& walls, size_t ops_per_thread, int threads) {
  std::vector<double> per_op, ops_s;
  for (double w : walls) {
    per_op.push_back(w / static_cast<double>(ops_per_thread));
    ops_s.push_back(static_cast<double>(ops_per_thread) * threads / (w * 1e-9));
  }
  return "\"wall_ns\": " + list(walls) + ", \"ns_per_op_per_thread\": " + list(per_op) +
         ", \"ops_per_s\": " + list(ops_s);
}

std::string bench_thread_pair(size_t size, size_t iters, int threads, int devices, int repeats) {
  Bench b;
  auto walls = run_rounds(
      threads, repeats, [](int) {},
      [&](int t) {
        PairRun run{&b.alloc.device(t % devices), size, iters};
        run.run_ops();
      },
      [](int) {});
  Peaks p = peaks(b, devices);
  check_clean(b, "threads pair " + std::to_string(size) + " devices " + std::to_string(devices));
  std::ostringstream o;
  o << "{\"size\": " << size << ", \"threads\": " << threads << ", \"devices\": " << devices
    << ", \"iters_per_thread\": " << iters << ", " << thread_figures(walls, iters, threads) << ", " << peaks_json(p)
    << "}";
  return o.str();
}

std::string bench_thread_random(size_t ops, int threads, int devices, int repeats) {
  Bench b;
  std::vector<RandomPlan> plans;
  for (int t = 0; t < threads; ++t) plans.push_back(make_plan(kSeed + t, ops));
  std::vector<RandomRun> runs(threads);
  auto walls = run_rounds(
      threads, repeats,
      [&](int t) {
        runs[t] = RandomRun{&b.alloc.device(t % devices), &plans[t], {}, 0};
        runs[t].fill();
      },
      [&](int t) { runs[t].run_ops(); }, [&](int t) { runs[t].drain(); });
  long ooms = 0;
  for (auto& r : runs) ooms += r.ooms;  // last round only
  Peaks p = peaks(b, devices);
  check_clean(b, "threads random devices " + std::to_string(devices));
  std::ostringstream o;
  o << "{\"threads\": " << threads << ", \"devices\": " << devices << ", \"ops_per_thread\": " << ops
    << ", \"window\": " << kWindow << ", \"seed\": \"7 + thread\", " << thread_figures(walls, ops, threads) << ", "
    << peaks_json(p) << ", \"skipped_ooms_last_round\": " << ooms << "}";
  return o.str();
}

// --------------------------------------------------------------- modes ----
int usage(const char* why) {
  std::fprintf(stderr,
               "bench_core: %s\nusage: bench_core timing [--repeats R] [--pair-iters N] [--random-ops N] "
               "[--thread-pair-iters N] [--thread-random-ops N] [--threads T] [--warmup-pairs N]\n"
               "       bench_core callgrind random <ops>\n"
               "       bench_core callgrind pair <bytes> <ops>\n",
               why);
  return 2;
}

bool parse_count(const char* s, size_t* out) {
  char* end = nullptr;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (end == s || *end != '\0' || v == 0) return false;
  *out = static_cast<size_t>(v);
  return true;
}

std::string checks_json() {
  std::string s = "\"ok\": " + std::string(g_failures.empty() ? "true" : "false") + ", \"failures\": [";
  for (size_t i = 0; i < g_failures.size(); ++i) s += (i ? ", " : "") + quote(g_failures[i]);
  return s + "]";
}

int finish(const std::string& body) {
  std::printf("{%s, %s}\n", body.c_str(), checks_json().c_str());
  std::fflush(stdout);
  for (auto& f : g_failures) std::fprintf(stderr, "bench_core: CHECK FAILED: %s\n", f.c_str());
  return g_failures.empty() ? 0 : 3;
}

int mode_timing(int argc, char** argv) {
  size_t repeats = 5, pair_iters = 200000, random_ops = 100000, thread_pair_iters = 20000, thread_random_ops = 10000,
         threads = 8, warmup = 1000;
  for (int i = 2; i < argc; i += 2) {
    if (i + 1 >= argc) return usage("an option is missing its value");
    const std::string k = argv[i];
    size_t* dst = k == "--repeats"             ? &repeats
                  : k == "--pair-iters"        ? &pair_iters
                  : k == "--random-ops"        ? &random_ops
                  : k == "--thread-pair-iters" ? &thread_pair_iters
                  : k == "--thread-random-ops" ? &thread_random_ops
                  : k == "--threads"           ? &threads
                  : k == "--warmup-pairs"      ? &warmup
                                               : nullptr;
    if (dst == nullptr) return usage(("unknown option " + k).c_str());
    if (!parse_count(argv[i + 1], dst)) return usage(("bad value for " + k + ": a positive integer").c_str());
  }
  const int R = static_cast<int>(repeats), T = static_cast<int>(threads);
  std::ostringstream o;
  o << "\"mode\": \"timing\", \"config\": " << quote(kConfig) << ", \"repeats\": " << R << ", \"pair\": [";
  for (size_t i = 0; i < sizeof kPairSizes / sizeof kPairSizes[0]; ++i)
    o << (i ? ", " : "") << bench_pair(kPairSizes[i], pair_iters, warmup, R);
  o << "], \"pair_recording\": " << bench_pair(size_t{64} << 10, pair_iters, warmup, R, size_t{1} << 16);
  o << ", \"random\": " << bench_random(random_ops, R);
  o << ", \"threads\": {\"threads\": " << T;
  for (int devices : {1, 2}) {
    o << ", \"pair_" << devices << "dev\": [";
    for (size_t i = 0; i < sizeof kPairSizes / sizeof kPairSizes[0]; ++i)
      o << (i ? ", " : "") << bench_thread_pair(kPairSizes[i], thread_pair_iters, T, devices, R);
    o << "], \"random_" << devices << "dev\": " << bench_thread_random(thread_random_ops, T, devices, R);
  }
  o << "}";
  return finish(o.str());
}

int mode_callgrind(int argc, char** argv) {
  if (argc < 4) return usage("callgrind needs a workload");
  const std::string workload = argv[2];
  Bench b;
  DeviceAllocator& dev = b.alloc.device(0);
  std::ostringstream o;
  o << "\"mode\": \"callgrind\", \"workload\": " << quote(workload) << ", \"config\": " << quote(kConfig);
  // A trailing "record" turns the event ring on (64 Ki records): the Ir
  // difference to the same workload without it is the recording cost.
  // A trailing "flight" puts the same ring in a flight recorder file (a
  // MAP_SHARED mapping with a sequence number per record, recorder.h).
  const std::string last = argv[argc - 1];
  constexpr size_t kRing = size_t{1} << 16;
  if (last == "record") {
    b.alloc.set_recording(0, kRing);
    --argc;
  } else if (last == "flight") {
    const std::string path = "/tmp/memalloc-bench-" + std::to_string(::getpid()) + ".flight";
    auto file = FlightMapping::create(path, kRing * (sizeof(TraceRecord) + sizeof(uint64_t)));
    ::unlink(path.c_str());  // the mapping stays; nothing is left behind
    auto* slots = reinterpret_cast<TraceRecord*>(file->data());
    b.alloc.set_recording_file(0, slots, reinterpret_cast<uint64_t*>(slots + kRing), kRing, file);
    --argc;
  }
  if (workload == "random" && argc == 4) {
    size_t ops;
    if (!parse_count(argv[3], &ops)) return usage("bad op count");
    RandomPlan plan = make_plan(kSeed, ops);
    RandomRun warm{&dev, &plan, {}, 0};
    warm.fill();
    warm.run_ops();
    warm.drain();
    RandomRun run{&dev, &plan, {}, 0};
    run.fill();
    memalloc_bench_measured(&call_run_ops<RandomRun>, &run);
    run.drain();
    Peaks p = peaks(b, 1);
    o << ", \"ops\": " << ops << ", " << peaks_json(p) << ", \"skipped_ooms\": " << warm.ooms + run.ooms;
  } else if (workload == "pair" && argc == 5) {
    size_t size, ops;
    if (!parse_count(argv[3], &size) || !parse_count(argv[4], &ops)) return usage("bad size or op count");
    PairRun warm{&dev, size, 1000};
    warm.run_ops();
    PairRun run{&dev, size, ops};
    memalloc_bench_measured(&call_run_ops<PairRun>, &run);
    o << ", \"size\": " << size << ", \"ops\": " << ops;
  } else {
    return usage("unknown callgrind workload");
  }
  uint64_t dropped = 0;
  o << ", \"recorded\": "
    << b.alloc.with_profiler(0, [&](Profiler& p) { return p.records(&dropped); }).size() + dropped;
  check_clean(b, "callgrind " + workload);
  return finish(o.str());
}

// Proves the self-check can fail: leaks one block, so the check must report
// it and the exit status must be 3 (tests/integration/test_bench_cpu.py).
int mode_leak_demo() {
  Bench b;
  b.alloc.device(0).malloc(4096, 0);
  check_clean(b, "leak-demo");
  return finish("\"mode\": \"leak-demo\"");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("no mode given");
  const std::string mode = argv[1];
  try {
    if (mode == "timing") return mode_timing(argc, argv);
    if (mode == "callgrind") return mode_callgrind(argc, argv);
    if (mode == "leak-demo" && argc == 2) return mode_leak_demo();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_core: unexpected error: %s\n", e.what());
    return 4;
  }
  return usage(("unknown mode " + mode).c_str());
}
