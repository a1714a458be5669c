"""Every counter of the host-backend allocator against an independent model,
after every one of thousands of random operations.

The model below re-implements the native rules (docs/architecture.md) in plain
Python, from the block layout up: segments tiled by blocks, each block live,
pending (freed after record_stream, waiting for the recorded streams) or free;
per-pool free lists searched best-fit by (stream, size, address); splitting
(small: >= 512 B left; large: below max_split_size and > 1 MiB left);
coalescing with free neighbours; pending frees completed at the start of the
next malloc once their streams were synchronized (in the order they were
queued); whole free segments returned by empty_cache and by the OOM retry
(which first waits for every pending free). From that state it derives the
counters with torch's Stat semantics (current/peak/allocated/freed, peak
updated on every change) and predicts, after each operation:

* current/peak/allocated/freed of all nine per-pool stats for all, small_pool
  and large_pool,
* oversize_allocations and oversize_segments (block / segment >= max_split_size),
* num_device_alloc, num_device_free, num_alloc_retries, num_ooms,
  num_sync_all_streams (one per cache release) and num_gc_releases (0 here),
* the pointer each malloc returns when it is served from the cache (a fresh
  segment's address is the only thing the model learns from the allocator),
* the full segment/block layout reported by segments() and mem_get_info(),
* the step tracker's window (take_window: the highest allocated and
  reserved bytes and the OOMs since the previous take, reset by nothing else).

The inactive_split stats move once per state change (an allocation with its
split, a free completion with its merges): the model computes each change as
"free split bytes after - before" over the blocks involved, which is what
torch's per-event accounting amounts to; allocated/freed therefore depend on
the order in which pending frees complete, which the model reproduces.
"""

from __future__ import annotations

import random

import pytest
import torch
from memtest_helpers import LARGE_SEGMENT, POOLS, SCALAR_KEYS, STAT_KEYS, MiB, rnd, segment_size

from memalloc import _C

KiB = 1 << 10
SMALL, LARGE = "small_pool", "large_pool"
FLAT_KEYS = ("oversize_allocations", "oversize_segments")


class Stat:
    """torch's counter: current, peak, and the totals ever added / removed."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def update(self, delta):
        self.current += delta
        if delta > 0:
            self.allocated += delta
        else:
            self.freed -= delta
        self.peak = max(self.peak, self.current)

    def as_dict(self):
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated, "freed": self.freed}


class Seg:
    __slots__ = ("addr", "size", "pool", "stream")

    def __init__(self, addr, size, pool, stream):
        self.addr, self.size, self.pool, self.stream = addr, size, pool, stream


class Blk:
    __slots__ = ("addr", "size", "seg", "state", "requested", "uses", "events", "prev", "next")

    def __init__(self, addr, size, seg):
        self.addr, self.size, self.seg = addr, size, seg
        self.state = "free"  # live | pending | free
        self.requested = 0
        self.uses = []  # streams recorded while live (not the block's own)
        self.events = 0  # outstanding events while pending
        self.prev = self.next = None

    @property
    def pool(self):
        return self.seg.pool

    @property
    def stream(self):
        return self.seg.stream

    def in_split_segment(self):
        return self.prev is not None or self.next is not None


class Model:
    def __init__(self, capacity, max_split):
        self.capacity = capacity
        self.max_split = max_split  # bytes, or None when unlimited
        self.segs = {}  # addr -> Seg
        self.blocks = {}  # addr -> Blk (every block of every segment)
        self.live = {}  # addr -> Blk
        self.pending = []  # [stream, ticket, Blk] in the order the events were queued
        self.submitted = {}  # stream -> events recorded on it
        self.completed = {}  # stream -> events known complete
        self.stats = {k: {p: Stat() for p in POOLS} for k in STAT_KEYS}
        self.flat = {k: Stat() for k in FLAT_KEYS}
        self.scalars = dict.fromkeys(SCALAR_KEYS, 0)
        self.window = {"allocated_bytes": 0, "reserved_bytes": 0}  # take_window's peaks
        self.window_ooms = 0
        self.grown_after_retry = 0  # for the test's coverage checks only

    # ---------------------------------------------------------- counters --
    def bump(self, key, pool, delta):
        if delta:
            self.stats[key]["all"].update(delta)
            self.stats[key][pool].update(delta)
            if key in self.window:
                self.window[key] = max(self.window[key], self.stats[key]["all"].current)

    def take_window(self):
        taken = (self.window["allocated_bytes"], self.window["reserved_bytes"], self.window_ooms)
        for key in self.window:
            self.window[key] = self.stats[key]["all"].current
        self.window_ooms = 0
        return taken

    def oversize(self, size):
        return self.max_split is not None and size >= self.max_split

    def reserved(self):
        return sum(s.size for s in self.segs.values())

    def expected_stats(self):
        out = {k: {p: st.as_dict() for p, st in per.items()} for k, per in self.stats.items()}
        out.update({k: st.as_dict() for k, st in self.flat.items()})
        out.update(self.scalars)
        return out

    def reset_peak(self):
        for st in self._all_stats():
            st.peak = st.current

    def reset_accumulated(self):
        for st in self._all_stats():
            st.allocated = st.freed = 0
        self.scalars = dict.fromkeys(SCALAR_KEYS, 0)

    def _all_stats(self):
        for per in self.stats.values():
            yield from per.values()
        yield from self.flat.values()

    def split_free(self, blk):
        """(bytes, count) blk contributes to inactive_split as a free block."""
        return (blk.size, 1) if blk.in_split_segment() else (0, 0)

    # ------------------------------------------------------------- rules --
    @staticmethod
    def pool_for(rounded):
        return SMALL if rounded <= MiB else LARGE

    def should_split(self, blk, size):
        remaining = blk.size - size
        if blk.pool == SMALL:
            return remaining >= 512
        return (self.max_split is None or size < self.max_split) and remaining > MiB

    def best_fit(self, pool, stream, size):
        cands = [
            b
            for b in self.blocks.values()
            if b.state == "free" and b.pool == pool and b.stream == stream and b.size >= size
        ]
        if not cands:
            return None
        b = min(cands, key=lambda b: (b.size, b.addr))
        if self.max_split is not None:
            if size < self.max_split and b.size >= self.max_split:
                return None  # an oversize block never serves a smaller request
            if size >= self.max_split and b.size >= size + LARGE_SEGMENT:
                return None  # ... nor one that would waste 20 MiB or more
        return b

    def can_grow(self, rounded):
        return self.reserved() + segment_size(rounded) <= self.capacity

    # --------------------------------------------------------- mutations --
    def alloc_block(self, b, from_cache, size, requested):
        d_bytes = d_count = 0
        if from_cache:
            fb, fc = self.split_free(b)
            d_bytes, d_count = -fb, -fc
        if self.should_split(b, size):
            rest = Blk(b.addr + size, b.size - size, b.seg)
            rest.prev, rest.next = b, b.next
            if b.next is not None:
                b.next.prev = rest
            b.next = rest
            b.size = size
            self.blocks[rest.addr] = rest
            fb, fc = self.split_free(rest)
            d_bytes, d_count = d_bytes + fb, d_count + fc
        b.state, b.requested = "live", requested
        self.live[b.addr] = b
        pool = b.pool
        if self.oversize(b.size):
            self.flat["oversize_allocations"].update(1)
        self.bump("allocation", pool, 1)
        self.bump("allocated_bytes", pool, b.size)
        self.bump("requested_bytes", pool, requested)
        self.bump("active", pool, 1)
        self.bump("active_bytes", pool, b.size)
        self.bump("inactive_split", pool, d_count)
        self.bump("inactive_split_bytes", pool, d_bytes)
        return b.addr

    def new_segment(self, addr, rounded, stream):
        size = segment_size(rounded)
        seg = Seg(addr, size, self.pool_for(rounded), stream)
        self.segs[addr] = seg
        blk = Blk(addr, size, seg)
        self.blocks[addr] = blk
        if self.oversize(size):
            self.flat["oversize_segments"].update(1)
        self.bump("segment", seg.pool, 1)
        self.bump("reserved_bytes", seg.pool, size)
        self.scalars["num_device_alloc"] += 1
        return blk

    def complete_free(self, b):
        """b stops being active: back to the free list, merged with free neighbours."""
        pool, size = b.pool, b.size
        d_bytes = d_count = 0
        for n in (b.prev, b.next):
            if n is None or n.state != "free":
                continue
            fb, fc = self.split_free(n)
            d_bytes, d_count = d_bytes - fb, d_count - fc
            del self.blocks[n.addr]
            if n is b.prev:
                del self.blocks[b.addr]
                b.addr = n.addr
                self.blocks[b.addr] = b
                b.prev = n.prev
                if b.prev is not None:
                    b.prev.next = b
            else:
                b.next = n.next
                if b.next is not None:
                    b.next.prev = b
            b.size += n.size
        b.state, b.requested = "free", 0
        fb, fc = self.split_free(b)
        self.bump("active", pool, -1)
        self.bump("active_bytes", pool, -size)
        self.bump("inactive_split", pool, d_count + fc)
        self.bump("inactive_split_bytes", pool, d_bytes + fb)

    def process_events(self):
        kept = []
        for entry in self.pending:
            stream, ticket, b = entry
            if self.completed.get(stream, 0) < ticket:
                kept.append(entry)
                continue
            b.events -= 1
            if b.events == 0:
                self.complete_free(b)
        self.pending = kept

    def release_cached(self):
        """Waits for every pending free, then returns every whole free segment."""
        self.scalars["num_sync_all_streams"] += 1
        for stream, ticket, _ in self.pending:
            self.completed[stream] = max(self.completed.get(stream, 0), ticket)
        self.process_events()
        released = 0
        for b in [b for b in self.blocks.values() if b.state == "free" and not b.in_split_segment()]:
            seg = b.seg
            del self.blocks[b.addr]
            del self.segs[seg.addr]
            released += seg.size
            if self.oversize(seg.size):
                self.flat["oversize_segments"].update(-1)
            self.bump("segment", seg.pool, -1)
            self.bump("reserved_bytes", seg.pool, -seg.size)
            self.scalars["num_device_free"] += 1
        return released

    # ------------------------------------------------------- operations --
    def plan_malloc(self, size, stream):
        """Everything malloc does before it needs a new segment's address.
        Returns ("zero",), ("cache", addr), ("grow", rounded) or ("oom",)."""
        if size == 0:
            return ("zero",)
        if self.pending:
            self.process_events()
        rounded = rnd(size)
        b = self.best_fit(self.pool_for(rounded), stream, rounded)
        if b is not None:
            return ("cache", self.alloc_block(b, True, rounded, size))
        if self.can_grow(rounded):
            return ("grow", rounded)
        self.scalars["num_alloc_retries"] += 1
        self.release_cached()
        if self.can_grow(rounded):
            self.grown_after_retry += 1
            return ("grow", rounded)
        self.scalars["num_ooms"] += 1
        self.window_ooms += 1
        return ("oom",)

    def finish_grow(self, addr, rounded, size, stream):
        assert addr % 512 == 0
        for seg in self.segs.values():
            assert not (seg.addr < addr + segment_size(rounded) and addr < seg.addr + seg.size), (
                "a new segment overlaps a live one"
            )
        blk = self.new_segment(addr, rounded, stream)
        self.alloc_block(blk, False, rounded, size)

    def free(self, addr):
        b = self.live.pop(addr)
        pool = b.pool
        if self.oversize(b.size):
            self.flat["oversize_allocations"].update(-1)
        self.bump("allocation", pool, -1)
        self.bump("allocated_bytes", pool, -b.size)
        self.bump("requested_bytes", pool, -b.requested)
        if not b.uses:
            self.complete_free(b)
            return
        b.state = "pending"
        for s in b.uses:
            self.submitted[s] = self.submitted.get(s, 0) + 1
            self.pending.append([s, self.submitted[s], b])
            b.events += 1
        b.uses = []

    def record_stream(self, addr, stream):
        b = self.live[addr]
        if stream != b.stream and stream not in b.uses:
            b.uses.append(stream)

    def synchronize_stream(self, stream):
        self.completed[stream] = self.submitted.get(stream, 0)

    def expected_segments(self):
        state = {"live": "active_allocated", "pending": "active_pending_free", "free": "inactive"}
        out = []
        for addr in sorted(self.segs):
            seg = self.segs[addr]
            blocks, b = [], self.blocks[addr]
            while b is not None:
                blocks.append(
                    {"address": b.addr, "size": b.size, "requested_size": b.requested, "state": state[b.state]}
                )
                b = b.next
            out.append(
                {
                    "device": 0,
                    "address": addr,
                    "total_size": seg.size,
                    "stream": seg.stream,
                    "segment_type": "small" if seg.pool == SMALL else "large",
                    "blocks": blocks,
                }
            )
        return out


SEG_FIELDS = ("device", "address", "total_size", "stream", "segment_type")
BLOCK_FIELDS = ("address", "size", "requested_size", "state")


def layout(a):
    """a.segments() restricted to the fields the model predicts (other
    fields, e.g. recording ids, are not accounting)."""
    out = []
    for seg in a.segments():
        d = {k: seg[k] for k in SEG_FIELDS}
        d["blocks"] = [{k: b[k] for k in BLOCK_FIELDS} for b in seg["blocks"]]
        out.append(d)
    return out


def diff(actual, expected):
    """The first few (key, actual, expected) that differ, for messages."""
    out = []
    for k in expected:
        if actual.get(k) != expected[k]:
            out.append((k, actual.get(k), expected[k]))
    return out[:6]


def random_size(rng, capacity):
    r = rng.random()
    if r < 0.12:
        return rng.randint(1, 512)
    if r < 0.30:
        return rng.randint(513, 64 * KiB)
    if r < 0.50:
        return rng.randint(64 * KiB, MiB)
    if r < 0.78:
        return rng.randint(MiB + 1, 10 * MiB - 1)
    if r < 0.88:
        return rng.randint(10 * MiB, 60 * MiB)
    if r < 0.985:
        return rng.randint(40 * MiB, 60 * MiB)  # around and above max_split_size
    return rng.randint(capacity - 8 * MiB, 2 * capacity)  # usually cannot fit at all


class Counts(dict):
    def __missing__(self, key):
        return 0


def run_random(seed, conf, capacity_mb, max_split_mb, steps):
    rng = random.Random(seed)
    capacity = capacity_mb * MiB
    a = _C.Allocator("host", conf)
    m = Model(capacity, max_split_mb * MiB if max_split_mb else None)
    assert a.max_split_size == (max_split_mb * MiB if max_split_mb else -1)
    seen = Counts()
    streams, record_streams = [0, 1, 2], [0, 1, 2, 3, 4]
    for step in range(steps):
        r = rng.random()
        if r < 0.40 or not m.live:
            size = 0 if rng.random() < 0.01 else random_size(rng, capacity)
            stream = rng.choice(streams)
            plan = m.plan_malloc(size, stream)
            seen[plan[0]] += 1
            if plan[0] == "oom":
                with pytest.raises(torch.OutOfMemoryError, match="Tried to allocate"):
                    a.malloc(size, 0, stream)
            else:
                ptr = a.malloc(size, 0, stream)
                if plan[0] == "zero":
                    assert ptr == 0
                elif plan[0] == "cache":
                    assert ptr == plan[1], f"step {step}: expected the cached block {plan[1]:#x}"
                else:
                    assert ptr not in m.blocks, f"step {step}: expected a new segment"
                    m.finish_grow(ptr, plan[1], size, stream)
        elif r < 0.75:
            ptr = rng.choice(list(m.live))
            if rng.random() < 0.3:
                for s in rng.sample(record_streams, rng.randint(1, 3)):
                    a.record_stream(ptr, s)
                    m.record_stream(ptr, s)
            a.free(ptr)
            m.free(ptr)
            seen["free"] += 1
        elif r < 0.80:
            ptr = rng.choice(list(m.live))
            s = rng.choice(record_streams)
            a.record_stream(ptr, s)
            m.record_stream(ptr, s)
        elif r < 0.90:
            s = rng.choice(record_streams)
            a.host_synchronize_stream(s)
            m.synchronize_stream(s)
        elif r < 0.94:
            released = a.empty_cache()
            assert released == m.release_cached()
            seen["empty_cache"] += 1
        elif r < 0.97:
            a.reset_peak_stats()
            m.reset_peak()
            seen["reset_peak"] += 1
        else:
            a.reset_accumulated_stats()
            m.reset_accumulated()
            seen["reset_accumulated"] += 1
        s = a.stats()
        expected = m.expected_stats()
        assert s == expected, f"step {step} ({seed}, {conf}): {diff(s, expected)}"
        if step % 7 == 6:  # not from rng: the random sequence stays that of the other checks
            assert a.take_window() == m.take_window(), f"step {step}: step window differs"
        a.validate()
        assert layout(a) == m.expected_segments(), f"step {step}: block layout differs"
        reserved = m.reserved()
        assert a.mem_get_info() == (capacity - reserved, capacity)
        assert _C._testing.live_segments(a) == len(m.segs)
        if m.pending:
            seen["pending_steps"] += 1
        if m.flat["oversize_allocations"].current:
            seen["oversize_steps"] += 1
    # drain: every live block freed, the cache emptied -> all currents 0
    for ptr in list(m.live):
        a.free(ptr)
        m.free(ptr)
    assert a.empty_cache() == m.release_cached()
    expected = m.expected_stats()
    assert a.stats() == expected
    for key in STAT_KEYS:
        assert expected[key]["all"]["current"] == 0, key
    assert a.segments() == []
    seen["grown_after_retry"] = m.grown_after_retry
    return a.stats(), seen


CONFIGS = [
    ("host_capacity_mb:96,max_split_size_mb:40", 96, 40),
    ("host_capacity_mb:96", 96, None),
    ("host_capacity_mb:256,max_split_size_mb:40", 256, 40),
]


@pytest.mark.parametrize(
    "conf,capacity_mb,max_split_mb", CONFIGS, ids=["96MiB-max_split_40", "96MiB-unlimited", "256MiB-max_split_40"]
)
@pytest.mark.parametrize("seed", [11, 22, 33])
def test_every_stat_matches_the_model(seed, conf, capacity_mb, max_split_mb):
    _, seen = run_random(seed, conf, capacity_mb, max_split_mb, steps=3000)
    # The run exercised what it claims to (else the test would prove little).
    assert seen["cache"] > 300 and seen["grow"] > 150, seen
    assert seen["oom"] > 10 and seen["grown_after_retry"] > 10 and seen["zero"] > 0, seen
    assert seen["empty_cache"] > 20 and seen["reset_peak"] > 20 and seen["reset_accumulated"] > 20, seen
    assert seen["pending_steps"] > 200, seen
    assert (seen["oversize_steps"] > 100) == (max_split_mb is not None), seen


def test_oversize_counters_move_only_with_max_split():
    """A fixed sequence whose oversize numbers are worked out by hand:
    max_split 40 MiB; 39.5 MiB -> a 40 MiB segment, unsplit (remainder
    0.5 MiB), so both the block and the segment are oversize."""
    for conf, over in (("host_capacity_mb:200,max_split_size_mb:40", True), ("host_capacity_mb:200", False)):
        a = _C.Allocator("host", conf)
        p = a.malloc(39 * MiB + MiB // 2)
        q = a.malloc(12 * MiB)  # 12 MiB segment, not oversize
        s = a.stats()
        n = 1 if over else 0
        assert s["oversize_allocations"] == {"current": n, "peak": n, "allocated": n, "freed": 0}
        assert s["oversize_segments"] == {"current": n, "peak": n, "allocated": n, "freed": 0}
        a.free(p)
        r = a.malloc(30 * MiB)
        s = a.stats()
        if over:  # below max_split: the cached 40 MiB block is not used -> a new 30 MiB segment
            assert r != p
            assert s["segment"]["all"]["current"] == 3
            assert s["oversize_allocations"] == {"current": 0, "peak": 1, "allocated": 1, "freed": 1}
        else:  # unlimited: the 40 MiB block is reused and split (10 MiB > 1 MiB left)
            assert r == p
            assert s["segment"]["all"]["current"] == 2
            assert s["inactive_split_bytes"]["all"]["current"] == 10 * MiB
            assert s["oversize_allocations"] == {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
        assert s["oversize_segments"]["current"] == n
        a.free(q)
        a.free(r)
        a.empty_cache()
        s = a.stats()
        assert s["oversize_segments"] == {"current": 0, "peak": n, "allocated": n, "freed": n}
        assert s["num_sync_all_streams"] == 1 and s["num_device_free"] == s["num_device_alloc"]


def test_step_window_by_hand_and_independent_of_torch_peaks():
    """take_window over a fixed sequence worked out by hand (1000 B -> a
    1024 B block of a 2 MiB segment; 3 MiB -> a 20 MiB segment): the window
    moves only with take_window, the torch-visible peaks and counts only
    with reset_peak_stats / reset_accumulated_stats, and neither disturbs
    the other."""
    a = _C.Allocator("host", "host_capacity_mb:64")

    def peaks():
        s = a.stats()
        return s["allocated_bytes"]["all"]["peak"], s["reserved_bytes"]["all"]["peak"], s["num_ooms"]

    assert a.take_window() == (0, 0, 0)
    p = a.malloc(1000)  # allocated 1024, reserved 2 MiB
    q = a.malloc(3 * MiB)  # allocated 1024 + 3 MiB, reserved 22 MiB
    a.free(q)  # allocated 1024 (the 20 MiB segment stays cached)
    assert a.take_window() == (1024 + 3 * MiB, 22 * MiB, 0)
    assert peaks() == (1024 + 3 * MiB, 22 * MiB, 0)  # taking the window left torch's peaks alone
    assert a.take_window() == (1024, 22 * MiB, 0)  # a new window starts at the currents
    a.reset_peak_stats()
    assert peaks() == (1024, 22 * MiB, 0)
    q = a.malloc(2 * MiB)  # from the cached 20 MiB segment
    a.free(q)
    with pytest.raises(torch.OutOfMemoryError):
        a.malloc(100 * MiB)  # releases the cached 20 MiB segment, then OOM
    a.reset_peak_stats()  # the user's resets: the window keeps its peaks ...
    a.reset_accumulated_stats()  # ... and its OOM
    assert peaks() == (1024, 2 * MiB, 0)
    assert a.take_window() == (1024 + 2 * MiB, 22 * MiB, 1)
    assert a.take_window() == (1024, 2 * MiB, 0)
    with pytest.raises(torch.OutOfMemoryError):
        a.malloc(100 * MiB)
    a.free(p)
    assert a.take_window() == (1024, 2 * MiB, 1)  # frees do not raise a window
    assert a.take_window() == (0, 2 * MiB, 0)
    assert peaks() == (1024, 2 * MiB, 1)
    a.validate()
    with pytest.raises(ValueError, match="does not exist"):
        a.take_window(1)
