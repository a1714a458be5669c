"""The flight recorder on CUDA (pytest -m gpu; skipped without a GPU): the
host suite's kill test (tests/integration/test_flight_recorder.py) with the
loop's tensors on the GPU under memalloc.enable(backend="cuda"): a SIGKILLed
run leaves exactly the records that the same loop's in-memory ring held at
that step, sequence numbers contiguous, none torn; and what the file-backed
ring costs, measured in one process against memalloc without recording
(benchmarks/gpu_worker.py memalloc flight): the bf16 transformer step within
1.02x and the 512 B pair within 1.05x."""
from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest
import torch

from test_cuda import gpu_worker, record

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOOP = os.path.join(REPO, "tests", "recording_cases", "flight_loop.py")


def run_loop(mode: str, directory) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO)
    env.pop("MEMALLOC_CONF", None)
    return subprocess.run([sys.executable, LOOP, mode, str(directory), "4096", "cuda"], env=env,
                          capture_output=True, text=True, timeout=300)


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


def test_the_file_backed_ring_costs_within_budget():
    r = gpu_worker("memalloc", "flight", "flight_cost")
    # (r["fr_*_x_memory"]: the in-memory ring's cost on the same baseline, for comparison)
    assert r["fr_bf16_ms_x_file"] <= 1.02, r
    assert r["fr_pair_us_512_x_file"] <= 1.05, r
