"""memalloc.StepTracker (memalloc/features/tracker.py) on the host backend with real
host tensors, in this process on an allocator the test owns
(``StepTracker(allocator=a)``, tensors from ``host.empty(..., allocator=a)``,
the allocator's own stats instead of the installed-allocator functions).
The step counter is process-wide, so step numbers are counted from its
value when a test starts. Only what needs ``memalloc.enable()`` (a tracker
made before it, the installed allocator as the default, torch.cuda's
answers) runs in a fresh interpreter.

Sizes: a request rounds up to 512 B; requests of <= 1 MiB come from 2 MiB
segments, 1-10 MiB ones from 20 MiB segments; the host device's free bytes
are its capacity minus memalloc's reserved bytes.
"""

from __future__ import annotations

import csv
import importlib.util
import json

import pytest
import torch
from memtest_helpers import stat

import memalloc
from memalloc import host
from memalloc.core import iteration
from memalloc.features import tracker as tracker_module

MiB = 1 << 20
SEG_SMALL, SEG_LARGE = 2 * MiB, 20 * MiB
CAPACITY = 64 * MiB
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
u8 = torch.uint8


@pytest.fixture(autouse=True)
def no_listener_left():
    """Every test stops its trackers: no step listener outlives it."""
    before = list(iteration._listeners)
    yield
    assert iteration._listeners == before, "a StepTracker was left listening"


def row(step, allocated, reserved, peak_allocated, peak_reserved, ooms=0):
    """The expected row of a host device of CAPACITY (time_s left out)."""
    return {
        "step": step,
        "allocated": allocated,
        "reserved": reserved,
        "peak_allocated": peak_allocated,
        "peak_reserved": peak_reserved,
        "device_used": reserved,
        "device_total": CAPACITY,
        "num_ooms": ooms,
    }


def no_time(rows):
    """The rows without time_s and the breakdown fields (tests/unit/test_breakdown.py checks those)."""
    return [{k: v for k, v in r.items() if k != "time_s" and k not in tracker_module.BREAKDOWN_FIELDS} for r in rows]


def raised(f) -> BaseException:
    """What ``f()`` raised (the test fails when it raised nothing)."""
    with pytest.raises(BaseException) as info:
        f()
    return info.value


def user_peaks(a):
    """What memalloc.memory.max_memory_allocated() / max_memory_reserved() answer for ``a``."""
    return [stat(a, "allocated_bytes", field="peak"), stat(a, "reserved_bytes", field="peak")]


def test_scripted_loop_exact_bytes_and_listener_removed_on_stop(host_allocator):
    a, base = host_allocator, memalloc.iteration.steps()
    keep = []
    with memalloc.StepTracker(allocator=a) as t:
        assert t._on_step in iteration._listeners
        for i in range(4):
            keep.append(host.empty(1000, dtype=u8, allocator=a))  # 1024 B, from the 2 MiB small segment
            big = host.empty(3 * MiB, dtype=u8, allocator=a)  # 3 MiB, from a 20 MiB segment
            del big  # the segment stays cached
            if i == 2:
                a.empty_cache()  # ... except in step 3
            memalloc.step()
    rows = t.rows
    assert t._on_step not in iteration._listeners and t.running is False
    memalloc.step()  # stopped: no row
    assert len(t.rows) == 4
    k = 1024
    assert no_time(rows) == [
        row(base + 1, 1 * k, SEG_SMALL + SEG_LARGE, 1 * k + 3 * MiB, SEG_SMALL + SEG_LARGE),
        row(base + 2, 2 * k, SEG_SMALL + SEG_LARGE, 2 * k + 3 * MiB, SEG_SMALL + SEG_LARGE),
        row(base + 3, 3 * k, SEG_SMALL, 3 * k + 3 * MiB, SEG_SMALL + SEG_LARGE),  # emptied before the boundary
        row(base + 4, 4 * k, SEG_SMALL + SEG_LARGE, 4 * k + 3 * MiB, SEG_SMALL + SEG_LARGE),
    ]
    for x in rows:  # the in-step peak is not the end-of-step figure
        assert x["peak_allocated"] - x["allocated"] == 3 * MiB
    times = [x["time_s"] for x in rows]
    assert times == sorted(times) and times[0] >= 0
    assert user_peaks(a)[0] == 4 * k + 3 * MiB  # the tracker never reset the user's peak
    assert repr(t) == (
        f"<memalloc.StepTracker device=0 stopped, 4 rows (steps {base + 1}..{base + 4}), allocated 4.00 KiB at the "
        "last, highest peak allocated 3.00 MiB, boundaries: 4 from memalloc.step()>"
    )


def test_torch_peaks_and_tracker_peaks_do_not_disturb_each_other(host_allocator):
    # torch.cuda.max_memory_allocated() answering from memalloc needs the
    # torch patch: test_tracker_before_enable_then_the_installed_allocator.
    a, base = host_allocator, memalloc.iteration.steps()
    t = memalloc.StepTracker(allocator=a).start()
    try:
        x = host.empty(5 * MiB, dtype=u8, allocator=a)
        del x  # 5 MiB in a 20 MiB segment
        a.reset_peak_stats(0)  # the user's reset, mid-step
        assert user_peaks(a) == [0, SEG_LARGE]
        memalloc.step()
        assert user_peaks(a) == [0, SEG_LARGE]
        y = host.empty(2 * MiB, dtype=u8, allocator=a)
        del y
        memalloc.step()
        assert user_peaks(a)[0] == 2 * MiB
        assert no_time(t.rows) == [
            row(base + 1, 0, SEG_LARGE, 5 * MiB, SEG_LARGE),
            row(base + 2, 0, SEG_LARGE, 2 * MiB, SEG_LARGE),
        ]
    finally:
        t.stop()


def test_two_trackers_of_one_device_each_see_their_own_steps(host_allocator):
    a, base = host_allocator, memalloc.iteration.steps()
    t1 = memalloc.StepTracker(allocator=a).start()
    t2 = memalloc.StepTracker(0, allocator=a)
    try:
        x = host.empty(4 * MiB, dtype=u8, allocator=a)
        del x
        memalloc.step()
        x = host.empty(6 * MiB, dtype=u8, allocator=a)
        del x  # before t2 starts: t1's step only
        t2.start()
        y = host.empty(2 * MiB, dtype=u8, allocator=a)
        del y
        memalloc.step()  # t1 records first; its take is folded into t2 too
        assert [x["peak_allocated"] for x in t1.rows] == [4 * MiB, 6 * MiB]
        assert [[x["step"], x["peak_allocated"]] for x in t2.rows] == [[base + 2, 2 * MiB]]
        t1.stop()
        z = host.empty(8 * MiB, dtype=u8, allocator=a)
        del z
        memalloc.step()
        assert [x["peak_allocated"] for x in t2.rows] == [2 * MiB, 8 * MiB] and len(t1.rows) == 2
    finally:
        t1.stop()
        t2.stop()


def test_record_row_ooms_summary_and_bad_input(host_allocator, tmp_path):
    a, d = host_allocator, str(tmp_path)
    bad_device = raised(lambda: memalloc.StepTracker(3, allocator=a))
    assert type(bad_device) is memalloc.errors.InvalidArgumentError and isinstance(bad_device, ValueError)
    assert "device 3 does not exist" in str(bad_device) and "indices 0..0" in str(bad_device)
    assert type(raised(lambda: memalloc.StepTracker(True, allocator=a))) is TypeError
    t = memalloc.StepTracker("cuda:0", allocator=a)
    not_running = raised(t.record_row)
    assert type(not_running) is RuntimeError and "start()" in str(not_running)
    t.start()
    try:
        twice = raised(t.start)
        assert type(twice) is RuntimeError and "already running" in str(twice)
        keep = host.empty(1000, dtype=u8, allocator=a)
        assert type(raised(lambda: host.empty(100 * MiB, dtype=u8, allocator=a))) is torch.OutOfMemoryError
        rows = [t.record_row()]  # step 1: the OOM
        rows.append(t.record_row())  # step 2: none
        a.reset_accumulated_stats(0)  # num_ooms back to 0 ...
        raised(lambda: host.empty(100 * MiB, dtype=u8, allocator=a))  # ... then one more
        rows.append(t.record_row(step=7))
        rows.append(t.record_row())
        bad_step = [
            raised(lambda: t.record_row(step=-1)),
            raised(lambda: t.record_row(step="3")),
            raised(lambda: t.record_row(step=True)),
        ]
        summary = t.summary()
        paths = [
            raised(lambda: t.to_csv(d)),
            raised(lambda: t.to_json(d + "/missing/x.json")),
            raised(lambda: t.to_csv(3)),
        ]
    finally:
        t.stop()
    t.stop()  # stopping twice is harmless
    assert type(raised(t.record_row)) is RuntimeError
    del keep
    small = SEG_SMALL
    assert no_time(rows) == [
        row(1, 1024, small, 1024, small, ooms=1),
        row(2, 1024, small, 1024, small),
        row(7, 1024, small, 1024, small, ooms=1),  # the per-step count ignores the reset
        row(8, 1024, small, 1024, small),
    ]
    assert [type(e).__name__ for e in bad_step] == ["ValueError", "TypeError", "TypeError"]
    assert summary.startswith("StepTracker, device 0 (host backend): 4 steps (1..8)")
    assert "OOMs: 2 (steps 1, 7)" in summary and "+0 B/step" in summary
    assert "peak allocated in a step: 1.00 KiB (step 1)" in summary
    assert [type(e).__name__ for e in paths] == ["IsADirectoryError", "FileNotFoundError", "TypeError"]
    assert "is a directory" in str(paths[0]) and "does not exist" in str(paths[1])
    assert memalloc.StepTracker(allocator=a).summary().endswith("no rows yet")


def test_csv_json_round_trip_and_plot(host_allocator, tmp_path):
    a, d, base = host_allocator, str(tmp_path), memalloc.iteration.steps()
    keep = []
    with memalloc.StepTracker(allocator=a) as t:
        for i in memalloc.steps_of(range(3)):
            keep.append(host.empty(200_000 * (i + 1), dtype=u8, allocator=a))
            tmp = host.empty(2 * MiB, dtype=u8, allocator=a)
            del tmp
        t.to_csv(d + "/m.csv")
        t.to_json(d + "/m.json")
    rows = t.rows
    assert [x["step"] for x in rows] == [base + 1, base + 2, base + 3]
    assert [x["allocated"] for x in rows] == [200192, 200192 + 400384, 200192 + 400384 + 600064]
    with open(tmp_path / "m.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == (
            "step",
            "time_s",
            "allocated",
            "reserved",
            "peak_allocated",
            "peak_reserved",
            "device_used",
            "device_total",
            "num_ooms",
            "peak_parameters",
            "peak_gradients",
            "peak_optimizer_state",
            "peak_activations",
            "peak_temporaries",
            "peak_other",
        )
        back = [{k: float(v) if k == "time_s" else int(v) for k, v in x.items()} for x in reader]
    assert back == rows
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["schema"] == "memalloc.step_tracker/1" and doc["backend"] == "host" and doc["device"] == 0
    assert doc["units"]["allocated"] == "bytes" and doc["units"]["time_s"] == "seconds"
    assert doc["rows"] == rows
    png = tmp_path / "m.png"
    if HAS_MATPLOTLIB:
        assert t.plot(png) == png
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        plot_empty = raised(lambda: memalloc.StepTracker(allocator=a).plot(d + "/empty.png"))
        assert type(plot_empty) is ValueError and "no rows" in str(plot_empty)
    else:
        plot = raised(lambda: t.plot(png))
        assert type(plot) is ImportError and "pip install matplotlib" in str(plot)
        assert not png.exists()


def test_tracker_before_enable_then_the_installed_allocator(fresh_python):
    # A fresh interpreter: a tracker made before memalloc.enable() (which is
    # once per process) has no allocator yet; after enable() the default is
    # the installed allocator, and torch.cuda's peaks answer from memalloc
    # (the torch patch), undisturbed by the tracker's window.
    _, r, _ = fresh_python.code(
        "",
        """
R["type_before_enable"] = err(lambda: memalloc.StepTracker(1.5))
early = memalloc.StepTracker()
R["start_before_enable"] = err(early.start)
R["device_before_enable"] = early.device
memalloc.enable(backend="host", config="host_capacity_mb:64,expandable_segments:False")
base = memalloc.iteration.steps()
early.start()
x = host.empty(5 * MiB, dtype=torch.uint8); del x
memalloc.memory.reset_peak_memory_stats()
R["user_peak_after_reset"] = [memalloc.memory.max_memory_allocated(), memalloc.memory.max_memory_reserved()]
memalloc.step()
R["user_peak_after_step"] = [memalloc.memory.max_memory_allocated(), memalloc.memory.max_memory_reserved(),
                             torch.cuda.max_memory_allocated()]
early.stop()
R["rows"] = early.rows
R["base"] = base
R["empty_summary"] = memalloc.StepTracker().summary()
""",
    )
    assert r["type_before_enable"][0] == "TypeError"
    assert r["start_before_enable"][0] == "RuntimeError" and "memalloc.enable()" in r["start_before_enable"][2]
    assert r["device_before_enable"] is None
    assert r["user_peak_after_reset"] == [0, SEG_LARGE]
    assert r["user_peak_after_step"] == [0, SEG_LARGE, 0]  # torch.cuda answers from memalloc too
    assert no_time(r["rows"]) == [row(r["base"] + 1, 0, SEG_LARGE, 5 * MiB, SEG_LARGE)]
    assert r["empty_summary"].endswith("no rows yet")
