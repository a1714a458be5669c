"""Fault injection on the host backend: the simulated device refuses
allocations (as out-of-memory or with a driver error) or refuses to take
segments back, at chosen or random points. memalloc must retry, report,
raise, and stay consistent: no segment lost, every counter exact."""

from __future__ import annotations

import random

import pytest
import torch
from memtest_helpers import LARGE_SEGMENT, SMALL_SEGMENT, Checked, MiB, cur

from memalloc import _C


def stat(a, key):
    return a.stats(0)[key]


def books_match_device(a, device=0):
    """memalloc's segments are exactly what the simulated device holds."""
    segs = a.segments(device)
    assert _C._testing.live_segments(a.a, device) == len(segs)
    assert cur(a, "reserved_bytes", device=device) == sum(s["total_size"] for s in segs)


def test_one_refused_allocation_is_retried_after_releasing_the_cache():
    a = Checked("host_capacity_mb:64")
    cached = a.malloc(3 * MiB)  # a 20 MiB segment, then cached
    a.free(cached)
    _C._testing.inject_allocate_faults(a.a, skip=0, count=1)
    p = a.malloc(24 * MiB)  # no cached fit: refused once, cache released, retried
    s = a.stats(0)
    assert s["num_alloc_retries"] == 1 and s["num_ooms"] == 0
    assert s["num_device_free"] == 1  # the cached 20 MiB segment went back first
    assert cur(a, "reserved_bytes") == 24 * MiB
    assert _C._testing.faults_injected(a.a, 0) == (1, 0)
    books_match_device(a)
    a.free(p)


def test_refused_twice_raises_oom_and_leaves_state_as_before():
    a = Checked("host_capacity_mb:64")
    keep = a.malloc(4096)
    before = a.stats(0)
    _C._testing.inject_allocate_faults(a.a, skip=0, count=2)
    with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
        a.malloc(12 * MiB)
    after = a.stats(0)
    assert after["num_ooms"] == before["num_ooms"] + 1
    assert after["num_alloc_retries"] == before["num_alloc_retries"] + 1
    for key in ("allocated_bytes", "requested_bytes", "allocation"):
        assert after[key]["all"]["current"] == before[key]["all"]["current"]
    books_match_device(a)
    q = a.malloc(12 * MiB)  # faults used up: works again
    books_match_device(a)
    a.free(q)
    a.free(keep)


def test_driver_error_propagates_and_changes_nothing():
    a = Checked("host_capacity_mb:64")
    keep = a.malloc(4096)
    before = a.stats(0)
    _C._testing.inject_allocate_faults(a.a, skip=0, count=1, driver_error=True)
    with pytest.raises(_C.DriverError, match="injected device error"):
        a.malloc(12 * MiB)
    assert a.stats(0) == before
    books_match_device(a)
    a.free(keep)


def test_skip_lets_the_first_allocations_through():
    a = Checked("host_capacity_mb:64")
    _C._testing.inject_allocate_faults(a.a, skip=2, count=1)
    p1 = a.malloc(1 * MiB)  # small segment: ok (skip 2 -> 1)
    p2 = a.malloc(2 * MiB)  # large segment: ok (skip 1 -> 0)
    a.free(p1)  # small segment now cached
    p3 = a.malloc(24 * MiB)  # no cached fit: refused once -> cache released -> retried
    assert a.stats(0)["num_alloc_retries"] == 1
    assert _C._testing.faults_injected(a.a, 0) == (1, 0)
    books_match_device(a)
    a.free(p2)
    a.free(p3)


def test_refused_release_keeps_the_segment_cached_and_retries_later():
    a = Checked("host_capacity_mb:64")
    p, q = a.malloc(4096), a.malloc(3 * MiB)
    a.free(p)
    a.free(q)
    _C._testing.inject_release_faults(a.a, skip=0, count=1)
    released = a.empty_cache(0)
    s = a.stats(0)
    assert s["num_device_free_failures"] == 1
    # One of the two segments was refused; it is still cached and counted.
    assert released in (SMALL_SEGMENT, LARGE_SEGMENT)
    assert cur(a, "reserved_bytes") == SMALL_SEGMENT + LARGE_SEGMENT - released
    books_match_device(a)
    assert a.empty_cache(0) == SMALL_SEGMENT + LARGE_SEGMENT - released
    assert cur(a, "reserved_bytes") == 0 and _C._testing.live_segments(a.a, 0) == 0
    assert _C._testing.faults_injected(a.a, 0) == (0, 1)


def test_refused_release_is_recorded_as_an_event():
    a = Checked("host_capacity_mb:64")
    a.set_recording(64, 0)
    a.free(a.malloc(4096))
    _C._testing.inject_release_faults(a.a, skip=0, count=1)
    a.empty_cache(0)
    raw, _ = a.trace(0)
    actions = [_C.action_names()[raw[i * 64 + 56]] for i in range(len(raw) // 64)]
    assert "segment_free_failed" in actions and "segment_free" not in actions


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_faults_lose_nothing(seed):
    """Thousands of random operations while allocations fail (as OOM) 15% of
    the time and releases 30% of the time: after each, validate() and the
    device's own segment list agree; at the end everything comes back."""
    a = Checked("host_capacity_mb:128,host_devices:1,max_split_size_mb:40")
    _C._testing.set_fault_rates(a.a, 0.15, 0.30, seed)
    rng = random.Random(seed)
    live, ooms = [], 0
    for i in range(3000):
        r = rng.random()
        if r < 0.55 or not live:
            size = rng.choice([rng.randrange(1, 4096), rng.randrange(1, MiB), rng.randrange(MiB, 30 * MiB)])
            try:
                live.append(a.malloc(size, 0, rng.choice([0, 7])))
            except torch.OutOfMemoryError:
                ooms += 1
        elif r < 0.95:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            a.empty_cache(0)
        if i % 50 == 0:
            books_match_device(a)
    injected = _C._testing.faults_injected(a.a, 0)
    assert injected[0] > 0 and injected[1] > 0, "the run must actually have injected faults"
    assert a.stats(0)["num_device_free_failures"] == injected[1]
    for p in live:
        a.free(p)
    _C._testing.set_fault_rates(a.a, 0.0, 0.0, 0)
    a.empty_cache(0)
    s = a.stats(0)
    assert s["allocated_bytes"]["all"]["current"] == 0 and s["reserved_bytes"]["all"]["current"] == 0
    assert _C._testing.live_segments(a.a, 0) == 0


def test_fault_api_rejects_bad_input_and_needs_the_host_backend():
    a = _C.Allocator("host", "host_capacity_mb:16")
    with pytest.raises(ValueError, match="probabilities"):
        _C._testing.set_fault_rates(a, 1.5, 0.0, 0)
    with pytest.raises(ValueError, match="does not exist"):
        _C._testing.inject_allocate_faults(a, 0, 1, device=3)
