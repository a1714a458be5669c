"""Cross-stream rules of the memalloc core (torch's record_stream semantics)
on the simulated device, whose streams never complete work on their own:
a block freed after record_stream(S) stays "active_pending_free" until S is
synchronized (host_synchronize_stream) and the allocator next looks at its
events (malloc), or until the allocator synchronizes itself (empty_cache,
the OOM retry). Every allocator call is followed by validate().
"""

import pytest
from memtest_helpers import LARGE_SEGMENT, SMALL_SEGMENT, Checked, MiB, block_of, cur, rnd

from memalloc import _C


def states(a, device=0):
    return {b["address"]: b["state"] for s in a.segments(device) for b in s["blocks"]}


def fill_segment_with_two(a, size=MiB, stream=0):
    """Two blocks that exactly fill one 2 MiB small segment."""
    p = a.malloc(size, 0, stream)
    q = a.malloc(SMALL_SEGMENT - size, 0, stream)
    assert q == p + size
    return p, q


# ------------------------------------------------------------------------
def test_pending_block_not_reused_until_stream_synchronized():
    a = Checked()
    p, q = fill_segment_with_two(a)
    a.record_stream(p, 5)
    assert block_of(a, p)["state"] == "active_allocated"
    a.free(p)
    blk = block_of(a, p)
    assert blk["state"] == "active_pending_free"
    assert blk["size"] == MiB
    # allocation bookkeeping drops at free, "active" only when the events complete
    assert cur(a, "allocated_bytes") == MiB
    assert cur(a, "requested_bytes") == MiB
    assert cur(a, "allocation") == 1
    assert cur(a, "active_bytes") == 2 * MiB
    assert cur(a, "active") == 2
    assert cur(a, "inactive_split_bytes") == 0
    # same stream, same size: the pending block must not be handed out
    r1 = a.malloc(MiB)
    assert r1 != p
    assert _C._testing.live_segments(a.a) == 2
    r2 = a.malloc(MiB)  # fills the second segment
    assert r2 == r1 + MiB
    assert block_of(a, p)["state"] == "active_pending_free"
    a.host_synchronize_stream(5)
    # the completion is noticed at the next malloc, which then reuses the block
    r3 = a.malloc(MiB)
    assert r3 == p
    assert _C._testing.live_segments(a.a) == 2
    assert cur(a, "active_bytes") == 4 * MiB
    assert cur(a, "active") == 4
    assert cur(a, "allocation") == 4


def test_completion_drops_active_counters():
    a = Checked()
    p, q = fill_segment_with_two(a)
    a.record_stream(p, 9)
    a.free(p)
    a.host_synchronize_stream(9)
    s = a.stats()
    assert s["active_bytes"]["all"]["current"] == 2 * MiB  # not yet processed
    r = a.malloc(512, 0, 3)  # any malloc processes completed events
    s = a.stats()
    assert block_of(a, p)["state"] == "inactive"
    assert s["active_bytes"]["all"]["current"] == MiB + 512
    assert s["active"]["all"]["current"] == 2
    assert s["active_bytes"]["all"]["freed"] == MiB
    assert s["inactive_split_bytes"]["all"]["current"] == MiB + (SMALL_SEGMENT - 512)
    assert s["inactive_split"]["all"]["current"] == 2
    a.free(r)
    a.free(q)
    (seg0,) = [s for s in a.segments() if s["address"] == p]
    assert seg0["blocks"] == [
        {"address": p, "size": SMALL_SEGMENT, "requested_size": 0, "state": "inactive", "stack_id": 0, "tag_id": 0}
    ]


def test_record_stream_on_own_stream_is_noop():
    a = Checked()
    p = a.malloc(4096, 0, 4)
    a.record_stream(p, 4)
    a.free(p)
    assert block_of(a, p)["state"] == "inactive"
    assert cur(a, "active_bytes") == 0
    assert a.malloc(4096, 0, 4) == p


def test_all_recorded_streams_must_complete():
    a = Checked()
    p, q = fill_segment_with_two(a)
    a.record_stream(p, 11)
    a.record_stream(p, 12)
    a.record_stream(p, 11)  # recorded once
    a.free(p)
    a.host_synchronize_stream(11)
    r = a.malloc(MiB)
    assert r != p
    assert block_of(a, p)["state"] == "active_pending_free"
    a.host_synchronize_stream(13)  # unrelated stream
    a.host_synchronize_stream(0)  # the allocation stream itself
    r2 = a.malloc(MiB)
    assert r2 != p
    assert block_of(a, p)["state"] == "active_pending_free"
    a.host_synchronize_stream(12)
    assert a.malloc(MiB) == p


def test_synchronize_before_free_does_not_help():
    a = Checked()
    p, q = fill_segment_with_two(a)
    a.record_stream(p, 6)
    a.host_synchronize_stream(6)  # completes work queued before the free only
    a.free(p)
    r = a.malloc(MiB)
    assert r != p
    assert block_of(a, p)["state"] == "active_pending_free"
    a.host_synchronize_stream(6)
    # now two free 1 MiB blocks: p and the new segment's remainder; best fit
    # hands out the lower address first
    r2 = a.malloc(MiB)
    r3 = a.malloc(MiB)
    assert {r2, r3} == {p, r + MiB}
    assert r2 < r3
    assert _C._testing.live_segments(a.a) == 2


def test_pending_block_does_not_coalesce_until_complete():
    a = Checked()
    x = a.malloc(4096)
    y = a.malloc(4096)
    z = a.malloc(4096)
    a.record_stream(y, 2)
    a.free(y)
    a.free(x)
    a.free(z)  # z merges with the tail, x stays alone: y is pending between them
    (seg,) = a.segments()
    assert [(b["address"], b["state"]) for b in seg["blocks"]] == [
        (x, "inactive"),
        (y, "active_pending_free"),
        (z, "inactive"),
    ]
    assert seg["blocks"][2]["size"] == SMALL_SEGMENT - 8192
    assert cur(a, "inactive_split") == 2
    assert cur(a, "inactive_split_bytes") == SMALL_SEGMENT - 4096
    assert cur(a, "active_bytes") == 4096
    assert cur(a, "allocated_bytes") == 0
    a.host_synchronize_stream(2)
    a.malloc(512, 0, 1)  # other stream: just processes events
    seg = [s for s in a.segments() if s["address"] == x][0]
    assert seg["blocks"] == [
        {"address": x, "size": SMALL_SEGMENT, "requested_size": 0, "state": "inactive", "stack_id": 0, "tag_id": 0}
    ]
    assert cur(a, "inactive_split", "small_pool") == 1  # only the stream-1 segment's tail
    assert cur(a, "active_bytes") == 512


def test_empty_cache_synchronizes_pending_frees():
    a = Checked()
    p = a.malloc(5 * MiB)
    q = a.malloc(1000)
    a.record_stream(p, 3)
    a.record_stream(q, 4)
    a.free(p)
    a.free(q)
    assert _C._testing.live_segments(a.a) == 2
    assert cur(a, "active_bytes") == 5 * MiB + rnd(1000)
    released = a.empty_cache()
    assert released == LARGE_SEGMENT + SMALL_SEGMENT
    assert _C._testing.live_segments(a.a) == 0
    assert a.segments() == []
    s = a.stats()
    assert s["active_bytes"]["all"]["current"] == 0
    assert s["active"]["all"]["current"] == 0
    assert s["reserved_bytes"]["all"]["current"] == 0


def test_empty_cache_keeps_segment_with_live_block_but_completes_pending():
    a = Checked()
    p, q = fill_segment_with_two(a)
    a.record_stream(p, 3)
    a.free(p)
    assert a.empty_cache() == 0
    assert _C._testing.live_segments(a.a) == 1
    assert block_of(a, p)["state"] == "inactive"
    assert cur(a, "active_bytes") == MiB
    assert a.malloc(MiB) == p


def test_oom_retry_synchronizes_pending_frees():
    a = Checked("host_capacity_mb:64")
    p = a.malloc(40 * MiB)
    a.record_stream(p, 8)
    a.free(p)
    s = a.stats()
    assert s["active_bytes"]["all"]["current"] == 40 * MiB
    # 30 MiB does not fit next to the 40 MiB segment; the pending block cannot
    # be reused, but the retry synchronizes it, releases its segment and succeeds
    q = a.malloc(30 * MiB)
    s = a.stats()
    assert s["num_alloc_retries"] == 1
    assert s["num_ooms"] == 0
    assert s["num_device_free"] == 1
    assert s["reserved_bytes"]["all"]["current"] == 30 * MiB
    assert _C._testing.live_segments(a.a) == 1
    assert a.mem_get_info() == (34 * MiB, 64 * MiB)
    a.free(q)


def test_pending_segment_of_other_stream_released_on_oom_retry():
    a = Checked("host_capacity_mb:64")
    p = a.malloc(30 * MiB, 0, 1)
    q = a.malloc(30 * MiB, 0, 2)
    a.record_stream(q, 1)
    a.free(p)  # cached on stream 1
    a.free(q)  # pending on stream 1's work
    r = a.malloc(50 * MiB, 0, 3)
    assert a.stats()["num_alloc_retries"] == 1
    assert _C._testing.live_segments(a.a) == 1
    assert a.segments()[0]["stream"] == 3
    a.free(r)


def test_record_stream_invalid_pointers():
    a = Checked()
    p = a.malloc(1000)
    with pytest.raises(_C.InvalidPointerError):
        a.record_stream(p + 512, 1)  # interior
    with pytest.raises(_C.InvalidPointerError):
        a.record_stream(0xDEAD000, 1)  # unknown
    a.record_stream(p, 1)
    a.free(p)
    before = a.stats()
    with pytest.raises(_C.InvalidPointerError):
        a.record_stream(p, 2)  # freed, pending
    with pytest.raises(_C.InvalidPointerError):
        a.free(p)  # double free of a pending block
    assert a.stats() == before
    assert block_of(a, p)["state"] == "active_pending_free"


def test_freed_block_on_other_stream_gets_its_own_segment():
    a = Checked()
    ptrs = {s: a.malloc(8192, 0, s) for s in (0, 1, 2, 3)}
    segs = {s["stream"]: s for s in a.segments()}
    assert sorted(segs) == [0, 1, 2, 3]
    for s, p in ptrs.items():
        assert segs[s]["address"] == p
    for p in ptrs.values():
        a.free(p)
    # stream 2 reuses its own block and nothing else
    assert a.malloc(8192, 0, 2) == ptrs[2]
    assert a.malloc(100, 0, 1) == ptrs[1]
    assert _C._testing.live_segments(a.a) == 4
    assert a.malloc(100, 0, 4) not in ptrs.values()
    assert _C._testing.live_segments(a.a) == 5


def test_record_stream_large_block():
    a = Checked()
    p = a.malloc(12 * MiB)  # 12 MiB segment, exact
    a.record_stream(p, 21)
    a.free(p)
    q = a.malloc(12 * MiB)
    assert q != p
    assert cur(a, "reserved_bytes") == 24 * MiB
    assert cur(a, "active_bytes", "large_pool") == 24 * MiB
    a.free(q)
    a.host_synchronize_stream(21)
    r = a.malloc(12 * MiB)
    assert r == min(p, q)  # two free 12 MiB blocks: lowest address first
    assert cur(a, "active_bytes") == 12 * MiB
    assert cur(a, "reserved_bytes") == 24 * MiB
    assert block_of(a, max(p, q))["state"] == "inactive"


def test_streams_are_per_device():
    a = Checked("host_capacity_mb:64,host_devices:2")
    p = a.malloc(MiB, 1)
    q = a.malloc(MiB, 1)
    a.record_stream(p, 7, 1)
    a.free(p, 1)
    a.host_synchronize_stream(7, 0)  # device 0's stream 7: unrelated
    r = a.malloc(MiB, 1)
    r2 = a.malloc(MiB, 1)  # fills the second segment
    assert p not in (r, r2)
    assert block_of(a, p, 1)["state"] == "active_pending_free"
    a.host_synchronize_stream(7, 1)
    a.malloc(512, 1, 99)
    assert block_of(a, p, 1)["state"] == "inactive"
    assert a.malloc(MiB, 1) == p
    assert a.segments(0) == []
    assert cur(a, "active_bytes", device=0) == 0
    assert cur(a, "allocation", device=1) == 5
    a.free(q, 1)
