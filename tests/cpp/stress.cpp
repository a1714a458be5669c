// stress.cpp — multi-threaded stress test of the caching core (no torch, no
// Python): built by tests/cpp/test_sanitizers.py three ways (ASan+UBSan, TSan,
// plain -O2) with g++ -std=c++17 and run under each sanitizer.
//
// One CachingAllocator on a HostBackend with two simulated devices. T worker
// threads each run OPS mixed operations on both devices and several streams:
//   * malloc of random sizes: small (16 B..1 MiB, 80%), large (1..12 MiB),
//     huge (12..96 MiB, 0.02%, some above max_split_size), and requests that
//     must fail (0.005% bigger than the device, 0.005% beyond any device);
//     OutOfMemory is caught and counted. The size mix keeps segment churn
//     moderate: under ASan every segment obtained or returned costs a shadow
//     memset of an eighth of its size.
//   * free: each thread owns its live set (a window of ~32 blocks). Every
//     block carries a per-block tag (thread id + serial) in its first and last
//     8 bytes; the tags are checked before the free and then scrubbed, and a
//     newly returned block must not start or end on a live tag. A block handed
//     to two owners at once, or overlapping another live block at either end,
//     is therefore reported. (An overlap strictly inside another block's
//     interior is not visible to end tags; the allocator's own tiling of its
//     segments is checked by validate() from the reader thread.)
//   * record_stream on another stream, followed a few operations later by
//     HostBackend::synchronize_stream of that stream (the simulated streams
//     never complete by themselves).
//   * occasional empty_cache of a random device.
//   * every successful malloc is attributed to one of kStacks synthetic call
//     stacks, interned in a StackTable shared by all threads (the lock-free
//     per-thread cache path and the locked path both run); each thread
//     checks that a stack always gets the same id, and at the end all threads
//     must agree and frames(id) must give back the stack.
// A reader thread meanwhile reads stats() (checking the invariants that hold
// at any instant), segments() (blocks tile each segment), trace() of device 0,
// where event recording is on (set_recording), resizes that ring now and
// then, and runs validate() on both devices.
//
// At the end: every block is freed, every stream synchronized, both caches
// emptied; then the counters must be exactly back to zero, the totals must
// match the operations the threads counted, the simulated devices must hold
// no segment and validate() must pass. Prints key=value lines; exits 1 with
// "FAIL: ..." on stderr at the first mismatch.
//
// Usage: stress [--threads=N] [--ops=N] [--capacity-mb=N] [--seed=N]
//   defaults: 8 threads, 1,000,000 operations each, 512 MiB per device, seed 1.
// Each thread draws from its own generator seeded from --seed; thread
// interleavings (and with them which requests hit a full device) still vary
// from run to run.
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "process/registry.h"
#include "profiler/stacks.h"

using namespace memalloc;

namespace {

constexpr int kDevices = 2;
constexpr int kStreams = 4;                       // streams 0..3 on each device
constexpr size_t kWindow = 32;                    // live blocks per thread, at most
constexpr size_t kRingA = 4096;                   // event ring sizes of device 0 (the reader
constexpr size_t kRingB = 1024;                   //   switches between them now and then)
constexpr uint64_t kTagMarker = 0x7a67ULL << 48;  // high 16 bits of a live tag
constexpr uint64_t kScrubbed = 0xf4eef4eef4eef4eeULL;
constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kStacks = 3000;  // synthetic call stacks (more than a thread cache holds)

// Synthetic stack k: 1 + k % 40 frames of fake code pointers.
std::vector<RawFrame> synthetic_stack(size_t k) {
  std::vector<RawFrame> f(1 + k % 40);
  for (size_t i = 0; i < f.size(); ++i)
    f[i] = RawFrame{reinterpret_cast<const void*>(0x10000 + 64 * ((k * 7 + i) % 97)), static_cast<int>(k * 2 + i)};
  return f;
}

struct Options {
  int threads = 8;
  long ops = 1000000;
  size_t capacity_mb = 512;
  uint64_t seed = 1;
};

// xorshift64*: fast, good enough, one per thread.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL) {
    if (s == 0) s = 1;
  }
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545f4914f6cdd1dULL;
  }
  uint64_t below(uint64_t n) { return next() % n; }
};

std::atomic<bool> g_failed{false};
std::mutex g_fail_mu;
std::string g_fail_msg;

void fail(const std::string& msg) {
  std::lock_guard<std::mutex> g(g_fail_mu);
  if (!g_failed.load()) g_fail_msg = msg;
  g_failed.store(true);
}

std::string hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
  return buf;
}

uint64_t load64(const void* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
void store64(void* p, uint64_t v) { std::memcpy(p, &v, 8); }

struct LiveBlock {
  void* ptr;
  size_t size;  // requested bytes (>= 16): the tags sit at [0, 8) and [size - 8, size)
  int device;
  Stream stream;
  uint64_t tag;
};

struct Counts {
  long ops = 0;
  long mallocs = 0;  // successful
  long frees = 0;
  long ooms = 0;
  long record_streams = 0;
  long syncs = 0;
  long empty_caches = 0;
  long bytes_requested = 0;
};

size_t pick_size(Rng& r, size_t capacity) {
  const uint64_t x = r.below(100000);
  if (x < 5) return capacity + 512 * (1 + r.below(1024));  // bigger than the device: OOM after a cache release
  if (x < 10) return size_t{1} << 61;                      // beyond any device: OOM at once
  if (x < 80000) {                                         // small pool, log-uniform 16 B .. 1 MiB - 1
    const unsigned bits = 4 + static_cast<unsigned>(r.below(16));
    const size_t lo = size_t{1} << bits;
    return lo + r.below(lo);
  }
  if (x < 99980) return kMiB + 1 + r.below(11 * kMiB);  // large: 1 .. 12 MiB
  return 12 * kMiB + r.below(84 * kMiB);                // huge: 12 .. 96 MiB (max_split is 64 MiB)
}

// Checks and scrubs the tags of a block about to be freed.
bool check_tags(const LiveBlock& b, int thread) {
  char* p = static_cast<char*>(b.ptr);
  const uint64_t head = load64(p);
  const uint64_t tail = load64(p + b.size - 8);
  if (head != b.tag || tail != b.tag) {
    auto owner = [](uint64_t v) {
      if ((v & (0xffffULL << 48)) != kTagMarker) return std::string("no live tag");
      return "tag of thread " + std::to_string((v >> 40) & 0xff) + " block #" + std::to_string(v & ((1ULL << 40) - 1));
    };
    fail("thread " + std::to_string(thread) + ": block " + hex(reinterpret_cast<uintptr_t>(b.ptr)) + " (" +
         std::to_string(b.size) + " bytes, device " + std::to_string(b.device) + ") was overwritten: head " +
         hex(head) + " (" + owner(head) + "), tail " + hex(tail) + " (" + owner(tail) + "), expected " + hex(b.tag) +
         ": another live block overlaps it");
    return false;
  }
  store64(p, kScrubbed);
  store64(p + b.size - 8, kScrubbed);
  return true;
}

void worker(CachingAllocator& alloc, HostBackend& host, StackTable& stacks,
            const std::vector<std::vector<RawFrame>>& stack_frames, const Options& opt, int thread, Counts& c,
            std::vector<uint32_t>& stack_ids) {
  Rng rng(opt.seed * 1000003ULL + static_cast<uint64_t>(thread));
  const size_t capacity = opt.capacity_mb * kMiB;
  CallContext ctx;
  ctx.thread = static_cast<uint32_t>(thread + 1);
  std::vector<LiveBlock> live;
  live.reserve(kWindow + 1);
  struct ToSync {
    int device;
    Stream stream;
  };
  std::vector<ToSync> to_sync;  // streams recorded on, synchronized a few operations later
  to_sync.reserve(64);
  uint64_t serial = 0;

  auto free_at = [&](size_t i) -> bool {
    LiveBlock b = live[i];
    live[i] = live.back();
    live.pop_back();
    if (!check_tags(b, thread)) return false;
    DeviceAllocator& dev = alloc.device(b.device);
    if (rng.below(1000) == 0 && alloc.find_owner(b.ptr) != &dev) {
      fail("find_owner does not name device " + std::to_string(b.device) + " for live block " +
           hex(reinterpret_cast<uintptr_t>(b.ptr)));
      return false;
    }
    dev.free(b.ptr, &ctx);
    c.frees++;
    return true;
  };

  try {
    for (long op = 0; op < opt.ops; ++op) {
      if ((op & 1023) == 0 && g_failed.load(std::memory_order_relaxed)) break;
      c.ops++;
      uint64_t r = rng.below(1000000);
      if (live.size() >= kWindow && r < 460000) r = 460000;  // window full: free instead
      if (live.empty() && r >= 460000 && r < 970000) r = 0;  // nothing to free: malloc instead
      if (r < 460000) {
        const int d = static_cast<int>(rng.below(kDevices));
        const Stream s = rng.below(kStreams);
        const size_t size = pick_size(rng, capacity);
        // Skewed choice: a few hot stacks (cache hits), a long tail (misses).
        const size_t k = rng.below(4) != 0 ? rng.below(32) : rng.below(kStacks);
        bool is_new = false;
        ctx.stack_id = stacks.intern(stack_frames[k].data(), stack_frames[k].size(), &is_new);
        if (ctx.stack_id == 0 || (stack_ids[k] != 0 && stack_ids[k] != ctx.stack_id)) {
          fail("thread " + std::to_string(thread) + ": stack " + std::to_string(k) + " interned as " +
               std::to_string(ctx.stack_id) + ", earlier as " + std::to_string(stack_ids[k]));
          break;
        }
        stack_ids[k] = ctx.stack_id;
        void* p;
        try {
          p = alloc.device(d).malloc(size, s, &ctx);
        } catch (const OutOfMemory&) {
          c.ooms++;
          continue;
        }
        if (p == nullptr) {
          fail("malloc(" + std::to_string(size) + ") returned nullptr without OutOfMemory");
          break;
        }
        char* cp = static_cast<char*>(p);
        const uint64_t head = load64(cp), tail = load64(cp + size - 8);
        if ((head & (0xffffULL << 48)) == kTagMarker || (tail & (0xffffULL << 48)) == kTagMarker) {
          fail("thread " + std::to_string(thread) + ": new block " + hex(reinterpret_cast<uintptr_t>(p)) + " (" +
               std::to_string(size) + " bytes, device " + std::to_string(d) + ") starts or ends on a live tag (" +
               hex(head) + ", " + hex(tail) + "): it overlaps a live block");
          break;
        }
        const uint64_t tag =
            kTagMarker | (static_cast<uint64_t>(thread & 0xff) << 40) | (++serial & ((1ULL << 40) - 1));
        store64(cp, tag);
        store64(cp + size - 8, tag);
        live.push_back(LiveBlock{p, size, d, s, tag});
        c.mallocs++;
        c.bytes_requested += static_cast<long>(size);
      } else if (r < 920000) {
        if (!free_at(rng.below(live.size()))) break;
      } else if (r < 970000) {
        LiveBlock& b = live[rng.below(live.size())];
        const Stream other = (b.stream + 1 + rng.below(kStreams - 1)) % kStreams;
        alloc.device(b.device).record_stream(b.ptr, other);
        if (to_sync.size() < to_sync.capacity()) to_sync.push_back(ToSync{b.device, other});
        c.record_streams++;
      } else if (r < 999980) {
        if (!to_sync.empty() && rng.below(4) != 0) {
          const size_t i = rng.below(to_sync.size());
          host.synchronize_stream(to_sync[i].device, to_sync[i].stream);
          to_sync[i] = to_sync.back();
          to_sync.pop_back();
        } else {
          host.synchronize_stream(static_cast<int>(rng.below(kDevices)), rng.below(kStreams));
        }
        c.syncs++;
      } else {
        alloc.device(static_cast<int>(rng.below(kDevices))).empty_cache(&ctx);
        c.empty_caches++;
      }
    }
    while (!live.empty())
      if (!free_at(live.size() - 1)) break;
  } catch (const std::exception& e) {
    fail("thread " + std::to_string(thread) + ": unexpected exception: " + e.what());
  }
}

// Invariants of one stats snapshot (taken under the device lock).
std::string check_snapshot(const DeviceStats& s) {
  auto pool = [](const Stat(&st)[kNumStatTypes], const char* name) -> std::string {
    for (int i = 0; i < kNumStatTypes; ++i) {
      if (st[i].current != st[i].allocated - st[i].freed)
        return std::string(name) + "[" + std::to_string(i) + "]: current != allocated - freed";
      if (st[i].current < 0) return std::string(name) + "[" + std::to_string(i) + "].current < 0";
      if (st[i].peak.value() < st[i].current) return std::string(name) + "[" + std::to_string(i) + "]: peak < current";
    }
    if (st[kStatAll].current != st[kStatSmall].current + st[kStatLarge].current ||
        st[kStatAll].allocated != st[kStatSmall].allocated + st[kStatLarge].allocated ||
        st[kStatAll].freed != st[kStatSmall].freed + st[kStatLarge].freed)
      return std::string(name) + ": all != small + large";
    return "";
  };
  std::string e;
#define STRESS_CHECK_POOL(name) \
  if ((e = pool(s.name, #name)).size()) return e;
  MEMALLOC_POOL_STATS(STRESS_CHECK_POOL)
#undef STRESS_CHECK_POOL
  for (int i = 0; i < kNumStatTypes; ++i) {
    if (s.requested_bytes[i].current > s.allocated_bytes[i].current) return "requested_bytes > allocated_bytes";
    if (s.allocated_bytes[i].current > s.active_bytes[i].current) return "allocated_bytes > active_bytes";
    if (s.active_bytes[i].current + s.inactive_split_bytes[i].current > s.reserved_bytes[i].current)
      return "active_bytes + inactive_split_bytes > reserved_bytes";
    if (s.allocation[i].current > s.active[i].current) return "allocation > active";
  }
  return "";
}

void reader(CachingAllocator& alloc, std::atomic<bool>& stop, long& reads) {
  size_t action_count = 0;
  action_names(&action_count);
  try {
    for (long it = 0; !stop.load() && !g_failed.load(); ++it) {
      for (int d = 0; d < kDevices; ++d) {
        std::string e = check_snapshot(alloc.device(d).stats());
        if (!e.empty()) {
          fail("stats() snapshot of device " + std::to_string(d) + ": " + e);
          return;
        }
      }
      if (it % 4 == 0) {
        for (int d = 0; d < kDevices; ++d) {
          for (const SegmentInfo& seg : alloc.device(d).segments()) {
            uintptr_t at = seg.addr;
            for (const BlockInfo& b : seg.blocks) {
              if (b.addr != at) {
                fail("segments(): blocks of segment " + hex(seg.addr) + " on device " + std::to_string(d) +
                     " do not tile it");
                return;
              }
              at += b.size;
            }
            if (at != seg.addr + seg.size) {
              fail("segments(): blocks of segment " + hex(seg.addr) + " do not cover it");
              return;
            }
          }
        }
      }
      if (it % 8 == 0) {
        uint64_t dropped = 0;
        for (const TraceRecord& r : alloc.with_profiler(0, [&](Profiler& p) { return p.records(&dropped); })) {
          if (r.device != 0 || r.action >= action_count) {
            fail("trace(): record with device " + std::to_string(r.device) + ", action " + std::to_string(r.action));
            return;
          }
        }
      }
      if (it % 64 == 0) {
        for (int d = 0; d < kDevices; ++d) alloc.device(d).validate();
      }
      if (it % 256 == 128) alloc.set_recording(0, (it / 256) % 2 ? kRingA : kRingB);
      reads++;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  } catch (const std::exception& e) {
    fail(std::string("reader: ") + e.what());
  }
}

bool parse_args(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* key) -> const char* {
      const size_t n = std::strlen(key);
      return a.compare(0, n, key) == 0 ? a.c_str() + n : nullptr;
    };
    const char* v;
    if ((v = value("--threads=")))
      o.threads = std::atoi(v);
    else if ((v = value("--ops=")))
      o.ops = std::atol(v);
    else if ((v = value("--capacity-mb=")))
      o.capacity_mb = std::strtoull(v, nullptr, 10);
    else if ((v = value("--seed=")))
      o.seed = std::strtoull(v, nullptr, 10);
    else
      return false;
  }
  return o.threads >= 1 && o.threads <= 255 && o.ops >= 0 && o.capacity_mb >= 128;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (!parse_args(argc, argv, opt)) {
    std::fprintf(stderr, "usage: %s [--threads=1..255] [--ops=N] [--capacity-mb=N>=128] [--seed=N]\n", argv[0]);
    return 2;
  }
  const Config config =
      parse_config("host_capacity_mb:" + std::to_string(opt.capacity_mb) + ",host_devices:2,max_split_size_mb:64");
  int status = 0;
  {
    CachingAllocator alloc(std::unique_ptr<Backend>(new HostBackend(config)), config);
    HostBackend& host = static_cast<HostBackend&>(alloc.backend());
    alloc.set_recording(0, kRingA);

    std::vector<Counts> counts(opt.threads);
    StackTable stacks;
    std::vector<std::vector<RawFrame>> stack_frames;
    for (size_t k = 0; k < kStacks; ++k) stack_frames.push_back(synthetic_stack(k));
    std::vector<std::vector<uint32_t>> stack_ids(opt.threads, std::vector<uint32_t>(kStacks, 0));
    std::atomic<bool> stop{false};
    long reads = 0;
    const auto t0 = std::chrono::steady_clock::now();
    std::thread reader_thread(reader, std::ref(alloc), std::ref(stop), std::ref(reads));
    std::vector<std::thread> workers;
    for (int t = 0; t < opt.threads; ++t)
      workers.emplace_back(worker, std::ref(alloc), std::ref(host), std::ref(stacks), std::cref(stack_frames),
                           std::cref(opt), t, std::ref(counts[t]), std::ref(stack_ids[t]));
    for (auto& w : workers) w.join();
    stop.store(true);
    reader_thread.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    Counts total;
    for (const Counts& c : counts) {
      total.ops += c.ops;
      total.mallocs += c.mallocs;
      total.frees += c.frees;
      total.ooms += c.ooms;
      total.record_streams += c.record_streams;
      total.syncs += c.syncs;
      total.empty_caches += c.empty_caches;
      total.bytes_requested += c.bytes_requested;
    }
    std::printf("threads=%d\nops_per_thread=%ld\ncapacity_mb=%zu\nseed=%" PRIu64 "\n", opt.threads, opt.ops,
                opt.capacity_mb, opt.seed);
    std::printf("ops=%ld\nmallocs=%ld\nfrees=%ld\nooms=%ld\nrecord_streams=%ld\nsyncs=%ld\nempty_caches=%ld\n",
                total.ops, total.mallocs, total.frees, total.ooms, total.record_streams, total.syncs,
                total.empty_caches);
    std::printf("reader_iterations=%ld\nseconds=%.2f\n", reads, seconds);

    std::vector<std::string> errors;
    if (g_failed.load()) errors.push_back(g_fail_msg);
    size_t distinct = 0;
    for (size_t k = 0; k < kStacks && errors.empty(); ++k) {
      uint32_t id = 0;
      for (int t = 0; t < opt.threads; ++t) {
        const uint32_t seen = stack_ids[t][k];
        if (seen == 0) continue;
        if (id != 0 && seen != id)
          errors.push_back("stack " + std::to_string(k) + " has ids " + std::to_string(id) + " and " +
                           std::to_string(seen) + " in different threads");
        id = seen;
      }
      if (id == 0) continue;
      distinct++;
      if (stacks.frames(id) != stack_frames[k])
        errors.push_back("frames(" + std::to_string(id) + ") != stack " + std::to_string(k));
    }
    if (errors.empty() && stacks.size() != distinct)
      errors.push_back("stack table holds " + std::to_string(stacks.size()) + " stacks, " + std::to_string(distinct) +
                       " were interned");
    std::printf("stacks_interned=%zu\n", distinct);
    if (errors.empty()) {
      try {
        for (int d = 0; d < kDevices; ++d)
          for (Stream s = 0; s < kStreams; ++s) host.synchronize_stream(d, s);
        for (int d = 0; d < kDevices; ++d) alloc.device(d).empty_cache();
        long allocs = 0, frees = 0, ooms = 0;
        long device_allocs = 0, retries = 0;
        for (int d = 0; d < kDevices; ++d) {
          DeviceAllocator& dev = alloc.device(d);
          const DeviceStats s = dev.stats();
          const std::string on = " on device " + std::to_string(d);
          auto expect = [&](bool ok, const std::string& what) {
            if (!ok) errors.push_back(what + on);
          };
          for (int i = 0; i < kNumStatTypes; ++i) {
            const std::string p = "[" + std::to_string(i) + "]";
#define STRESS_ZERO(name) \
  expect(s.name[i].current == 0, #name + p + ".current == " + std::to_string(s.name[i].current) + ", expected 0");
            STRESS_ZERO(allocation)
            STRESS_ZERO(active)
            STRESS_ZERO(allocated_bytes)
            STRESS_ZERO(active_bytes)
            STRESS_ZERO(requested_bytes)
            STRESS_ZERO(reserved_bytes)
            STRESS_ZERO(segment)
            STRESS_ZERO(inactive_split)
            STRESS_ZERO(inactive_split_bytes)
#undef STRESS_ZERO
            expect(s.allocation[i].allocated == s.allocation[i].freed,
                   "allocation" + p + ".allocated " + std::to_string(s.allocation[i].allocated) + " != freed " +
                       std::to_string(s.allocation[i].freed));
            expect(s.segment[i].allocated == s.segment[i].freed, "segment" + p + ".allocated " +
                                                                     std::to_string(s.segment[i].allocated) +
                                                                     " != freed " + std::to_string(s.segment[i].freed));
          }
          expect(s.oversize_allocations.current == 0, "oversize_allocations.current != 0");
          expect(s.oversize_segments.current == 0, "oversize_segments.current != 0");
          expect(s.num_device_alloc == s.num_device_free, "num_device_alloc " + std::to_string(s.num_device_alloc) +
                                                              " != num_device_free " +
                                                              std::to_string(s.num_device_free));
          expect(host.live_segments(d) == 0,
                 "host live_segments == " + std::to_string(host.live_segments(d)) + ", expected 0");
          const MemInfo info = dev.mem_get_info();
          expect(info.free == info.total,
                 "the simulated device still has " + std::to_string(info.total - info.free) + " bytes in use");
          try {
            dev.validate();
          } catch (const std::exception& e) {
            errors.push_back(std::string("validate(): ") + e.what() + on);
          }
          allocs += s.allocation[kStatAll].allocated;
          frees += s.allocation[kStatAll].freed;
          ooms += s.num_ooms;
          device_allocs += s.num_device_alloc;
          retries += s.num_alloc_retries;
        }
        if (allocs != total.mallocs)
          errors.push_back("allocation.all.allocated " + std::to_string(allocs) + " != successful mallocs " +
                           std::to_string(total.mallocs));
        if (frees != total.frees)
          errors.push_back("allocation.all.freed " + std::to_string(frees) + " != frees " +
                           std::to_string(total.frees));
        if (ooms != total.ooms)
          errors.push_back("num_ooms " + std::to_string(ooms) + " != OutOfMemory caught " + std::to_string(total.ooms));
        if (total.ops != static_cast<long>(opt.threads) * opt.ops)
          errors.push_back("ops " + std::to_string(total.ops) + " != threads * ops_per_thread");
        std::printf("device_allocs=%ld\nalloc_retries=%ld\n", device_allocs, retries);
        uint64_t dropped = 0;
        const size_t records = alloc.with_profiler(0, [&](Profiler& p) { return p.records(&dropped); }).size();
        std::printf("trace_records=%zu\ntrace_dropped=%" PRIu64 "\n", records, dropped);
      } catch (const std::exception& e) {
        errors.push_back(std::string("final checks: unexpected exception: ") + e.what());
      }
    }
    for (const std::string& e : errors) std::fprintf(stderr, "FAIL: %s\n", e.c_str());
    if (!errors.empty()) status = 1;
  }  // the allocator and its backend are destroyed here (LeakSanitizer checks at exit)
  if (status == 0) std::printf("OK\n");
  return status;
}
