"""What growing costs in driver calls (issue 38), counted on the host backend
without a GPU: the host device counts the CUDA calls its virtual memory
would have made (backend_cuda.cpp's, call for call: _C._testing.vm_calls).

On an H200, one physical allocation (cuMemCreate + cuMemMap) takes tens of
microseconds whatever its size; memalloc mapped 2 MiB pages, 512 per GiB,
and took 372-444 ms for a fresh 16 GiB tensor where native's expandable
segments, mapping 20 MiB handles (torch's kLargeBuffer, its large pool's
segment size), took 49 ms. memalloc now maps pages of that size for the
large pool's requests of 256 MiB or more on devices of 8 GiB or more, and
for all of them once 8 GiB is held; 8 MiB pages once 2 GiB is held
(pool/vm_arena.h says why not sooner).
The guard: on a device of an H200's size, every way memory grows (one
16 GiB tensor, 64 tensors of 256 MiB, the same again after empty_cache)
makes no more driver calls than native's expandable segments make for it,
counted by the rule torch's ExpandableSegment::map follows (a handle of
20 MiB per 20 MiB mapped, one cuMemSetAccess per map): 1,641 and 1,704
calls where 2 MiB pages made 16,385 and 16,448; reusing mapped memory
makes none; and reserved bytes stay within one page of allocated bytes
after each fresh growth. A training loop whose requests are smaller
(activations of tens to hundreds of MiB: a loop of growing lengths, and
the H200's trace of a ~1B model trained at varying lengths) still makes
more: their tests are expected failures until issue 38 is done.

The GPU's side (the time itself, native beside memalloc in fresh
processes): benchmarks/speed/growth.py."""

from __future__ import annotations

import pytest

import memalloc
from memalloc import _C

T = _C._testing
MiB = 1 << 20
GiB = 1 << 30
H200_MB = 143_771  # torch.cuda.get_device_properties(0).total_memory of the lent H200, in MiB (about 140 GiB)
NATIVE_HANDLE = 20 * MiB  # torch's kLargeBuffer: the large pool's handle in native's expandable segments


def native_calls(sizes: list[int]) -> int:
    """The fewest driver calls native's expandable segments make to grow
    a fresh segment for ``sizes`` (bytes, allocated in order, none freed):
    each allocation that does not fit the segment's mapped free tail maps
    whole 20 MiB handles for the rest (cuMemCreate + cuMemMap each) and
    sets access once."""
    calls, tail = 0, 0
    for size in sizes:
        if size <= tail:
            tail -= size
            continue
        handles = -(-(size - tail) // NATIVE_HANDLE)
        calls += 2 * handles + 1
        tail = tail + handles * NATIVE_HANDLE - size
    return calls


def total(calls: dict) -> int:
    return sum(calls.values())


@pytest.fixture
def h200():
    """An allocator on a host device of an H200's size, expandable segments
    on (memalloc.enable()'s default). Nothing is touched: the host
    backend's mappings are address space until written."""
    a = memalloc.Allocator("host", f"expandable_segments:True,host_capacity_mb:{H200_MB}")
    yield a
    a.empty_cache()
    a.validate()


def grow(a, sizes: list[int]) -> tuple[list[int], int]:
    """Allocates ``sizes`` in order; the pointers and the driver calls made."""
    before = total(T.vm_calls(a))
    ptrs = [a.malloc(s) for s in sizes]
    return ptrs, total(T.vm_calls(a)) - before


def reserved(a) -> int:
    return a.stats(0)["reserved_bytes"]["all"]["current"]


def allocated(a) -> int:
    return a.stats(0)["allocated_bytes"]["all"]["current"]


def largest_page(a) -> int:
    """The largest page of the allocator's expandable segments (bytes)."""
    return max(s["page_size"] for s in a.segments(0))


@pytest.mark.parametrize("sizes", [[16 * GiB], [256 * MiB] * 64], ids=["one 16 GiB tensor", "64 x 256 MiB"])
def test_growing_makes_no_more_driver_calls_than_native_expandable(h200, sizes):
    a = h200
    ptrs, calls = grow(a, sizes)
    native = native_calls(sizes)
    assert calls <= native, (calls, native)
    # native's page, and what it maps is what was asked, within a page
    page = largest_page(a)
    assert page == NATIVE_HANDLE and sum(sizes) <= reserved(a) <= allocated(a) + page
    # the same again after freeing them: the mapped memory is reused, no driver call
    for p in ptrs:
        a.free(p)
    again, calls = grow(a, sizes)
    assert calls == 0
    # after empty_cache every page goes back, and growing again costs what the fresh one did at most
    for p in again:
        a.free(p)
    a.empty_cache()
    assert reserved(a) == 0
    ptrs, calls = grow(a, sizes)
    assert calls <= native, (calls, native)
    for p in ptrs:
        a.free(p)


# Every large-pool request in 20 MiB pages (native's rule) passes both tests
# below (the 1B trace: 3,058 pages for a peak of 3,026) but reserves 1.0527
# per allocated byte on the varlen trace's replay, over issue 14's 1.05
# (tests/integration/test_replay.py), and large pages from 20 MiB reserve
# 1.088 on the random workload's (2026-12-03): not landed.
OPEN = (
    "issue 38, open: below 8 GiB held, the large pool's requests under 256 MiB grow in 2 and 8 MiB pages "
    "(pool/vm_arena.h says why)"
)


@pytest.mark.xfail(strict=True, reason=OPEN + "; at length 256, 96 MiB grown: 99 driver calls where native makes 11")
def test_a_training_loop_growing_step_by_step_stays_within_natives_calls(h200):
    """A training loop's growth: activations of lengths that grow step by
    step (the 1B run's new longest sequences: 16 to 512 MiB here), each
    step's blocks freed before the next; every step that grows makes no
    more calls than native would for the same step's new bytes."""
    a = h200
    for length in (256, 512, 768, 1024, 1536, 2048):
        step = [length * 64 * 1024, length * 256 * 1024, length * 64 * 1024]  # 16 MiB..64 MiB at 256
        before_reserved = reserved(a)
        ptrs, calls = grow(a, step)
        grown = reserved(a) - before_reserved
        assert calls <= native_calls([max(grown, 1)]) + len(step), (length, calls, grown)
        for p in ptrs:
            a.free(p)


def replay_1b(a) -> tuple[dict, dict]:
    """The H200's trace of benchmarks/speed/growth.py's train case (a ~1B
    Llama, lengths 256 to 2048: benchmarks/traces/llama1b_growth.mtrace.gz)
    replayed into allocator ``a`` request by request, what it left live then
    freed: (the backend's driver calls, device 0's stats before the frees)."""
    from memtest_helpers import REPO

    from memalloc.trace.trace_files import load_trace

    events = load_trace(REPO / "benchmarks" / "traces" / "llama1b_growth.mtrace.gz").events[0]
    ptrs = {}
    for e in events:
        if e.action == "alloc":
            ptrs[e.addr] = a.malloc(e.requested, 0, e.stream)
        elif e.action == "free_requested":
            a.free(ptrs.pop(e.addr), 0)
    calls, stats = T.vm_calls(a), a.stats(0)
    for p in ptrs.values():
        a.free(p, 0)
    return calls, stats


@pytest.mark.xfail(
    strict=True,
    reason=OPEN + "; the 1B trace creates 4,362 pages (22,461 before 2026-12-06) where its peak holds 3,026 "
    "of 20 MiB (its first step: 1.5 s on the H200 against native expandable's 0.85-0.93 s)",
)
def test_the_1b_model_trained_on_the_h200_grows_in_natives_pages(h200):
    """The 1B trace (replay_1b) on a host device of the H200's size: the
    pages it creates are
    no more than 2% above the 20 MiB pages of its peak reserved bytes (no
    churn, native's page), one access call per mapping, and the peak
    reserved stays within the reuse ceiling (5% over the peak allocated)."""
    calls, s = replay_1b(h200)
    peak_reserved, peak_allocated = s["reserved_bytes"]["all"]["peak"], s["allocated_bytes"]["all"]["peak"]
    assert calls["create"] <= 1.02 * -(-peak_reserved // NATIVE_HANDLE), calls
    assert calls["set_access"] == s["num_device_alloc"]
    assert peak_reserved <= 1.05 * peak_allocated, (peak_reserved, peak_allocated)


def test_a_pool_of_8_gib_grows_in_natives_large_pages(h200):
    """Once the device holds 8 GiB (VmArena::kLargePagesOnceReserved), the
    large pool's requests of any size grow in 20 MiB pages, as native's
    (a page is then at most 1/400 of the pool); from 2 GiB
    (kMidPagesOnceReserved) in 8 MiB pages; below it, requests under
    256 MiB grow in 2 MiB pages. 64 requests of 200 MiB, none freed: the
    pages each one maps follow from the bytes reserved before it."""
    a, size, ptrs = h200, 200 * MiB, []
    want = 0
    for _ in range(64):
        reserved = a.stats(0)["reserved_bytes"]["all"]["current"]
        want += size // (NATIVE_HANDLE if reserved >= 8 * GiB else 8 * MiB if reserved >= 2 * GiB else 2 * MiB)
        ptrs.append(a.malloc(size, 0, 0))
    calls = T.vm_calls(a)
    assert calls["create"] == calls["map"] == want, (calls, want)
    assert want < 64 * size // (2 * MiB)  # the case crosses 8 GiB: some requests took large pages
    assert a.stats(0)["reserved_bytes"]["all"]["current"] == 64 * size  # 200 MiB is whole pages of both sizes
    for p in ptrs:
        a.free(p, 0)


def test_growing_again_after_empty_cache_takes_large_pages_at_once(h200):
    """A process that has held 8 GiB grows in 20 MiB pages from its first
    request after empty_cache() gave every page back (the arena remembers
    its high-water mark of allocated bytes), not in 2 MiB pages until
    8 GiB again: re-growing costs what the first growth past 8 GiB did."""
    a, size = h200, 200 * MiB
    ptrs = [a.malloc(size, 0, 0) for _ in range(48)]  # 9.4 GiB
    for p in ptrs:
        a.free(p, 0)
    a.empty_cache()
    assert a.stats(0)["reserved_bytes"]["all"]["current"] == 0
    before = T.vm_calls(a)["create"]
    ptrs = [a.malloc(size, 0, 0) for _ in range(5)]  # 1,000 MiB, far below 8 GiB
    assert T.vm_calls(a)["create"] - before == 5 * size // NATIVE_HANDLE
    for p in ptrs:
        a.free(p, 0)


def test_the_1b_trace_grows_in_no_more_pages_than_it_does_now(h200):
    """A ratchet under the expected failure above: the 1B trace (replay_1b)
    on a host device of the H200's size creates at most RATCHET_1B physical
    allocations (22,461 before the 8 GiB rule of 2026-12-06, 6,754 before
    its 8 MiB pages from 2 GiB, 4,443 before the reuse ceiling's 512 MiB cap,
    whose 44 page moves created their pages again, 4,570 until the moves
    took the pages they unmap; lower it when a rule lowers it), one
    set-access per mapping, and reserves at most 1.01 per allocated byte at
    its peak (issue 38's target: 1.0438 under the 5% ceiling alone, with
    2.4 GiB free at the peak in blocks too small for the longest sequence's
    requests; 1.0098 with the cap, on the H100 too). Its page moves
    synchronise no stream (44 synchronisations before 2026-12-06's moves,
    each a drained GPU on the device: 1.03x native's run time on the H100);
    a mapping waits for a moved range's stream at most MOVE_WAITS_1B times."""
    calls, s = replay_1b(h200)
    assert calls["create"] <= RATCHET_1B, calls
    assert calls["map"] > calls["create"], calls  # page moves map pages they did not create
    assert calls["set_access"] == s["num_device_alloc"]
    assert calls["stream_syncs"] == 0 and calls["waits"] <= MOVE_WAITS_1B, calls
    assert s["reserved_bytes"]["all"]["peak"] <= 1.01 * s["allocated_bytes"]["all"]["peak"]


RATCHET_1B = 4_362
MOVE_WAITS_1B = 2
