"""Empty-cache policies on the host backend: threshold (C++, per device),
on-OOM (C++, always on), every N steps (Python, memalloc.step()), how they are
reported (memalloc.memory.empty_cache_policy(), memory_summary's footer) and how
their config keys are parsed.

Threshold rule (csrc/allocator/growth.cpp): before a new segment of S bytes is obtained,
if reserved + S > threshold * limit (limit = the memory-fraction cap when a
fraction is set, else the device capacity), every fully free cached segment
is released first (after waiting for pending frees); the growth then goes
ahead even when it still crosses the threshold (the threshold is not a cap).

Tests that need memalloc.enable() run in a fresh interpreter (enable is once
per process) and report one ``RESULT <json>`` line.
"""

from __future__ import annotations

import ctypes
import random

import pytest
import torch
from memtest_helpers import LARGE_SEGMENT, SMALL_SEGMENT, MiB, segment_size
from test_stats_model import Model, diff

from memalloc import _C

PRELUDE = """
def footer():
    return memalloc.memory.memory_summary().rstrip("\\n").split("\\n")[-1]
"""


@pytest.fixture
def run_child(fresh_python):
    """run_child(code, conf=None): PRELUDE + code in a fresh interpreter (enable()
    and memory_summary() of the installed allocator; tests/conftest.py); its RESULT dict."""
    return lambda code, conf=None: fresh_python.code(PRELUDE, code, conf)[1]


def reserved(a):
    return a.stats()["reserved_bytes"]["all"]["current"]


def scalars(a, *keys):
    s = a.stats()
    return [s[k] for k in keys]


def stamp(ptr, value):
    ctypes.c_uint64.from_address(ptr).value = value


def stamped(ptr):
    return ctypes.c_uint64.from_address(ptr).value


# ---------------------------------------------------------- threshold ----
@pytest.mark.parametrize("how", ["config", "setter"])
def test_threshold_releases_cached_segments_before_crossing(how):
    conf = "host_capacity_mb:64" + (",garbage_collection_threshold:0.5" if how == "config" else "")
    a = _C.Allocator("host", conf)
    if how == "setter":
        assert a.gc_threshold() == 0.0
        a.set_gc_threshold(0.5)
    assert a.gc_threshold() == 0.5
    # three 10 MiB blocks, each its own 10 MiB segment: 30 MiB <= 32 MiB, no release
    p = [a.malloc(10 * MiB) for _ in range(3)]
    assert reserved(a) == 30 * MiB
    assert scalars(a, "num_gc_releases", "num_device_free") == [0, 0]
    stamp(p[1], 0xC0FFEE)
    a.free(p[0])
    a.free(p[2])
    assert reserved(a) == 30 * MiB  # 20 MiB cached
    # 12 MiB needs a 12 MiB segment: 30 + 12 > 32 -> the two cached segments go first
    q = a.malloc(12 * MiB)
    assert scalars(a, "num_gc_releases", "num_device_free", "num_device_alloc") == [1, 2, 4]
    assert reserved(a) == 10 * MiB + 12 * MiB
    assert scalars(a, "num_alloc_retries", "num_ooms") == [0, 0]
    # the live block is untouched
    assert stamped(p[1]) == 0xC0FFEE
    live = {b["address"]: b for s in a.segments() for b in s["blocks"]}
    assert live[p[1]]["state"] == "active_allocated" and live[p[1]]["size"] == 10 * MiB
    assert sorted(s["total_size"] for s in a.segments()) == [10 * MiB, 12 * MiB]
    # below the threshold (22 + 2 <= 32): no release even with a cached segment
    a.free(q)
    r = a.malloc(1000)  # small pool: a new 2 MiB segment
    assert reserved(a) == 24 * MiB
    assert scalars(a, "num_gc_releases", "num_device_free") == [1, 2]
    # crossing with live memory needing it: the cached 12 MiB goes, growth still happens
    big = a.malloc(26 * MiB)  # 10 + 2 + 26 = 38 > 32 after the release: not a cap
    assert scalars(a, "num_gc_releases", "num_device_free") == [2, 3]
    assert reserved(a) == 10 * MiB + SMALL_SEGMENT + 26 * MiB
    assert a.stats()["reserved_bytes"]["all"]["peak"] == 38 * MiB
    for ptr in (p[1], r, big):
        a.free(ptr)
    a.validate()


def test_threshold_zero_is_off():
    a = _C.Allocator("host", "host_capacity_mb:64,garbage_collection_threshold:0.5")
    a.set_gc_threshold(0)
    assert a.gc_threshold() == 0.0
    p = [a.malloc(10 * MiB) for _ in range(3)]
    a.free(p[0])
    a.free(p[2])
    q = a.malloc(12 * MiB)  # would have released 20 MiB at 0.5
    assert reserved(a) == 42 * MiB
    assert scalars(a, "num_gc_releases", "num_device_free", "num_sync_all_streams") == [0, 0, 0]
    a.free(q)
    a.free(p[1])


def test_threshold_limit_is_the_memory_fraction_when_set():
    # capacity 64 MiB; fraction 0.5 -> limit 32 MiB; threshold 0.5 of it = 16 MiB
    for fraction, released in ((None, False), (0.5, True)):
        a = _C.Allocator("host", "host_capacity_mb:64,garbage_collection_threshold:0.5")
        if fraction:
            a.set_memory_fraction(fraction)
        p = a.malloc(10 * MiB)
        a.free(p)
        a.malloc(12 * MiB)  # 10 + 12 = 22: above 16, below 32
        assert reserved(a) == (12 * MiB if released else 22 * MiB), fraction
        assert scalars(a, "num_gc_releases", "num_device_free") == ([1, 1] if released else [0, 0])


def test_threshold_release_waits_for_pending_frees():
    a = _C.Allocator("host", "host_capacity_mb:64,garbage_collection_threshold:0.5")
    p = a.malloc(20 * MiB)
    a.record_stream(p, 7)
    a.free(p)  # pending until stream 7's work completes
    assert a.stats()["active_bytes"]["all"]["current"] == 20 * MiB
    a.malloc(14 * MiB)  # 20 + 14 > 32: release syncs stream 7, then returns the 20 MiB segment
    s = a.stats()
    assert s["num_gc_releases"] == 1 and s["num_sync_all_streams"] == 1 and s["num_device_free"] == 1
    assert s["reserved_bytes"]["all"]["current"] == 14 * MiB
    assert s["active_bytes"]["all"]["current"] == 14 * MiB


class GcModel(Model):
    """The stats model of test_stats_model plus the threshold rule and the
    memory-fraction cap, applied each time a segment is about to be obtained."""

    def __init__(self, capacity, threshold, fraction=None):
        super().__init__(capacity, None)
        self.threshold = threshold
        self.allowed = int(fraction * capacity) if fraction else None

    def can_grow(self, rounded):
        size = segment_size(rounded)
        limit = self.allowed if self.allowed is not None else self.capacity
        if self.threshold > 0 and self.reserved() + size > self.threshold * limit:
            self.scalars["num_gc_releases"] += 1
            self.release_cached()
        return self.reserved() + size <= min(self.capacity, limit)


@pytest.mark.parametrize("seed,threshold,fraction", [(1, 0.5, None), (2, 0.3, 0.75), (3, 0.8, 0.5)])
def test_threshold_random_operations_against_model(seed, threshold, fraction):
    rng = random.Random(seed)
    capacity = 64 * MiB
    a = _C.Allocator("host", f"host_capacity_mb:64,garbage_collection_threshold:{threshold}")
    if fraction:
        a.set_memory_fraction(fraction)
    m = GcModel(capacity, threshold, fraction)
    limit = fraction * capacity if fraction else capacity
    grows_over = 0
    for step in range(1200):
        if rng.random() < 0.5 or not m.live:
            size = rng.choice([rng.randint(1, MiB), rng.randint(MiB, 10 * MiB), rng.randint(10 * MiB, 24 * MiB)])
            stream = rng.choice([0, 1])
            plan = m.plan_malloc(size, stream)
            if plan[0] == "oom":
                with pytest.raises(torch.OutOfMemoryError):
                    a.malloc(size, 0, stream)
            else:
                before = m.reserved()
                ptr = a.malloc(size, 0, stream)
                if plan[0] == "cache":
                    assert ptr == plan[1]
                else:
                    m.finish_grow(ptr, plan[1], size, stream)
                    # a growth past the threshold happened with no whole free segment left
                    if m.reserved() > threshold * limit:
                        grows_over += 1
                        assert not [b for b in m.blocks.values() if b.state == "free" and not b.in_split_segment()]
                    assert before <= m.reserved() <= limit
        else:
            ptr = rng.choice(list(m.live))
            if rng.random() < 0.2:
                a.record_stream(ptr, 5)
                m.record_stream(ptr, 5)
            a.free(ptr)
            m.free(ptr)
            if rng.random() < 0.2:
                a.host_synchronize_stream(5)
                m.synchronize_stream(5)
        s = a.stats()
        expected = m.expected_stats()
        assert s == expected, f"step {step}: {diff(s, expected)}"
    assert m.scalars["num_gc_releases"] > 10
    assert grows_over > 0
    a.validate()


@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5, float("nan")])
def test_invalid_threshold_raises_value_error_naming_it(bad):
    a = _C.Allocator("host", "host_capacity_mb:64,garbage_collection_threshold:0.25")
    with pytest.raises(ValueError) as info:
        a.set_gc_threshold(bad)
    msg = str(info.value)
    assert "garbage_collection_threshold" in msg
    if bad == bad:  # not NaN
        assert str(bad) in msg or f"{bad:f}" in msg
    assert a.gc_threshold() == 0.25  # unchanged


# ------------------------------------------------------------- on-OOM ----
def test_on_oom_releases_the_cache_then_retries_or_raises():
    a = _C.Allocator("host", "host_capacity_mb:64")
    keep = a.malloc(10 * MiB)
    cached = a.malloc(30 * MiB)
    a.free(cached)
    # 40 + 40 > 64: the retry releases the cached 30 MiB, then 10 + 40 fits
    p = a.malloc(40 * MiB)
    assert scalars(a, "num_alloc_retries", "num_ooms", "num_device_free", "num_sync_all_streams") == [1, 0, 1, 1]
    assert reserved(a) == 50 * MiB
    a.free(p)  # 40 MiB cached again
    with pytest.raises(torch.OutOfMemoryError):
        a.malloc(60 * MiB)  # 10 + 60 > 64 even with an empty cache
    # the cache was released before raising; the live block stays
    assert scalars(a, "num_alloc_retries", "num_ooms", "num_device_free", "num_sync_all_streams") == [2, 1, 2, 2]
    assert reserved(a) == 10 * MiB
    assert [s["total_size"] for s in a.segments()] == [10 * MiB]
    assert a.mem_get_info() == (54 * MiB, 64 * MiB)
    a.free(keep)
    a.validate()


# --------------------------------------------------- every N steps ----
def test_every_n_steps_empties_the_cache_on_every_nth_step(run_child):
    r = run_child(
        """
        memalloc.enable(backend="host", config="expandable_segments:False")  # plain segments: whole ones cached
        R["policy"] = memalloc.memory.empty_cache_policy()
        R["footer"] = footer()
        keep = host.empty(1000, torch.float32)           # 4096 B in a 2 MiB segment
        def churn():
            t = host.empty((3, MiB), torch.uint8)         # a 20 MiB segment, cached when t dies
            del t
        churn()
        R["reserved"] = [memalloc.memory.memory_reserved()]
        R["steps"] = []
        for _ in range(3):
            R["steps"].append(memalloc.step())
            R["reserved"].append(memalloc.memory.memory_reserved())
        churn()
        for _ in range(3):
            R["steps"].append(memalloc.step())
            R["reserved"].append(memalloc.memory.memory_reserved())
        R["frees"] = memalloc.memory.memory_stats_raw()["num_device_free"]
        memalloc.memory.set_empty_cache_policy(every_n_steps=0)
        R["off_policy"] = memalloc.memory.empty_cache_policy()
        R["off_footer"] = footer()
        churn()
        R["off"] = []
        for _ in range(4):
            R["steps"].append(memalloc.step())
            R["off"].append(memalloc.memory.memory_reserved())
        R["bad"] = [err(lambda: memalloc.memory.set_empty_cache_policy(every_n_steps=v)) for v in (-1, 1.5, True, "3")]
        R["after_bad"] = memalloc.memory.empty_cache_policy()["every_n_steps"]
        R["live"] = memalloc.memory.memory_allocated()
        """,
        conf="empty_cache_every_n_steps:3",
    )
    assert r["policy"] == {"manual": True, "on_oom": True, "threshold": 0.0, "every_n_steps": 3}
    assert r["footer"].endswith("empty-cache policy: manual + on-OOM + every 3 steps")
    cached = SMALL_SEGMENT + LARGE_SEGMENT
    assert r["steps"] == list(range(1, 11))
    # emptied exactly on steps 3 and 6: down to the 2 MiB segment of the live tensor
    assert r["reserved"] == [cached, cached, cached, SMALL_SEGMENT, cached, cached, SMALL_SEGMENT]
    assert r["frees"] == 2
    assert r["off_policy"]["every_n_steps"] == 0
    assert r["off_footer"].endswith("empty-cache policy: manual + on-OOM")
    assert r["off"] == [cached] * 4  # step 9 would have emptied it
    for e in r["bad"]:
        assert e is not None and "ValueError" in e[1], e
        assert "every_n_steps" in e[2]
    assert r["after_bad"] == 0
    assert r["live"] == 4096


def test_policy_report_and_footer_name_threshold_and_every_n(run_child):
    r = run_child(
        """
        memalloc.enable(backend="host")
        R["p"] = memalloc.memory.empty_cache_policy()
        R["f"] = footer()
        R["steps0"] = [memalloc.step(), memalloc.step()]
        """,
        conf="garbage_collection_threshold:0.5,empty_cache_every_n_steps:3",
    )
    assert r["p"] == {"manual": True, "on_oom": True, "threshold": 0.5, "every_n_steps": 3}
    assert r["f"].endswith("empty-cache policy: manual + on-OOM + threshold 0.5 of the limit + every 3 steps")
    assert r["steps0"] == [1, 2]


def test_set_empty_cache_policy_threshold_at_run_time(run_child):
    r = run_child(
        """
        memalloc.enable(backend="host", config="host_capacity_mb:64")
        a = memalloc.installed_allocator()
        R["p0"] = memalloc.memory.empty_cache_policy()
        memalloc.memory.set_empty_cache_policy(threshold=0.5)
        R["p1"] = [memalloc.memory.empty_cache_policy()["threshold"], a.gc_threshold(0)]
        R["f1"] = footer()
        t = host.empty(10 * MiB, torch.uint8); del t       # a cached 10 MiB segment
        u = host.empty(24 * MiB, torch.uint8)               # 10 + 24 > 32: released first
        R["after"] = [memalloc.memory.memory_reserved(), memalloc.memory.memory_stats_raw()["num_gc_releases"]]
        R["gc_in_torch_stats"] = "num_gc_releases" in memalloc.memory.memory_stats()
        R["bad"] = [err(lambda: memalloc.memory.set_empty_cache_policy(threshold=v)) for v in (1.0, -0.1)]
        R["p2"] = memalloc.memory.empty_cache_policy()["threshold"]
        memalloc.memory.set_empty_cache_policy(threshold=0)
        R["p3"] = memalloc.memory.empty_cache_policy()
        R["f3"] = footer()
        """
    )
    assert r["p0"] == {"manual": True, "on_oom": True, "threshold": 0.0, "every_n_steps": 0}
    assert r["p1"] == [0.5, 0.5]
    assert r["f1"].endswith("empty-cache policy: manual + on-OOM + threshold 0.5 of the limit")
    assert r["after"] == [24 * MiB, 1]
    assert r["gc_in_torch_stats"] is False
    for e, text in zip(r["bad"], ("1.0", "-0.1")):
        assert e is not None and "ValueError" in e[1], e
        assert "garbage_collection_threshold" in e[2] and text in e[2]
    assert r["p2"] == 0.5
    assert r["p3"]["threshold"] == 0.0
    assert r["f3"].endswith("empty-cache policy: manual + on-OOM")


def test_rejected_set_empty_cache_policy_changes_nothing(run_child):
    r = run_child(
        """
        memalloc.enable(backend="host")
        R["bad"] = err(lambda: memalloc.memory.set_empty_cache_policy(threshold=0.3, every_n_steps=-1))
        R["p"] = memalloc.memory.empty_cache_policy()
        """
    )
    assert r["bad"] is not None and "ValueError" in r["bad"][1]
    assert r["p"]["threshold"] == 0.0 and r["p"]["every_n_steps"] == 0


def test_every_n_steps_from_config_works_after_a_step_before_enable(run_child):
    r = run_child(
        """
        R["early"] = memalloc.step()          # e.g. a training-loop helper that runs before enable()
        memalloc.enable(backend="host")
        R["policy"] = memalloc.memory.empty_cache_policy()["every_n_steps"]
        t = host.empty((3, MiB), torch.uint8); del t      # 20 MiB cached
        R["reserved"] = []
        for _ in range(3):                    # steps 2, 3, 4: one of them is a multiple of 3
            memalloc.step()
            R["reserved"].append(memalloc.memory.memory_reserved())
        """,
        conf="empty_cache_every_n_steps:3",
    )
    assert r["early"] == 1
    assert r["policy"] == 3
    assert r["reserved"][-1] == 0


# ------------------------------------------------------- config keys ----
@pytest.mark.parametrize("value", ["0.8", "0.5", "0.1234567890123", "1e-3", "0.99999999999999989"])
def test_gc_threshold_config_round_trips_exactly(value):
    text = _C.parse_config(f"garbage_collection_threshold:{value}")
    items = dict(i.split(":", 1) for i in text.split(","))
    assert float(items["garbage_collection_threshold"]) == float(value)
    assert _C.parse_config(text) == text
    a = _C.Allocator("host", text)
    assert a.gc_threshold() == float(value)
    if value == "0.8":
        assert items["garbage_collection_threshold"] == "0.8"


def test_gc_threshold_zero_means_off_and_is_omitted():
    text = _C.parse_config("garbage_collection_threshold:0")
    assert "garbage_collection_threshold" not in text
    assert _C.Allocator("host", text).gc_threshold() == 0.0


@pytest.mark.parametrize(
    "key,value",
    [
        ("garbage_collection_threshold", "1"),
        ("garbage_collection_threshold", "1.5"),
        ("garbage_collection_threshold", "-1"),
        ("garbage_collection_threshold", "abc"),
        ("garbage_collection_threshold", ""),
        ("garbage_collection_threshold", "0.5x"),
        ("patch_torch", "maybe"),
        ("patch_torch", "2"),
        ("empty_cache_every_n_steps", "-1"),
        ("empty_cache_every_n_steps", "abc"),
        ("empty_cache_every_n_steps", "1.5"),
    ],
)
def test_bad_policy_config_values_are_rejected_naming_the_key(key, value):
    with pytest.raises(ValueError) as info:
        _C.parse_config(f"{key}:{value}")
    msg = str(info.value)
    assert key in msg
    if value:
        assert value in msg


@pytest.mark.parametrize(
    "value,expected",
    [
        ("True", True),
        ("true", True),
        ("1", True),
        ("False", False),
        ("false", False),
        ("0", False),
    ],
)
def test_patch_torch_config_values(value, expected):
    text = _C.parse_config(f"patch_torch:{value}")
    assert ("patch_torch:False" in text) == (not expected)
    assert _C.parse_config(text) == text


@pytest.mark.parametrize("value,expected", [("3", 3), ("1", 1), ("0", 0), ("100000", 100000)])
def test_every_n_steps_config_values(value, expected):
    text = _C.parse_config(f"empty_cache_every_n_steps:{value}")
    items = dict(i.split(":", 1) for i in text.split(","))
    assert int(items.get("empty_cache_every_n_steps", 0)) == expected
    assert _C.parse_config(text) == text
