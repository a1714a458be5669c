"""The CPU benchmark suite (benchmarks/cpu/suite.py, benchmarks/cpu/bench_core.cpp):
bench_core builds and runs in a tiny mode with sane figures and its
self-checks (counters back to zero, validate()) passing; the --check
comparison fails above +10% of the baseline and passes within it. The full
suite is `python -m benchmarks cpu --check` (CI runs it with
--quick)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.cpu import suite as cpu_bench  # noqa: E402

pytestmark = pytest.mark.slow  # CI runs it; `pytest -m 'not slow'` skips it

TINY = {"pair-iters": 2000, "random-ops": 2000, "thread-pair-iters": 500, "thread-random-ops": 500, "threads": 4}


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    if not (shutil.which("g++") or shutil.which("c++")):
        pytest.fail("a C++ compiler (g++) is needed to build bench_core")
    info = cpu_bench.build(build_dir=tmp_path_factory.mktemp("cpu_bench"), rebuild=True, log=lambda s: None)
    assert not info["cached"]
    assert "warning" not in info.get("warnings", ""), info["warnings"]
    return info["binary"]


def test_bench_core_tiny_run_is_sane(binary):
    raw = cpu_bench.run_timings(binary, repeats=2, counts=TINY, timeout=60)  # raises unless exit 0 and "ok"
    assert raw["ok"] is True and raw["failures"] == []
    assert raw["repeats"] == 2
    sizes = [p["size"] for p in raw["pair"]]
    assert sizes == cpu_bench.PAIR_SIZES
    for p in raw["pair"]:
        assert len(p["ns_per_pair"]) == 2 and all(v > 0 for v in p["ns_per_pair"])
        assert p["peak_reserved"] >= p["peak_allocated"] >= p["size"]
        assert p["num_device_alloc"] == 1  # every pair after the first is a cache hit
    r = raw["random"]
    assert len(r["ns_per_op"]) == 2 and all(v > 0 for v in r["ns_per_op"])
    assert r["peak_reserved"] >= r["peak_allocated"] > 0
    assert r["num_ooms"] == 0 and r["skipped_ooms"] == 0
    th = raw["threads"]
    assert th["threads"] == 4
    for key in ("pair_1dev", "pair_2dev"):
        for entry in th[key]:
            assert all(v > 0 for v in entry["ns_per_op_per_thread"]) and all(v > 0 for v in entry["ops_per_s"])
            assert entry["peak_reserved"] >= entry["peak_allocated"] > 0
    for key in ("random_1dev", "random_2dev"):
        entry = th[key]
        assert all(v > 0 for v in entry["ops_per_s"])
        assert entry["peak_reserved"] >= entry["peak_allocated"] > 0

    summary = cpu_bench.summarize_timings(raw)
    # Every callgrind workload has a timing row, except the random workload
    # with recording on (its cost shows in the pair_64KiB_recording row).
    # (the flight recorder's ring is counted in instructions only: pair_64KiB_flight)
    assert set(summary["rows"]) == set(cpu_bench.callgrind_workloads()) - {"random_recording", "pair_64KiB_flight"}
    rec = summary["rows"]["pair_64KiB_recording"]
    assert rec["ns_per_op"] > 0 and "ns_per_event_added" in rec
    assert summary["rows"]["random"]["fragmentation"] >= 1.0
    table = cpu_bench.format_table(summary, None, None)
    assert "random" in table and "pair 256 MiB" in table


def test_bench_core_rejects_bad_usage(binary):
    proc = subprocess.run([binary, "timing", "--repeats", "0"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "positive integer" in proc.stderr
    proc = subprocess.run([binary, "nonsense"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind not installed")
def test_callgrind_counts_only_the_measured_region(binary, tmp_path):
    # Two small workloads, once: the region must be collected (hundreds of
    # instructions per op) and the count must not include the warm-up or
    # setup (which would make it far larger per op at this size).
    workloads = {k: v for k, v in cpu_bench.callgrind_workloads(ops=2000).items() if k in ("random", "pair_64KiB")}
    figures = cpu_bench.run_callgrind(binary, workloads, out_dir=tmp_path)
    for name, f in figures.items():
        assert f["ops"] == 2000
        assert 100 < f["ir_per_op"] < 20000, (name, f)


def test_check_fails_above_ten_percent_and_passes_within():
    measured = {"random": 2000.0, "pair_64KiB": 1500.0}
    # A baseline 20% lower than the measured figure: +25% -> regression.
    low = cpu_bench.compare_to_baseline(measured, {"random": 2000.0 * 0.8, "pair_64KiB": 1500.0})
    assert not low["ok"]
    assert [r["status"] for r in low["rows"]] == ["REGRESSION", "ok"]
    assert "random" in low["failures"][0] and "+25.0%" in low["failures"][0]
    # 5% lower: +5.3%, within the 10% tolerance.
    close = cpu_bench.compare_to_baseline(measured, {"random": 2000.0 * 0.95, "pair_64KiB": 1500.0})
    assert close["ok"] and close["failures"] == []
    # Far below the baseline (an improvement) passes with a note only.
    better = cpu_bench.compare_to_baseline(measured, {"random": 2000.0 / 0.8, "pair_64KiB": 1500.0})
    assert better["ok"] and better["rows"][0]["status"] == "improved" and better["notes"]
    # A workload without a baseline figure cannot be checked: failure.
    missing = cpu_bench.compare_to_baseline(measured, {"random": 2000.0})
    assert not missing["ok"] and "pair_64KiB" in missing["failures"][0]


def test_committed_baseline_covers_every_workload():
    baseline = cpu_bench.load_baseline()
    assert baseline is not None, "benchmarks/baselines/cpu_instructions.json is missing"
    figures = cpu_bench.baseline_figures(baseline)
    assert set(figures) == set(cpu_bench.callgrind_workloads())
    assert all(v > 0 for v in figures.values())
    assert baseline["flags"][:3] == ["-std=c++17", "-O2", "-g"] and baseline["compiler"]
    assert all(w["ops"] == cpu_bench.CALLGRIND_OPS for w in baseline["workloads"].values())


def test_bench_core_self_check_fails_on_a_leak(binary):
    # bench_core's "leak-demo" mode leaks one block: the same check that runs
    # after every benchmark must report it and exit non-zero.
    proc = subprocess.run([binary, "leak-demo"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "allocated_bytes.current = 4096" in proc.stdout
    with pytest.raises(cpu_bench.SuiteError, match="self-check failures"):
        cpu_bench.parse_bench_output(proc, "leak-demo")
