"""Caching policy of the memalloc core on the simulated (host) device.

Every expected number below is derived from the native rules
(docs/architecture.md, c10/cuda/CUDACachingAllocator.cpp):
  * sizes < 512 B round to 512 B, others up to a multiple of 512 B;
  * rounded sizes <= 1 MiB are served from 2 MiB small segments;
  * 1 MiB < size < 10 MiB get a 20 MiB large segment, >= 10 MiB a segment
    rounded up to 2 MiB;
  * small blocks split when >= 512 B remain, large ones when > 1 MiB remains
    and the request is below max_split_size;
  * best fit: smallest adequate free block on the same stream, lowest
    address first; free neighbours coalesce.

Every scripted test goes through `Checked`, which runs validate() on every
device after each allocator call.
"""

import pytest
import torch
from memtest_helpers import (
    LARGE_SEGMENT,
    SCALAR_KEYS,
    SMALL_SEGMENT,
    STAT_KEYS,
    Checked,
    KiB,
    MiB,
    block_of,
    cur,
    live_block_bytes,
    rnd,
    rnd_pow2,
    segment_of,
    segment_size,
    stat,
)

from memalloc import _C


# --------------------------------------------------------------- rounding ----
@pytest.mark.parametrize("size", [1, 100, 511, 512, 513, 1000, 1024, 4097, 65536 + 1, MiB - 1, MiB])
def test_small_request_rounding_and_segment(size):
    a = Checked()
    p = a.malloc(size)
    assert p != 0
    want = rnd(size)
    assert want % 512 == 0 and want >= size
    assert cur(a, "allocated_bytes") == want
    assert cur(a, "allocated_bytes", "small_pool") == want
    assert cur(a, "allocated_bytes", "large_pool") == 0
    assert cur(a, "requested_bytes") == size
    assert cur(a, "reserved_bytes") == SMALL_SEGMENT
    assert cur(a, "segment", "small_pool") == 1
    (seg,) = a.segments()
    assert seg["segment_type"] == "small"
    assert seg["total_size"] == SMALL_SEGMENT
    assert seg["address"] == p
    first = seg["blocks"][0]
    assert first == {
        "address": p,
        "size": want,
        "requested_size": size,
        "state": "active_allocated",
        "stack_id": 0,
        "tag_id": 0,
    }
    rest = SMALL_SEGMENT - want
    # remainder >= 512 always splits in the small pool
    assert [b["size"] for b in seg["blocks"][1:]] == [rest]
    assert seg["blocks"][1]["state"] == "inactive"
    assert cur(a, "inactive_split_bytes") == rest
    assert cur(a, "inactive_split") == 1
    assert _C._testing.live_segments(a.a) == 1
    a.free(p)
    assert cur(a, "allocated_bytes") == 0
    assert cur(a, "requested_bytes") == 0
    assert cur(a, "reserved_bytes") == SMALL_SEGMENT  # cached, not returned
    assert cur(a, "inactive_split") == 0  # coalesced back into one block


def test_zero_size_is_null_and_counts_nothing():
    a = Checked()
    before = a.stats()
    assert a.malloc(0) == 0
    a.free(0)  # free(nullptr) is a no-op
    assert a.stats() == before
    assert a.segments() == []
    assert _C._testing.live_segments(a.a) == 0


@pytest.mark.parametrize(
    "size",
    [MiB + 1, 2 * MiB, 5 * MiB + 7, 9 * MiB, 10 * MiB - 512, 10 * MiB - 511],
)
def test_mid_size_request_gets_20mib_large_segment(size):
    a = Checked()
    p = a.malloc(size)
    want = rnd(size)
    assert MiB < want <= 10 * MiB
    seg = segment_of(a, p)
    assert seg["segment_type"] == "large"
    if want < 10 * MiB:
        assert seg["total_size"] == LARGE_SEGMENT
    else:  # exactly 10 MiB after rounding: its own segment
        assert seg["total_size"] == 10 * MiB
    remaining = seg["total_size"] - want
    blk = block_of(a, p)
    if remaining > MiB:
        assert blk["size"] == want
        assert [b["size"] for b in seg["blocks"]] == [want, remaining]
    else:
        assert blk["size"] == seg["total_size"]
    assert cur(a, "allocated_bytes", "large_pool") == blk["size"]
    assert cur(a, "allocated_bytes", "small_pool") == 0
    assert cur(a, "requested_bytes", "large_pool") == size
    assert cur(a, "reserved_bytes", "large_pool") == seg["total_size"]


@pytest.mark.parametrize(
    "size,segment,block",
    [
        # exactly 10 MiB: own segment of 10 MiB, nothing left
        (10 * MiB, 10 * MiB, 10 * MiB),
        # 10 MiB + 1 -> 10 MiB + 512 in a 12 MiB segment; 2 MiB - 512 left > 1 MiB: split
        (10 * MiB + 1, 12 * MiB, 10 * MiB + 512),
        # 11 MiB + 1 -> 11 MiB + 512 in 12 MiB; 1 MiB - 512 left: not split
        (11 * MiB + 1, 12 * MiB, 12 * MiB),
        # 13 MiB in 14 MiB: exactly 1 MiB left is not "more than 1 MiB": not split
        (13 * MiB, 14 * MiB, 14 * MiB),
        # 13 MiB - 512 in 14 MiB: 1 MiB + 512 left: split
        (13 * MiB - 512, 14 * MiB, 13 * MiB - 512),
        (33 * MiB + 3, 34 * MiB, 34 * MiB),
    ],
)
def test_big_request_segment_rounded_to_2mib(size, segment, block):
    a = Checked()
    # the table above follows from the rules; double-check it against them
    assert segment == segment_size(rnd(size))
    assert block == (rnd(size) if segment - rnd(size) > MiB else segment)
    p = a.malloc(size)
    seg = segment_of(a, p)
    assert seg["total_size"] == segment
    assert seg["segment_type"] == "large"
    assert block_of(a, p)["size"] == block
    # allocated_bytes counts the whole block, including an unsplit remainder
    assert cur(a, "allocated_bytes") == block
    assert cur(a, "requested_bytes") == size
    assert cur(a, "reserved_bytes") == segment
    assert cur(a, "inactive_split_bytes") == segment - block
    assert cur(a, "active_bytes") == block
    a.free(p)
    assert cur(a, "allocated_bytes") == 0
    assert cur(a, "active_bytes") == 0
    assert stat(a, "allocated_bytes", field="allocated") == block
    assert stat(a, "allocated_bytes", field="freed") == block


@pytest.mark.parametrize("divisions", [2, 4, 8])
@pytest.mark.parametrize(
    "size",
    [1, 600, 2049, 2500, 4097, 5000, 8192, 12289, MiB - 1, MiB + 1, 3 * MiB + 5, 11 * MiB + 1],
)
def test_roundup_power2_divisions(divisions, size):
    a = Checked(f"host_capacity_mb:64,roundup_power2_divisions:{divisions}")
    p = a.malloc(size)
    want = rnd_pow2(size, divisions)
    assert want >= size and want % 512 == 0
    assert cur(a, "requested_bytes") == size
    pool = "small_pool" if want <= MiB else "large_pool"
    seg = segment_of(a, p)
    assert seg["segment_type"] == ("small" if want <= MiB else "large")
    assert seg["total_size"] == segment_size(want)
    remaining = seg["total_size"] - want
    splits = remaining >= 512 if want <= MiB else remaining > MiB
    expected_block = want if splits else seg["total_size"]
    assert block_of(a, p)["size"] == expected_block
    assert cur(a, "allocated_bytes", pool) == expected_block


def test_roundup_power2_divisions_differs_from_plain_rounding():
    # 4097 B: plain rounding gives 4608, four divisions of [4096, 8192) give 5120
    plain = Checked()
    div4 = Checked("roundup_power2_divisions:4")
    plain.malloc(4097)
    div4.malloc(4097)
    assert cur(plain, "allocated_bytes") == 4608
    assert cur(div4, "allocated_bytes") == 5120
    assert _C.parse_config("roundup_power2_divisions:1") == _C.parse_config("")


# ------------------------------------------------------------ small pool ----
def test_small_segment_is_carved_until_full():
    a = Checked()
    p1 = a.malloc(MiB)
    p2 = a.malloc(MiB)  # remainder of exactly 1 MiB: used whole, nothing left
    assert p2 == p1 + MiB
    assert _C._testing.live_segments(a.a) == 1
    assert cur(a, "inactive_split_bytes") == 0
    (seg,) = a.segments()
    assert [b["size"] for b in seg["blocks"]] == [MiB, MiB]
    p3 = a.malloc(512)  # no free byte left: a second small segment
    assert _C._testing.live_segments(a.a) == 2
    assert cur(a, "segment", "small_pool") == 2
    assert segment_of(a, p3)["address"] == p3
    assert cur(a, "reserved_bytes") == 2 * SMALL_SEGMENT


def test_consecutive_small_allocations_are_adjacent():
    a = Checked()
    sizes = [100, 513, 4096, 3000, 1]
    ptrs = [a.malloc(s) for s in sizes]
    addr = ptrs[0]
    for p, s in zip(ptrs, sizes):
        assert p == addr
        addr += rnd(s)
    assert cur(a, "allocation") == len(sizes)
    assert cur(a, "allocated_bytes") == sum(rnd(s) for s in sizes)
    assert cur(a, "requested_bytes") == sum(sizes)
    assert cur(a, "inactive_split_bytes") == SMALL_SEGMENT - sum(rnd(s) for s in sizes)
    assert _C._testing.live_segments(a.a) == 1


def test_small_and_large_pools_are_separate():
    a = Checked()
    big = a.malloc(5 * MiB)  # 20 MiB large segment with 15 MiB free
    small = a.malloc(1000)  # must not be carved from the large segment
    assert segment_of(a, small)["segment_type"] == "small"
    assert segment_of(a, small)["address"] != segment_of(a, big)["address"]
    assert cur(a, "segment", "small_pool") == 1
    assert cur(a, "segment", "large_pool") == 1
    assert cur(a, "reserved_bytes", "small_pool") == SMALL_SEGMENT
    assert cur(a, "reserved_bytes", "large_pool") == LARGE_SEGMENT
    assert cur(a, "reserved_bytes") == SMALL_SEGMENT + LARGE_SEGMENT
    # a request just above 1 MiB never comes from the small segment's free space
    mid = a.malloc(MiB + 512)
    assert segment_of(a, mid)["address"] == segment_of(a, big)["address"]
    assert mid == big + 5 * MiB
    for key in STAT_KEYS:
        s = a.stats()[key]
        for field in ("current", "allocated", "freed"):
            assert s["all"][field] == s["small_pool"][field] + s["large_pool"][field], (key, field)


def test_large_segment_shared_and_unsplit_remainder_counted():
    a = Checked()
    p1 = a.malloc(5 * MiB)
    p2 = a.malloc(5 * MiB)
    assert p2 == p1 + 5 * MiB  # carved from the same 20 MiB segment
    # 10 MiB remain; a 9 MiB request would leave exactly 1 MiB: not split
    p3 = a.malloc(9 * MiB)
    assert p3 == p1 + 10 * MiB
    assert block_of(a, p3)["size"] == 10 * MiB
    assert _C._testing.live_segments(a.a) == 1
    assert cur(a, "allocated_bytes") == 20 * MiB
    assert cur(a, "requested_bytes") == 19 * MiB
    assert cur(a, "inactive_split_bytes") == 0
    assert cur(a, "allocation", "large_pool") == 3
    a.free(p3)
    # the freed 10 MiB block is reused whole by an 8.5 MiB request (1.5 MiB > 1 MiB: split)
    p4 = a.malloc(8 * MiB + 512 * 1024)
    assert p4 == p3
    assert block_of(a, p4)["size"] == 8 * MiB + 512 * KiB
    assert cur(a, "inactive_split_bytes") == 10 * MiB - (8 * MiB + 512 * KiB)


def test_big_request_served_from_cached_large_remainder():
    # best fit searches the whole large pool: a >= 10 MiB request fits in the
    # free 15 MiB remainder of a 20 MiB segment and gets no segment of its own
    a = Checked()
    p = a.malloc(5 * MiB)
    q = a.malloc(12 * MiB)
    assert q == p + 5 * MiB
    assert _C._testing.live_segments(a.a) == 1
    assert block_of(a, q)["size"] == 12 * MiB  # 3 MiB left > 1 MiB: split
    assert cur(a, "inactive_split_bytes") == 3 * MiB
    # 14 MiB does not fit in the 3 MiB left: own 14 MiB segment
    r = a.malloc(14 * MiB)
    assert segment_of(a, r)["total_size"] == 14 * MiB
    assert _C._testing.live_segments(a.a) == 2


# --------------------------------------------------------------- best fit ----
def _holey_small_segment(a, hole_sizes):
    """Lays out hole0, sep, hole1, sep, ... , rest in one small segment and
    frees the holes. Returns the hole addresses (separators stay live)."""
    holes, seps = [], []
    for size in hole_sizes:
        holes.append(a.malloc(size))
        seps.append(a.malloc(512))
    for h in holes:
        a.free(h)
    assert _C._testing.live_segments(a.a) == 1
    return holes


def test_best_fit_picks_smallest_adequate_block():
    a = Checked()
    holes = _holey_small_segment(a, [4 * KiB, 8 * KiB, 2 * KiB])
    a4, a8, a2 = holes
    assert cur(a, "inactive_split") == 4  # three holes + the tail
    # 2 KiB: exact fit in the 2 KiB hole, though the 4 KiB hole is lower
    assert a.malloc(2 * KiB) == a2
    # 3 KiB: the 4 KiB hole (smallest adequate), split: 1 KiB stays free there
    assert a.malloc(3 * KiB) == a4
    assert block_of(a, a4 + 3 * KiB) == {
        "address": a4 + 3 * KiB,
        "size": KiB,
        "requested_size": 0,
        "state": "inactive",
        "stack_id": 0,
        "tag_id": 0,
    }
    # 6 KiB: neither the 1 KiB leftover nor the tail (bigger) but the 8 KiB hole
    assert a.malloc(6 * KiB) == a8
    # 1 KiB: the 1 KiB leftover, not the 2 KiB leftover of the 8 KiB hole
    assert a.malloc(KiB) == a4 + 3 * KiB


def test_best_fit_lowest_address_among_equal_sizes():
    a = Checked()
    holes = _holey_small_segment(a, [4 * KiB, 4 * KiB, 4 * KiB])
    assert [a.malloc(4 * KiB) for _ in holes] == sorted(holes)


def test_best_fit_across_large_segments():
    a = Checked("host_capacity_mb:128")
    # two 20 MiB segments, each with a different free remainder
    x = a.malloc(6 * MiB)  # remainder 14 MiB
    y = a.malloc(15 * MiB)  # own 16 MiB segment (>= 10 MiB), 1 MiB left: unsplit
    z = a.malloc(6 * MiB)  # from x's segment remainder -> 8 MiB left there
    assert z == x + 6 * MiB
    assert block_of(a, y)["size"] == 16 * MiB
    w = a.malloc(2 * MiB)  # best fit: only the 8 MiB remainder fits
    assert w == x + 12 * MiB
    a.free(y)  # a free 16 MiB whole segment; the 6 MiB remainder of x's segment
    # 5 MiB: the 6 MiB remainder (smaller) beats the 16 MiB segment
    v = a.malloc(5 * MiB)
    assert v == x + 14 * MiB
    assert block_of(a, v)["size"] == 6 * MiB  # 1 MiB left: not split
    # 7 MiB: only the cached 16 MiB segment fits; reused, no new segment
    n = cur(a, "segment")
    u = a.malloc(7 * MiB)
    assert u == y
    assert cur(a, "segment") == n
    assert stat(a, "segment", field="allocated") == 2


# ------------------------------------------------------------ coalescing ----
@pytest.mark.parametrize("order", [(0, 1, 2), (1, 0, 2), (2, 1, 0), (1, 2, 0), (0, 2, 1)])
def test_coalescing_restores_whole_segment(order):
    a = Checked()
    ptrs = [a.malloc(s) for s in (3000, 70000, 512)]
    tail = SMALL_SEGMENT - sum(rnd(s) for s in (3000, 70000, 512))
    for i, idx in enumerate(order):
        a.free(ptrs[idx])
        seg = a.segments()[0]
        # no two adjacent inactive blocks, ever
        states = [b["state"] for b in seg["blocks"]]
        assert all(not (s == t == "inactive") for s, t in zip(states, states[1:]))
        live = [p for j, p in enumerate(ptrs) if j not in order[: i + 1]]
        assert [b["address"] for b in seg["blocks"] if b["state"] == "active_allocated"] == live
        assert cur(a, "inactive_split_bytes") == (SMALL_SEGMENT - live_block_bytes(a) if live else 0)
    (seg,) = a.segments()
    assert seg["blocks"] == [
        {
            "address": ptrs[0],
            "size": SMALL_SEGMENT,
            "requested_size": 0,
            "state": "inactive",
            "stack_id": 0,
            "tag_id": 0,
        }
    ]
    assert tail > 0
    assert cur(a, "inactive_split") == 0
    assert cur(a, "inactive_split_bytes") == 0
    assert cur(a, "reserved_bytes") == SMALL_SEGMENT
    # the whole segment is reusable for a full 1 MiB + 1 MiB
    assert a.malloc(MiB) == ptrs[0]
    assert a.malloc(MiB) == ptrs[0] + MiB
    assert _C._testing.live_segments(a.a) == 1


def test_coalesced_large_block_serves_bigger_request():
    a = Checked()
    p1 = a.malloc(4 * MiB)
    p2 = a.malloc(4 * MiB)
    p3 = a.malloc(4 * MiB)
    a.free(p1)
    a.free(p2)  # p1+p2 coalesce into 8 MiB at p1
    seg = segment_of(a, p1)
    assert [(b["size"], b["state"]) for b in seg["blocks"]] == [
        (8 * MiB, "inactive"),
        (4 * MiB, "active_allocated"),
        (8 * MiB, "inactive"),
    ]
    assert cur(a, "inactive_split") == 2
    assert cur(a, "inactive_split_bytes") == 16 * MiB
    # 7 MiB: both 8 MiB blocks fit; the lower address is taken (8 - 7 = 1 MiB: unsplit)
    q = a.malloc(7 * MiB)
    assert q == p1
    assert block_of(a, q)["size"] == 8 * MiB
    assert _C._testing.live_segments(a.a) == 1
    a.free(q)
    a.free(p3)
    (seg,) = a.segments()
    assert [(b["size"], b["state"]) for b in seg["blocks"]] == [(LARGE_SEGMENT, "inactive")]


# ------------------------------------------------------------ stream reuse ----
@pytest.mark.parametrize("size", [1000, 5 * MiB, 12 * MiB])
def test_freed_block_reused_by_same_stream_only(size):
    a = Checked()
    p = a.malloc(size, 0, 0)
    a.free(p)
    assert a.malloc(size, 0, 0) == p  # same stream: cached block reused
    assert stat(a, "segment", field="allocated") == 1
    a.free(p)
    q = a.malloc(size, 0, 7)  # other stream: never the stream-0 block
    assert q != p
    assert segment_of(a, q)["address"] != segment_of(a, p)["address"]
    assert segment_of(a, q)["stream"] == 7
    assert segment_of(a, p)["stream"] == 0
    assert _C._testing.live_segments(a.a) == 2
    assert stat(a, "segment", field="allocated") == 2
    a.free(q)
    # each stream keeps finding its own block
    assert a.malloc(size, 0, 7) == q
    assert a.malloc(size, 0, 0) == p
    assert _C._testing.live_segments(a.a) == 2


def test_other_stream_does_not_use_free_space_of_split_segment():
    a = Checked()
    p = a.malloc(4096, stream=1)
    q = a.malloc(4096, stream=2)
    assert segment_of(a, p)["address"] != segment_of(a, q)["address"]
    r = a.malloc(4096, stream=1)
    assert r == p + 4096
    assert cur(a, "segment") == 2
    streams = sorted(s["stream"] for s in a.segments())
    assert streams == [1, 2]


# ----------------------------------------------------------- accounting ----
def test_counters_current_allocated_freed():
    a = Checked()
    # the big request first: later it would fit in the 20 MiB segment's remainder
    sizes = [100, 2000, 13 * MiB + 1, 3 * MiB]
    ptrs = [a.malloc(s) for s in sizes]
    blocks = [block_of(a, p)["size"] for p in ptrs]
    assert blocks[0:2] == [rnd(100), rnd(2000)]
    assert blocks[2] == 14 * MiB  # 13 MiB + 512 in 14 MiB: 1 MiB - 512 left, unsplit
    assert blocks[3] == 3 * MiB  # from a new 20 MiB segment, split
    s = a.stats()
    assert s["allocation"]["all"]["current"] == 4
    assert s["allocation"]["small_pool"]["current"] == 2
    assert s["allocation"]["large_pool"]["current"] == 2
    assert s["allocated_bytes"]["all"]["current"] == sum(blocks)
    assert s["allocated_bytes"]["small_pool"]["current"] == sum(blocks[:2])
    assert s["requested_bytes"]["all"]["current"] == sum(sizes)
    assert s["requested_bytes"]["large_pool"]["current"] == sum(sizes[2:])
    assert s["active_bytes"]["all"]["current"] == sum(blocks)
    assert s["active"]["all"]["current"] == 4
    assert s["segment"]["all"]["current"] == 3
    assert s["reserved_bytes"]["all"]["current"] == SMALL_SEGMENT + LARGE_SEGMENT + 14 * MiB
    assert s["num_device_alloc"] == 3
    assert s["num_device_free"] == 0
    for p in ptrs[::-1]:
        a.free(p)
    s = a.stats()
    for key in ("allocation", "allocated_bytes", "requested_bytes", "active", "active_bytes"):
        for pool in ("all", "small_pool", "large_pool"):
            st = s[key][pool]
            assert st["current"] == 0, (key, pool)
            assert st["allocated"] == st["freed"], (key, pool)
    assert s["allocated_bytes"]["all"]["allocated"] == sum(blocks)
    assert s["requested_bytes"]["all"]["freed"] == sum(sizes)
    assert s["allocation"]["all"]["allocated"] == 4
    # cached, not released
    assert s["reserved_bytes"]["all"]["current"] == SMALL_SEGMENT + LARGE_SEGMENT + 14 * MiB
    assert s["reserved_bytes"]["all"]["freed"] == 0


def test_peak_and_reset_peak():
    a = Checked()
    p1 = a.malloc(MiB)
    p2 = a.malloc(5 * MiB)
    p3 = a.malloc(1000)
    peak_alloc = MiB + 5 * MiB + rnd(1000)
    a.free(p2)
    s = a.stats()
    assert s["allocated_bytes"]["all"]["peak"] == peak_alloc
    assert s["allocated_bytes"]["all"]["current"] == MiB + rnd(1000)
    assert s["allocated_bytes"]["large_pool"]["peak"] == 5 * MiB
    assert s["allocated_bytes"]["large_pool"]["current"] == 0
    assert s["requested_bytes"]["all"]["peak"] == MiB + 5 * MiB + 1000
    assert s["allocation"]["all"]["peak"] == 3
    assert s["reserved_bytes"]["all"]["peak"] == SMALL_SEGMENT + LARGE_SEGMENT

    a.reset_peak_stats()
    s = a.stats()
    for key in STAT_KEYS:
        for pool in ("all", "small_pool", "large_pool"):
            assert s[key][pool]["peak"] == s[key][pool]["current"], (key, pool)
    assert s["allocated_bytes"]["all"]["peak"] == MiB + rnd(1000)
    # allocated/freed are untouched by reset_peak
    assert s["allocated_bytes"]["all"]["allocated"] == peak_alloc

    p4 = a.malloc(2 * MiB)  # from the cached 20 MiB segment
    a.free(p4)
    s = a.stats()
    assert s["allocated_bytes"]["all"]["peak"] == MiB + rnd(1000) + 2 * MiB
    assert s["allocated_bytes"]["all"]["peak"] < peak_alloc
    assert s["reserved_bytes"]["all"]["peak"] == SMALL_SEGMENT + LARGE_SEGMENT
    a.free(p1)
    a.free(p3)
    a.empty_cache()
    a.reset_peak_stats()
    s = a.stats()
    assert s["reserved_bytes"]["all"]["peak"] == 0
    assert s["allocated_bytes"]["all"]["peak"] == 0


def test_reset_accumulated_stats():
    a = Checked()
    p = a.malloc(3000)
    q = a.malloc(3 * MiB)
    a.free(q)
    a.reset_accumulated_stats()
    s = a.stats()
    for key in STAT_KEYS:
        for pool in ("all", "small_pool", "large_pool"):
            assert s[key][pool]["allocated"] == 0 and s[key][pool]["freed"] == 0, (key, pool)
    for key in SCALAR_KEYS:
        assert s[key] == 0
    assert s["allocated_bytes"]["all"]["current"] == rnd(3000)
    assert s["reserved_bytes"]["all"]["current"] == SMALL_SEGMENT + LARGE_SEGMENT
    assert s["allocated_bytes"]["all"]["peak"] == rnd(3000) + 3 * MiB
    a.free(p)
    a.malloc(512)
    s = a.stats()
    assert s["allocated_bytes"]["all"]["freed"] == rnd(3000)
    assert s["allocated_bytes"]["all"]["allocated"] == 512
    assert s["allocation"]["all"]["allocated"] == 1
    assert s["num_device_alloc"] == 0  # served from cache


# -------------------------------------------------------- max_split_size ----
def test_max_split_oversize_block_not_used_for_smaller_request():
    a = Checked("host_capacity_mb:256,max_split_size_mb:40")
    p = a.malloc(50 * MiB)
    assert block_of(a, p)["size"] == 50 * MiB
    a.free(p)
    # 30 MiB < max_split, cached 50 MiB >= max_split: not used, new segment
    q = a.malloc(30 * MiB)
    assert q != p
    assert segment_of(a, q)["total_size"] == 30 * MiB
    assert _C._testing.live_segments(a.a) == 2
    assert cur(a, "reserved_bytes") == 80 * MiB
    # the 50 MiB block is still one unsplit free block
    assert segment_of(a, p)["blocks"] == [
        {"address": p, "size": 50 * MiB, "requested_size": 0, "state": "inactive", "stack_id": 0, "tag_id": 0}
    ]


def test_max_split_oversize_block_serves_big_request_unsplit():
    a = Checked("host_capacity_mb:256,max_split_size_mb:40")
    p = a.malloc(60 * MiB)
    a.free(p)
    # 42 MiB >= max_split; 60 MiB wastes < 20 MiB (kLargeBuffer): reused, not split
    q = a.malloc(42 * MiB)
    assert q == p
    assert block_of(a, q)["size"] == 60 * MiB
    assert cur(a, "allocated_bytes") == 60 * MiB
    assert cur(a, "requested_bytes") == 42 * MiB
    assert cur(a, "inactive_split_bytes") == 0
    assert _C._testing.live_segments(a.a) == 1


def test_max_split_oversize_block_wasting_too_much_is_skipped():
    a = Checked("host_capacity_mb:256,max_split_size_mb:40")
    p = a.malloc(64 * MiB)
    a.free(p)
    # 42 + 20 <= 64: the cached block would waste >= 20 MiB: new segment
    q = a.malloc(42 * MiB)
    assert q != p
    assert segment_of(a, q)["total_size"] == 42 * MiB
    assert _C._testing.live_segments(a.a) == 2


def test_without_max_split_big_cached_block_is_split():
    a = Checked("host_capacity_mb:256")
    p = a.malloc(60 * MiB)
    a.free(p)
    q = a.malloc(30 * MiB)
    assert q == p
    assert block_of(a, q)["size"] == 30 * MiB
    assert cur(a, "inactive_split_bytes") == 30 * MiB
    assert _C._testing.live_segments(a.a) == 1


def test_max_split_small_requests_still_split_20mib_segments():
    a = Checked("host_capacity_mb:256,max_split_size_mb:40")
    p = a.malloc(5 * MiB)
    q = a.malloc(5 * MiB)
    assert q == p + 5 * MiB
    assert _C._testing.live_segments(a.a) == 1
    assert cur(a, "inactive_split_bytes") == 10 * MiB


# ------------------------------------------------------------ empty_cache ----
def test_empty_cache_releases_only_fully_free_segments():
    a = Checked()
    small = a.malloc(1000)
    big = a.malloc(12 * MiB)  # before mid: it would fit in mid's free remainder
    mid = a.malloc(5 * MiB)
    mid2 = a.malloc(5 * MiB, stream=3)
    assert _C._testing.live_segments(a.a) == 4
    free0, total = a.mem_get_info()
    assert total == 64 * MiB
    assert free0 == total - (SMALL_SEGMENT + 2 * LARGE_SEGMENT + 12 * MiB)
    a.free(mid)
    a.free(big)
    released = a.empty_cache()
    assert released == LARGE_SEGMENT + 12 * MiB
    assert _C._testing.live_segments(a.a) == 2
    assert cur(a, "reserved_bytes") == SMALL_SEGMENT + LARGE_SEGMENT
    assert cur(a, "segment") == 2
    assert a.mem_get_info() == (free0 + released, total)
    s = a.stats()
    assert s["num_device_free"] == 2
    assert s["reserved_bytes"]["all"]["freed"] == released
    # the split segments with live blocks are kept, their blocks untouched
    assert block_of(a, small)["state"] == "active_allocated"
    assert block_of(a, mid2)["state"] == "active_allocated"
    assert a.empty_cache() == 0
    a.free(small)
    a.free(mid2)
    assert a.empty_cache() == SMALL_SEGMENT + LARGE_SEGMENT
    assert _C._testing.live_segments(a.a) == 0
    assert a.segments() == []
    assert cur(a, "reserved_bytes") == 0
    assert a.mem_get_info() == (total, total)
    # usable again afterwards
    p = a.malloc(1000)
    assert _C._testing.live_segments(a.a) == 1
    a.free(p)


# ---------------------------------------------------------- memory fraction ----
def test_memory_fraction_limits_reserved():
    a = Checked()
    assert a.memory_fraction() == 1.0  # no limit set: the whole device, as torch answers
    a.set_memory_fraction(0.5)  # 32 MiB of 64
    assert a.memory_fraction() == 0.5
    p = a.malloc(30 * MiB)  # 30 MiB segment: fits the 32 MiB cap
    free, total = a.mem_get_info()
    assert free == 34 * MiB
    # 4 MiB needs a 20 MiB segment: fits the device, not the fraction
    with pytest.raises(torch.OutOfMemoryError) as exc:
        a.malloc(4 * MiB)
    assert "Tried to allocate" in str(exc.value)
    assert a.stats()["num_ooms"] == 1
    assert _C._testing.live_segments(a.a) == 1
    # a small 2 MiB segment still fits (30 + 2 <= 32)
    q = a.malloc(1000)
    assert cur(a, "reserved_bytes") == 32 * MiB
    a.free(q)
    a.free(p)
    # another stream cannot use the cached 30 MiB block; the cache (30 + 2 MiB)
    # is released to make room under the cap (retry)
    r = a.malloc(20 * MiB, stream=1)
    s = a.stats()
    assert s["num_alloc_retries"] == 2
    assert s["num_ooms"] == 1
    assert cur(a, "reserved_bytes") == 20 * MiB
    a.free(r)
    a.set_memory_fraction(1.0)
    big = a.malloc(40 * MiB)  # stream 0 cannot use r's segment; 20 + 40 <= 64
    assert _C._testing.live_segments(a.a) == 2
    a.free(big)


def test_lowering_fraction_releases_nothing():
    a = Checked()
    p = a.malloc(30 * MiB)
    a.set_memory_fraction(0.25)  # 16 MiB < 30 MiB reserved
    assert cur(a, "reserved_bytes") == 30 * MiB
    assert _C._testing.live_segments(a.a) == 1
    with pytest.raises(torch.OutOfMemoryError):
        a.malloc(1000)
    a.free(p)
    # after releasing the cache (retry) there is room again
    q = a.malloc(1000)
    assert cur(a, "reserved_bytes") == SMALL_SEGMENT
    a.free(q)


# ---------------------------------------------------------- multi device ----
def test_devices_are_accounted_separately():
    a = Checked("host_capacity_mb:64,host_devices:2")
    assert a.device_count == 2
    p0 = a.malloc(1000, 0)
    p1 = a.malloc(5 * MiB, 1)
    q1 = a.malloc(3000, 1)
    s0, s1 = a.stats(0), a.stats(1)
    assert s0["allocated_bytes"]["all"]["current"] == rnd(1000)
    assert s0["reserved_bytes"]["all"]["current"] == SMALL_SEGMENT
    assert s1["allocated_bytes"]["all"]["current"] == 5 * MiB + rnd(3000)
    assert s1["reserved_bytes"]["all"]["current"] == LARGE_SEGMENT + SMALL_SEGMENT
    assert _C._testing.live_segments(a.a, 0) == 1
    assert _C._testing.live_segments(a.a, 1) == 2
    assert a.mem_get_info(0) == (64 * MiB - SMALL_SEGMENT, 64 * MiB)
    assert a.mem_get_info(1) == (64 * MiB - LARGE_SEGMENT - SMALL_SEGMENT, 64 * MiB)
    assert len(a.segments(0)) == 1 and len(a.segments(1)) == 2
    assert all(s["device"] == 1 for s in a.segments(1))
    # each device has its own capacity
    big0 = a.malloc(60 * MiB, 0)
    big1 = a.malloc(40 * MiB, 1)
    a.free(big0, 0)
    a.free(big1, 1)
    a.free(p1, 1)
    a.reset_peak_stats(1)
    assert stat(a, "allocated_bytes", field="peak", device=0) == rnd(1000) + 60 * MiB
    assert stat(a, "allocated_bytes", field="peak", device=1) == rnd(3000)
    assert a.empty_cache(1) == LARGE_SEGMENT + 40 * MiB
    assert _C._testing.live_segments(a.a, 0) == 2
    a.free(q1, 1)
    a.free(p0, 0)
    assert cur(a, "allocated_bytes", device=0) == 0
    assert cur(a, "allocated_bytes", device=1) == 0


def test_fraction_is_per_device():
    a = Checked("host_capacity_mb:64,host_devices:2")
    a.set_memory_fraction(0.25, 1)
    assert a.memory_fraction(0) == 1.0  # none set on device 0
    assert a.memory_fraction(1) == 0.25
    with pytest.raises(torch.OutOfMemoryError):
        a.malloc(20 * MiB, 1)
    p = a.malloc(20 * MiB, 0)
    a.free(p, 0)
    assert a.stats(0)["num_ooms"] == 0
    assert a.stats(1)["num_ooms"] == 1
