"""Property-based state-machine test of the caching core (host backend, no GPU).

Hypothesis drives a two-device host allocator (host_devices:2) through random
sequences of malloc (sizes aimed at the small/large pools, the 512 B / 1 MiB /
10 MiB / max_split_size boundaries, the capacity and the 2**60 request limit;
three streams), free (often after record_stream on other streams, so the free
pends), record_stream, host_synchronize_stream, empty_cache,
set_memory_fraction (values that cause OOMs, back to 1.0, invalid values),
reset_peak_stats / reset_accumulated_stats, and frees / record_streams of
pointers that are not live (stale, other device, interior, null).

Next to the allocator it runs, per device, the exact independent model of
tests/unit/test_stats_model.py (imported, not copied), extended only by what that
model leaves out: the memory-fraction limit and the request limit (a request
above 2**60 bytes fails at once, without the cache-release retry).

After EVERY operation the device it touched gets the full check below, and
after every rule both devices do (a device no operation touched since its
last full check must report exactly the same segments() and stats() as then,
and pass validate()). The checks, independent of validate():
  * segments() is well formed: segments in address order, not overlapping
    (across both devices), blocks tiling each segment exactly, sizes positive
    multiples of 512, no two adjacent free ("inactive") blocks (coalescing);
  * the live pointers this test holds are exactly the allocated blocks
    reported, each inside a listed segment, none overlapping another, each
    with the requested size it was asked for and at least that many bytes;
  * counters re-derived from segments(): allocated / requested / active /
    reserved / inactive_split bytes and the allocation / active / segment /
    inactive_split counts, for all / small_pool / large_pool;
  * _C._testing.live_segments() == len(segments()); mem_get_info() agrees
    with the reserved bytes; memory_fraction() is the one last set;
  * every counter of stats() (current/peak/allocated/freed, OOM and retry
    counts, device allocs/frees, sync_all_streams, oversize) equals the
    model's, the block layout equals the model's, each pointer served from
    the cache is the model's best fit and each OOM is predicted;
  * and validate().

To keep 100,000 checked operations within ~40 s on two cores (hypothesis
itself costs ~0.5 ms per rule), the malloc, free and record_stream rules act
on a burst of 1-n pointers (each burst shrinks to a single operation), and a
device holds at most MAX_LIVE live pointers (a malloc beyond frees the oldest).

Budget: MEMALLOC_PROPERTY_OPS operations (default 100,000) per test, counted
as they execute; the test fails if fewer ran, and prints the count. Hypothesis
runs of ROUND_EXAMPLES examples repeat until the target is reached: the first
with derandomize=True, the next ones with fixed seeds 1, 2, ..., never an
example database, so every CI run draws the same rules and arguments. (Host
segment addresses come from the C library and decide best-fit ties, so the
effects of those rules can differ between processes; the model follows the
addresses it is given, and every check stays exact.) Set MEMALLOC_PROPERTY_OPS
higher (e.g. 1000000) for a nightly-style run.
"""

from __future__ import annotations

import math
import operator
import os
import sys
import time
from collections import Counter

import hypothesis
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test
from memtest_helpers import KiB, MiB, segment_size
from test_stats_model import Model

from memalloc import _C

pytestmark = pytest.mark.slow  # CI runs it; `pytest -m 'not slow'` skips it

TARGET_OPS = int(os.environ.get("MEMALLOC_PROPERTY_OPS", "100000"))
STEPS = 200  # rules per example (hypothesis' stateful_step_count)
ROUND_EXAMPLES = 10  # examples per hypothesis run; runs repeat (new seeds) until TARGET_OPS ran
DEVICES = 2
MAX_LIVE = 32  # live pointers per device; a malloc beyond frees the oldest first
K_MAX_REQUEST = 1 << 60  # csrc/pool/block.h kMaxRequest: larger requests fail at once
INT64_MAX = (1 << 63) - 1  # the largest size the binding accepts
ALLOC_STREAMS = (0, 1, 2)
USE_STREAMS = (0, 1, 2, 3)  # record_stream / synchronize may name a stream nothing allocates on
STATES = {"live": "active_allocated", "pending": "active_pending_free", "free": "inactive"}
STATE_CODE = {"active_allocated": "A", "active_pending_free": "P", "inactive": "F"}
BLOCK_FIELDS = operator.itemgetter("address", "size", "requested_size", "state")
POOL_INDEX = {"small": 0, "large": 1}
# stats() key -> index of the per-pool totals check_device re-derives from segments()
DERIVED = (
    ("allocated_bytes", 0),
    ("requested_bytes", 1),
    ("allocation", 2),
    ("active_bytes", 3),
    ("active", 4),
    ("reserved_bytes", 5),
    ("segment", 6),
    ("inactive_split_bytes", 7),
    ("inactive_split", 8),
)

# (config, capacity MiB per device, max_split_size MiB or None)
CONFIGS = (
    ("host_capacity_mb:96,max_split_size_mb:40", 96, 40),
    ("host_capacity_mb:96", 96, None),
    ("host_capacity_mb:64,max_split_size_mb:22", 64, 22),
)

# What ran, across the whole test (module level: the final assertion is real).
RUN = Counter()


class HostModel(Model):
    """test_stats_model.Model plus set_memory_fraction and the request limit."""

    def __init__(self, capacity, max_split):
        super().__init__(capacity, max_split)
        self.allowed = None  # bytes allowed by the memory fraction; None = never set

    def set_fraction(self, fraction):
        # native: allowed_max_ = static_cast<size_t>(fraction * double(total))
        self.allowed = int(fraction * float(self.capacity))

    def can_grow(self, rounded):
        limit = self.capacity if self.allowed is None else min(self.capacity, self.allowed)
        return self.reserved() + segment_size(rounded) <= limit

    def plan_malloc(self, size, stream):
        if size > K_MAX_REQUEST:  # nothing can ever fit: no retry, no cache release
            if self.pending:
                self.process_events()
            self.scalars["num_ooms"] += 1
            return ("oom",)
        return super().plan_malloc(size, stream)

    def layout(self, device):
        """The segments() layout the model predicts, as tuples (what
        Model.expected_segments gives, without building dicts)."""
        out = []
        for addr in sorted(self.segs):
            seg = self.segs[addr]
            blocks, b = [], self.blocks[addr]
            while b is not None:
                blocks.append((b.addr, b.size, b.requested, STATES[b.state]))
                b = b.next
            out.append(
                (device, addr, seg.size, seg.stream, "small" if seg.pool == "small_pool" else "large", tuple(blocks))
            )
        return out


# ------------------------------------------------------------- strategies --
BOUNDARY_SIZES = (
    0,
    1,
    511,
    512,
    513,
    1023,
    1024,
    4 * KiB,
    MiB - 513,
    MiB - 512,
    MiB - 1,
    MiB,
    MiB + 1,
    MiB + 512,
    2 * MiB - 1,
    2 * MiB,
    2 * MiB + 1,
    10 * MiB - 512,
    10 * MiB - 1,
    10 * MiB,
    10 * MiB + 1,
    19 * MiB + 1,
    20 * MiB,
    20 * MiB + 1,
    21 * MiB + 1,
    22 * MiB,
)
# Sizes relative to the configuration, resolved by the machine.
RELATIVE_SIZES = (
    ("split", -MiB),
    ("split", -512),
    ("split", -1),
    ("split", 0),
    ("split", 1),
    ("split", 2 * MiB),
    ("cap", -2 * MiB),
    ("cap", -1),
    ("cap", 0),
    ("cap", 1),
    ("cap", 2 * MiB),
    ("half_cap", 0),
    ("2cap", 0),
    ("kmax", -1),
    ("kmax", 0),
    ("kmax", 1),
    ("i64max", 0),
    ("negative", -1),  # rejected by the binding, nothing changes
)
SMALL_SIZES = st.one_of(st.integers(1, 512), st.integers(513, 64 * KiB), st.integers(513, MiB))
LARGE_SIZES = st.one_of(st.integers(MiB + 1, 10 * MiB - 1), st.integers(10 * MiB, 48 * MiB))
EDGE_SIZES = st.one_of(st.sampled_from(BOUNDARY_SIZES), st.sampled_from(RELATIVE_SIZES))
FRACTIONS = st.one_of(
    st.just(1.0),
    st.sampled_from((1.0, 1.0, 0.9, 0.75, 0.5, 0.3, 0.21, 0.1, 0.02, 0.01)),
    st.floats(min_value=1e-4, max_value=1.0, allow_nan=False, allow_infinity=False),
    st.sampled_from(
        (0.0, -0.0, -0.5, 1.0000001, 2.0, math.inf, -math.inf, math.nan)
    ),  # 0 allowed (torch), the rest rejected
)
DEV = st.integers(0, DEVICES - 1)
STREAM = st.sampled_from(ALLOC_STREAMS)
PICK = st.integers(0, 1 << 16)  # which live pointer (an index, modulo, into them in allocation order)


class CachingCoreMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.a = None

    # ------------------------------------------------------------ setup --
    @initialize(conf=st.sampled_from(CONFIGS))
    def start(self, conf):
        text, cap_mb, split_mb = conf
        self.a = _C.Allocator("host", text + f",host_devices:{DEVICES}")
        self.capacity = cap_mb * MiB
        self.max_split = split_mb * MiB if split_mb else None
        assert self.a.device_count == DEVICES
        assert self.a.max_split_size == (self.max_split or -1)
        self.models = [HostModel(self.capacity, self.max_split) for _ in range(DEVICES)]
        # This test's own book of its live pointers: ptr -> requested size.
        self.live = [{} for _ in range(DEVICES)]
        self.ever = [{} for _ in range(DEVICES)]  # every pointer malloc returned (a dict: ordered)
        self.fraction = [1.0] * DEVICES  # memory_fraction(): 1.0 (the whole device) until set
        self.dirty = [True] * DEVICES  # an operation ran on the device since its last full check
        self.seen = [None] * DEVICES  # (segments(), stats()) at the last full check
        RUN["examples"] += 1

    def op(self, name, dev, check):
        """Counts one executed operation; `check`: check its device now (the
        last operation of a rule is checked by the invariant, both devices)."""
        RUN["ops"] += 1
        RUN[name] += 1
        self.dirty[dev] = True
        if check:
            self.check_device(dev)

    def resolve(self, spec):
        if isinstance(spec, int):
            return spec
        kind, delta = spec
        base = {
            "split": self.max_split or 40 * MiB,
            "cap": self.capacity,
            "half_cap": self.capacity // 2,
            "2cap": 2 * self.capacity,
            "kmax": K_MAX_REQUEST,
            "i64max": INT64_MAX,
            "negative": 0,
        }[kind]
        if kind == "negative":
            return delta
        return max(1, min(base + delta, INT64_MAX))

    def picks(self, dev, i, n):
        """Up to n distinct live pointers, of `dev` if it has any, else of the
        other device: (dev, [ptr...]); none when nothing is live."""
        if not self.live[dev]:
            dev = 1 - dev
        ptrs = list(self.live[dev])  # allocation order (addresses vary from run to run)
        k = len(ptrs)
        if k == 0:
            return dev, []
        step = 1 + (i >> 8) % k  # spread the burst over the pointers
        chosen = []
        for j in range(min(n, k)):
            p = ptrs[(i + j * step) % k]
            if p not in chosen:
                chosen.append(p)
        return dev, chosen

    # ------------------------------------------------------------ rules --
    def do_free(self, dev, ptr, check):
        self.a.free(ptr, dev)
        self.models[dev].free(ptr)
        del self.live[dev][ptr]
        self.op("free", dev, check)

    def do_malloc(self, dev, stream, size, check):
        if size < 0:
            try:
                self.a.malloc(size, dev, stream)
            except _C.InvalidArgumentError as e:
                assert "negative size" in str(e)
            else:
                raise AssertionError(f"malloc({size}) was accepted")
            self.op("malloc_negative", dev, check)
            return
        if len(self.live[dev]) >= MAX_LIVE:  # keeps checks cheap; frees even where swarm testing disabled `free`
            self.do_free(dev, next(iter(self.live[dev])), True)
        m = self.models[dev]
        plan = m.plan_malloc(size, stream)
        if plan[0] == "oom":
            try:
                self.a.malloc(size, dev, stream)
            except torch.OutOfMemoryError as e:
                assert "Tried to allocate" in str(e)
            else:
                raise AssertionError(
                    f"malloc({size}, device {dev}, stream {stream}) succeeded; the model expected an OOM"
                )
        else:
            ptr = self.a.malloc(size, dev, stream)
            if plan[0] == "zero":
                assert ptr == 0
            elif plan[0] == "cache":
                assert ptr == plan[1], f"malloc({size}) returned {ptr:#x}, the model's best fit is {plan[1]:#x}"
            else:
                assert ptr not in m.blocks, f"malloc({size}) returned {ptr:#x}, expected a new segment"
                m.finish_grow(ptr, plan[1], size, stream)
            if ptr:
                assert ptr not in self.live[dev]
                self.live[dev][ptr] = size
                self.ever[dev][ptr] = None
        self.op("malloc_" + plan[0], dev, check)

    @rule(dev=DEV, stream=STREAM, size=SMALL_SIZES, n=st.integers(1, 24))
    def malloc_small(self, dev, stream, size, n):
        for j in range(n):
            self.do_malloc(dev, stream, size, j < n - 1)

    @rule(dev=DEV, stream=STREAM, size=LARGE_SIZES, n=st.integers(1, 10))
    def malloc_large(self, dev, stream, size, n):
        for j in range(n):
            self.do_malloc(dev, stream, size, j < n - 1)

    @rule(dev=DEV, stream=STREAM, spec=EDGE_SIZES, n=st.integers(1, 6))
    def malloc_edge(self, dev, stream, spec, n):
        size = self.resolve(spec)
        for j in range(n):
            self.do_malloc(dev, stream, size, j < n - 1)

    @rule(dev=DEV, i=PICK, n=st.integers(1, 20), uses=st.lists(st.sampled_from(USE_STREAMS), max_size=3))
    def free(self, dev, i, n, uses):
        """Frees a burst of live pointers; with `uses`, each is first
        record_stream'ed on those streams (the free then pends)."""
        dev, ptrs = self.picks(dev, i, n)  # none when nothing is live: the rule does nothing
        m = self.models[dev]
        for j, ptr in enumerate(ptrs):
            for s in uses:
                self.a.record_stream(ptr, s, dev)
                m.record_stream(ptr, s)
                self.op("record_stream", dev, True)
            self.do_free(dev, ptr, j < len(ptrs) - 1)

    @rule(dev=DEV, i=PICK, n=st.integers(1, 10), stream=st.sampled_from(USE_STREAMS))
    def record_stream(self, dev, i, n, stream):
        dev, ptrs = self.picks(dev, i, n)
        for j, ptr in enumerate(ptrs):
            self.a.record_stream(ptr, stream, dev)
            self.models[dev].record_stream(ptr, stream)
            self.op("record_stream", dev, j < len(ptrs) - 1)

    @rule(dev=DEV, stream=st.sampled_from(USE_STREAMS))
    def synchronize_stream(self, dev, stream):
        self.a.host_synchronize_stream(stream, dev)
        self.models[dev].synchronize_stream(stream)
        self.op("synchronize_stream", dev, False)

    @rule(dev=DEV)
    def empty_cache(self, dev):
        released = self.a.empty_cache(dev)
        assert released == self.models[dev].release_cached(), "empty_cache released other bytes than the model"
        self.op("empty_cache", dev, False)

    @rule(dev=DEV, fraction=FRACTIONS)
    def set_memory_fraction(self, dev, fraction):
        if not 0.0 <= fraction <= 1.0:  # torch's range: 0 allows no new segment
            try:
                self.a.set_memory_fraction(fraction, dev)
            except _C.InvalidArgumentError as e:
                assert "invalid memory fraction" in str(e)
            else:
                raise AssertionError(f"set_memory_fraction({fraction}) was accepted")
            self.op("invalid_memory_fraction", dev, False)
            return
        self.a.set_memory_fraction(fraction, dev)
        self.models[dev].set_fraction(fraction)
        self.fraction[dev] = fraction
        self.op("set_memory_fraction" if fraction < 1.0 else "reset_memory_fraction", dev, False)

    @rule(dev=DEV, accumulated=st.booleans())
    def reset_stats(self, dev, accumulated):
        if accumulated:
            self.a.reset_accumulated_stats(dev)
            self.models[dev].reset_accumulated()
            self.op("reset_accumulated_stats", dev, False)
        else:
            self.a.reset_peak_stats(dev)
            self.models[dev].reset_peak()
            self.op("reset_peak_stats", dev, False)

    @rule(dev=DEV, i=PICK, kind=st.sampled_from(("stale", "other_device", "interior", "null")), record=st.booleans())
    def not_live_pointer(self, dev, i, kind, record):
        """free / record_stream of a pointer that is not live on `dev`: an
        error, and nothing changes (the invariant compares with the untouched
        model)."""
        if kind == "null":
            if not record:
                self.a.free(0, dev)  # free(nullptr) does nothing
                self.op("free_not_live", dev, False)
            return
        if kind == "stale":
            cands = self.ever[dev]
        elif kind == "other_device":
            cands = self.live[1 - dev]
        else:
            cands = [p + 512 for p, n in self.live[dev].items() if n > 512]
        cands = [p for p in cands if p not in self.live[dev]]
        if not cands:
            return
        ptr = cands[i % len(cands)]
        try:
            if record:
                self.a.record_stream(ptr, 1, dev)
            else:
                self.a.free(ptr, dev)
        except _C.InvalidPointerError:
            pass
        else:
            raise AssertionError(
                f"{'record_stream' if record else 'free'} of {kind} pointer {ptr:#x} on device {dev} was accepted"
            )
        self.op("record_stream_not_live" if record else "free_not_live", dev, False)

    # ------------------------------------------------------- invariants --
    @invariant()
    def everything_agrees(self):
        if self.a is None:
            return
        RUN["rules"] += 1  # (this invariant runs after every rule)
        spans = []
        for dev in range(DEVICES):
            if self.dirty[dev]:
                self.check_device(dev)
            else:
                # No operation touched it since its full check (same model state):
                # it must report exactly what it reported then.
                segs, s = self.seen[dev]
                assert self.a.segments(dev) == segs, f"device {dev}: segments() changed by another device's operation"
                assert self.a.stats(dev) == s, f"device {dev}: stats() changed by another device's operation"
                assert _C._testing.live_segments(self.a, dev) == len(segs)
                self.a.validate(dev)
                RUN["quick_checks"] += 1
            spans += [(seg["address"], seg["address"] + seg["total_size"]) for seg in self.seen[dev][0]]
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert a1 <= b0, f"segments [{a0:#x}, {a1:#x}) and [{b0:#x}, {b1:#x}) overlap (across devices)"

    def check_device(self, dev):
        RUN["checks"] += 1
        a, m, live = self.a, self.models[dev], self.live[dev]
        segs = a.segments(dev)
        # --- structure, from segments() alone ---------------------------------
        # per pool [small, large]: allocated, requested, allocations, active bytes,
        # active blocks, reserved, segments, inactive-split bytes, inactive-split blocks
        tot = [[0] * 9, [0] * 9]
        layout = []
        end = 0  # end of everything seen so far, in address order
        n_live = 0
        for seg in segs:
            base, total, kind = seg["address"], seg["total_size"], seg["segment_type"]
            t = tot[POOL_INDEX[kind]]
            assert total > 0 and total % 512 == 0 and base % 512 == 0, f"segment {base:#x} of {total} bytes"
            assert base >= end, f"device {dev}: segment {base:#x} overlaps the one before (or out of order)"
            rows = tuple(map(BLOCK_FIELDS, seg["blocks"]))
            # blocks tile the segment: each starts where the previous ended
            end = base
            for addr, size, _, _ in rows:
                assert addr == end and size > 0 and size % 512 == 0, (
                    f"device {dev} segment {base:#x}: block {addr:#x} of {size} bytes, expected one at {end:#x}"
                )
                end += size
            assert end == base + total, f"device {dev} segment {base:#x}: blocks cover {end - base} of {total} bytes"
            codes = "".join([STATE_CODE[r[3]] for r in rows])  # KeyError: an unknown state
            assert "FF" not in codes, f"device {dev} segment {base:#x}: adjacent free blocks ({codes})"
            for addr, size, req, state in rows:
                if state == "active_allocated":
                    # a live block: a pointer this test holds, with its requested size
                    assert live.get(addr) == req, (
                        f"device {dev}: allocated block {addr:#x} (requested {req}) is not a live pointer"
                    )
                    assert size >= req
                    t[0] += size
                    t[1] += req
                    t[2] += 1
                    n_live += 1
                if state == "inactive":
                    assert req == 0
                    if len(rows) > 1:
                        t[7] += size
                        t[8] += 1
                else:
                    t[3] += size
                    t[4] += 1
            t[5] += total
            t[6] += 1
            layout.append((seg["device"], base, total, seg["stream"], kind, rows))
        # Every live pointer is an allocated block; blocks are distinct and tile
        # non-overlapping segments, so no two live blocks overlap.
        assert n_live == len(live), f"device {dev}: {len(live) - n_live} live pointers lie in no segment"
        # --- counters re-derived from the layout ------------------------------
        s = a.stats(dev)
        for key, i in DERIVED:
            small, large = tot[0][i], tot[1][i]
            got = s[key]
            assert (got["all"]["current"], got["small_pool"]["current"], got["large_pool"]["current"]) == (
                small + large,
                small,
                large,
            ), f"device {dev}: {key} {got} but the layout has {small}+{large}"
        reserved = tot[0][5] + tot[1][5]
        assert _C._testing.live_segments(a, dev) == len(segs), f"device {dev}: backend segments != segments()"
        assert a.mem_get_info(dev) == (self.capacity - reserved, self.capacity)
        assert a.memory_fraction(dev) == self.fraction[dev]
        # --- every counter and the layout against the model -------------------
        expected = m.expected_stats()
        if s != expected:
            for key in set(s) | set(expected):
                if key in s and key in expected:
                    assert s[key] == expected[key], f"device {dev}: {key} = {s[key]}, model {expected[key]}"
                else:  # a counter only one side knows (a build older/newer than the helpers): idle
                    assert s.get(key, 0) == 0 and expected.get(key, 0) == 0, (key, s.get(key), expected.get(key))
        assert layout == m.layout(dev), f"device {dev}: block layout differs from the model"
        a.validate(dev)
        if m.pending:
            RUN["checks_with_pending_frees"] += 1
        if m.allowed is not None and m.allowed < self.capacity:
            RUN["checks_under_fraction"] += 1
        self.seen[dev] = (segs, s)
        self.dirty[dev] = False

    def teardown(self):
        if self.a is None or sys.exc_info()[0] is not None:
            return  # (after a failure: let hypothesis see that failure, not a later one)
        # Drain: free everything, empty the caches; every current returns to 0.
        for dev in range(DEVICES):
            m = self.models[dev]
            for ptr in list(self.live[dev]):
                self.a.free(ptr, dev)
                m.free(ptr)
            self.live[dev].clear()
            assert self.a.empty_cache(dev) == m.release_cached()
            self.check_device(dev)
            s = self.a.stats(dev)
            for key in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "segment"):
                assert s[key]["all"]["current"] == 0, (dev, key, s[key])
            assert self.a.segments(dev) == [] and _C._testing.live_segments(self.a, dev) == 0
        RUN["grown_after_retry"] += sum(m.grown_after_retry for m in self.models)


def run_round(seed):
    """One hypothesis run of ROUND_EXAMPLES examples. Round 0 is derandomized
    (its sequence follows from this file's source); round k > 0 uses the fixed
    seed k. Every run of a given version of this file therefore executes the
    same operations, and the total stops within one round of the target
    whatever the rounds' mix of cheap and costly rules."""
    factory = CachingCoreMachine
    if seed:
        factory = hypothesis.seed(seed)(type(f"CachingCoreMachineRound{seed}", (CachingCoreMachine,), {}))
    run_state_machine_as_test(
        factory,
        settings=settings(
            max_examples=ROUND_EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
            print_blob=True,
        ),
    )


def test_caching_core_state_machine(record_property):
    RUN.clear()
    t0 = time.perf_counter()
    rounds = 0
    while RUN["ops"] < TARGET_OPS and rounds < TARGET_OPS // 500 + 10:  # (a round runs ~5,000)
        run_round(rounds)
        rounds += 1
    elapsed = time.perf_counter() - t0
    ops = RUN["ops"]
    record_property("operations", ops)
    record_property("seconds", round(elapsed, 1))
    print(
        f"\nmemalloc property test: {ops} operations ({RUN['rules']} rules) in {RUN['examples']} examples "
        f"of up to {STEPS} rules ({rounds} hypothesis runs), {RUN['checks']} full + {RUN['quick_checks']} "
        f"quick device checks, {elapsed:.1f} s"
    )
    print("  " + ", ".join(f"{k}={v}" for k, v in sorted(RUN.items())))
    assert ops >= TARGET_OPS, f"only {ops} operations ran; MEMALLOC_PROPERTY_OPS={TARGET_OPS}"
    # The run exercised what it claims to (else it would prove little).
    per = TARGET_OPS / 100000
    for key, least in (
        ("malloc_cache", 10000),
        ("malloc_grow", 2000),
        ("malloc_oom", 5000),
        ("malloc_zero", 50),
        ("malloc_negative", 20),
        ("free", 15000),
        ("record_stream", 8000),
        ("empty_cache", 1500),
        ("synchronize_stream", 800),
        ("set_memory_fraction", 400),
        ("reset_memory_fraction", 300),
        ("invalid_memory_fraction", 200),
        ("reset_peak_stats", 500),
        ("reset_accumulated_stats", 500),
        ("free_not_live", 400),
        ("record_stream_not_live", 300),
        ("checks_with_pending_frees", 15000),
        ("checks_under_fraction", 15000),
        ("grown_after_retry", 200),
    ):
        assert RUN[key] >= least * per, (key, RUN[key], dict(RUN))
