"""What the framework callback costs a training step on the GPU (pytest -m
gpu; issue 41: "add nothing measurable to step time"): a Lightning run of a
bf16 transformer encoder (tests/callback_cases/lightning_timing.py) with and
without memalloc's MemoryMonitor, both under memalloc.enable(), logging at
every step (the callback's most expensive setting: its figures and leak
rate each step, a flight recorder, the run page at the end). Fresh
processes in ABBA order, ROUNDS of each; each process's median step time
after WARMUP steps; the ratio of the two modes' medians must stay within
BOUND, the bound of memalloc's own step-time targets
(tests/gpu/test_cuda_step_time.py). One more process with the monitor times
its pieces (the case's ``parts``) and every process reports the allocator's
device allocations, frees and synchronisations, so a failure names where the
time goes."""

from __future__ import annotations

import os
import statistics

import pytest
import torch
from memtest_helpers import run_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASE = os.path.join(REPO, "tests", "callback_cases", "lightning_timing.py")
ROUNDS, STEPS, WARMUP, BOUND = 3, 60, 10, 1.02


def _run(tmp_path, with_monitor: bool, i: int, *extra: str) -> dict:
    out = tmp_path / f"run{i}"
    r = run_case(CASE, str(out), "1" if with_monitor else "0", str(STEPS), "cuda", *extra, cwd=tmp_path)
    assert len(r["times"]) == STEPS
    if with_monitor:  # the callback did its work: its page is there
        assert list(out.glob("lightning_logs/version_0/index.html")), list(out.rglob("*"))
    r["median"] = statistics.median(r["times"][WARMUP:])
    return r


def test_memory_monitor_adds_nothing_measurable_to_step_time(tmp_path):
    pytest.importorskip("lightning")
    medians: dict[bool, list[float]] = {False: [], True: []}
    counters: dict[bool, list[dict]] = {False: [], True: []}
    order = [False, True, True, False] * ((ROUNDS + 1) // 2)
    for i, with_monitor in enumerate(order[: 2 * ROUNDS]):
        r = _run(tmp_path, with_monitor, i)
        medians[with_monitor].append(r["median"])
        counters[with_monitor].append(r["counters"])
    ratio = statistics.median(medians[True]) / statistics.median(medians[False])
    parts = _run(tmp_path, True, 2 * ROUNDS, "parts")
    print(f"MemoryMonitor step time ratio {ratio:.4f} (with {medians[True]}, without {medians[False]})")
    print(f"counters: with {counters[True]}, without {counters[False]}")
    print(f"the monitor's parts (calls, median ms; step median {parts['median'] * 1e3:.2f} ms): {parts['parts_ms']}")
    assert ratio <= BOUND, (ratio, medians, parts["parts_ms"], counters)
