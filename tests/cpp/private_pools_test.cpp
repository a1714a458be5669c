// private_pools_test.cpp — C++ unit tests of the PrivatePools part
// (csrc/pool/private_pools.h) on its own: pools and routes made through the
// part's calls, segment counts set by hand (the SegmentTable keeps them in
// the allocator), and the part's invariants checked after every step. The
// error texts are the ones Python tests match. Built by
// tests/cpp/test_cpp_core.py.
#include <cstdio>
#include <memory>
#include <memory_resource>
#include <string>
#include <vector>

#include "common/errors.h"
#include "pool/node_cache.h"
#include "pool/private_pools.h"
#include "part_test.h"

using namespace memalloc;

namespace {
using part_test::problems;

// The InvalidArgument message `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

PoolFilter any_stream() {
  return [](Stream) { return true; };
}
PoolFilter only(Stream s) {
  return [s](Stream x) { return x == s; };
}

struct NullSource : SegmentSource {
  void* allocate(size_t, Stream) override { return nullptr; }
  bool release(void*, size_t) noexcept override { return true; }
};

constexpr int kDevice = 3;
const PoolId A{1, 0}, B{0, 2}, C{7, 0};

struct Fixture {
  NodeCache mr;
  PrivatePools pools{kDevice, &mr};
};

void use_counts_and_the_default_pool() {
  Fixture f;
  EXPECT(f.pools.use_count(A) == 0 && f.pools.find(A) == nullptr);
  PrivatePool& a = f.pools.create_or_incref(A);
  EXPECT(a.id == A && a.use_count == 1 && f.pools.find(A) == &a && f.pools.use_count(A) == 1);
  EXPECT(&f.pools.create_or_incref(A) == &a && a.use_count == 2);
  EXPECT(error_of([&] { f.pools.create_or_incref(kDefaultPool); }) ==
         "pool id (0, 0) is the default pool; a private pool needs another id");
  EXPECT(f.pools.size() == 1 && f.pools.find(kDefaultPool) == nullptr);
  // Pools keep their address while others come and go.
  for (unsigned long long i = 100; i < 200; ++i) f.pools.create_or_incref(PoolId{i, 0});
  EXPECT(f.pools.find(A) == &a && f.pools.size() == 101);
  f.pools.release(A);
  EXPECT(a.use_count == 1);
  f.pools.release(A);
  EXPECT(a.use_count == 0 && f.pools.use_count(A) == 0 && PrivatePools::freeable(a) && f.pools.find(A) == &a);
  EXPECT(error_of([&] { f.pools.release(A); }) == "release_pool: private pool (1, 0) was already released");
  EXPECT(a.use_count == 0);
  EXPECT(error_of([&] { f.pools.release(PoolId{9, 9}); }) ==
         "release_pool: private pool (9, 9) does not exist on device 3; create it first (torch.cuda.MemPool or "
         "a graph capture)");
  EXPECT(error_of([&] { f.pools.get(PoolId{0, 4}, "set_no_split"); }) ==
         "set_no_split: private pool (0, 4) does not exist on device 3; create it first (torch.cuda.MemPool or "
         "a graph capture)");
  EXPECT(&f.pools.get(A, "checkpoint_pool") == &a);
  VALID(f.pools);
}

void a_pool_keeps_the_source_it_was_created_with() {
  Fixture f;
  auto s1 = std::make_shared<NullSource>();
  auto s2 = std::make_shared<NullSource>();
  PrivatePool& a = f.pools.create_or_incref(A, s1);
  EXPECT(a.source == s1 && a.use_count == 1);
  f.pools.create_or_incref(A, s1);
  EXPECT(a.use_count == 2);
  EXPECT(error_of([&] { f.pools.create_or_incref(A, s2); }) ==
         "private pool (1, 0) already exists with another segment source");
  EXPECT(a.source == s1 && a.use_count == 2);  // nothing changed
  f.pools.create_or_incref(A);                 // no source given: the pool's stays
  EXPECT(a.source == s1 && a.use_count == 3);
  PrivatePool& b = f.pools.create_or_incref(B);
  EXPECT(b.source == nullptr);
  EXPECT(!error_of([&] { f.pools.create_or_incref(B, s2); }).empty());  // a backend pool takes no source later
  EXPECT(b.source == nullptr && b.use_count == 1);
  VALID(f.pools);
}

void routes_are_asked_newest_first_with_their_filters() {
  Fixture f;
  EXPECT(!f.pools.any_route() && f.pools.route(1) == nullptr);
  PrivatePool& a = f.pools.begin_route(A, any_stream());
  EXPECT(a.use_count == 1 && f.pools.any_route() && f.pools.routed(a));
  PrivatePool& b = f.pools.begin_route(B, only(2));
  VALID(f.pools);
  EXPECT(f.pools.route(2) == &b);  // newest first
  EXPECT(f.pools.route(1) == &a);  // b's filter refuses stream 1
  f.pools.create_or_incref(C);
  PrivatePool& c = f.pools.begin_route(C, only(1));  // an existing pool: one more use
  EXPECT(c.use_count == 2);
  EXPECT(f.pools.route(1) == &c && f.pools.route(2) == &b && f.pools.route(3) == &a);
  f.pools.end_route(C);
  EXPECT(c.use_count == 2 && !f.pools.routed(c));  // ending a route drops no use
  EXPECT(f.pools.route(1) == &a && f.pools.route(2) == &b);
  f.pools.end_route(A);  // the oldest route ends first: the newer one stays
  EXPECT(f.pools.route(1) == nullptr && f.pools.route(2) == &b && f.pools.any_route());
  f.pools.end_route(B);
  EXPECT(!f.pools.any_route() && f.pools.route(2) == nullptr);
  // A route may open again once ended.
  EXPECT(&f.pools.begin_route(A, only(5)) == &a && a.use_count == 2 && f.pools.route(5) == &a);
  VALID(f.pools);
}

void route_mistakes_are_refused_and_change_nothing() {
  Fixture f;
  PrivatePool& a = f.pools.begin_route(A, any_stream());
  EXPECT(error_of([&] { f.pools.begin_route(A, only(1)); }) ==
         "begin_allocate_to_pool: allocations already go to private pool (1, 0); end that (endAllocateToPool) "
         "before beginning another");
  EXPECT(a.use_count == 1 && f.pools.route(2) == &a);
  EXPECT(error_of([&] { f.pools.begin_route(kDefaultPool, any_stream()); }) ==
         "allocate to pool (0, 0): the default pool takes no route");
  EXPECT(error_of([&] { f.pools.begin_route(B, PoolFilter{}); }) == "begin_allocate_to_pool: no filter given");
  EXPECT(f.pools.find(B) == nullptr && f.pools.size() == 1);
  EXPECT(error_of([&] { f.pools.end_route(C); }) ==
         "end_allocate_to_pool: allocations do not go to private pool (7, 0)");
  f.pools.end_route(A);
  EXPECT(error_of([&] { f.pools.end_route(A); }) ==
         "end_allocate_to_pool: allocations do not go to private pool (1, 0)");
  VALID(f.pools);
}

void only_freeable_pools_without_segments_or_routes_are_deleted() {
  Fixture f;
  const PoolId idle{1, 0}, with_segment{2, 0}, routed{3, 0}, used{4, 0};
  f.pools.create_or_incref(idle);
  f.pools.create_or_incref(with_segment).segments = 1;
  f.pools.begin_route(routed, any_stream());
  f.pools.create_or_incref(used);
  for (PoolId id : {idle, with_segment, routed}) f.pools.release(id);
  f.pools.delete_unused();
  EXPECT(f.pools.find(idle) == nullptr);
  EXPECT(f.pools.find(with_segment) != nullptr && f.pools.find(routed) != nullptr && f.pools.find(used) != nullptr);
  VALID(f.pools);  // the open route still names a pool of the table
  f.pools.find(with_segment)->segments = 0;
  f.pools.delete_unused();
  EXPECT(f.pools.find(with_segment) == nullptr && f.pools.find(routed) != nullptr);
  f.pools.end_route(routed);
  f.pools.delete_unused();
  EXPECT(f.pools.find(routed) == nullptr && f.pools.find(used) != nullptr && f.pools.size() == 1);
  EXPECT(error_of([&] { f.pools.release(idle); }) ==
         "release_pool: private pool (1, 0) does not exist on device 3; create it first (torch.cuda.MemPool or "
         "a graph capture)");
  // A deleted id starts again from one use.
  EXPECT(f.pools.create_or_incref(idle).use_count == 1);
  VALID(f.pools);
}

void free_lists_in_id_order_after_the_default_pools() {
  Fixture f;
  FreeLists default_lists(&f.mr);
  for (PoolId id : {PoolId{2, 0}, PoolId{0, 5}, PoolId{1, 0}}) f.pools.create_or_incref(id);
  std::vector<FreeLists*> all = f.pools.all_free_lists(default_lists);
  EXPECT(all.size() == 4 && all[0] == &default_lists);
  EXPECT(all.size() == 4 && all[1] == &f.pools.find(PoolId{0, 5})->lists &&
         all[2] == &f.pools.find(PoolId{1, 0})->lists && all[3] == &f.pools.find(PoolId{2, 0})->lists);
  std::vector<PoolId> order;
  for (auto& kv : f.pools) order.push_back(kv.first);
  EXPECT((order == std::vector<PoolId>{{0, 5}, {1, 0}, {2, 0}}));
}

void validate_reports_a_negative_use_count() {
  Fixture f;
  f.pools.create_or_incref(A).use_count = -1;  // broken by hand
  std::vector<std::string> p = problems(f.pools);
  EXPECT(p.size() == 1 && p[0] == "a private pool's use count is negative");
}
}  // namespace

int main() {
  use_counts_and_the_default_pool();
  a_pool_keeps_the_source_it_was_created_with();
  routes_are_asked_newest_first_with_their_filters();
  route_mistakes_are_refused_and_change_nothing();
  only_freeable_pools_without_segments_or_routes_are_deleted();
  free_lists_in_id_order_after_the_default_pools();
  validate_reports_a_negative_use_count();
  return part_test::finish();
}
