"""Private pools of the memalloc core on the simulated device: what CUDA
graphs, CUDA graph trees and torch.cuda.MemPool rely on (torch's
beginAllocateToPool / endAllocateToPool / releasePool / createOrIncrefPool /
emptyCache(pool) / checkPoolLiveAllocations / get/setCheckpointPoolState).

A route's filter here is a set of streams (torch's are a capture id or a
thread); every allocator call is followed by validate() (Checked).
"""

import pytest
from memtest_helpers import LARGE_SEGMENT, SMALL_SEGMENT, Checked, MiB, block_of, cur

from memalloc import _C

POOL = (0, 7)
GRAPH = (3, 0)
CAPTURE_STREAM = 11


def segments_of(a, pool):
    return [s for s in a.segments() if tuple(s["segment_pool_id"]) == pool]


# ---------------------------------------------------------------- routing ----
def test_allocations_on_a_routed_stream_come_from_the_pool_and_return_to_it():
    a = Checked()
    eager = a.malloc(MiB)  # default pool, default stream
    a.begin_allocate_to_pool(GRAPH, [CAPTURE_STREAM])
    assert a.capturing()
    inside = a.malloc(MiB, 0, CAPTURE_STREAM)
    other = a.malloc(MiB, 0, 0)  # not the routed stream: default pool
    a.end_allocate_to_pool(GRAPH)
    assert not a.capturing()
    assert [b["address"] for s in segments_of(a, GRAPH) for b in s["blocks"] if b["state"] == "active_allocated"] == [
        inside
    ]
    assert other == eager + MiB  # same default segment
    # Freed after the capture ended: back to the pool, never to eager work.
    a.free(inside)
    again = a.malloc(MiB, 0, CAPTURE_STREAM)
    assert again != inside
    assert segments_of(a, (0, 0)) and all(again != b["address"] for s in segments_of(a, GRAPH) for b in s["blocks"])


def test_a_block_freed_inside_the_capture_is_not_handed_to_eager_work():
    """The capture-safety rule: allocate and free inside a capture, allocate
    eagerly after it; the eager block must not be the captured one."""
    a = Checked()
    a.begin_allocate_to_pool(GRAPH, [CAPTURE_STREAM])
    tmp = a.malloc(4 * MiB, 0, CAPTURE_STREAM)
    out = a.malloc(4 * MiB, 0, CAPTURE_STREAM)
    a.free(tmp)  # freed during the capture: stays in the graph's pool
    a.end_allocate_to_pool(GRAPH)
    eager = a.malloc(4 * MiB, 0, CAPTURE_STREAM)  # same stream, same size, after the capture
    pool_span = [(s["address"], s["address"] + s["total_size"]) for s in segments_of(a, GRAPH)]
    assert not any(lo <= eager < hi for lo, hi in pool_span)
    assert out != eager and tmp != eager
    # Inside the pool the freed block is reused by the next capture into it.
    a.begin_allocate_to_pool(GRAPH, [CAPTURE_STREAM])
    assert a.malloc(4 * MiB, 0, CAPTURE_STREAM) == tmp
    a.end_allocate_to_pool(GRAPH)


def test_newest_route_wins_when_two_filters_accept():
    a = Checked()
    a.begin_allocate_to_pool(POOL, [5])
    a.begin_allocate_to_pool(GRAPH, [5, 6])
    p = a.malloc(MiB, 0, 5)
    a.end_allocate_to_pool(GRAPH)
    q = a.malloc(MiB, 0, 5)
    a.end_allocate_to_pool(POOL)
    assert a.pool_live_blocks_are(GRAPH, [p])
    assert a.pool_live_blocks_are(POOL, [q])


def test_pool_accounting_counts_like_the_default_pool():
    a = Checked()
    a.begin_allocate_to_pool(GRAPH, [CAPTURE_STREAM])
    p = a.malloc(3 * MiB, 0, CAPTURE_STREAM)
    a.end_allocate_to_pool(GRAPH)
    assert cur(a, "reserved_bytes") == LARGE_SEGMENT
    assert cur(a, "allocated_bytes") == 3 * MiB
    assert cur(a, "inactive_split_bytes") == LARGE_SEGMENT - 3 * MiB
    a.free(p)
    assert cur(a, "allocated_bytes") == 0
    assert cur(a, "reserved_bytes") == LARGE_SEGMENT


# -------------------------------------------------------------- lifetimes ----
def test_use_counts_and_release_follow_torch():
    a = Checked()
    a.create_or_incref_pool(POOL)  # MemPool()
    assert a.pool_use_count(POOL) == 1
    a.begin_allocate_to_pool(POOL, [0])  # use_mem_pool: begin adds a use...
    assert a.pool_use_count(POOL) == 2
    p = a.malloc(MiB)
    a.end_allocate_to_pool(POOL)
    a.release_pool(POOL)  # ...and release drops it
    assert a.pool_use_count(POOL) == 1
    a.free(p)
    # In use: neither empty_cache() nor emptying the pool releases its segment.
    assert a.empty_cache() == 0
    assert a.empty_pool_cache(POOL) == 0
    assert len(segments_of(a, POOL)) == 1
    a.release_pool(POOL)  # ~MemPool
    assert a.pool_use_count(POOL) == 0
    assert a.empty_pool_cache(POOL) == SMALL_SEGMENT
    assert segments_of(a, POOL) == [] and cur(a, "reserved_bytes") == 0
    with pytest.raises(_C.InvalidArgumentError, match="does not exist"):
        a.release_pool(POOL)  # deleted once freeable and empty


def test_a_freeable_pool_keeps_live_blocks_until_they_are_freed():
    a = Checked()
    a.begin_allocate_to_pool(GRAPH, [CAPTURE_STREAM])
    p = a.malloc(MiB, 0, CAPTURE_STREAM)
    a.end_allocate_to_pool(GRAPH)
    a.release_pool(GRAPH)  # graph reset while an output is still alive
    assert a.empty_cache() == 0  # the segment holds a live block
    assert len(segments_of(a, GRAPH)) == 1
    a.free(p)
    assert a.empty_cache() == SMALL_SEGMENT  # freeable pools go with the default cache
    assert a.pool_use_count(GRAPH) == 0 and segments_of(a, GRAPH) == []


def test_route_misuse_is_refused_and_changes_nothing():
    a = Checked()
    a.begin_allocate_to_pool(GRAPH, [1])
    with pytest.raises(_C.InvalidArgumentError, match="already go to"):
        a.begin_allocate_to_pool(GRAPH, [2])
    assert a.pool_use_count(GRAPH) == 1
    a.end_allocate_to_pool(GRAPH)
    with pytest.raises(_C.InvalidArgumentError, match="do not go to"):
        a.end_allocate_to_pool(GRAPH)
    with pytest.raises(_C.InvalidArgumentError, match="default pool"):
        a.create_or_incref_pool((0, 0))
    with pytest.raises(TypeError, match="pair of ints"):
        a.create_or_incref_pool(7)
    with pytest.raises(_C.InvalidArgumentError, match="negative"):
        a.create_or_incref_pool((-1, 2))
    a.release_pool(GRAPH)
    with pytest.raises(_C.InvalidArgumentError, match="already released"):
        a.release_pool(GRAPH)


# --------------------------------------------------------------- capture ----
def test_during_a_capture_nothing_is_released_and_cross_stream_frees_wait():
    """No release, no event query while a route is open (a CUDA capture
    forbids both); a free that needs stream events is deferred."""
    a = Checked("host_capacity_mb:64")
    cached = a.malloc(30 * MiB)
    a.free(cached)  # a cached 30 MiB segment that a release would return
    shared = a.malloc(MiB)
    a.record_stream(shared, 9)
    a.begin_allocate_to_pool(GRAPH, [CAPTURE_STREAM])
    a.free(shared)  # needs an event on stream 9: deferred, still active
    assert block_of(a, shared)["state"] == "active_pending_free"
    assert a.empty_cache() == 0
    with pytest.raises(Exception, match="out of memory"):
        a.malloc(40 * MiB, 0, CAPTURE_STREAM)  # no release-and-retry during a capture
    assert cur(a, "reserved_bytes") >= 30 * MiB  # the cached segment is still there
    a.end_allocate_to_pool(GRAPH)
    a.malloc(512)  # the first call outside the capture records the deferred events...
    assert block_of(a, shared)["state"] == "active_pending_free"
    a.host_synchronize_stream(9)
    a.malloc(512)  # ...and a later one sees them complete
    assert block_of(a, shared)["state"] == "inactive"
    assert a.empty_cache() >= 30 * MiB


def test_use_on_oom_pool_lends_its_free_blocks_to_a_failing_default_allocation():
    a = Checked("host_capacity_mb:40")
    a.create_or_incref_pool(POOL)
    a.begin_allocate_to_pool(POOL, [0])
    p = a.malloc(30 * MiB)
    a.end_allocate_to_pool(POOL)
    a.release_pool(POOL)
    a.free(p)
    a.set_pool_use_on_oom(POOL, False)
    with pytest.raises(Exception, match="out of memory"):
        a.malloc(30 * MiB)
    a.set_pool_use_on_oom(POOL, True)
    assert a.malloc(30 * MiB) == p


# ------------------------------------------------------------ checkpoints ----
def test_live_blocks_check_is_exact_set_equality():
    a = Checked()
    a.begin_allocate_to_pool(GRAPH, [CAPTURE_STREAM])
    p = a.malloc(MiB, 0, CAPTURE_STREAM)
    q = a.malloc(2 * MiB, 0, CAPTURE_STREAM)
    a.end_allocate_to_pool(GRAPH)
    assert a.pool_live_blocks_are(GRAPH, [p, q])
    assert not a.pool_live_blocks_are(GRAPH, [p])
    assert not a.pool_live_blocks_are(GRAPH, [p, q, q + 512])
    eager = a.malloc(MiB)
    assert not a.pool_live_blocks_are(GRAPH, [p, eager])
    assert not a.pool_live_blocks_are((9, 9), [])
    a.free(p)
    assert a.pool_live_blocks_are(GRAPH, [q])


def test_restoring_a_checkpoint_puts_the_pool_back_at_the_same_addresses():
    a = Checked()
    a.begin_allocate_to_pool(GRAPH, [CAPTURE_STREAM])
    x = a.malloc(MiB, 0, CAPTURE_STREAM)
    y = a.malloc(3 * MiB, 0, CAPTURE_STREAM)
    z = a.malloc(700, 0, CAPTURE_STREAM)
    a.free(y)
    state = a.checkpoint_pool(GRAPH)
    before = cur(a, "allocated_bytes"), cur(a, "requested_bytes"), cur(a, "inactive_split_bytes")
    layout = [
        (s["address"], [(b["address"], b["size"], b["state"]) for b in s["blocks"]]) for s in segments_of(a, GRAPH)
    ]
    assert state.pool == GRAPH and len(state.to_dict()["segments"]) == len(layout)
    # The pool moves on: x freed, new blocks taken (also in a new segment).
    a.free(x)
    w = a.malloc(5 * MiB, 0, CAPTURE_STREAM)
    v = a.malloc(30 * MiB, 0, CAPTURE_STREAM)
    a.end_allocate_to_pool(GRAPH)
    freed, allocated = a.restore_pool(state)
    assert sorted(freed) == sorted([z, w, v])
    assert sorted(allocated) == sorted([x, z])
    assert (cur(a, "allocated_bytes"), cur(a, "requested_bytes"), cur(a, "inactive_split_bytes")) == (
        before[0],
        before[1],
        before[2],
    )  # the segment added later stays, whole and free (not split)
    after = [
        (s["address"], [(b["address"], b["size"], b["state"]) for b in s["blocks"]])
        for s in segments_of(a, GRAPH)
        if s["address"] in {seg for seg, _ in layout}
    ]
    assert after == layout
    assert a.pool_live_blocks_are(GRAPH, [x, z])
    a.free(x)
    a.free(z)


def test_restoring_a_state_whose_segment_is_gone_is_refused_and_changes_nothing():
    a = Checked()
    a.create_or_incref_pool(POOL)
    a.begin_allocate_to_pool(POOL, [0])
    p = a.malloc(MiB)
    a.end_allocate_to_pool(POOL)
    a.release_pool(POOL)  # use_mem_pool's exit
    state = a.checkpoint_pool(POOL)
    a.free(p)
    a.release_pool(POOL)
    assert a.empty_pool_cache(POOL) == SMALL_SEGMENT  # its segment goes, and the empty pool with it
    a.create_or_incref_pool(POOL)  # a new pool with the same id
    before = a.stats()
    with pytest.raises(_C.InvalidArgumentError, match="no longer"):
        a.restore_pool(state)
    assert a.stats() == before


# ------------------------------------------------ a pool's own segment source ----
# torch.cuda.MemPool(allocator=...) (ncclMemAlloc, symmetric memory): the
# pool's segments come from that allocator; memalloc caches, splits,
# accounts and releases them as any pool's.
def test_a_pool_with_its_own_source_takes_and_returns_segments_through_it():
    a = Checked()
    src = _C._testing.HostSegmentSource(64 * MiB)
    a.create_or_incref_pool(POOL, source=src)
    a.begin_allocate_to_pool(POOL, [CAPTURE_STREAM])
    p = a.malloc(MiB, 0, CAPTURE_STREAM)
    q = a.malloc(MiB, 0, CAPTURE_STREAM)  # the same small segment: cached, no second call
    eager = a.malloc(MiB)  # not routed: the backend's default pool
    a.end_allocate_to_pool(POOL)
    a.release_pool(POOL)  # the route's use, as torch's use_mem_pool
    assert src.allocations == 1 and src.held == SMALL_SEGMENT
    assert [s["total_size"] for s in segments_of(a, POOL)] == [SMALL_SEGMENT]
    assert cur(a, "reserved_bytes") == 2 * SMALL_SEGMENT  # counted as any segment
    a.release_pool(POOL)  # the MemPool is gone; its blocks still live
    a.free(p)
    a.empty_cache()
    assert src.releases == 0  # q still lives in the segment
    a.free(q)
    a.empty_cache()
    assert src.releases == 1 and src.held == 0 and segments_of(a, POOL) == []
    a.free(eager)


def test_a_source_that_refuses_is_an_out_of_memory_of_that_pool_only():
    import torch

    a = Checked()
    src = _C._testing.HostSegmentSource(SMALL_SEGMENT)
    a.create_or_incref_pool(POOL, source=src)
    a.begin_allocate_to_pool(POOL, [CAPTURE_STREAM])
    p = a.malloc(MiB, 0, CAPTURE_STREAM)
    with pytest.raises(torch.OutOfMemoryError):
        a.malloc(4 * MiB, 0, CAPTURE_STREAM)  # needs a second segment: the source says no
    a.end_allocate_to_pool(POOL)
    a.release_pool(POOL)  # the route's use
    a.free(a.malloc(4 * MiB))  # the default pool is not limited by it
    assert src.allocations == 1 and cur(a, "allocated_bytes") == MiB
    a.free(p)
    a.release_pool(POOL)
    a.empty_cache()
    assert src.held == 0


def test_a_pool_keeps_the_source_it_was_made_with():
    a = Checked()
    src, other = _C._testing.HostSegmentSource(8 * MiB), _C._testing.HostSegmentSource(8 * MiB)
    a.create_or_incref_pool(POOL, source=src)
    a.create_or_incref_pool(POOL, source=src)  # the same one: one more use
    assert a.pool_use_count(POOL) == 2
    with pytest.raises(ValueError, match="already exists with another segment source"):
        a.create_or_incref_pool(POOL, source=other)
    assert a.pool_use_count(POOL) == 2  # nothing changed


def test_pools_with_a_source_under_a_memory_fraction_and_use_on_oom():
    """upstream test_cuda.py's test_mempool_limited_memory_with_allocator on
    the simulated device: two pools of one outside allocator, one use_on_oom,
    80 MiB allowed; the default pool falls back to the use_on_oom pool's free
    block (same address), never to the other pool's, and the pools give their
    segments back through the allocator when they go."""
    import torch

    a = Checked("host_capacity_mb:4096")
    src = _C._testing.HostSegmentSource(1 << 40)
    other, fallback = (0, 1), (0, 2)
    for pool in (other, fallback):
        a.create_or_incref_pool(pool, source=src)
    a.set_pool_use_on_oom(fallback, True)
    a.set_memory_fraction(80 * MiB / (4096 * MiB))

    def in_pool(pool, nbytes):
        a.begin_allocate_to_pool(pool, [0])  # use_mem_pool: this thread's allocations, current stream
        p = a.malloc(nbytes)
        a.end_allocate_to_pool(pool)
        a.release_pool(pool)
        return p

    pa, pb = in_pool(other, 40 * MiB), in_pool(fallback, 40 * MiB)
    with pytest.raises(torch.OutOfMemoryError):
        a.malloc(40 * MiB)
    a.free(pa)
    a.free(pb)
    c = a.malloc(30 * MiB)
    assert c == pb  # the use_on_oom pool's block
    with pytest.raises(torch.OutOfMemoryError):
        a.malloc(30 * MiB)  # the other pool is not a fallback
    a.free(c)
    e = in_pool(fallback, 20 * MiB)
    assert e == c
    a.free(e)
    for pool in (fallback, other):  # the MemPools' destructors
        a.set_pool_use_on_oom(pool, False)
        a.release_pool(pool)
        a.empty_pool_cache(pool)
    assert src.allocations == 2 and src.releases == 2 and src.held == 0
