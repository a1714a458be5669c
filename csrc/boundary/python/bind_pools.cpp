// bind_pools.cpp — test hooks (memalloc._C._testing, not API) of the
// private-pool calls (torch's MempoolId_t calls, private_pool.h), each
// taking the allocator first, so that pool routing, use counts and
// checkpoints are tested on the host backend. No user path reaches them on
// the host (torch's MemPool and graph pools are CUDA's); torch itself
// reaches these calls through csrc/boundary/torch/cuda/.
//
// Invariants: as bindings.cpp (the GIL is released before a device lock is
// taken; arguments are checked before anything changes). A route's filter
// here is a set of stream handles, checked without the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdlib>
#include <unordered_set>

#include "boundary/python/bind.h"
#include "common/errors.h"
#include "boundary/python/pyargs.h"
#include "process/registry.h"

namespace py = pybind11;

namespace memalloc {
namespace {

using NoGil = py::call_guard<py::gil_scoped_release>;
using pyargs::Device;

// A pool id: a pair of ints >= 0, not (0, 0).
PoolId pool_id(const py::handle& obj) {
  const char* what = "pool must be a pair of ints >= 0, e.g. (0, 1), as torch.cuda.MemPool().id";
  if (!py::isinstance<py::tuple>(obj) && !py::isinstance<py::list>(obj))
    throw py::type_error(std::string(what) + ", not " +
                         std::string(py::str(py::type::handle_of(obj).attr("__name__"))));
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  MEMALLOC_EXPECTS(seq.size() == 2, std::string(what) + "; got " + std::to_string(seq.size()) + " items");
  unsigned long long parts[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    py::handle item = seq[i];
    if (py::isinstance<py::bool_>(item) || !py::isinstance<py::int_>(item)) throw py::type_error(what);
    const auto v = item.cast<long long>();
    MEMALLOC_EXPECTS(v >= 0, std::string(what) + "; got a negative part");
    parts[i] = static_cast<unsigned long long>(v);
  }
  MEMALLOC_EXPECTS(!(parts[0] == 0 && parts[1] == 0), "pool (0, 0) is the default pool, not a private pool");
  return {parts[0], parts[1]};
}

std::vector<uintptr_t> ints(const py::handle& obj, const char* name) {
  std::vector<uintptr_t> out;
  for (py::handle item : py::iter(obj)) {
    if (py::isinstance<py::bool_>(item) || !py::isinstance<py::int_>(item))
      throw py::type_error(std::string(name) + " must hold ints (addresses or stream handles)");
    const auto v = item.cast<long long>();
    MEMALLOC_EXPECTS(v >= 0, std::string(name) + " holds a negative value");
    out.push_back(static_cast<uintptr_t>(v));
  }
  return out;
}

py::dict state_dict(const PoolState& s) {
  py::list segments;
  for (const SegmentState& seg : s.segments) {
    py::list blocks;
    for (const BlockState& b : seg.blocks) blocks.append(py::make_tuple(b.addr, b.size, b.requested, b.allocated));
    py::dict d;
    d["address"] = seg.addr;
    d["size"] = seg.size;
    d["stream"] = seg.stream;
    d["blocks"] = blocks;
    segments.append(d);
  }
  py::dict out;
  out["pool"] = py::make_tuple(s.id.first, s.id.second);
  out["segments"] = segments;
  return out;
}

// A pool's own segment source in host memory (the host backend's stand-in
// for torch.cuda.MemPool(allocator=...)): counts its calls and refuses to
// hold more than `limit` bytes at once.
class HostSegmentSource final : public SegmentSource {
 public:
  explicit HostSegmentSource(size_t limit) : limit_(limit) {}
  void* allocate(size_t bytes, Stream) override {
    if (held_ + bytes > limit_) return nullptr;
    void* p = std::aligned_alloc(512, (bytes + 511) / 512 * 512);
    if (p == nullptr) return nullptr;
    held_ += bytes;
    allocations_ += 1;
    return p;
  }
  bool release(void* ptr, size_t bytes) noexcept override {
    std::free(ptr);
    held_ -= bytes;
    releases_ += 1;
    return true;
  }
  size_t limit_;
  std::atomic<size_t> held_{0}, allocations_{0}, releases_{0};
};

}  // namespace

void bind_pools(py::module_& t) {
  py::class_<PoolState>(t, "PoolState", "A private pool's layout (checkpoint_pool); pass it to restore_pool.")
      .def_property_readonly("pool", [](const PoolState& s) { return py::make_tuple(s.id.first, s.id.second); })
      .def("to_dict", &state_dict,
           "{'pool', 'segments': [{'address', 'size', 'stream', 'blocks': [(address, size, requested, "
           "allocated)]}]} (bytes)");
  py::class_<HostSegmentSource, std::shared_ptr<HostSegmentSource>>(
      t, "HostSegmentSource",
      "Segments for one private pool from host memory, at most `limit` bytes at once (the host backend's "
      "torch.cuda.MemPool(allocator=...)); counts allocations and releases.")
      .def(py::init([](pyargs::SizeArg limit) { return std::make_shared<HostSegmentSource>(limit); }), py::arg("limit"))
      .def_property_readonly("allocations", [](const HostSegmentSource& s) { return s.allocations_.load(); })
      .def_property_readonly("releases", [](const HostSegmentSource& s) { return s.releases_.load(); })
      .def_property_readonly("held", [](const HostSegmentSource& s) { return s.held_.load(); });
  t.def(
       "create_or_incref_pool",
       [](pyargs::AllocatorArg a, py::object pool, Device device, py::object source_arg) {
         const PoolId id = pool_id(pool);
         std::shared_ptr<HostSegmentSource> source;
         if (!source_arg.is_none()) {
           if (!py::isinstance<HostSegmentSource>(source_arg))
             throw py::type_error("source must be a memalloc._C._testing.HostSegmentSource or None, not " +
                                  std::string(py::str(py::type::handle_of(source_arg).attr("__name__"))));
           source = source_arg.cast<std::shared_ptr<HostSegmentSource>>();
         }
         py::gil_scoped_release nogil;
         a->device(device).with_pools([&](PrivatePools& p) { p.create_or_incref(id, source); });
       },
       py::arg("allocator"), py::arg("pool"), py::arg("device") = 0, py::arg("source") = py::none(),
       "Creates the private pool (use count 1) or adds one use; with `source` (a HostSegmentSource) "
       "the pool's segments come from it.")
      .def(
          "begin_allocate_to_pool",
          [](pyargs::AllocatorArg a, py::object pool, py::object streams, Device device) {
            const PoolId id = pool_id(pool);
            const std::vector<uintptr_t> list = ints(streams, "streams");
            std::unordered_set<Stream> set(list.begin(), list.end());
            py::gil_scoped_release nogil;
            a->device(device).with_pools(
                [&](PrivatePools& p) { p.begin_route(id, [set](Stream s) { return set.count(s) != 0; }); });
          },
          py::arg("allocator"), py::arg("pool"), py::arg("streams"), py::arg("device") = 0,
          "Adds a use of the pool and sends allocations on `streams` to it until end_allocate_to_pool.")
      .def(
          "end_allocate_to_pool",
          [](pyargs::AllocatorArg a, py::object pool, Device device) {
            const PoolId id = pool_id(pool);
            py::gil_scoped_release nogil;
            a->device(device).with_pools([&](PrivatePools& p) { p.end_route(id); });
          },
          py::arg("allocator"), py::arg("pool"), py::arg("device") = 0)
      .def(
          "release_pool",
          [](pyargs::AllocatorArg a, py::object pool, Device device) {
            const PoolId id = pool_id(pool);
            py::gil_scoped_release nogil;
            a->device(device).with_pools([&](PrivatePools& p) { p.release(id); });
          },
          py::arg("allocator"), py::arg("pool"), py::arg("device") = 0,
          "Drops one use; at zero the pool's free segments may be released.")
      .def(
          "pool_use_count",
          [](pyargs::AllocatorArg a, py::object pool, Device device) {
            const PoolId id = pool_id(pool);
            py::gil_scoped_release nogil;
            return a->device(device).with_pools([&](PrivatePools& p) { return p.use_count(id); });
          },
          py::arg("allocator"), py::arg("pool"), py::arg("device") = 0)
      .def(
          "set_pool_use_on_oom",
          [](pyargs::AllocatorArg a, py::object pool, pyargs::UseOnOomArg use_on_oom, Device device) {
            const PoolId id = pool_id(pool);
            const bool flag = use_on_oom;
            py::gil_scoped_release nogil;
            a->device(device).with_pools([&](PrivatePools& p) { p.get(id, "set_use_on_oom").use_on_oom = flag; });
          },
          py::arg("allocator"), py::arg("pool"), py::arg("use_on_oom"), py::arg("device") = 0)
      .def(
          "empty_pool_cache",
          [](pyargs::AllocatorArg a, py::object pool, Device device) {
            const PoolId id = pool_id(pool);
            py::gil_scoped_release nogil;
            const memalloc::CallContext caller = AllocatorRegistry::instance().thread_context();
            return a->device(device).empty_cache(&caller, id);
          },
          py::arg("allocator"), py::arg("pool"), py::arg("device") = 0,
          "Releases the pool's fully free segments; returns the bytes.")
      .def(
          "capturing",
          [](pyargs::AllocatorArg a, Device device) {
            return a->device(device).with_pools([](PrivatePools& p) { return p.any_route(); });
          },
          py::arg("allocator"), py::arg("device") = 0, NoGil(), "True while a route to a private pool is open.")
      .def(
          "pool_live_blocks_are",
          [](pyargs::AllocatorArg a, py::object pool, py::object ptrs, Device device) {
            const PoolId id = pool_id(pool);
            std::vector<void*> expected;
            for (uintptr_t p : ints(ptrs, "ptrs")) expected.push_back(reinterpret_cast<void*>(p));
            py::gil_scoped_release nogil;
            return a->device(device).with_checkpoints(
                [&](PoolCheckpoints& c) { return c.live_blocks_are(id, expected); });
          },
          py::arg("allocator"), py::arg("pool"), py::arg("ptrs"), py::arg("device") = 0)
      .def(
          "checkpoint_pool",
          [](pyargs::AllocatorArg a, py::object pool, Device device) {
            const PoolId id = pool_id(pool);
            py::gil_scoped_release nogil;
            return a->device(device).with_checkpoints([&](PoolCheckpoints& c) { return c.checkpoint(id); });
          },
          py::arg("allocator"), py::arg("pool"), py::arg("device") = 0)
      .def(
          "restore_pool",
          [](pyargs::AllocatorArg a, py::object state, Device device) {
            if (!py::isinstance<PoolState>(state))
              throw py::type_error("state must be a PoolState from checkpoint_pool, not " +
                                   std::string(py::str(py::type::handle_of(state).attr("__name__"))));
            const PoolState& s = state.cast<const PoolState&>();
            PoolRestore r;
            {
              py::gil_scoped_release nogil;
              const CallContext caller = AllocatorRegistry::instance().thread_context();
              r = a->device(device).with_checkpoints([&](PoolCheckpoints& c) { return c.restore(s); }, &caller);
            }
            std::vector<uintptr_t> freed, allocated;
            for (void* p : r.freed) freed.push_back(reinterpret_cast<uintptr_t>(p));
            for (void* p : r.allocated) allocated.push_back(reinterpret_cast<uintptr_t>(p));
            return py::make_tuple(freed, allocated);
          },
          py::arg("allocator"), py::arg("state"), py::arg("device") = 0,
          "Puts the pool back as the state recorded it; returns (freed pointers, live-again pointers).");
}

}  // namespace memalloc
