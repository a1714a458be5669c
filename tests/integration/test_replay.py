"""Trace replay (memalloc/features/replay.py) on the host backend: exact peaks of
hand-made workloads under the native size rules, address mapping, deferred
frees and streams of traces, unknown frees, a trace recorded in-process
round-tripping through save_trace, the random workload of the GPU benchmark
against the H200's figures, and the committed baseline.

The baseline (benchmarks/baselines/replay.json) holds the figures of every
workload it names, written by the command it records. A replay repeats its
figures to the byte: among free blocks of equal size best fit takes the
lowest address, and the host backend hands out addresses deterministically
(first fit in one reserved range per device, csrc/backend/backend_host.cpp), so the
ties fall the same way in every run and process. Any change of a figure is
a policy change, and the baseline must then be rewritten on purpose with the
command it records. Only the comparison with the H200 allows TOLERANCE:
there the addresses came from cudaMalloc.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import sys
from collections.abc import Iterator

import pytest
from memalloc.recording import Event
from memalloc.replay import repeat_last_step, replay_steps
from memtest_helpers import LARGE_SEGMENT, REPO, SMALL_SEGMENT, MiB, rnd, rnd_pow2, segment_size

from memalloc import _C, recording, replay, save_trace
from memalloc.reporters import replay as reporters_replay
from memalloc.trace.trace_files import Trace, load_trace

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.speed.worker import random_plan  # noqa: E402  (the GPU benchmark's plan, stdlib only)
from benchmarks.traces import record as trace_recorder  # noqa: E402  (the GPU traces' recorder)

BASELINE = REPO / "benchmarks" / "baselines" / "replay.json"
TOLERANCE = 0.01  # host replay against the H200's figures (addresses from cudaMalloc there)


def event(action: str, addr: int = 0, size: int = 0, requested: int = 0, stream: int = 0, device: int = 0) -> Event:
    return Event(0, action, device, stream, addr, size, requested, 0, "", 0, 0, "large")


def alloc_events(addr: int, requested: int, stream: int = 0, segment: int = 0, device: int = 0) -> list[Event]:
    """An alloc as the allocator records it: its new segment (if ``segment``) first."""
    seg = [event("segment_alloc", addr, segment, stream=stream, device=device)] if segment else []
    return seg + [event("alloc", addr, rnd(requested), requested, stream, device)]


def free_events(addr: int, size: int, stream: int = 0) -> list[Event]:
    return [event(action, addr, rnd(size), size, stream) for action in ("free_requested", "free_completed")]


def trace_of(*devices: list[Event], dropped: int = 0) -> Trace:
    return Trace([list(d) for d in devices], [dropped] * len(devices), {}, [""])


def only_device(result: replay.ReplayResult) -> replay.DeviceReplay:
    assert len(result.devices) == 1
    return result.devices[0]


# =============================================================================
# 1. Synthetic ops: exact peaks under the native rules
# =============================================================================
SIZES = (1000, 3 * MiB, 20 * MiB + 1)  # a small block, a 20 MiB segment, too big for its rest: a 22 MiB segment


def test_three_allocations_give_the_native_peaks():
    ops = [("alloc", size) for size in SIZES]
    d = only_device(replay.replay_ops(ops))
    assert d.peak_allocated == sum(rnd(s) for s in SIZES) == 1024 + 3 * MiB + 20 * MiB + 512
    assert d.peak_reserved == sum(segment_size(rnd(s)) for s in SIZES) == SMALL_SEGMENT + LARGE_SEGMENT + 22 * MiB
    assert d.ratio == d.peak_reserved / d.peak_allocated
    assert (d.allocations, d.ooms, d.final_reserved, d.final_allocated) == (3, 0, d.peak_reserved, d.peak_allocated)


def test_frees_reuse_the_cache_and_empty_cache_returns_it():
    ops = [("alloc", size) for size in SIZES] + [
        ("free", 1),  # the 3 MiB block
        ("alloc", 2 * MiB),  # key 3: from the free 20 MiB segment, no new segment
        ("free", 0),
        ("free", 2),
        ("free", 3),
        ("empty_cache",),
    ]
    d = only_device(replay.replay_ops(ops, name="hand"))
    assert d.peak_allocated == sum(rnd(s) for s in SIZES)
    assert d.peak_reserved == SMALL_SEGMENT + LARGE_SEGMENT + 22 * MiB
    assert (d.allocations, d.final_reserved, d.final_allocated) == (4, 0, 0)


def test_the_config_changes_the_rounding():
    size = 5 * MiB + 1
    plain = only_device(replay.replay_ops([("alloc", size)]))
    rounded = only_device(replay.replay_ops([("alloc", size)], "roundup_power2_divisions:4"))
    assert plain.peak_allocated == rnd(size) == 5 * MiB + 512
    assert rounded.peak_allocated == rnd_pow2(size, 4) == 6 * MiB
    assert plain.peak_reserved == rounded.peak_reserved == LARGE_SEGMENT


def test_the_capacity_limits_a_replay_only_when_asked():
    ops = [("alloc", 400 * MiB)] * 3 + [("free", 2), ("free", 0)]  # 1200 MiB: above the host default (1024)
    free = replay.replay_ops(ops)
    assert (only_device(free).ooms, only_device(free).allocations) == (0, 3)
    assert free.capacity == replay.capacity_bound([400 * MiB] * 3) >= 3 * 802 * MiB
    for limited in (replay.replay_ops(ops, host_capacity_mb=1000), replay.replay_ops(ops, "host_capacity_mb:1000")):
        d = only_device(limited)
        assert limited.capacity == 1000 * MiB
        # The third allocation ran out of memory; freeing its key is no error.
        assert (d.ooms, d.allocations, d.peak_allocated, d.final_allocated) == (1, 2, 800 * MiB, 400 * MiB)


# =============================================================================
# 2. Traces: address mapping, streams, deferred frees, unknown frees
# =============================================================================
X, Y = 0x7F00_0000_0000, 0x7F00_4000_0000  # original addresses (the replay gets others)


def test_an_original_address_reused_maps_to_each_new_replay_pointer():
    events = (
        alloc_events(X, 3 * MiB, segment=LARGE_SEGMENT)
        + free_events(X, 3 * MiB)
        + alloc_events(X, 5 * MiB)
        + alloc_events(Y, 1000, segment=SMALL_SEGMENT)
        + free_events(X, 5 * MiB)
        + free_events(Y, 1000)
    )
    d = only_device(replay.replay_trace(trace_of(events)))
    assert (d.allocations, d.final_allocated, d.unknown_frees) == (3, 0, 0)
    assert d.peak_allocated == d.recorded_peak_allocated == 5 * MiB + 1024
    assert d.peak_reserved == d.recorded_peak_reserved == LARGE_SEGMENT + SMALL_SEGMENT


def test_an_allocation_at_a_live_address_is_a_corrupt_trace():
    with pytest.raises(ValueError, match=f"allocation at {X:#x}, which is still allocated"):
        replay.replay_trace(trace_of(alloc_events(X, 1000) + alloc_events(X, 2000)))


def test_streams_are_kept():
    """A block freed on stream 0 is not reused by stream 5."""

    def run(second_stream: int) -> replay.DeviceReplay:
        events = alloc_events(X, 12 * MiB) + free_events(X, 12 * MiB) + alloc_events(Y, 12 * MiB, stream=second_stream)
        return only_device(replay.replay_trace(trace_of(events)))

    assert run(0).peak_reserved == 12 * MiB
    assert run(5).peak_reserved == 24 * MiB


def test_a_free_completed_later_keeps_its_block_until_then():
    """free_requested ... free_completed (a record_stream use): the block is
    not reused before its free completes, as in the original."""
    Z = Y + (1 << 30)
    req, done = free_events(X, 12 * MiB)
    cases = {
        "at once": alloc_events(X, 12 * MiB) + [req, done] + alloc_events(Y, 12 * MiB),  # Y takes X's block
        "later": alloc_events(X, 12 * MiB)
        + [req]
        + alloc_events(Y, 12 * MiB)
        + [done]
        + alloc_events(Z, 12 * MiB),  # Z takes it
        "never": alloc_events(X, 12 * MiB) + [req] + alloc_events(Y, 12 * MiB) + alloc_events(Z, 12 * MiB),
    }
    reserved = {
        name: only_device(replay.replay_trace(trace_of(events))).peak_reserved for name, events in cases.items()
    }
    assert reserved == {"at once": 12 * MiB, "later": 24 * MiB, "never": 36 * MiB}


def test_a_free_of_an_unknown_address_is_refused_or_counted():
    events = [free_events(Y, 1000)[0]] + alloc_events(X, 1000) + free_events(X, 1000) + [free_events(Y, 1000)[1]]
    with pytest.raises(ValueError) as raised:
        replay.replay_trace(trace_of(events), name="late.trace")
    message = str(raised.value)
    assert message.startswith("late.trace: device 0, event 0 frees ")
    assert f"frees {Y:#x}, which no earlier alloc of the trace returned" in message
    assert "skip_unknown_frees=True" in message
    d = only_device(replay.replay_trace(trace_of(events), skip_unknown_frees=True))
    assert (d.unknown_frees, d.allocations, d.final_allocated) == (1, 1, 0)  # one free: its request and completion
    assert (d.recorded_peak_allocated, d.recorded_peak_reserved) == (None, None)
    dropped = only_device(replay.replay_trace(trace_of(alloc_events(X, 1000), dropped=3)))
    assert (dropped.peak_allocated, dropped.recorded_peak_allocated) == (1024, None)


def test_each_device_of_a_trace_replays_on_its_own_device():
    result = replay.replay_trace(trace_of(alloc_events(X, 1000), alloc_events(X, 3 * MiB, device=1)))
    assert [d.device for d in result.devices] == [0, 1]
    assert [d.peak_reserved for d in result.devices] == [SMALL_SEGMENT, LARGE_SEGMENT]


# =============================================================================
# 3. A trace recorded in-process round-trips through save_trace
# =============================================================================
@contextlib.contextmanager
def recorded_allocator(config: str) -> Iterator[_C.Allocator]:
    """A fresh host allocator recording from its first allocation (no
    stacks); the process-wide stack mode is restored afterwards."""
    mode = _C.stack_mode()
    a = _C.Allocator("host", config)
    try:
        recording.record_history(max_entries=1 << 16, stacks="none", allocator=a)
        yield a
    finally:
        recording.record_history(False, allocator=a)
        _C.set_stack_mode(mode)


def original_figures(a: _C.Allocator) -> dict:
    s = a.stats(0)
    return {
        "peak_allocated": s["allocated_bytes"]["all"]["peak"],
        "peak_reserved": s["reserved_bytes"]["all"]["peak"],
        "allocations": s["allocation"]["all"]["allocated"],
        "final_reserved": s["reserved_bytes"]["all"]["current"],
        "final_allocated": s["allocated_bytes"]["all"]["current"],
    }


def test_a_recorded_trace_replays_to_the_original_figures(tmp_path):
    """Streams, a record_stream use, empty_cache: no two free blocks of one
    size ever compete, so the replay's figures are the original's exactly."""
    with recorded_allocator("host_capacity_mb:256") as a:
        p1, p2, p3 = a.malloc(1000), a.malloc(3 * MiB), a.malloc(11 * MiB + 1, 0, 7)
        a.record_stream(p2, 9)
        a.free(p2)  # completes only once stream 9 is synchronised
        p4 = a.malloc(3 * MiB + 512)  # cannot take p2's block yet
        a.host_synchronize_stream(9)
        p5 = a.malloc(2 * MiB)  # takes p2's block
        a.free(p1)
        a.free(p3)
        a.empty_cache()
        p6 = a.malloc(30 * MiB)
        a.free(p4)
        a.free(p5)
        original = original_figures(a)
        path = save_trace(tmp_path / "run.trace", allocator=a)
        a.free(p6)
    result = replay.replay_trace(path)
    d = only_device(result)
    assert result.source == str(tmp_path / "run.trace")
    assert {k: getattr(d, k) for k in original} == original
    assert (d.recorded_peak_allocated, d.recorded_peak_reserved) == (
        original["peak_allocated"],
        original["peak_reserved"],
    )
    assert (d.ooms, d.unknown_frees) == (0, 0)


def test_a_recorded_random_workload_round_trips(tmp_path):
    """3,000 random allocations: the trace's own peaks and the replay's are
    the original's exactly (deterministic host addresses, module docstring)."""
    with recorded_allocator(f"host_capacity_mb:{1 << 20}") as a:
        ptrs: dict[int, int] = {}
        for op, arg in replay.random_workload(3000):
            if op == "alloc":
                ptrs[len(ptrs)] = a.malloc(arg)
            else:
                a.free(ptrs[arg])
        original = original_figures(a)
        path = save_trace(tmp_path / "random.trace", allocator=a)
        for p in ptrs.values():
            with contextlib.suppress(_C.InvalidPointerError):
                a.free(p)
    d = only_device(replay.replay_trace(path))
    assert (d.recorded_peak_allocated, d.recorded_peak_reserved) == (
        original["peak_allocated"],
        original["peak_reserved"],
    )
    assert d.allocations == original["allocations"] == 3000
    assert (d.peak_allocated, d.peak_reserved) == (original["peak_allocated"], original["peak_reserved"])


def test_replays_repeat_to_the_byte_in_one_process():
    first = only_device(replay.replay_source("random:20000"))
    replay.replay_source("random:3000", "roundup_power2_divisions:4")  # other addresses in between
    again = only_device(replay.replay_source("random:20000"))
    assert (again.peak_allocated, again.peak_reserved, again.final_reserved) == (
        first.peak_allocated,
        first.peak_reserved,
        first.final_reserved,
    )


# =============================================================================
# 4. The random workload: the GPU benchmark's plan, the H200's figures
# =============================================================================
def plan_ops(n: int) -> list[tuple]:
    """benchmarks/speed/worker.py's run_random as ops."""
    sizes, victims, live = random_plan(n_allocs=n)
    slots: list = [None] * live
    ops: list[tuple] = []
    for key, (size, victim) in enumerate(zip(sizes, victims)):
        if slots[victim] is not None:
            ops.append(("free", slots[victim]))
        slots[victim] = key
        ops.append(("alloc", size))
    return ops


@pytest.mark.parametrize("n", [0, 1, 100, 5000])
def test_random_workload_is_the_gpu_benchmarks_plan(n):
    assert list(replay.random_workload(n)) == plan_ops(n)


def test_random_workload_gives_the_h200_figures():
    """The GPU benchmark measured the 50,000-allocation workload under native
    and memalloc on an H200 (the newest benchmarks/results/*-gpu-bench.json);
    the host replay of the default policy gives the same bytes (within the
    address-tie TOLERANCE)."""
    newest = sorted(glob.glob(str(REPO / "benchmarks" / "results" / "*-gpu-bench.json")))[-1]
    runs = json.loads(open(newest).read())["raw"]
    d = only_device(replay.replay_source("random:50000"))
    for allocator in ("native", "memalloc"):
        gpu = next(run for run in runs[allocator] if "random_peak_allocated" in run)
        for key in ("peak_allocated", "peak_reserved"):
            assert abs(getattr(d, key) / gpu[f"random_{key}"] - 1) <= TOLERANCE, (allocator, key, getattr(d, key))
        assert abs(d.ratio / gpu["random_reserved_over_allocated"] - 1) <= TOLERANCE


# =============================================================================
# 5. The committed baseline
# =============================================================================
def baseline_results() -> list[dict]:
    return json.loads(BASELINE.read_text())["results"]


def test_the_baseline_records_its_command_and_the_default_random_workload():
    baseline = json.loads(BASELINE.read_text())
    assert baseline["command"].startswith("python -m memalloc replay ")
    assert {("random:50000", "")} <= {(r["source"], r["config"]) for r in baseline["results"]}


@pytest.mark.parametrize("entry", baseline_results(), ids=lambda r: f"{r['source']}[{r['config'] or 'default'}]")
def test_replay_matches_the_baseline(entry):
    source = entry["source"]
    if not source.startswith(replay.RANDOM_SOURCE):
        source = str(REPO / source)  # committed traces: paths relative to the repository
    got = replay.replay_source(source, entry["config"])
    assert len(got.devices) == len(entry["devices"])
    command = json.loads(BASELINE.read_text())["command"]
    for device, want in zip(got.devices, entry["devices"]):
        assert device.ooms == want["ooms"]
        for key in ("peak_allocated", "peak_reserved"):
            now, then = getattr(device, key), want[key]
            assert now == then, (
                f"{entry['source']} under {entry['config'] or 'the default config'!r}, device {device.device}: "
                f"{key} {now} bytes against the baseline's {then} ({now / then - 1:+.3%}). Replays are "
                f"deterministic, so the policy changed: if on purpose, rewrite "
                f"benchmarks/baselines/replay.json with: {command}"
            )


# =============================================================================
# 6. Bad input and the reports
# =============================================================================
@pytest.mark.parametrize(
    "call, error, fragment",
    [
        (lambda: replay.replay_ops([("alloc", -1)]), ValueError, "op 0 is ('alloc', -1)"),
        (lambda: replay.replay_ops([("alloc", 1.5)]), ValueError, "sizes and keys ints >= 0"),
        (lambda: replay.replay_ops([("alloc", True)]), ValueError, "op 0"),
        (lambda: replay.replay_ops([("alloc", 10), ("malloc", 10)]), ValueError, "op 1 is ('malloc', 10)"),
        (lambda: replay.replay_ops(["alloc"]), ValueError, "op 0 is 'alloc'"),
        (lambda: replay.replay_ops([("empty_cache", 0)]), ValueError, "('empty_cache',)"),
        (
            lambda: replay.replay_ops([("alloc", 10), ("free", 1)]),
            ValueError,
            "ops: op 1 frees key 1, which no earlier alloc op made",
        ),
        (
            lambda: replay.replay_ops([("alloc", 10), ("free", 0), ("free", 0)]),
            ValueError,
            "or which was freed already",
        ),
        (lambda: replay.replay_ops([], 5), TypeError, "config must be 'key:value,...' text, not int"),
        (lambda: replay.replay_ops([], "bogus:1"), _C.InvalidArgumentError, "unknown key 'bogus'"),
        (
            lambda: replay.replay_ops([], "host_devices:2"),
            ValueError,
            "sets host_devices: the replay sets those itself",
        ),
        (lambda: replay.replay_ops([], "backend:host"), ValueError, "sets backend"),
        (
            lambda: replay.replay_ops([], "host_capacity_mb:64", host_capacity_mb=64),
            ValueError,
            "the capacity is given twice",
        ),
        (lambda: replay.replay_ops([], host_capacity_mb=0), ValueError, "host_capacity_mb must be an int in 1.."),
        (lambda: replay.replay_ops([], host_capacity_mb=1.5), ValueError, "host_capacity_mb must be an int"),
        (lambda: replay.random_workload(-1), ValueError, "n_allocs must be an int >= 0, not -1"),
        (lambda: replay.random_workload(10, live=0), ValueError, "live must be an int >= 1"),
        (lambda: replay.replay_source("random:ten"), ValueError, "write random:N"),
        (lambda: replay.replay_source(__file__), ValueError, "is not a memalloc trace file"),
        (lambda: replay.replay_trace("/nonexistent/run.trace"), FileNotFoundError, "/nonexistent/run.trace"),
        (lambda: replay.replay_trace(trace_of()), ValueError, "the trace has no device"),
    ],
)
def test_bad_input_gets_a_clear_error(call, error, fragment):
    with pytest.raises(error) as raised:
        call()
    assert fragment in str(raised.value)


def test_results_table_and_json(tmp_path):
    results = [
        replay.replay_ops([("alloc", 1000)], name="one"),
        replay.replay_ops([("alloc", 3 * MiB)], "max_split_size_mb:64", name="two"),
        replay.replay_ops([], name="none"),
    ]
    lines = reporters_replay.results_table([r.to_dict() for r in results]).splitlines()
    assert lines[0].split() == [
        "workload",
        "config",
        "device",
        "peak",
        "allocated",
        "peak",
        "reserved",
        "reserved/allocated",
        "OOMs",
    ]
    assert lines[1].split() == ["one", "(default)", "0", "1.00", "KiB", "2.00", "MiB", "2048.0000", "0"]
    assert lines[2].split() == ["two", "max_split_size_mb:64", "0", "3.00", "MiB", "20.00", "MiB", "6.6667", "0"]
    assert lines[3].split() == ["none", "(default)", "0", "0", "B", "0", "B", "-", "0"]
    text = reporters_replay.results_to_json([r.to_dict() for r in results], tmp_path / "r.json", command="cmd")
    assert (tmp_path / "r.json").read_text() == text
    data = json.loads(text)
    assert data["command"] == "cmd"
    assert data["results"][1] == {
        **dataclasses.asdict(results[1]),
        "devices": [{**dataclasses.asdict(results[1].devices[0]), "ratio": 20 / 3}],
    }
    assert data["results"][2]["devices"][0]["ratio"] is None


# =============================================================================
# 7. Compressed traces and the recording script
# =============================================================================
def test_a_gz_trace_reads_back_the_same_and_a_damaged_one_is_named(tmp_path):
    with recorded_allocator("host_capacity_mb:64") as a:
        ptrs = [a.malloc(1000 * (i + 1)) for i in range(20)]
        for p in ptrs[::2]:
            a.free(p)
        plain = save_trace(tmp_path / "t.mtrace", allocator=a)
        packed = save_trace(tmp_path / "t.mtrace.gz", allocator=a)
        for p in ptrs[1::2]:
            a.free(p)
    assert load_trace(packed) == load_trace(plain)
    assert (tmp_path / "t.mtrace.gz").stat().st_size < (tmp_path / "t.mtrace").stat().st_size
    assert replay.replay_trace(packed).devices[0].peak_reserved == replay.replay_trace(plain).devices[0].peak_reserved
    (tmp_path / "bad.gz").write_bytes(b"\x1f\x8bnot gzip")
    with pytest.raises(ValueError, match="bad.gz is a damaged gzip file"):
        load_trace(tmp_path / "bad.gz")


@pytest.mark.slow  # every host workload recorded, then replayed (~5 s)
def test_traces_recorded_on_the_host_replay_to_the_runs_own_peaks(tmp_path):
    """benchmarks/traces/record.py (the GPU traces' recorder) on the host
    backend: a training loop's trace replays to the peaks the run had."""
    assert trace_recorder.main(["--out", str(tmp_path), "--backend", "host", "--workloads", "tiny"]) == 0
    (r,) = json.loads((tmp_path / "recorded.json").read_text())["results"]
    assert r["workload"] == "tiny" and r["dropped"] == 0 and r["events"] > 100
    assert (r["replay_peak_allocated"], r["replay_peak_reserved"]) == (r["peak_allocated"], r["peak_reserved"])


def test_expandable_segments_meet_the_fragmentation_target_on_every_baseline_workload():
    """Issue 14's target, guarded in CI: peak reserved / peak allocated <= 1.05
    under expandable_segments:True (the GPU run measured 1.0474 on the random
    workload, the replay's figure), and never more reserved than the default."""
    by_source: dict = {}
    for entry in baseline_results():
        by_source.setdefault(entry["source"], {})[entry["config"]] = entry["devices"][0]
    assert len(by_source) >= 4  # the three GPU traces and the random workload
    for source, configs in by_source.items():
        exp, default = configs["expandable_segments:True"], configs[""]
        assert exp["peak_reserved"] <= 1.05 * exp["peak_allocated"], source
        assert exp["peak_reserved"] < default["peak_reserved"], source


def test_a_loop_that_moved_pages_every_step_stops_moving_them():
    """transformers' GPT-2 on the CPU (benchmarks/traces/gpt2_cpu.mtrace.gz,
    benchmarks/traces/record.py): under expandable segments' 5% ceiling its
    loss's 786 MiB request gave pages back and mapped new ones at every step
    (a stream synchronisation and driver calls per step on a GPU). The loop
    rule (csrc/pool/vm_arena.h) finds it (replay.replay_steps replays
    it step by step) and doubles the slack: no page moves after the first
    steps, at most 1.10 reserved per allocated byte,
    less than without reuse (reuse_free_pages:False, native's expandable
    segments) and than plain segments."""
    trace = REPO / "benchmarks" / "traces" / "gpt2_cpu.mtrace.gz"
    rows = replay_steps(trace, "expandable_segments:True")
    assert len(rows) == 12
    assert sum(r.maps + r.unmaps for r in rows[1:4]) > 0  # it did move pages after step 0
    assert [(r.maps, r.unmaps) for r in rows[5:]] == [(0, 0)] * 7
    last = rows[-1]
    assert last.peak_reserved <= 1.10 * last.peak_allocated
    no_reuse = replay_steps(trace, "expandable_segments:True,reuse_free_pages:False")[-1]
    plain = replay_steps(trace, "")[-1]
    ratio = lambda r: r.peak_reserved / r.peak_allocated  # noqa: E731
    assert last.peak_allocated == no_reuse.peak_allocated  # (plain segments round blocks otherwise)
    assert ratio(last) < ratio(no_reuse) < ratio(plain)


def test_a_loop_that_keeps_a_small_tensor_every_step_still_stops_moving_pages():
    """The same GPT-2 trace with a 512-byte tensor kept at the start of every
    step (a loss kept for logging, say): its bytes allocated and high-water
    mark creep up each step, and the loop is still found: no page moves
    after step 4 either."""
    trace = load_trace(REPO / "benchmarks" / "traces" / "gpt2_cpu.mtrace.gz").events[0]
    first_alloc = next(e for e in trace if e.action == "alloc")
    kept, seen, base = [], set(), 1 << 60  # addresses far from the trace's
    for e in trace:
        if e.step >= 1 and e.step not in seen:
            seen.add(e.step)
            kept.append(
                dataclasses.replace(first_alloc, addr=base + e.step * 4096, size=512, requested=512, step=e.step)
            )
        kept.append(e)
    rows = replay_steps(kept, "expandable_segments:True")
    assert len(rows) == 12
    assert rows[-1].peak_allocated > replay_steps(trace, "expandable_segments:True")[-1].peak_allocated
    assert [(r.maps, r.unmaps) for r in rows[5:]] == [(0, 0)] * 7
    assert rows[-1].peak_reserved <= 1.10 * rows[-1].peak_allocated


def test_a_loop_that_goes_over_the_ceiling_every_few_steps_stops_moving_pages():
    """The bf16 transformer's trace (benchmarks/traces/transformer.mtrace.gz,
    8 steps on the H200) with its last step run 20 more times: under the 5%
    ceiling its 132 MiB request went over only every few steps (after 1, 5,
    3, 1, 2, 3, 1 and 1 steps: where the free pages lie changes from step to
    step), and the loop rule, which then wanted two equal gaps, found it in
    step 19 after maps in steps 8-18, as the live H200 run mapped 9 times and
    unmapped 11 in 25 timed steps (benchmarks/results/
    2026-12-02-gpu-step-time-crowd.json). Gaps that are whole multiples of
    one step's allocations are a loop now: one mapping in step 8, none
    after, at most 1.07 reserved per allocated byte, still under plain
    segments'."""
    events = load_trace(REPO / "benchmarks" / "traces" / "transformer.mtrace.gz").events[0]
    longer = repeat_last_step(events, 20)
    rows = replay_steps(longer, "expandable_segments:True")
    assert len(rows) == 28
    assert {r.peak_allocated for r in rows[1:]} == {rows[-1].peak_allocated}  # a loop: the same peak
    assert [(r.maps, r.unmaps) for r in rows[9:]] == [(0, 0)] * 19
    ratio = lambda r: r.peak_reserved / r.peak_allocated  # noqa: E731
    assert ratio(rows[-1]) <= 1.07 < ratio(replay_steps(longer, "")[-1])


def test_a_loop_in_a_pool_of_27_gib_stops_moving_pages_under_the_capped_ceiling():
    """The bf16 transformer's trace at six times its sizes (a 26.97 GiB peak, in
    20 MiB pages) with its last step run 12 more times: above 10 GiB the
    reuse ceiling is 512 MiB over the most allocated, not 5%
    (VmArena::kReuseSlackCap), and the loop rule doubles the cap as it
    halves the divisor. Its pages move in the first steps and once in step
    7, then never (under the 5% alone they moved in step 14 too); it reserves
    at most 1.05 per allocated byte, less than plain segments."""
    events = load_trace(REPO / "benchmarks" / "traces" / "transformer.mtrace.gz").events[0]
    big = repeat_last_step([dataclasses.replace(e, size=e.size * 6, requested=e.requested * 6) for e in events], 12)
    rows = replay_steps(big, "expandable_segments:True", host_capacity_mb=200_000)
    assert len(rows) == 20 and rows[-1].peak_allocated > 26 << 30
    assert [(r.maps, r.unmaps) for r in rows[8:]] == [(0, 0)] * 12
    ratio = lambda r: r.peak_reserved / r.peak_allocated  # noqa: E731
    assert ratio(rows[-1]) <= 1.05 < ratio(replay_steps(big, "", host_capacity_mb=200_000)[-1])


def test_repeating_a_last_step_keeps_its_requests_and_refuses_what_is_no_loop():
    events = load_trace(REPO / "benchmarks" / "traces" / "transformer.mtrace.gz").events[0]
    longer = repeat_last_step(events, 2)
    last = max(e.step for e in events)

    def step(evs, s):  # a step's allocation-level requests
        return [(e.action, e.requested) for e in evs if e.step == s and e.action != "segment_map"]

    assert step(longer, last + 1) == step(longer, last + 2) == step(events, last)
    assert repeat_last_step(events, 0) == events
    with pytest.raises(ValueError, match="times must be an int >= 0, not -1"):
        repeat_last_step(events, -1)
    with pytest.raises(ValueError, match="device 1: the trace has 1 device"):
        replay_steps(load_trace(REPO / "benchmarks" / "traces" / "transformer.mtrace.gz"), device=1)
    # a last step that frees a block of two steps back, or allocates otherwise than the step before
    old = alloc_events(0x1000, 4096)  # step 0
    mid = [dataclasses.replace(e, step=1) for e in alloc_events(0x9000, 4096)]
    tail = [dataclasses.replace(e, step=2) for e in free_events(0x1000, 4096) + alloc_events(0x9000 + 8192, 4096)]
    with pytest.raises(ValueError, match=r"the last step \(step 2\) frees 0x1000, which step 0 allocated"):
        repeat_last_step(old + mid + tail, 1)
    other = [dataclasses.replace(e, step=2) for e in alloc_events(0x20000, 8192)]
    with pytest.raises(ValueError, match="steps 1 and 2 allocate other sizes"):
        repeat_last_step(old + mid + other, 1)
