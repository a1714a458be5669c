"""Expandable segments on the host backend (csrc/pool/vm_arena.h, expandable.cpp):
MEMALLOC_CONF=expandable_segments:True backs one address range per (stream,
pool kind) page by page; reserved bytes are mapped bytes; free whole pages
go back on empty_cache, before an OOM and (reuse_free_pages, the default)
before new pages are mapped. In-process, on allocators the tests own; every
test validates the allocator's invariants after each step that changes it.
The CUDA counterpart: tests/gpu/test_cuda_expandable.py."""

from __future__ import annotations

import random

import pytest
import torch
from memalloc._C import _testing
from memalloc.recording import events

import memalloc
from memalloc import _C

T = _C._testing
MiB = 1 << 20
PAGE = 2 * MiB
EXPANDABLE = "expandable_segments:True"
NATIVE_LIKE = "expandable_segments:True,reuse_free_pages:False"


def make(config: str = EXPANDABLE, capacity_mb: int = 256) -> _C.Allocator:
    return memalloc.Allocator("host", f"{config},host_capacity_mb:{capacity_mb}")


def stat(a, key: str, pool: str = "all") -> int:
    return a.stats(0)[key][pool]["current"]


def check(a) -> list:
    """validate(), and the figures a user reads agree with each other: reserved
    == sum of the reported segments == device memory in use; the segment count
    == the number of reported segments (one per mapped run)."""
    a.validate()
    segs = a.segments(0)
    reserved = stat(a, "reserved_bytes")
    assert reserved == sum(s["total_size"] for s in segs)
    assert stat(a, "segment") == len(segs)
    free, total = a.mem_get_info(0)
    assert total - free == reserved
    for s in segs:
        assert s["total_size"] == sum(b["size"] for b in s["blocks"])
    return segs


def test_config_keys_round_trip():
    a = make("expandable_segments:True,reuse_free_pages:False")
    text = a.config
    assert "expandable_segments:True" in text and "reuse_free_pages:False" in text
    assert "expandable_segments" not in memalloc.Allocator("host", "").config
    with pytest.raises(
        memalloc.errors.InvalidArgumentError, match="expandable_segments:True or expandable_segments:False"
    ):
        memalloc.Allocator("host", "expandable_segments:yes")


def test_growth_maps_pages_next_to_the_last_block_and_reserved_is_mapped_bytes():
    a = make()
    p = a.malloc(30 * MiB)
    q = a.malloc(3 * MiB)  # 1-10 MiB: native would reserve a 20 MiB segment
    segs = check(a)
    assert q == p + 30 * MiB  # the same range, right after
    assert len(segs) == 1 and segs[0]["is_expandable"]
    assert stat(a, "reserved_bytes") == 34 * MiB  # whole pages: 30 + 4
    assert [b["size"] for b in segs[0]["blocks"]] == [30 * MiB, 3 * MiB, 1 * MiB]  # the tail is split off
    r = a.malloc(3 * MiB // 2)  # the free 1 MiB tail plus one new page
    assert r == q + 3 * MiB
    assert stat(a, "reserved_bytes") == 36 * MiB
    check(a)
    for x in (p, q, r):
        a.free(x)
    check(a)


def test_small_and_large_requests_and_streams_get_their_own_segments():
    a = make()
    small = a.malloc(4096)
    large = a.malloc(12 * MiB)
    other = a.malloc(12 * MiB, 0, 7)
    segs = check(a)
    assert len(segs) == 3
    kinds = sorted((s["segment_type"], s["stream"]) for s in segs)
    assert kinds == [("large", 0), ("large", 7), ("small", 0)]
    assert stat(a, "reserved_bytes", "small_pool") == PAGE
    for x in (small, large, other):
        a.free(x)
    check(a)


def test_empty_cache_unmaps_free_pages_and_ends_empty_reservations():
    a = make()
    ptrs = [a.malloc(8 * MiB) for _ in range(6)]
    for x in ptrs[1::2]:
        a.free(x)  # three 8 MiB holes between live blocks
    check(a)
    assert stat(a, "reserved_bytes") == 48 * MiB
    released = a.empty_cache()
    assert released == 24 * MiB  # every free page, though no segment is wholly free
    segs = check(a)
    assert stat(a, "reserved_bytes") == 24 * MiB and len(segs) == 3  # three mapped runs
    assert stat(a, "inactive_split_bytes") == 0
    for x in ptrs[0::2]:
        a.free(x)
    assert a.empty_cache() == 24 * MiB
    assert check(a) == [] and a.mem_get_info(0)[0] == 256 * MiB
    p = a.malloc(5 * MiB)  # a new reservation after the old one ended
    check(a)
    a.free(p)


def test_reuse_keeps_reserved_near_the_most_allocated_where_native_like_growth_adds_pages():
    def run(config):
        a = make(config, capacity_mb=512)
        big = a.malloc(100 * MiB)
        keep = a.malloc(10 * MiB)
        a.free(big)
        c = a.malloc(150 * MiB)  # does not fit the 100 MiB hole
        check(a)
        peak = a.stats(0)["reserved_bytes"]["all"]["peak"]
        a.free(keep)
        a.free(c)
        check(a)
        return peak

    assert run(NATIVE_LIKE) == 260 * MiB
    # The most allocated at once is 160 MiB; reserved may reach 5% above it
    # (168 MiB) without a stream synchronisation, and the hole's pages make up
    # the rest: 92 MiB of them are unmapped and mapped again under c.
    assert run(EXPANDABLE) == 168 * MiB


def test_above_10_gib_the_reuse_ceiling_is_512_mib_over_the_most_allocated():
    """The same moves at 100x the size: the most allocated at once is 16 GiB,
    where 5% would let 819 MiB lie free; the ceiling is capped at 512 MiB
    above it (VmArena::kReuseSlackCap), so reserved peaks within one 20 MiB
    page (the page of a pool of 8 GiB or more) under 16 GiB + 512 MiB. The
    hole's pages make up the rest; without reuse they stay mapped."""
    GiB, large_page, cap = 1 << 30, 20 * MiB, 512 * MiB

    def run(config):
        a = make(config, capacity_mb=64 * 1024)
        big = a.malloc(10 * GiB)
        keep = a.malloc(1 * GiB)
        a.free(big)
        c = a.malloc(15 * GiB)  # does not fit the 10 GiB hole
        check(a)
        s = a.stats(0)
        a.free(keep)
        a.free(c)
        check(a)
        return s["reserved_bytes"]["all"]["peak"], s["allocated_bytes"]["all"]["peak"]

    reserved, allocated = run(EXPANDABLE)
    assert allocated == 16 * GiB
    assert allocated + cap - large_page < reserved <= allocated + cap < allocated * 1.05
    reserved_native_like, _ = run(NATIVE_LIKE)
    assert reserved_native_like >= 26 * GiB  # the hole, keep's page and c's pages


def test_a_batch_that_plain_segments_cannot_fit():
    """Live 5 MiB blocks with 5 MiB holes between them: 50 MiB free, but in
    plain segments no segment is wholly free, so 40 MiB more does not fit in a
    128 MiB device; expandable segments give back the holes' pages and map
    them again where the 40 MiB goes."""

    def fill(a):
        ptrs = [a.malloc(5 * MiB) for _ in range(20)]
        for x in ptrs[::2]:
            a.free(x)
        return ptrs[1::2]

    plain = make("", capacity_mb=128)
    live = fill(plain)
    with pytest.raises(torch.OutOfMemoryError):
        plain.malloc(40 * MiB)
    plain.validate()
    for x in live:
        plain.free(x)

    for config in (EXPANDABLE, NATIVE_LIKE):  # native-like reaches it by the release before an OOM
        a = make(config, capacity_mb=128)
        live = fill(a)
        big = a.malloc(40 * MiB)
        check(a)
        assert stat(a, "reserved_bytes") <= 128 * MiB
        assert a.stats(0)["num_alloc_retries"] == (1 if config == NATIVE_LIKE else 0)
        for x in live + [big]:
            a.free(x)
        check(a)


def test_memory_fraction_caps_mapped_bytes():
    a = make(capacity_mb=256)
    a.set_memory_fraction(0.25)  # 64 MiB
    p = a.malloc(60 * MiB)
    with pytest.raises(torch.OutOfMemoryError, match="memory fraction"):
        a.malloc(8 * MiB)
    check(a)
    assert stat(a, "reserved_bytes") == 60 * MiB
    a.free(p)
    q = a.malloc(64 * MiB)  # the free pages are reused, reserved stays within the cap
    assert stat(a, "reserved_bytes") == 64 * MiB
    check(a)
    a.free(q)


def test_a_failed_map_is_an_oom_after_releasing_and_the_books_stay_exact():
    a = make(capacity_mb=64)
    p = a.malloc(8 * MiB)
    T.inject_allocate_faults(a, 0, 2)  # the map and its retry fail
    with pytest.raises(torch.OutOfMemoryError):
        a.malloc(8 * MiB)
    check(a)
    assert stat(a, "reserved_bytes") == 8 * MiB and stat(a, "allocated_bytes") == 8 * MiB
    q = a.malloc(8 * MiB)
    check(a)
    a.free(p)
    a.free(q)
    T.inject_allocate_faults(a, 0, 1, True)
    with pytest.raises(memalloc.errors.DriverError, match="injected"):
        a.malloc(32 * MiB)  # more than the 16 MiB cached
    check(a)


def test_private_pools_keep_plain_segments():
    a = make()
    pool, stream = (1, 0), 5
    _testing.begin_allocate_to_pool(a, pool, [stream])
    g = a.malloc(3 * MiB, 0, stream)
    _testing.end_allocate_to_pool(a, pool)
    d = a.malloc(3 * MiB, 0, stream)
    segs = check(a)
    owned = [s for s in segs if s["segment_pool_id"] == pool]
    assert len(owned) == 1 and not owned[0]["is_expandable"] and owned[0]["total_size"] == 20 * MiB
    assert [s["is_expandable"] for s in segs if s["segment_pool_id"] == (0, 0)] == [True]
    a.free(g)
    a.free(d)
    _testing.release_pool(a, pool)
    a.empty_cache()
    assert check(a) == []


def test_pages_of_a_block_pending_on_another_stream_are_not_unmapped():
    a = make()
    p = a.malloc(16 * MiB)
    a.record_stream(p, 9)
    a.free(p)  # pending until stream 9's work is done
    check(a)
    a.malloc(8 * MiB, 0, 3)  # another stream maps its own pages
    assert stat(a, "active_bytes") == 24 * MiB
    assert stat(a, "reserved_bytes") == 24 * MiB  # the pending block's pages stay mapped
    a.empty_cache()  # waits for stream 9, then unmaps them
    check(a)
    assert stat(a, "reserved_bytes") == 8 * MiB


def test_events_and_snapshot_name_the_mappings():
    a = make()
    a.set_recording(1000)
    p = a.malloc(12 * MiB)
    a.free(p)
    a.empty_cache()
    actions = [(e.action, e.size) for e in events(allocator=a)]
    assert ("segment_map", 12 * MiB) in actions and ("segment_unmap", 12 * MiB) in actions
    assert not any(act == "segment_alloc" for act, _ in actions)
    snap = memalloc.snapshot(allocator=a)
    kinds = [e["action"] for e in snap["device_traces"][0]]
    assert "segment_map" in kinds and "segment_unmap" in kinds


def test_unknown_and_double_frees_inside_an_expandable_segment_are_refused():
    a = make()
    p = a.malloc(12 * MiB)
    a.free(p)
    with pytest.raises(memalloc.errors.InvalidPointerError, match="double free"):
        a.free(p)
    with pytest.raises(memalloc.errors.InvalidPointerError, match="double free"):
        a.free(p + MiB)
    check(a)


@pytest.mark.parametrize(
    "config",
    [EXPANDABLE, NATIVE_LIKE, EXPANDABLE + ",roundup_power2_divisions:4", EXPANDABLE + ",max_split_size_mb:64"],
)
def test_random_operations_keep_every_invariant(config):
    """Seeded random mallocs (sizes across the small/large pools), frees,
    cross-stream uses, stream synchronisations, empty_cache, a memory
    fraction, OOMs: validate() and the user-visible figures after each."""
    rng = random.Random(config)
    a = make(config, capacity_mb=192)
    live: list[int] = []
    ooms = 0
    for _ in range(1500):
        op = rng.random()
        if op < 0.5 or not live:
            size = int(2 ** rng.uniform(8, 26))
            stream = rng.choice((0, 0, 0, 11))
            try:
                live.append(a.malloc(size, 0, stream))
            except torch.OutOfMemoryError:
                ooms += 1
        elif op < 0.88:
            p = live.pop(rng.randrange(len(live)))
            if rng.random() < 0.2:
                a.record_stream(p, 13)
            a.free(p)
        elif op < 0.93:
            a.host_synchronize_stream(13)
        elif op < 0.97:
            a.empty_cache()
        else:
            a.set_memory_fraction(rng.choice((0.3, 1.0)))
        check(a)
    assert ooms > 0  # the capacity was reached: the OOM path ran too
    for p in live:
        a.free(p)
    a.empty_cache()
    assert check(a) == []


def test_a_steady_loop_stops_giving_pages_back_after_its_first_steps():
    """reuse_free_pages gives pages back (a stream synchronisation each time on
    CUDA) only while growth would pass 1.05x the most ever allocated: a loop
    repeating the same allocations settles, and then maps and unmaps nothing."""
    rng = random.Random(5)
    sizes = [int(2 ** rng.uniform(20, 26)) for _ in range(40)]
    a = make(capacity_mb=4096)
    a.set_recording(100_000)
    marks = []
    for _ in range(12):
        marks.append(len(events(allocator=a)))
        live = []
        for i, size in enumerate(sizes):
            live.append(a.malloc(size))
            if i % 3 == 2:  # activations freed along the way, in another order
                a.free(live.pop(len(live) // 2))
        for p in reversed(live):
            a.free(p)
        check(a)
    evs = events(allocator=a)
    late = [e.action for e in evs[marks[4] :] if e.action in ("segment_map", "segment_unmap")]
    assert late == []
    s = a.stats(0)
    assert s["reserved_bytes"]["all"]["peak"] <= 1.05 * s["allocated_bytes"]["all"]["peak"] + PAGE


def test_the_threshold_policy_unmaps_free_pages_before_growing_past_it():
    a = make(EXPANDABLE + ",garbage_collection_threshold:0.5,reuse_free_pages:False", capacity_mb=256)
    ptrs = [a.malloc(20 * MiB) for _ in range(6)]  # 120 MiB
    for x in ptrs[0::2]:
        a.free(x)  # three 20 MiB holes between live blocks, still mapped
    assert stat(a, "reserved_bytes") == 120 * MiB
    big = a.malloc(40 * MiB)  # fits no hole; 160 MiB would pass 0.5 x 256: the free pages go first
    assert a.stats(0)["num_gc_releases"] == 1
    assert stat(a, "reserved_bytes") == 100 * MiB  # 120 - 60 + 40
    check(a)
    for x in [big, *ptrs[1::2]]:
        a.free(x)
    check(a)


def test_each_device_has_its_own_expandable_segments():
    a = memalloc.Allocator("host", EXPANDABLE + ",host_capacity_mb:128,host_devices:2")
    p0 = a.malloc(30 * MiB, 0)
    p1 = a.malloc(50 * MiB, 1)
    for d, want in ((0, 30 * MiB), (1, 50 * MiB)):
        a.validate(d)
        assert a.stats(d)["reserved_bytes"]["all"]["current"] == want
        assert a.mem_get_info(d)[0] == 128 * MiB - want
        assert [s["is_expandable"] for s in a.segments(d)] == [True]
    with pytest.raises(memalloc.errors.InvalidPointerError):
        a.free(p0, 1)  # device 1 never allocated it
    a.free(p0, 0)
    a.free(p1, 1)
    assert a.empty_cache(0) == 30 * MiB and a.empty_cache(1) == 50 * MiB
    a.validate(0)
    a.validate(1)


def test_the_oom_message_suggests_expandable_segments_unless_they_are_on():
    for config, fragment in (
        ("", "MEMALLOC_CONF=expandable_segments:True to avoid fragmentation"),
        (EXPANDABLE, "expandable segments: free pages were given back"),
    ):
        a = make(config, capacity_mb=64)
        with pytest.raises(torch.OutOfMemoryError) as e:
            a.malloc(100 * MiB)
        assert fragment in str(e.value)
        a.validate()


@pytest.mark.parametrize("held_gib,page_mib", [(2, 8), (8, 20)])
def test_max_split_size_does_not_keep_a_page_tail_in_the_block(held_gib, page_mib):
    """Native's should_split with expandable segments on: any remainder of
    512 B or more splits off, whatever max_split_size says. torch's
    test_allocator_settings sets max_split_size_mb:40 and then reads 84 MiB of
    active bytes for an 84 MiB tensor; once 2 (8) GiB is held the request
    maps whole 8 (20) MiB pages, and the tail must stay a free block, not
    part of the tensor's."""
    a = make(EXPANDABLE + ",max_split_size_mb:40", capacity_mb=16 * 1024)
    hold = a.malloc(-(-(held_gib << 30) // (40 * MiB)) * 40 * MiB)  # whole 8 and 20 MiB pages: no tail
    keys = ("active_bytes", "reserved_bytes", "requested_bytes", "inactive_split_bytes")
    before = {k: stat(a, k) for k in keys}
    assert before["inactive_split_bytes"] == 0
    size = 84 * MiB
    p = a.malloc(size)
    check(a)
    mapped = -(-size // (page_mib * MiB)) * page_mib * MiB
    assert mapped > size  # the page leaves a tail: the case under test
    assert stat(a, "reserved_bytes") - before["reserved_bytes"] == mapped
    assert stat(a, "active_bytes") - before["active_bytes"] == size
    assert stat(a, "requested_bytes") - before["requested_bytes"] == size
    assert stat(a, "inactive_split_bytes") - before["inactive_split_bytes"] == mapped - size
    a.free(p)
    a.free(hold)
    a.empty_cache()
    assert check(a) == []


def test_a_private_pools_plain_block_splits_as_natives_does_with_expandable_segments_on():
    """The rule follows the setting, not the segment: a private pool keeps a
    plain segment (2 MiB-rounded), and with expandable segments on native
    splits its sub-MiB tail off even above max_split_size."""
    size = 41 * MiB + 512 * 1024  # its segment: 42 MiB; the tail 512 KiB
    for config, splits in ((EXPANDABLE + ",max_split_size_mb:40", True), ("max_split_size_mb:40", False)):
        a = make(config)
        pool, stream = (1, 0), 5
        _testing.begin_allocate_to_pool(a, pool, [stream])
        p = a.malloc(size, 0, stream)
        _testing.end_allocate_to_pool(a, pool)
        check(a)
        assert stat(a, "reserved_bytes") == 42 * MiB
        assert stat(a, "active_bytes") == (size if splits else 42 * MiB), config
        a.free(p)
        _testing.release_pool(a, pool)
        a.empty_cache()
        assert check(a) == []
