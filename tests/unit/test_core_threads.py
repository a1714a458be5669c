"""Concurrency and randomized model tests of the memalloc core (host backend).

* Several Python threads hammer one allocator with random malloc / free /
  record_stream / synchronize; the binding releases the GIL, so the C++ core
  really runs concurrently. Every thread stamps its blocks (ctypes) and checks
  the stamp before freeing: two live allocations sharing memory would show.
  At the end every counter must be back to zero and validate() must pass.
* A single-threaded random-operation test checks every counter, after every
  operation, against an independent Python model of the native rules.
"""

import ctypes
import random
import threading

import pytest
import torch
from memtest_helpers import POOLS, STAT_KEYS, KiB, MiB, pool_of, rnd

from memalloc import _C


def random_size(rng):
    r = rng.random()
    if r < 0.45:
        return rng.randint(16, 4 * KiB)
    if r < 0.75:
        return rng.randint(4 * KiB, MiB)
    if r < 0.95:
        return rng.randint(MiB + 1, 10 * MiB - 1)
    return rng.randint(10 * MiB, 13 * MiB)


def check_stats_shape(s):
    """Invariants of one consistent stats snapshot."""
    for key in STAT_KEYS:
        st = s[key]
        for field in ("current", "allocated", "freed"):
            assert st["all"][field] == st["small_pool"][field] + st["large_pool"][field], (key, field)
        for pool in POOLS:
            assert st[pool]["current"] == st[pool]["allocated"] - st[pool]["freed"], (key, pool)
            assert st[pool]["peak"] >= st[pool]["current"], (key, pool)
            assert st[pool]["current"] >= 0, (key, pool)


def stamp(ptr, size, tag):
    ctypes.c_uint64.from_address(ptr).value = tag
    ctypes.c_uint64.from_address(ptr + size - 8).value = tag


def stamped(ptr, size):
    return (ctypes.c_uint64.from_address(ptr).value, ctypes.c_uint64.from_address(ptr + size - 8).value)


# ------------------------------------------------------------- threads ----
def _worker(a, device, seed, n_ops, streams, results, errors, start):
    try:
        rng = random.Random(seed)
        live = {}  # ptr -> (size, tag)
        mallocs = frees = ooms = 0
        start.wait()
        for i in range(n_ops):
            r = rng.random()
            if not live or (len(live) < 12 and r < 0.55):
                size = random_size(rng)
                stream = rng.choice(streams)
                try:
                    p = a.malloc(size, device, stream)
                except torch.OutOfMemoryError:
                    ooms += 1
                    continue
                assert p != 0 and p % 512 == 0
                tag = (seed << 32) | i
                stamp(p, size, tag)
                live[p] = (size, tag)
                mallocs += 1
            elif r < 0.93:
                p = rng.choice(list(live))
                size, tag = live.pop(p)
                assert stamped(p, size) == (tag, tag), "another allocation wrote into this block"
                if rng.random() < 0.15:
                    a.record_stream(p, rng.choice(streams), device)
                a.free(p, device)
                frees += 1
            elif r < 0.97:
                a.host_synchronize_stream(rng.choice(streams), device)
            else:
                s = a.stats(device)
                assert s["allocation"]["all"]["current"] >= len(live)
        results[seed] = {"live": live, "mallocs": mallocs, "frees": frees, "ooms": ooms, "device": device}
    except BaseException as e:  # reported by the main thread
        errors.append((seed, e))


def _run_threads(a, plan, n_ops, streams):
    """plan: list of (device, seed). Returns the per-thread results."""
    results, errors = {}, []
    start = threading.Barrier(len(plan))
    threads = [
        threading.Thread(target=_worker, args=(a, dev, seed, n_ops, streams, results, errors, start))
        for dev, seed in plan
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
        assert not t.is_alive(), "a worker thread hangs (deadlock?)"
    assert not errors, errors
    assert len(results) == len(plan)
    return results


def _check_live_and_drain(a, results, device):
    mine = [r for r in results.values() if r["device"] == device]
    live = {}
    for r in mine:
        for p, (size, _tag) in r["live"].items():
            assert p not in live, "one pointer handed to two threads"
            live[p] = size
    a.validate(device)
    blocks = {b["address"]: b for s in a.segments(device) for b in s["blocks"]}
    s = a.stats(device)
    check_stats_shape(s)
    assert s["allocation"]["all"]["current"] == len(live)
    assert s["requested_bytes"]["all"]["current"] == sum(live.values())
    for p, size in live.items():
        assert blocks[p]["state"] == "active_allocated"
        assert blocks[p]["requested_size"] == size
        assert blocks[p]["size"] >= rnd(size)
    assert s["allocated_bytes"]["all"]["current"] == sum(blocks[p]["size"] for p in live)
    mallocs = sum(r["mallocs"] for r in mine)
    assert s["allocation"]["all"]["allocated"] == mallocs
    assert s["allocation"]["all"]["freed"] == sum(r["frees"] for r in mine)
    assert s["num_ooms"] == sum(r["ooms"] for r in mine)
    for r in mine:
        for p, (size, tag) in r["live"].items():
            assert stamped(p, size) == (tag, tag)
            a.free(p, device)
    a.validate(device)
    s = a.stats(device)
    for key in ("allocation", "allocated_bytes", "requested_bytes"):
        for pool in POOLS:
            st = s[key][pool]
            assert st["current"] == 0, (key, pool)
            assert st["allocated"] == st["freed"], (key, pool)
    assert s["allocation"]["all"]["allocated"] == mallocs
    reserved = s["reserved_bytes"]["all"]["current"]
    assert a.empty_cache(device) == reserved  # everything is free once pending frees complete
    a.validate(device)
    s = a.stats(device)
    check_stats_shape(s)
    for key in STAT_KEYS:
        for pool in POOLS:
            assert s[key][pool]["current"] == 0, (key, pool)
    assert s["active_bytes"]["all"]["allocated"] == s["active_bytes"]["all"]["freed"]
    assert s["reserved_bytes"]["all"]["allocated"] == s["reserved_bytes"]["all"]["freed"]
    assert s["num_device_alloc"] == s["num_device_free"]
    assert _C._testing.live_segments(a, device) == 0
    assert a.segments(device) == []
    free, total = a.mem_get_info(device)
    assert free == total


def test_eight_threads_random_malloc_free():
    a = _C.Allocator("host", "host_capacity_mb:4096")
    results = _run_threads(a, [(0, seed) for seed in range(1, 9)], n_ops=3000, streams=[0, 1, 2, 3])
    assert sum(r["mallocs"] for r in results.values()) > 8 * 1000
    assert sum(r["ooms"] for r in results.values()) == 0
    _check_live_and_drain(a, results, 0)


def test_threads_under_memory_pressure():
    # small device: OOMs and cache-release retries happen while others allocate
    a = _C.Allocator("host", "host_capacity_mb:160")
    results = _run_threads(a, [(0, seed) for seed in range(11, 19)], n_ops=1500, streams=[0, 1, 2])
    s = a.stats()
    assert s["num_alloc_retries"] >= s["num_ooms"]
    _check_live_and_drain(a, results, 0)


def test_threads_on_two_devices_with_observer():
    a = _C.Allocator("host", "host_capacity_mb:1024,host_devices:2")
    stop = threading.Event()
    observed, errors = [0], []

    def observer():
        try:
            while not stop.is_set():
                for d in (0, 1):
                    a.validate(d)
                    check_stats_shape(a.stats(d))
                    for seg in a.segments(d):
                        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
                observed[0] += 1
        except BaseException as e:
            errors.append(e)

    watcher = threading.Thread(target=observer)
    watcher.start()
    try:
        plan = [(seed % 2, seed) for seed in range(21, 29)]
        results = _run_threads(a, plan, n_ops=1500, streams=[0, 5])
    finally:
        stop.set()
        watcher.join(timeout=60)
    assert not errors, errors
    assert observed[0] > 0
    for d in (0, 1):
        _check_live_and_drain(a, results, d)


# --------------------------------------------------------- model test ----
class Model:
    """Independent model of what the native rules make determinable."""

    def __init__(self):
        self.live = {}  # ptr -> [requested, stream, block size, recorded streams]
        self.pending = {}  # addr -> [remaining streams, block size]
        self.peak = {"allocation": 0, "requested_bytes": 0, "allocated_bytes": 0}
        self.acc = {k: [0, 0] for k in ("allocation", "requested_bytes", "allocated_bytes")}

    def current(self, key, pool="all"):
        items = [v for v in self.live.values() if pool == "all" or pool_of(v[0]) == pool]
        if key == "allocation":
            return len(items)
        if key == "requested_bytes":
            return sum(v[0] for v in items)
        return sum(v[2] for v in items)

    def complete_ready(self):
        for addr in [k for k, v in self.pending.items() if not v[0]]:
            del self.pending[addr]

    def update_peaks(self):
        for key in self.peak:
            self.peak[key] = max(self.peak[key], self.current(key))


def _check_model(a, m, capacity):
    a.validate()
    s = a.stats()
    check_stats_shape(s)
    segs = a.segments()
    blocks = {b["address"]: (b, len(seg["blocks"])) for seg in segs for b in seg["blocks"]}
    for key in ("allocation", "requested_bytes", "allocated_bytes"):
        for pool in POOLS:
            assert s[key][pool]["current"] == m.current(key, pool), (key, pool)
        assert s[key]["all"]["peak"] == m.peak[key], key
        assert s[key]["all"]["allocated"] == m.acc[key][0], key
        assert s[key]["all"]["freed"] == m.acc[key][1], key
    for p, (req, _stream, size, _) in m.live.items():
        b, _n = blocks[p]
        assert b["state"] == "active_allocated"
        assert b["requested_size"] == req
        assert b["size"] == size
    live_blocks = {addr for addr, (b, _) in blocks.items() if b["state"] == "active_allocated"}
    assert live_blocks == set(m.live)
    pending_blocks = {addr for addr, (b, _) in blocks.items() if b["state"] == "active_pending_free"}
    assert pending_blocks == set(m.pending)
    for addr, (_, size) in m.pending.items():
        assert blocks[addr][0]["size"] == size  # pending blocks are never merged
    pending_bytes = sum(v[1] for v in m.pending.values())
    assert s["active_bytes"]["all"]["current"] == m.current("allocated_bytes") + pending_bytes
    assert s["active"]["all"]["current"] == len(m.live) + len(m.pending)
    reserved = sum(seg["total_size"] for seg in segs)
    assert s["reserved_bytes"]["all"]["current"] == reserved
    assert s["segment"]["all"]["current"] == len(segs) == _C._testing.live_segments(a)
    assert a.mem_get_info() == (capacity - reserved, capacity)
    split_free = [b["size"] for b, n in blocks.values() if b["state"] == "inactive" and n > 1]
    assert s["inactive_split_bytes"]["all"]["current"] == sum(split_free)
    assert s["inactive_split"]["all"]["current"] == len(split_free)


@pytest.mark.parametrize("seed,capacity_mb,steps", [(101, 8192, 1500), (202, 8192, 1500), (303, 48, 2000)])
def test_random_operations_against_model(seed, capacity_mb, steps):
    rng = random.Random(seed)
    capacity = capacity_mb * MiB
    a = _C.Allocator("host", f"host_capacity_mb:{capacity_mb}")
    m = Model()
    streams = [0, 1, 2]
    other_streams = [0, 1, 2, 3, 4]
    ooms = 0
    for _ in range(steps):
        r = rng.random()
        if r < 0.45 or not m.live:
            size = random_size(rng)
            stream = rng.choice(streams)
            retries = a.stats()["num_alloc_retries"]
            m.complete_ready()  # malloc first looks at completed events
            try:
                p = a.malloc(size, 0, stream)
            except torch.OutOfMemoryError as e:
                ooms += 1
                assert "Tried to allocate" in str(e)
                assert a.stats()["num_alloc_retries"] == retries + 1
                m.pending.clear()  # the retry synchronized every pending free
                assert a.stats()["num_ooms"] == ooms
            else:
                if a.stats()["num_alloc_retries"] != retries:
                    m.pending.clear()
                assert p not in m.live
                blk = [b for seg in a.segments() for b in seg["blocks"] if b["address"] == p][0]
                want = rnd(size)
                if want <= MiB:
                    assert blk["size"] == want  # small remainders are always >= 512: split
                else:
                    assert want <= blk["size"] <= want + MiB  # > 1 MiB left would be split
                m.live[p] = [size, stream, blk["size"], set()]
                m.acc["allocation"][0] += 1
                m.acc["requested_bytes"][0] += size
                m.acc["allocated_bytes"][0] += blk["size"]
        elif r < 0.80:
            p = rng.choice(list(m.live))
            if rng.random() < 0.25:
                for s in rng.sample(other_streams, rng.randint(1, 2)):
                    a.record_stream(p, s)
                    if s != m.live[p][1]:
                        m.live[p][3].add(s)
            req, stream, size, uses = m.live.pop(p)
            a.free(p)
            m.acc["allocation"][1] += 1
            m.acc["requested_bytes"][1] += req
            m.acc["allocated_bytes"][1] += size
            if uses:
                m.pending[p] = [set(uses), size]
        elif r < 0.85:
            p = rng.choice(list(m.live))
            s = rng.choice(other_streams)
            a.record_stream(p, s)
            if s != m.live[p][1]:
                m.live[p][3].add(s)
        elif r < 0.95:
            s = rng.choice(other_streams)
            a.host_synchronize_stream(s)
            for entry in m.pending.values():
                entry[0].discard(s)
        elif r < 0.975:
            before = a.stats()["reserved_bytes"]["all"]["current"]
            released = a.empty_cache()
            m.pending.clear()
            assert released == before - a.stats()["reserved_bytes"]["all"]["current"]
            assert all(
                b["state"] != "inactive" or len(seg["blocks"]) > 1 for seg in a.segments() for b in seg["blocks"]
            )
        else:
            a.reset_peak_stats()
            for key in m.peak:
                m.peak[key] = m.current(key)
        m.update_peaks()
        _check_model(a, m, capacity)
    s = a.stats()
    assert s["num_ooms"] == ooms
    if capacity_mb < 100:
        assert ooms > 0, "the small-capacity run should exercise the OOM path"
    else:
        assert ooms == 0
    for p in list(m.live):
        a.free(p)
    a.empty_cache()
    a.validate()
    s = a.stats()
    for key in STAT_KEYS:
        assert s[key]["all"]["current"] == 0, key
    assert _C._testing.live_segments(a) == 0
