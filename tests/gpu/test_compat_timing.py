"""Step time of the two compatibility cases with a speed target (issue:
compatibility): a ResNet-50 training step with ``cudnn.benchmark = True`` and
``torch.compile(mode="reduce-overhead")`` on a small transformer, each within
5% of native (pytest -m gpu; skipped without a GPU).

One process per mode is not a measurement: cudnn.benchmark times candidate
algorithms in each process and keeps what won there, so two native processes
differ too (seen on the H200: native 19.5 - 24.7 ms per step across runs,
memalloc/native 0.95 - 1.12 from single pairs; three rounds gave native
21.2, 22.9, 19.7 ms and memalloc 23.5, 23.1, 19.6 ms). Here the modes run in
interleaved fresh processes, in ABBA order (native, memalloc, memalloc,
native, ...) so that neither mode always runs second on a warmer GPU; each
process reports its median time, and the test compares the medians over
ROUNDS processes per mode (8: three, then five, could not resolve 5% against
that spread; five gave native 19.5, 18.7, 21.1, 18.0, 18.6 and memalloc
18.5, 18.0, 20.9, 19.8, 21.6 ms). The cases and their correctness checks are in
compat_cases.py / test_compat.py.
"""

from __future__ import annotations

import os
import statistics

import pytest
import torch
from test_compat import TIME_FACTOR, require_ok, run_case
from test_cuda import record

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROUNDS = int(os.environ.get("MEMALLOC_COMPAT_TIMING_ROUNDS", "8"))


def interleaved(case: str, key: str) -> dict:
    """{mode: [per-process median]} over ROUNDS interleaved rounds, ABBA order."""
    times: dict = {"native": [], "memalloc": []}
    for rnd in range(ROUNDS):
        for mode in ("native", "memalloc") if rnd % 2 == 0 else ("memalloc", "native"):
            r = run_case(case, mode, timeout=420)
            require_ok(r)
            times[mode].append(r[key])
    record(f"timing_{case}", "interleaved", times)
    return times


@pytest.mark.parametrize(
    "case,key,what",
    [
        ("cudnn_benchmark", "median_step_ms", "ResNet-50 step with cudnn.benchmark"),
        ("reduce_overhead", "median_call_ms", "torch.compile(mode='reduce-overhead') call"),
    ],
)
def test_within_five_percent_of_native(case, key, what):
    times = interleaved(case, key)
    native, mem = statistics.median(times["native"]), statistics.median(times["memalloc"])
    assert mem <= TIME_FACTOR * native, (
        f"{what}: memalloc {mem:.3f} ms > {TIME_FACTOR} x native {native:.3f} ms ({times})"
    )
