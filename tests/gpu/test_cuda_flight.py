"""The flight recorder on CUDA (pytest -m gpu; skipped without a GPU): the
host suite's kill test (tests/integration/test_flight_recorder.py) with the
loop's tensors on the GPU under memalloc.enable(backend="cuda"): a SIGKILLed
run leaves exactly the records that the same loop's in-memory ring held at
that step, sequence numbers contiguous, none torn; the host suite's
end-to-end checks (tests/recording_cases/flight_checks.py) on CUDA:
postmortem and its memory_viz snapshot of the killed run, top --once
against a live CUDA process, and torchrun with two ranks on the one GPU
(gloo) merged by report DIR. And what the file-backed ring costs: the 512 B
pair within 1.05x of memalloc without recording, measured in one process
(benchmarks/gpu_worker.py memalloc flight); the bf16 transformer step within
1.02x of native with the recorder on as ``python -m memalloc run`` turns it
on (a heartbeat and checkpoint at every optimizer.step()), from interleaved
fresh processes (gpu_worker memalloc_flight bf16 against native bf16)."""
from __future__ import annotations

import os
import statistics
import struct
import subprocess
import sys

import pytest
import torch

from test_cuda import gpu_worker, record

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recording_cases"))
import flight_checks  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

def run_loop(mode: str, directory) -> subprocess.CompletedProcess:
    return flight_checks.run_loop(mode, directory, 4096, "cuda", timeout=300)


def test_a_killed_cuda_process_leaves_every_committed_record(tmp_path):
    from memalloc.trace import flight_files as ff
    from memalloc.trace.recording import ACTIONS, RECORD_FORMAT

    p = run_loop("memory", tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    truth = [(size, req, step, ACTIONS[action], dev)
             for (_t, _a, size, req, _s, _st, _tag, _th, step, action, dev, _pool)
             in struct.iter_unpack(RECORD_FORMAT, (tmp_path / "ring.bin").read_bytes())]
    d = tmp_path / "flight"
    p = run_loop("kill", d)
    assert p.returncode == -9, p.stderr[-3000:]
    (path,) = ff.files_in(d)
    f = ff.read(path)
    assert f.backend == "cuda" and f.step == 21 and f.torn[0] == 0
    assert f.sequences[0] == list(range(1, len(f.rings[0]) + 1))
    got = [(e.size, e.requested, e.step, e.action, e.device) for e in f.rings[0]]
    record("flight_kill_cuda", "memalloc", {"records": len(got), "truth_records": len(truth),
                                             "actions": sorted({e[3] for e in got})})
    assert got == truth


@pytest.fixture(scope="module")
def killed_cuda(tmp_path_factory):
    d = tmp_path_factory.mktemp("killed-cuda")
    p = run_loop("kill", d)
    assert p.returncode == -9, p.stderr[-3000:]
    return d


def test_postmortem_of_a_killed_cuda_process_names_the_keeping_line(killed_cuda):
    text = flight_checks.check_postmortem(killed_cuda)
    record("flight_postmortem_cuda", "memalloc", {"text": text[:4000]})


def test_postmortem_snapshot_of_a_cuda_run_reads_in_memory_viz(killed_cuda):
    flight_checks.check_snapshot(killed_cuda)


def test_top_once_shows_a_live_cuda_process(tmp_path):
    flight_checks.check_top(tmp_path, "cuda")


def test_torchrun_two_ranks_on_one_gpu_give_one_report(tmp_path):
    text, page, script, lines = flight_checks.run_job(tmp_path / "out", "cuda")
    record("flight_job_report_cuda", "memalloc", {"text": text[:4000]})
    flight_checks.check_job(text, page, script, lines)


def test_the_file_backed_ring_costs_within_budget():
    """In one process, rounds alternating memalloc without recording, the
    in-memory ring and the flight recorder (as ``memalloc run`` sets it: the
    file, and a heartbeat and checkpoint at every optimizer.step()): the
    512 B pair within 1.05x and the bf16 step within 1.02x of no recording."""
    r = gpu_worker("memalloc", "flight", "flight_cost")
    # (r["fr_*_x_memory"]: the in-memory ring's cost on the same baseline, for comparison;
    # fr_*_x_file_shm: the same file on tmpfs; fr_pair_minflt_per_1000_*: page faults)
    assert r["fr_pair_us_512_x_file"] <= 1.05, r
    assert r["fr_bf16_ms_x_file"] <= 1.02, r


BF16_ROUNDS = int(os.environ.get("MEMALLOC_FLIGHT_TIMING_ROUNDS", "12"))


def test_bf16_step_with_the_flight_recorder_within_2pct_of_native():
    """native against memalloc with the flight recorder as ``memalloc run``
    sets it, in fresh processes on the same 4 cores (gpu_worker bf16: the
    median of 20 steps each): BF16_ROUNDS rounds of one process per mode, in
    ABBA order; the figure is the median over rounds of each round's ratio
    (the machine's speed drifts between rounds: seen 26 - 35 ms per step
    for native across 8 processes, memalloc/native 0.94 from medians of
    them, which cannot resolve 2%)."""
    env = dict(os.environ, MEMALLOC_BENCH_CPUS="2-5")
    times: dict = {"native": [], "memalloc_flight": []}
    for rnd in range(BF16_ROUNDS):
        for mode in (("native", "memalloc_flight") if rnd % 2 == 0 else ("memalloc_flight", "native")):
            times[mode].append(gpu_worker(mode, "bf16", "flight_bf16", env=env)["transformer_bf16_ms"])
    ratios = [f / n for f, n in zip(times["memalloc_flight"], times["native"])]
    ratio = statistics.median(ratios)
    record("flight_bf16_interleaved", "interleaved", {"times_ms": times, "round_ratios": ratios,
                                                      "median_ratio": ratio, "cpus": env["MEMALLOC_BENCH_CPUS"]})
    assert ratio <= 1.02, (ratio, times)
