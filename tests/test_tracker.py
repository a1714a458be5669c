"""memalloc.StepTracker (memalloc/tracker.py) on the host backend with real
host tensors. Each scenario runs in a fresh interpreter (enable() is once per
process; the step counter is process-wide).

Sizes: a request rounds up to 512 B; requests of <= 1 MiB come from 2 MiB
segments, 1-10 MiB ones from 20 MiB segments; the host device's free bytes
are its capacity minus memalloc's reserved bytes.
"""
from __future__ import annotations

import csv
import importlib.util
import json

from memtest_helpers import run_python

MiB = 1 << 20
SEG_SMALL, SEG_LARGE = 2 * MiB, 20 * MiB
CAPACITY = 64 * MiB
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None

PRELUDE = """
memalloc.enable(backend="host", config="host_capacity_mb:64")
u8 = torch.uint8
"""


def row(step, allocated, reserved, peak_allocated, peak_reserved, ooms=0):
    """The expected row of a host device of CAPACITY (time_s left out)."""
    return {"step": step, "allocated": allocated, "reserved": reserved, "peak_allocated": peak_allocated,
            "peak_reserved": peak_reserved, "device_used": reserved, "device_total": CAPACITY, "num_ooms": ooms}


def no_time(rows):
    return [{k: v for k, v in r.items() if k != "time_s"} for r in rows]


def test_scripted_loop_exact_bytes_and_listener_removed_on_stop():
    _, r, _ = run_python(PRELUDE, """
keep = []
with memalloc.StepTracker() as t:
    R["listening"] = t._on_step in memalloc.iteration._listeners
    for i in range(4):
        keep.append(host.empty(1000, dtype=u8))  # 1024 B, from the 2 MiB small segment
        big = host.empty(3 * MiB, dtype=u8)       # 3 MiB, from a 20 MiB segment
        del big                                   # the segment stays cached
        if i == 2:
            memalloc.empty_cache()                # ... except in step 3
        memalloc.step()
R["rows"] = t.rows
R["listening_after"] = t._on_step in memalloc.iteration._listeners
R["running_after"] = t.running
memalloc.step()                                   # stopped: no row
R["rows_after_stop"] = len(t.rows)
R["torch_peak"] = memalloc.max_memory_allocated()
R["repr"] = repr(t)
""")
    k = 1024
    assert no_time(r["rows"]) == [
        row(1, 1 * k, SEG_SMALL + SEG_LARGE, 1 * k + 3 * MiB, SEG_SMALL + SEG_LARGE),
        row(2, 2 * k, SEG_SMALL + SEG_LARGE, 2 * k + 3 * MiB, SEG_SMALL + SEG_LARGE),
        row(3, 3 * k, SEG_SMALL, 3 * k + 3 * MiB, SEG_SMALL + SEG_LARGE),  # emptied before the boundary
        row(4, 4 * k, SEG_SMALL + SEG_LARGE, 4 * k + 3 * MiB, SEG_SMALL + SEG_LARGE),
    ]
    for x in r["rows"]:  # the in-step peak is not the end-of-step figure
        assert x["peak_allocated"] - x["allocated"] == 3 * MiB
    times = [x["time_s"] for x in r["rows"]]
    assert times == sorted(times) and times[0] >= 0
    assert r["listening"] is True and r["listening_after"] is False and r["running_after"] is False
    assert r["rows_after_stop"] == 4
    assert r["torch_peak"] == 4 * k + 3 * MiB  # the tracker never reset the user's peak
    assert r["repr"] == "<memalloc.StepTracker device=0 stopped, 4 rows>"


def test_torch_peaks_and_tracker_peaks_do_not_disturb_each_other():
    _, r, _ = run_python(PRELUDE, """
t = memalloc.StepTracker().start()
x = host.empty(5 * MiB, dtype=u8); del x          # 5 MiB in a 20 MiB segment
memalloc.reset_peak_memory_stats()               # the user's reset, mid-step
R["user_peak_after_reset"] = [memalloc.max_memory_allocated(), memalloc.max_memory_reserved()]
memalloc.step()
R["user_peak_after_step"] = [memalloc.max_memory_allocated(), memalloc.max_memory_reserved(),
                             torch.cuda.max_memory_allocated()]
y = host.empty(2 * MiB, dtype=u8); del y
memalloc.step()
R["user_peak_end"] = memalloc.max_memory_allocated()
R["rows"] = t.rows
t.stop()
""")
    assert r["user_peak_after_reset"] == [0, SEG_LARGE]
    assert r["user_peak_after_step"] == [0, SEG_LARGE, 0]  # torch.cuda answers from memalloc too
    assert r["user_peak_end"] == 2 * MiB
    assert no_time(r["rows"]) == [row(1, 0, SEG_LARGE, 5 * MiB, SEG_LARGE), row(2, 0, SEG_LARGE, 2 * MiB, SEG_LARGE)]


def test_two_trackers_of_one_device_each_see_their_own_steps():
    _, r, _ = run_python(PRELUDE, """
t1 = memalloc.StepTracker().start()
x = host.empty(4 * MiB, dtype=u8); del x
memalloc.step()
x = host.empty(6 * MiB, dtype=u8); del x        # before t2 starts: t1's step only
t2 = memalloc.StepTracker(0).start()
y = host.empty(2 * MiB, dtype=u8); del y
memalloc.step()                                 # t1 records first; its take is folded into t2 too
R["t1"] = [x["peak_allocated"] for x in t1.rows]
R["t2"] = [[x["step"], x["peak_allocated"]] for x in t2.rows]
t1.stop()
z = host.empty(8 * MiB, dtype=u8); del z
memalloc.step()
R["t2_after"] = [x["peak_allocated"] for x in t2.rows]
R["t1_rows"] = len(t1.rows)
t2.stop()
""")
    assert r["t1"] == [4 * MiB, 6 * MiB]
    assert r["t2"] == [[2, 2 * MiB]]
    assert r["t2_after"] == [2 * MiB, 8 * MiB] and r["t1_rows"] == 2


def test_record_row_ooms_summary_and_bad_input(tmp_path):
    _, r, _ = run_python("", f"""
d = {str(tmp_path)!r}
R["type_before_enable"] = err(lambda: memalloc.StepTracker(1.5))
early = memalloc.StepTracker()
R["start_before_enable"] = err(early.start)
R["device_before_enable"] = early.device
memalloc.enable(backend="host", config="host_capacity_mb:64")
u8 = torch.uint8
R["bad_device"] = err(lambda: memalloc.StepTracker(3))
R["bad_bool"] = err(lambda: memalloc.StepTracker(True))
t = memalloc.StepTracker("cuda:0")
R["not_running"] = err(t.record_row)
t.start()
R["twice"] = err(t.start)
keep = host.empty(1000, dtype=u8)
R["oom"] = err(lambda: host.empty(100 * MiB, dtype=u8))
R["rows"] = [t.record_row()]                                  # step 1: the OOM
R["rows"].append(t.record_row())                              # step 2: none
memalloc.reset_accumulated_memory_stats()                     # num_ooms back to 0 ...
err(lambda: host.empty(100 * MiB, dtype=u8))                  # ... then one more
R["rows"].append(t.record_row(step=7))
R["rows"].append(t.record_row())
R["bad_step"] = [err(lambda: t.record_row(step=-1)), err(lambda: t.record_row(step="3")),
                 err(lambda: t.record_row(step=True))]
R["summary"] = t.summary()
R["paths"] = [err(lambda: t.to_csv(d)), err(lambda: t.to_json(d + "/missing/x.json")), err(lambda: t.to_csv(3))]
t.stop()
t.stop()                                                      # stopping twice is harmless
R["stopped"] = err(t.record_row)
R["empty_summary"] = memalloc.StepTracker().summary()
""")
    assert r["type_before_enable"][0] == "TypeError"
    assert r["start_before_enable"][0] == "RuntimeError" and "memalloc.enable()" in r["start_before_enable"][2]
    assert r["device_before_enable"] is None
    assert r["bad_device"][0] == "InvalidArgumentError" and "ValueError" in r["bad_device"][1]
    assert "device 3 does not exist" in r["bad_device"][2] and "indices 0..0" in r["bad_device"][2]
    assert r["bad_bool"][0] == "TypeError"
    assert r["not_running"][0] == "RuntimeError" and "start()" in r["not_running"][2]
    assert r["twice"][0] == "RuntimeError" and "already running" in r["twice"][2]
    assert r["oom"][0] == "OutOfMemoryError"
    small = SEG_SMALL
    assert no_time(r["rows"]) == [
        row(1, 1024, small, 1024, small, ooms=1),
        row(2, 1024, small, 1024, small),
        row(7, 1024, small, 1024, small, ooms=1),  # the per-step count ignores the reset
        row(8, 1024, small, 1024, small),
    ]
    assert [e[0] for e in r["bad_step"]] == ["ValueError", "TypeError", "TypeError"]
    summary = r["summary"]
    assert summary.startswith("StepTracker, device 0 (host backend): 4 steps (1..8)")
    assert "OOMs: 2 (steps 1, 7)" in summary and "+0 B/step" in summary
    assert "peak allocated in a step: 1.00 KiB (step 1)" in summary
    assert [e[0] for e in r["paths"]] == ["IsADirectoryError", "FileNotFoundError", "TypeError"]
    assert "is a directory" in r["paths"][0][2] and "does not exist" in r["paths"][1][2]
    assert r["stopped"][0] == "RuntimeError"
    assert r["empty_summary"].endswith("no rows yet")


def test_csv_json_round_trip_and_plot(tmp_path):
    _, r, _ = run_python(PRELUDE, f"""
d = {str(tmp_path)!r}
keep = []
with memalloc.StepTracker() as t:
    for i in memalloc.steps_of(range(3)):
        keep.append(host.empty(200_000 * (i + 1), dtype=u8))
        tmp = host.empty(2 * MiB, dtype=u8); del tmp
    t.to_csv(d + "/m.csv")
    t.to_json(d + "/m.json")
R["rows"] = t.rows
R["plot"] = err(lambda: t.plot(d + "/m.png"))
R["plot_empty"] = err(lambda: memalloc.StepTracker().plot(d + "/empty.png"))
""")
    rows = r["rows"]
    assert [x["step"] for x in rows] == [1, 2, 3]
    assert [x["allocated"] for x in rows] == [200192, 200192 + 400384, 200192 + 400384 + 600064]
    with open(tmp_path / "m.csv", newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == ("step", "time_s", "allocated", "reserved", "peak_allocated",
                                            "peak_reserved", "device_used", "device_total", "num_ooms")
        back = [{k: float(v) if k == "time_s" else int(v) for k, v in x.items()} for x in reader]
    assert back == rows
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["schema"] == "memalloc.step_tracker/1" and doc["backend"] == "host" and doc["device"] == 0
    assert doc["units"]["allocated"] == "bytes" and doc["units"]["time_s"] == "seconds"
    assert doc["rows"] == rows
    png = tmp_path / "m.png"
    if HAS_MATPLOTLIB:
        assert r["plot"] is None
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert r["plot_empty"][0] == "ValueError" and "no rows" in r["plot_empty"][2]
    else:
        assert r["plot"][0] == "ImportError" and "pip install matplotlib" in r["plot"][2]
        assert not png.exists()
